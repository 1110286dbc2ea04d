"""Geometric median: widelimit vs the `geom-median` and `hdmedians` packages, same data, same run.

Every returned point is scored with widelimit's certified lower bound (a dual bound valid for
any point), so "certified rel. gap" is (G(point) - lower_bound) / G(point) for each method.
widelimit is also run with its tolerance set to the gap each peer reached ("equal accuracy").

    python benchmarks/median_peers.py [--sizes 10000 100000] [--dim 64]

hdmedians' PyPI wheel is built against NumPy 1.x; with NumPy 2 build it from source:
    pip install cython && pip install --no-binary hdmedians --no-build-isolation hdmedians
"""

from __future__ import annotations

import argparse

import numpy as np

import widelimit as wl
from _common import timed, write


def gvalue(X, b):
    return float(np.mean(np.linalg.norm(X - b, axis=1)))


def peers():
    out = {}
    try:
        from geom_median.numpy import compute_geometric_median

        out["geom-median"] = lambda X: np.asarray(compute_geometric_median(X, eps=1e-12, maxiter=1000, ftol=1e-20).median)
    except ImportError as e:  # pragma: no cover
        print("geom-median unavailable:", e)
    try:
        import hdmedians as hd

        out["hdmedians"] = lambda X: np.asarray(hd.geomedian(X, axis=0, eps=1e-12, maxiters=1000))
    except ImportError as e:  # pragma: no cover
        print("hdmedians unavailable:", e)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--dim", type=int, default=64)
    a = ap.parse_args()
    rows = []
    for N in a.sizes:
        rng = np.random.default_rng(1)
        X = rng.standard_normal((N, a.dim)) * np.linspace(0.2, 3, a.dim)  # anisotropic
        t_ours, ref = timed(wl.geometric_median, X, repeat=3)
        lb = ref.lower_bound
        rows.append(dict(N=N, method="widelimit", time_s=t_ours, rel_gap=(ref.value - lb) / ref.value))
        for name, fn in peers().items():
            t, pt = timed(fn, X)
            gap = (gvalue(X, pt) - lb) / gvalue(X, pt)
            t_eq, r_eq = timed(wl.geometric_median, X, tol=max(gap, 1e-15), xtol=1.0, repeat=3)
            rows.append(dict(N=N, method=name, time_s=t, rel_gap=gap, widelimit_same_gap_s=t_eq,
                             widelimit_same_gap_rel_gap=r_eq.rel_gap, ratio=t / t_eq, ratio_vs_full=t / t_ours))
    md = ["| N | method | time (s) | certified rel. gap | widelimit at that gap (s) | speed-up at equal accuracy | speed-up vs widelimit to 1e-12 |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["method"] == "widelimit":
            md.append(f"| {r['N']} | widelimit (tol 1e-12) | {r['time_s']:.3f} | {r['rel_gap']:.1e} | | | |")
        else:
            md.append(f"| {r['N']} | {r['method']} | {r['time_s']:.3f} | {r['rel_gap']:.1e} | {r['widelimit_same_gap_s']:.3f} | "
                      f"{r['ratio']:.1f}x | {r['ratio_vs_full']:.1f}x |")
    write("median_peers", {"rows": rows, "command": "python benchmarks/median_peers.py"}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
