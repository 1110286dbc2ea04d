"""CP factorisation benchmark: the random protocol of the literature, and refinement of relaxation optima.

Protocol (Groetzner & Dür 2020; Bot & Nguyen): ``A = C C^T`` with ``C = |randn(n, 2n)|``,
factor width ``r`` in {1.5 n, 3 n}, n in {20, 40, 100}; success = relative residual
``||Z Z^T - A||_F / ||A||_F <= 1e-8`` with ``Z >= 0``.

    PYTHONPATH=$PWD python3 benchmarks/cpfactor.py            # a few minutes on 2 cores
    PYTHONPATH=$PWD python3 benchmarks/cpfactor.py --quick

Writes benchmarks/results/cpfactor.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import widelimit as wl
from widelimit.relax.cpfactor import factorize_cp, random_cp_matrix, refine
from widelimit.relax.families import make_bench_instance
from widelimit.relax.cones import relax

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trials", type=int, default=10, help="matrices per (n, r) for n <= 40")
    ap.add_argument("--trials-large", type=int, default=5, help="matrices per (n, r) for n = 100")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [20] if args.quick else [20, 40, 100]
    rows = []
    for n in sizes:
        trials = 3 if args.quick else (args.trials if n <= 40 else args.trials_large)
        for fac in (1.5, 3.0):
            r = int(round(fac * n))
            times, ok, res, iters = [], 0, [], []
            for seed in range(trials):
                A, _ = random_cp_matrix(n, seed=seed)
                f = factorize_cp(A, width=r, seed=seed)
                times.append(f.time_s)
                ok += f.success
                res.append(f.residual)
                iters.append(f.n_iter)
            row = {"n": n, "r": r, "trials": trials, "success_rate": ok / trials,
                   "mean_time_s": float(np.mean(times)), "max_time_s": float(np.max(times)),
                   "median_iterations": float(np.median(iters)), "max_residual": float(np.max(res))}
            rows.append(row)
            print(json.dumps(row), flush=True)

    # refinement of relaxation optima: narrowest width vs the exact number of rays
    refine_rows = []
    for family, N in [("rays", 20), ("rays", 40), ("rays", 80), ("random", 20), ("collinear", 20)]:
        inst = make_bench_instance(family, N, dim=3, seed=0)
        sol = wl.solve(inst.X, lam=inst.lam)
        rel = relax(inst.X, lam=inst.lam, cone="dnn", solver="SCS", tol=1e-8)
        t0 = time.perf_counter()
        ref = refine(inst.X, rel.Q, rel.b, lam=inst.lam)
        row = {"family": family, "N": N, "exact_value": sol.value, "exact_width": sol.width,
               "relax_status": rel.status, "refined_value": ref.value,
               "refined_rel_error": abs(ref.value - sol.value) / sol.value, "refined_width": ref.width,
               "factor_width": ref.factor_width, "factor_residual": ref.factorization.residual,
               "certified_rel_gap": ref.certificate.rel_gap,
               "refine_time_s": time.perf_counter() - t0}
        refine_rows.append(row)
        print(json.dumps(row), flush=True)

    cmd = "PYTHONPATH=$PWD python3 benchmarks/cpfactor.py" + (" --quick" if args.quick else "")
    (args.out / "cpfactor.json").write_text(json.dumps({"command": cmd, "protocol": rows,
                                                       "refine": refine_rows}, indent=1))
    lines = ["# CP factorisation benchmark", "", f"Command: `{cmd}` (shared 2-core machine; times are noisy)", "",
             "Random protocol A = C C^T, C = |randn(n, 2n)|, Groetzner-Dür alternating projections "
             "(5 random starts, <= 5000 iterations each), success = relative residual <= 1e-8.", "",
             "| n | r | trials | success rate | mean time (s) | max time (s) | median iterations | max residual |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['r']} | {r['trials']} | {100 * r['success_rate']:.0f}% | {r['mean_time_s']:.2f} "
                     f"| {r['max_time_s']:.2f} | {r['median_iterations']:.0f} | {r['max_residual']:.1e} |")
    lines += ["", "Refinement of the DNN optimum (cvxpy + SCS, tol 1e-8): CP factor of Q, ridge dictionary, "
              "parallel atoms merged.", "",
              "| family | N | exact width | factor width | factor residual | refined width | refined rel. error "
              "| certified rel. gap | time (s) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in refine_rows:
        lines.append(f"| {r['family']} | {r['N']} | {r['exact_width']} | {r['factor_width']} | "
                     f"{r['factor_residual']:.1e} | {r['refined_width']} | {r['refined_rel_error']:.1e} | "
                     f"{r['certified_rel_gap']:.1e} | {r['refine_time_s']:.2f} |")
    (args.out / "cpfactor.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
