"""Scale: the exact solve at N = 1e6, n = 256, float32 (about 1 GB), on this machine's cores.

The total time is expressed as a multiple of one plain NumPy pass over X measured in the same
run (a float32 matrix-vector product X @ v, which reads X once; best of 5), and the peak extra
memory (tracemalloc, which sees NumPy's allocations) as a multiple of X's size. Both sides use
all the machine's cores (OpenBLAS threads for X @ v, ``widelimit.engine.local.default_threads()``
pass threads for the solve); ``--threads 1`` with ``OPENBLAS_NUM_THREADS=1`` measures one core.
With ``--lam 12`` about 80% of the points lie beyond lam, so the narrowest dictionary has about
800,000 atoms (an 0.8 GB output).

    python benchmarks/scale.py --lam 12 [--N 1000000] [--dim 256] [--threads T] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import tracemalloc

import numpy as np

import widelimit as wl
from _common import write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--lam", type=float, default=12.0)
    ap.add_argument("--threads", type=int, default=0, help="pass threads (default: all usable cores)")
    ap.add_argument("--repeat", type=int, default=3, help="solves timed (the best is reported)")
    a = ap.parse_args()
    if a.threads:
        os.environ["WIDELIMIT_THREADS"] = str(a.threads)
    from widelimit.engine.local import default_threads
    load0 = " ".join(f"{v:.2f}" for v in os.getloadavg())
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
    sol = wl.solve(X, lam=a.lam)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    times = []
    for _ in range(a.repeat):  # timed without tracemalloc (which slows every allocation)
        del sol
        t0 = time.perf_counter()
        sol = wl.solve(X, lam=a.lam)
        times.append(time.perf_counter() - t0)
    t_solve = min(times)
    t0 = time.perf_counter()
    med = wl.huber_median(X, lam=a.lam)
    t_med = time.perf_counter() - t0
    res = dict(N=a.N, n=a.dim, lam=a.lam, threads=default_threads(), x_bytes=X.nbytes, numpy_pass_s=t_pass,
               solve_s=t_solve, solve_all_s=times, solve_data_passes=sol.n_passes,
               solve_in_passes=t_solve / t_pass, median_s=t_med, median_in_passes=t_med / t_pass,
               median_data_passes=med.n_passes, peak_extra_bytes=peak, peak_extra_over_x=peak / X.nbytes,
               width=sol.width, certified=bool(sol.certified), rel_gap=sol.certificate.rel_gap)
    cmd = "python benchmarks/scale.py " + " ".join(sys.argv[1:])
    md = ("| N | n | X (GB) | threads | one numpy pass (s) | solve (s) | solve / pass | solve data passes | median (s) | median data passes | peak extra memory / X | width | certified rel. gap |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
          f"| {a.N} | {a.dim} | {X.nbytes / 1e9:.2f} | {default_threads()} | {t_pass:.3f} | {t_solve:.2f} | {t_solve / t_pass:.1f} | {sol.n_passes} | "
          f"{t_med:.2f} | {med.n_passes} | {peak / X.nbytes:.2f} | {sol.width} | {sol.certificate.rel_gap:.1e} |\n\n"
          f"Command: `{cmd.strip()}` ({platform.platform()}, load average before the run: {load0}).\n")
    write("scale", dict(res, command=cmd.strip(), load_average_before=load0), md)


if __name__ == "__main__":
    main()
