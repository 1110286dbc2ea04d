"""Relaxation benchmark: cones x solvers x N on instances with a known optimum.

Every Q-problem relaxation of the wide-limit problem has the closed-form optimum
``widelimit.solve(X, lam).value`` (theory.md §4), so each solve is scored by its
error against the truth, and outer <= exact <= inner is checked.

    PYTHONPATH=$PWD python3 benchmarks/relaxations.py            # default grid, a few minutes on 2 cores
    PYTHONPATH=$PWD python3 benchmarks/relaxations.py --quick    # seconds
    PYTHONPATH=$PWD python3 benchmarks/relaxations.py --large 2000 --large-time 600 --large-only  # own solver, big N
    PYTHONPATH=$PWD python3 benchmarks/relaxations.py --vs-scs 50,100,200   # own solver vs SCS at equal accuracy

Run with one BLAS/torch thread for both sides:
``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1`` in front of the command.

Writes benchmarks/results/relaxations.{csv,json,md,png} (and relaxations_large.json,
relaxations_vs_scs.{json,md}).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import widelimit as wl
from widelimit.relax.dnn import solve_dnn
from widelimit.relax.families import make_bench_instance
from widelimit.relax.cones import CONES, OUTER_CONES, estimate_memory, relax

RESULTS = Path(__file__).resolve().parent / "results"

# Sizes beyond which a (solver, cone) pair is skipped, with the reason recorded.
CLARABEL_MAX_N = {"dnn": 50, "diagonal": 50}  # other cones: 20
SCS_ALL_CONES_MAX_N = 100  # at N = 200 only dnn (about a minute per cone on a shared 2-core machine)


def plan(family: str, N: int, main_family: bool):
    """(solver, cone, skip_reason or None) for one instance."""
    out = []
    for cone in CONES:
        if cone == "dnn_horn" and N < 5:
            continue
        # SCS
        if main_family and N > SCS_ALL_CONES_MAX_N and cone != "dnn":
            out.append(("SCS", cone, f"time budget: SCS needs ~1 min per cone at N={N} here; dnn is run"))
        else:
            out.append(("SCS", cone, None))
        # Clarabel
        lim = CLARABEL_MAX_N.get(cone, 20)
        if N > lim:
            est = estimate_memory(N, 5, cone, "CLARABEL") / 2**30
            out.append(("CLARABEL", cone, f"interior point: dense KKT block ~{est:.2g} GiB, minutes per solve "
                                           f"beyond N={lim} on a shared 2-core machine"))
        else:
            out.append(("CLARABEL", cone, None))
    out.append(("TORCH", "dnn", None))
    return out


def run_one(inst, exact, solver, cone, tol):
    if solver == "TORCH":
        r = solve_dnn(inst.X, lam=inst.lam, tol=tol, time_limit=300)
        status = "optimal" if r.certified else "not_converged"
        # the certified lower bound is the outer (DNN) bound; the feasible value is reported too
        value = r.lower_bound if r.certified else float("nan")
        extra = {"upper_value": r.value, "upper_rel_error": abs(r.value - exact) / exact, "rel_gap": r.rel_gap,
                 "n_iter": r.n_iter}
        return status, value, "outer", r.time_s, extra
    r = relax(inst.X, lam=inst.lam, cone=cone, solver=solver, tol=tol)
    return r.status, r.value, r.kind, r.time_s, {"n_cuts": r.n_cuts}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N in {10, 20} only")
    ap.add_argument("--sizes", default="10,20,50,100,200")
    ap.add_argument("--dim", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-6, help="solver tolerance (TORCH: certified relative gap)")
    ap.add_argument("--large", type=int, default=0, help="also run the own DNN solver at this N (CPU)")
    ap.add_argument("--large-time", type=float, default=600.0)
    ap.add_argument("--large-seed", type=int, default=0, help="seed of the --large instance")
    ap.add_argument("--large-only", action="store_true", help="run only the --large solve (keeps the grid results)")
    ap.add_argument("--replot", action="store_true", help="redraw the plot from relaxations.json only")
    ap.add_argument("--vs-scs", default="", metavar="SIZES",
                    help="only compare the own DNN solver with SCS at equal accuracy at these N (comma-separated)")
    ap.add_argument("--target", type=float, default=1e-6, help="--vs-scs: accuracy both sides must reach")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.replot:
        rows = json.loads((args.out / "relaxations.json").read_text())["rows"]
        plot(rows, args.out / "relaxations.png")
        return rows
    sizes = [10, 20] if args.quick else [int(s) for s in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.vs_scs:
        return vs_scs([int(v) for v in args.vs_scs.split(",")], args.dim, args.target, args.out, argv)

    jobs = [("random", N, True) for N in sizes]
    jobs += [(fam, 20, False) for fam in ("rays", "collinear", "hierarchical")]
    if args.large_only:
        jobs = []
    rows = []
    t_start = time.perf_counter()
    for family, N, main_family in jobs:
        if family == "hierarchical":  # a parent and 2 children (widelimit.data.datasets), not a bench family
            X, _ = wl.datasets.hierarchical(2, max(args.dim, 3), N // 2, seed=0)
            inst = SimpleNamespace(X=X, lam=0.5)
        else:
            inst = make_bench_instance(family, N, dim=args.dim, seed=0)
        t0 = time.perf_counter()
        sol = wl.solve(inst.X, lam=inst.lam)
        t_exact = time.perf_counter() - t0
        exact = sol.value
        base = {"family": family, "N": N, "n": inst.X.shape[1], "lam": inst.lam, "exact_value": exact,
                "exact_time_s": t_exact, "exact_width": sol.width}
        for solver, cone, skip in plan(family, N, main_family):
            row = dict(base, solver=solver, cone=cone)
            if skip:
                row.update(status="skipped", skip_reason=skip, kind="outer" if cone in OUTER_CONES else "inner")
                rows.append(row)
                continue
            status, value, kind, t, extra = run_one(inst, exact, solver, cone, args.tol)
            ok = status == "optimal"
            err = value - exact if ok else float("nan")
            slack = max(1e-5, 100 * args.tol) * max(1.0, abs(exact))
            consistent = (err <= slack if kind == "outer" else err >= -slack) if ok else None
            row.update(status=status, kind=kind, value=value, error=err,
                       rel_error=abs(err) / abs(exact) if ok else float("nan"), consistent=consistent,
                       time_s=t, **extra)
            rows.append(row)
            print(f"{family:12s} N={N:4d} {solver:8s} {cone:9s} {status:14s} rel_err={row['rel_error']:.2e} "
                  f"t={t:7.2f}s", flush=True)

    large = None
    if args.large:
        inst = make_bench_instance("random", args.large, dim=args.dim, seed=args.large_seed)
        exact = wl.solve(inst.X, lam=inst.lam).value
        r = solve_dnn(inst.X, lam=inst.lam, tol=args.tol, time_limit=args.large_time, device="cpu", threads=1, progress=lambda e: print(f"  large N={args.large}: iter {e.rows_done} value {e.value:.10g} "
                                               f"lower bound {e.lower_bound:.10g}", flush=True))
        large = {"N": args.large, "n": args.dim, "seed": args.large_seed, "exact_value": exact, "value": r.value, "lower_bound": r.lower_bound,
                 "load_average_after": os.getloadavg(), "threads": 1,
                 "rel_gap": r.rel_gap, "rel_error_upper": abs(r.value - exact) / exact,
                 "rel_error_lower": abs(r.lower_bound - exact) / exact, "converged": r.certified,
                 "n_iter": r.n_iter, "n_eigh": r.history[-1]["n_eigh"] if r.history else None,
                 "time_s": r.time_s, "time_limit_s": args.large_time, "device": r.device}
        (args.out / "relaxations_large.json").write_text(json.dumps(large, indent=2))
        print(json.dumps(large))
    if args.large_only:
        return rows

    meta = {"command": "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$PWD python3 "
                       "benchmarks/relaxations.py " + " ".join(argv or sys.argv[1:]),
            "threads": _threads(), "load_average_end": os.getloadavg(), "tol": args.tol, "dim": args.dim, "python": platform.python_version(), "machine": platform.machine(),
            "total_time_s": time.perf_counter() - t_start, "widelimit": wl.__version__}
    write(rows, meta, args.out, large)
    return rows


def _threads():
    import torch

    return {"torch": torch.get_num_threads(),
            **{k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}


def vs_scs(sizes, dim, target, out: Path, argv):
    """Own DNN solver vs cvxpy + SCS on the DNN cone at equal accuracy, in one run.

    SCS is run at ``eps = 1e-6, 1e-7, ...`` until its value is within ``target`` (relative) of
    the closed-form optimum; its time is that of the first solve that gets there (one solve, as if
    the right ``eps`` had been known). The own solver is run once to a certified relative gap
    ``<= target``, which bounds its error without knowing the optimum. One torch thread.
    """
    small = make_bench_instance("random", 10, dim=dim, seed=1)  # warm-up: imports and first-call costs of both
    relax(small.X, lam=small.lam, cone="dnn", solver="SCS", tol=1e-4)
    solve_dnn(small.X, lam=small.lam, tol=1e-4, device="cpu", threads=1)
    rows = []
    for N in sizes:
        inst = make_bench_instance("random", N, dim=dim, seed=0)
        exact = wl.solve(inst.X, lam=inst.lam).value
        load0 = os.getloadavg()
        scs_runs = []
        for eps in (1e-6, 1e-7, 1e-8, 1e-9):
            r = relax(inst.X, lam=inst.lam, cone="dnn", solver="SCS", tol=eps)
            err = abs(r.value - exact) / exact if r.ok else float("nan")
            scs_runs.append({"eps": eps, "status": r.status, "time_s": r.time_s, "solve_time_s": r.solve_time_s,
                             "rel_error": err})
            print(f"N={N} SCS eps={eps:g} {r.status} rel_err={err:.2e} t={r.time_s:.2f}s", flush=True)
            if r.ok and err <= target:
                break
        hit = scs_runs[-1] if scs_runs[-1]["rel_error"] <= target else None
        o = solve_dnn(inst.X, lam=inst.lam, tol=target, device="cpu", threads=1)
        own = {"time_s": o.time_s, "converged": o.certified, "n_iter": o.n_iter, "rel_gap": o.rel_gap,
               "rel_error_upper": abs(o.value - exact) / exact, "rel_error_lower": abs(exact - o.lower_bound) / exact,
               "n_eigh": o.history[-1]["n_eigh"] if o.history else None}
        print(f"N={N} own converged={o.certified} gap={o.rel_gap:.2e} t={o.time_s:.3f}s", flush=True)
        rows.append({"N": N, "n": dim, "lam": inst.lam, "exact_value": exact, "target": target, "scs_runs": scs_runs,
                     "scs_eps": hit["eps"] if hit else None, "scs_time_s": hit["time_s"] if hit else None,
                     "scs_solve_time_s": hit["solve_time_s"] if hit else None,
                     "scs_rel_error": hit["rel_error"] if hit else None, "own": own,
                     "ratio": hit["time_s"] / o.time_s if hit and o.certified else None,
                     "ratio_solve_only": hit["solve_time_s"] / o.time_s if hit and o.certified else None,
                     "load_average_before": load0, "load_average_after": os.getloadavg()})
    meta = {"command": "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$PWD python3 "
                       "benchmarks/relaxations.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "threads": _threads(), "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "widelimit": wl.__version__}
    (out / "relaxations_vs_scs.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# Own DNN solver vs cvxpy + SCS at equal accuracy (DNN cone, random family)", "",
             f"Command: `{meta['command']}`  ", f"threads: {meta['threads']}; {meta['cpus']} CPUs, shared machine.", "",
             f"Both sides must reach relative error <= {target:g} against the closed-form optimum: SCS at the "
             "first `eps` in 1e-6, 1e-7, ... that gets there (time of that one solve, model building included); "
             "the own solver to a certified relative gap <= target (time of the whole solve). "
             "'SCS solve' is SCS's own solve time (cvxpy's model building left out), for a second ratio.", "",
             "| N | SCS eps | SCS time (s) | SCS solve (s) | SCS rel. error | own time (s) | own iterations (eigh) "
             "| own certified gap | own rel. error (upper / lower) | ratio SCS/own | ratio SCS solve/own "
             "| load avg (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o = r["own"]
        scs = (f"{r['scs_eps']:g} | {r['scs_time_s']:.2f} | {r['scs_solve_time_s']:.2f} | {r['scs_rel_error']:.1e}"
               if r["scs_eps"] else f"not reached (eps {r['scs_runs'][-1]['eps']:g}) | | | ")
        ratio = (f"{r['ratio']:.0f} | {r['ratio_solve_only']:.0f}" if r["ratio"] else "n/a | n/a")
        lines.append(f"| {r['N']} | {scs} | {o['time_s']:.3f} | {o['n_iter']} ({o['n_eigh']}) | {o['rel_gap']:.1e} | "
                     f"{o['rel_error_upper']:.1e} / {o['rel_error_lower']:.1e} | {ratio} | "
                     f"{r['load_average_before'][0]:.2f} -> {r['load_average_after'][0]:.2f} |")
    (out / "relaxations_vs_scs.md").write_text("\n".join(lines) + "\n")
    return rows


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    return v


def write(rows, meta, out: Path, large=None):
    keys = ["family", "N", "n", "lam", "solver", "cone", "kind", "status", "value", "exact_value", "error",
            "rel_error", "consistent", "time_s", "exact_time_s", "exact_width", "upper_value", "upper_rel_error",
            "rel_gap", "n_iter", "n_cuts", "skip_reason"]
    with open(out / "relaxations.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _clean(r.get(k)) for k in keys})
    (out / "relaxations.json").write_text(json.dumps({"meta": meta, "rows": [{k: _clean(v) for k, v in r.items()}
                                                                            for r in rows]}, indent=1))
    # markdown table
    lines = [f"# Relaxation benchmark (known optimum)\n", f"Command: `{meta['command']}`  ",
             f"solver tolerance {meta['tol']:g}, dim {meta['dim']}, total {meta['total_time_s']:.0f} s "
             f"on a shared 2-core machine (timings are noisy); threads {meta['threads']}, "
             f"load average at the end {meta['load_average_end'][0]:.2f}.\n",
             "| family | N | solver | cone | kind | status | rel. error | time (s) | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] == "skipped":
            lines.append(f"| {r['family']} | {r['N']} | {r['solver']} | {r['cone']} | {r['kind']} | skipped | | | "
                         f"{r['skip_reason']} |")
            continue
        chk = {True: "ok", False: "VIOLATED", None: "no bound"}[r["consistent"]]
        lines.append(f"| {r['family']} | {r['N']} | {r['solver']} | {r['cone']} | {r['kind']} | {r['status']} | "
                     f"{r['rel_error']:.1e} | {r['time_s']:.2f} | {chk} |")
    # own solver vs SCS on DNN
    lines += ["", "## Own DNN solver (TORCH, certified gap) vs cvxpy + SCS on the DNN cone (random family)", "",
              "| N | SCS time (s) | SCS rel. error | TORCH time (s) | TORCH rel. error (lower / upper) | TORCH certified gap | time ratio SCS/TORCH |",
              "|---|---|---|---|---|---|---|"]
    for N in sorted({r["N"] for r in rows if r["family"] == "random"}):
        s = [r for r in rows if r["family"] == "random" and r["N"] == N and r["solver"] == "SCS" and r["cone"] == "dnn"
             and r["status"] != "skipped"]
        t = [r for r in rows if r["family"] == "random" and r["N"] == N and r["solver"] == "TORCH"]
        if s and t:
            s, t = s[0], t[0]
            lines.append(f"| {N} | {s['time_s']:.2f} | {s['rel_error']:.1e} | {t['time_s']:.2f} | "
                         f"{t['rel_error']:.1e} / {t['upper_rel_error']:.1e} | {t['rel_gap']:.1e} | "
                         f"{s['time_s'] / t['time_s']:.1f} |")
    if large:
        lines += ["", f"Own DNN solver at N = {large['N']} (CPU, time limit {large['time_limit_s']:.0f} s): "
                  f"{large['n_iter']} iterations in {large['time_s']:.0f} s, certified relative gap "
                  f"{large['rel_gap']:.1e}, relative error of the feasible value {large['rel_error_upper']:.1e}, "
                  f"converged: {large['converged']}."]
    (out / "relaxations.md").write_text("\n".join(lines) + "\n")
    plot(rows, out / "relaxations.png")


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    done = [r for r in rows if r["family"] == "random" and r["status"] == "optimal"]
    combos = sorted({(r["solver"], r["cone"]) for r in done})
    markers = {"SCS": "o", "CLARABEL": "s", "TORCH": "*"}
    colors = dict(zip(CONES, ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]))
    for solver, cone in combos:
        rs = sorted((r for r in done if r["solver"] == solver and r["cone"] == cone), key=lambda r: r["N"])
        Ns = [r["N"] for r in rs]
        ls = "-" if cone in ("nonneg", "dnn", "dnn_horn") else "--"
        lab = f"{solver} {cone}"
        color = "black" if solver == "TORCH" else colors[cone]
        ms = 10 if solver == "TORCH" else 5
        axes[0].loglog(Ns, [max(r["rel_error"], 1e-16) for r in rs], ls, marker=markers[solver], ms=ms, color=color,
                       label=lab)
        axes[1].loglog(Ns, [r["time_s"] for r in rs], ls, marker=markers[solver], ms=ms, color=color, label=lab)
    axes[0].set_title("relative error vs the closed-form optimum")
    axes[1].set_title("time (s), model building + solve")
    for ax in axes:
        ax.set_xlabel("N (points)")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle("Q-problem relaxations, random family (colour: cone; marker: solver o SCS, s Clarabel, "
                 "* own DNN solver; solid: outer, dashed: inner)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
