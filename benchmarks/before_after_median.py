"""In-memory huber_median (2e6 x 128 float32) and solve (20000 x 64): best-of timings for one tree.

    PYTHONPATH=<tree> python3 benchmarks/before_after_median.py <label>
"""
import time, sys, numpy as np, widelimit as wl
X = np.random.default_rng(0).standard_normal((2_000_000, 128)).astype(np.float32)
Y = np.random.default_rng(1).standard_normal((20000, 64))
def best(f, r=5):
    t = []
    for _ in range(r):
        t0 = time.perf_counter(); out = f(); t.append(time.perf_counter() - t0)
    return min(t), out
try:
    tm, m = best(lambda: wl.huber_median(X, lam=1.0), 3)
    ts, s = best(lambda: wl.solve(Y, lam=4.0), 10)
except TypeError:
    tm, m = best(lambda: wl.huber_median(X, 1.0), 3)
    ts, s = best(lambda: wl.solve(Y, 4.0), 10)
print(sys.argv[1], f"median 2e6x128 f32: {tm:.3f}s {m.n_passes} passes ({tm/m.n_passes:.3f} s/pass); solve 20000x64: {ts*1e3:.1f} ms")
