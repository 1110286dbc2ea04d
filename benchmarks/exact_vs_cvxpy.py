"""Exact wide-limit solve vs cvxpy + Clarabel on the same Huber location problem.

    min_b  (1/N) sum_i h_lam(||x_i - b||),   h = twice the Huber loss (cvxpy.huber(., lam))

is the wide-limit optimum (theory.md §3). Both are timed in the same run on the same data;
widelimit's time is the whole `solve` (median, rays, codes and certificate), cvxpy's is
problem construction + Clarabel. Accuracy: cvxpy's value is compared with widelimit's certified
lower bound, so "rel_err" is cvxpy's own suboptimality (ours is at most its certified gap).

    python benchmarks/exact_vs_cvxpy.py [--sizes 2000 20000] [--dim 64]
"""

from __future__ import annotations

import argparse

import cvxpy as cp
import numpy as np

import widelimit as wl
from _common import timed, write


def data(N, n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n))
    X[: N // 4] *= 0.1  # a dense core near the median, so some points lie within lam
    return X


def cvxpy_huber(X, lam):
    N, n = X.shape
    b = cp.Variable(n)
    resid = X - np.ones((N, 1)) @ cp.reshape(b, (1, n), order="C")
    prob = cp.Problem(cp.Minimize(cp.sum(cp.huber(cp.norm(resid, axis=1), lam)) / N))
    prob.solve(solver=cp.CLARABEL)
    return prob.value, b.value, prob.status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--lam", type=float, default=4.0)
    a = ap.parse_args()
    rows = []
    for N in a.sizes:
        X = data(N, a.dim)
        t_wl, sol = timed(wl.solve, X, lam=a.lam, repeat=3)
        t_med, med = timed(wl.huber_median, X, lam=a.lam, repeat=3)
        t_cv, (v_cv, b_cv, status) = timed(cvxpy_huber, X, a.lam)
        rows.append(dict(N=N, n=a.dim, lam=a.lam, widelimit_solve_s=t_wl, widelimit_median_s=t_med, cvxpy_clarabel_s=t_cv,
                         ratio_solve=t_cv / t_wl, ratio_median=t_cv / t_med, value=sol.value,
                         certified_rel_gap=sol.certificate.rel_gap, cvxpy_value=v_cv, cvxpy_status=status,
                         cvxpy_rel_err=(v_cv - sol.lower_bound) / sol.value,
                         bias_diff=float(np.linalg.norm(b_cv - sol.bias)), width=sol.width))
    md = ["| N | n | widelimit solve (s) | huber_median (s) | cvxpy+Clarabel (s) | speed-up (solve) | speed-up (median) | our certified rel. gap | cvxpy rel. error |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['N']} | {r['n']} | {r['widelimit_solve_s']:.3f} | {r['widelimit_median_s']:.3f} | {r['cvxpy_clarabel_s']:.2f} | "
                  f"{r['ratio_solve']:.0f}x | {r['ratio_median']:.0f}x | {r['certified_rel_gap']:.1e} | {r['cvxpy_rel_err']:.1e} |")
    write("exact_vs_cvxpy", {"rows": rows, "command": "python benchmarks/exact_vs_cvxpy.py"}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
