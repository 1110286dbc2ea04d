"""Scale: the exact solve at N = 1e6, n = 256, float32 (about 1 GB), on this machine's cores.

The total time is expressed as a multiple of one plain NumPy pass over X measured in the same
run (a float32 matrix-vector product X @ v, which reads X once), and the peak extra memory
(tracemalloc, which sees NumPy's allocations) as a multiple of X's size.

    python benchmarks/scale.py [--N 1000000] [--dim 256] [--lam 20]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

import widelimit as wl
from _common import write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--lam", type=float, default=20.0)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    X = np.empty((a.N, a.dim), dtype=np.float32)
    for s in range(0, a.N, 100_000):
        X[s : s + 100_000] = rng.standard_normal((min(100_000, a.N - s), a.dim), dtype=np.float32)
    X[: a.N // 5] *= 0.5  # points on both sides of lam
    v = np.ones(a.dim, dtype=np.float32)
    passes = []
    for _ in range(5):
        t0 = time.perf_counter()
        X @ v
        passes.append(time.perf_counter() - t0)
    t_pass = min(passes)
    tracemalloc.start()
    t0 = time.perf_counter()
    sol = wl.solve(X, a.lam)
    t_solve = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t0 = time.perf_counter()
    med = wl.huber_median(X, a.lam)
    t_med = time.perf_counter() - t0
    res = dict(N=a.N, n=a.dim, lam=a.lam, x_bytes=X.nbytes, numpy_pass_s=t_pass, solve_s=t_solve,
               solve_in_passes=t_solve / t_pass, median_s=t_med, median_in_passes=t_med / t_pass,
               median_data_passes=med.n_passes, peak_extra_bytes=peak, peak_extra_over_x=peak / X.nbytes,
               width=sol.width, certified=bool(sol.certified), rel_gap=sol.certificate.rel_gap)
    md = ("| N | n | X (GB) | one numpy pass (s) | solve (s) | solve / pass | median (s) | median data passes | peak extra memory / X | width | certified rel. gap |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|\n"
          f"| {a.N} | {a.dim} | {X.nbytes / 1e9:.2f} | {t_pass:.3f} | {t_solve:.1f} | {t_solve / t_pass:.1f} | {t_med:.1f} | {med.n_passes} | "
          f"{peak / X.nbytes:.2f} | {sol.width} | {sol.certificate.rel_gap:.1e} |\n")
    write("scale", dict(res, command="python benchmarks/scale.py"), md)


if __name__ == "__main__":
    main()
