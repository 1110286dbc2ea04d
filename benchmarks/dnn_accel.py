"""The DNN solver with and without momentum (``solve_dnn(accelerate=...)``), side by side in one run.

Instances with a known optimum (the DNN relaxation is tight, theory.md §4.3, so ``widelimit.solve``
gives the value both must reach): the benchmark families of ``widelimit.relax.families`` at
N = 100, 300, 800, and Gaussian points whose last coordinate is stretched by s = 1, 10, 100
(anisotropic data, where first-order steps crawl). Each solve: tolerance 1e-6 (certified relative
gap), CPU, the solver's default threads, a time limit per solve.

Usage::

    PYTHONPATH=. python3 benchmarks/dnn_accel.py [--time-limit 60] [--quick]

Writes ``benchmarks/results/dnn_accel.{json,md}``. The ratio is plain time / accelerated time
(both certified, or the plain one stopped at the time limit or max_iter: then the ratio is a lower bound, ">").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def main():
    import widelimit as wl
    from widelimit.relax.families import FAMILIES, make_bench_instance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="N = 100 and s <= 10 only")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    cases = []
    for N in ((100,) if args.quick else (100, 300, 800)):
        for fam in FAMILIES:
            if fam == "scaled" and N > 300:
                continue  # the plain splitting needs far more than the time limit there
            inst = make_bench_instance(fam, N, seed=0)
            cases.append((f"{fam} N={N}", inst.X, inst.lam, inst.optimum))
    for s in ((1.0, 10.0) if args.quick else (1.0, 10.0, 100.0)):
        X = wl.datasets.gaussian(200, 5, seed=1)[0] * np.array([1.0, 1.0, 1.0, 1.0, s])
        cases.append((f"gaussian N=200, last axis x{s:g}", X, 0.5, wl.solve(X, lam=0.5).value))

    wl.solve_dnn(cases[0][1][:20], lam=cases[0][2], device="cpu")  # load the kernels
    rows = []
    t_start = time.time()
    load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    for name, X, lam, opt in cases:
        row = {"case": name, "optimum": opt}
        for acc in (False, True):
            t0 = time.perf_counter()
            r = wl.solve_dnn(X, lam=lam, tol=1e-6, time_limit=args.time_limit, device="cpu", accelerate=acc)
            key = "momentum" if acc else "plain"
            row[key] = {"seconds": time.perf_counter() - t0, "iterations": r.n_iter, "converged": r.certified,
                        "rel_gap": r.rel_gap, "eigendecompositions": r.history[-1]["n_eigh"] if r.history else 0,
                        "brackets_optimum": bool(r.lower_bound <= opt * (1 + 1e-12) + 1e-12
                                                 and r.value >= opt * (1 - 1e-12) - 1e-12)}
        row["ratio"] = row["plain"]["seconds"] / row["momentum"]["seconds"]
        rows.append(row)
        p, m = row["plain"], row["momentum"]
        print(f"{name:34s} plain {p['iterations']:6d} it {p['seconds']:7.2f} s {'ok ' if p['converged'] else 'cap'} | "
              f"momentum {m['iterations']:6d} it {m['seconds']:7.2f} s {'ok ' if m['converged'] else 'cap'} | "
              f"{'>' if not p['converged'] else ''}{row['ratio']:.1f}x", flush=True)

    out = {"command": "PYTHONPATH=. python3 benchmarks/dnn_accel.py" + (" --quick" if args.quick else "")
           + (f" --time-limit {args.time_limit:g}" if args.time_limit != 60.0 else ""),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "time_limit_s": args.time_limit,
           "load_average_start": load_start, "seconds": time.time() - t_start, "tol": 1e-6, "cases": rows}
    try:
        out["load_average_end"] = list(os.getloadavg())
    except OSError:
        pass
    args.out.mkdir(parents=True, exist_ok=True)
    name = "dnn_accel_quick" if args.quick else "dnn_accel"
    (args.out / f"{name}.json").write_text(json.dumps(out, indent=1))
    lines = [f"# solve_dnn: plain splitting vs momentum ({out['date']}, tolerance 1e-6, limit {args.time_limit:g} s)", "",
             "| case | plain: iterations, s | momentum: iterations, s | ratio |", "|---|---|---|---|"]
    for r in rows:
        p, m = r["plain"], r["momentum"]
        cap = lambda d: "" if d["certified"] else " (not certified: stopped)"  # noqa: E731
        lines.append(f"| {r['case']} | {p['iterations']}, {p['seconds']:.2f}{cap(p)} | {m['iterations']}, "
                     f"{m['seconds']:.2f}{cap(m)} | {'>' if not p['converged'] else ''}{r['ratio']:.1f}x |")
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / name}.json and .md")


if __name__ == "__main__":
    main()
