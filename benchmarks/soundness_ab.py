"""A/B timing of one source tree (issue 13: the cost of the fingerprint and the rounding bounds): best-of-3 seconds as JSON.

Usage: run it alternately on two checkouts, e.g. `git archive <commit> | tar -x -C /tmp/a`, then
`cd /tmp && python3 <this file> /tmp/a` and the same for the other tree; compare the minima over rounds.
"""
import sys, time, json, os
sys.path.insert(0, sys.argv[1])
import numpy as np, widelimit as wl
def kw(f, X, lam, **o):
    try:
        return f(X, lam=lam, **o)
    except TypeError:
        return f(X, lam, **o)
def best(fn, k=3):
    fn(); ts = []
    for _ in range(k):
        t = time.perf_counter(); r = fn(); ts.append(time.perf_counter() - t)
    return min(ts), r
out = {}
rng = np.random.default_rng(0); X = rng.standard_normal((20000, 64)); X[:5000] *= 0.1
out["median_20000x64"], m = best(lambda: kw(wl.huber_median, X, 4.0))
out["solve_20000x64"], s = best(lambda: kw(wl.solve, X, 4.0))
rng = np.random.default_rng(0); Y = rng.standard_normal((200000, 256), dtype=np.float32); Y[:40000] *= 0.5
out["solve_200000x256_f32"], s2 = best(lambda: kw(wl.solve, Y, 12.0))
out["median_200000x256_f32"], m2 = best(lambda: kw(wl.huber_median, Y, 12.0))
d = "/tmp/r13/shards"
if not os.path.exists(d):
    os.makedirs(d)
    Z = np.random.default_rng(1).standard_normal((800000, 128), dtype=np.float32)
    for i in range(4):
        np.save(f"{d}/s{i}.npy", Z[i * 200000:(i + 1) * 200000])
S = wl.ActivationSource.open(d)
out["median_stream_800000x128_f32"], m3 = best(lambda: kw(wl.huber_median, S, 1.0))
out["passes"] = [m.n_passes, s.n_passes, s2.n_passes, m2.n_passes, m3.n_passes]
out["rel_gaps"] = [m.rel_gap, s.certificate.rel_gap, s2.certificate.rel_gap, m3.rel_gap]
print(json.dumps(out))
