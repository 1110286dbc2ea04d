"""Relaxation leaderboard: every SDP solver on this machine vs the known optimum, by family and N.

Each instance of ``widelimit relax-bench`` (docs/relaxation_benchmark.md) is the DNN
relaxation of the Q-problem, whose optimal value is known exactly (``widelimit.solve``).
Every conic solver cvxpy can call here with semidefinite support (SCS, Clarabel, CVXOPT,
SDPA; MOSEK or COPT when installed with a licence) solves the same SDP, built from the
coordinates that the exported files hold (``widelimit.relax.export.cvxpy_problem``);
SDPA also solves the exported ``.dat-s`` file itself (``sdpa-python``), and widelimit's own
first-order DNN solver solves the Q-problem directly. Each run is scored by its relative
error against the optimum and its wall time. Every solver runs with its default settings.

    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
    PYTHONPATH=$PWD python3 benchmarks/relax_leaderboard.py            # about 5 minutes on 2 cores
    PYTHONPATH=$PWD python3 benchmarks/relax_leaderboard.py --quick    # seconds
    PYTHONPATH=$PWD python3 benchmarks/relax_leaderboard.py --sizes 10,100,1000  # exported file sizes only

Writes benchmarks/results/relax_leaderboard.{csv,json,md,png} and relax_file_sizes.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment  # noqa: E402

from widelimit.relax.export import FORMATS, conic_data, cvxpy_problem, write_cbf, write_sdpa  # noqa: E402
from widelimit.relax.families import FAMILIES, make_bench_instance  # noqa: E402

#: Largest N per solver in the default grid (interior-point methods factor a dense m x m
#: Schur complement, m ~ N^2/2: about 3-4 s at N = 40 and ~16x that at N = 80 here).
MAX_N = {"CLARABEL": 40, "CVXOPT": 40, "SDPA": 40, "SDPA (.dat-s)": 40, "MOSEK": 80, "COPT": 80,
         "SCS": 160, "widelimit DNN": 160}
CANDIDATES = ("SCS", "CLARABEL", "CVXOPT", "SDPA", "MOSEK", "COPT")


@contextlib.contextmanager
def quiet():
    """Silence stdout at the file-descriptor level (SDPA's C++ code prints)."""
    sys.stdout.flush()
    fd = os.dup(1)
    with open(os.devnull, "w") as dn:
        os.dup2(dn.fileno(), 1)
        try:
            with contextlib.redirect_stdout(open(os.devnull, "w")), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            sys.stdout.flush()
            os.dup2(fd, 1)
            os.close(fd)


def available_solvers() -> tuple[list[str], dict]:
    """cvxpy solvers with PSD support that solve a 2x2 SDP here (licence included), and why others do not."""
    import cvxpy as cp

    ok, why = [], {}
    installed = set(cp.installed_solvers())
    for s in CANDIDATES:
        if s not in installed:
            why[s] = "not installed"
            continue
        x = cp.Variable()
        prob = cp.Problem(cp.Minimize(x), [cp.bmat([[x, 1.0], [1.0, x]]) >> 0])
        try:
            with quiet():
                prob.solve(solver=s)
            if prob.status not in ("optimal", "optimal_inaccurate") or abs(prob.value - 1) > 1e-4:
                why[s] = f"test SDP: status {prob.status}"
            else:
                ok.append(s)
        except Exception as e:  # a missing licence raises here
            why[s] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    return ok, why


def run_cvxpy(inst, solver):
    import cvxpy as cp

    prob, _ = cvxpy_problem(conic_data(inst.X, lam=inst.lam, cone="dnn"))
    t0 = time.perf_counter()
    try:
        with quiet():
            prob.solve(solver=solver)
        status = str(prob.status)
        value = float(prob.value) if prob.value is not None else float("nan")
    except cp.error.SolverError as e:
        status, value = "solver_error", float("nan")
    wall = time.perf_counter() - t0
    st = getattr(prob.solver_stats, "solve_time", None) if prob.solver_stats else None
    return status, value, wall, (float(st) if st is not None else float("nan")), ""


def run_sdpa_file(inst, tmp):
    import sdpap

    path = write_sdpa(inst.X, Path(tmp) / f"{inst.name}.dat-s", lam=inst.lam)
    t0 = time.perf_counter()
    with quiet():
        A, b, c, K, J = sdpap.importsdpa(str(path))
        _, _, info, _, _ = sdpap.solve(A, b, c, K, J, {"print": "no"})
    wall = time.perf_counter() - t0
    return str(info["phasevalue"]), -float(info["primalObj"]), wall, float("nan"), f"gap {info['dualityGap']:.1e}"


def run_dnn(inst):
    import widelimit as wl

    t0 = time.perf_counter()
    r = wl.solve_dnn(inst.X, lam=inst.lam, tol=1e-6, time_limit=120, device="cpu")
    wall = time.perf_counter() - t0
    status = "optimal" if r.certified else "not_converged"
    return status, float(r.value), wall, float(r.time_s), f"certified gap {r.rel_gap:.1e}, {r.n_iter} it"


def leaderboard(Ns, families, seed, solvers):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            for N in Ns:
                inst = make_bench_instance(fam, N, seed=seed)
                for s in solvers:
                    if N > MAX_N.get(s, 40):
                        continue
                    if s == "widelimit DNN":
                        status, value, wall, st, note = run_dnn(inst)
                    elif s == "SDPA (.dat-s)":
                        status, value, wall, st, note = run_sdpa_file(inst, tmp)
                    else:
                        status, value, wall, st, note = run_cvxpy(inst, s)
                    err = abs(value - inst.optimum) / abs(inst.optimum) if math.isfinite(value) else float("nan")
                    row = {"family": fam, "N": N, "n": inst.n, "lam": inst.lam, "optimum": inst.optimum,
                           "solver": s, "status": status, "value": value, "rel_error": err, "time_s": wall,
                           "solver_time_s": st, "note": note}
                    rows.append(row)
                    print(f"{fam:10s} N={N:4d} {s:14s} {status:20s} err {err:9.2e}  {wall:8.3f} s  {note}", flush=True)
    return rows


def plot(rows, families, solvers):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * len(families), 6.4), layout="constrained")
    axs = fig.subplots(2, len(families), sharex=True, squeeze=False)
    for j, fam in enumerate(families):
        for s in solvers:
            rr = [r for r in rows if r["family"] == fam and r["solver"] == s]
            if not rr:
                continue
            N = [r["N"] for r in rr]
            err = [max(r["rel_error"], 1e-16) if math.isfinite(r["rel_error"]) else np.nan for r in rr]
            axs[0, j].loglog(N, err, "o-", label=s, ms=4)
            axs[1, j].loglog(N, [r["time_s"] for r in rr], "o-", label=s, ms=4)
        axs[0, j].set_title(fam)
        axs[1, j].set_xlabel("N (points)")
    axs[0, 0].set_ylabel("relative error vs known optimum")
    axs[1, 0].set_ylabel("wall time (s)")
    axs[0, -1].legend(fontsize=7)
    fig.suptitle("DNN relaxation with known optimum: error and time by solver (default settings)")
    return fig


def file_sizes(Ns, n=5):
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for N in Ns:
            inst = make_bench_instance("random", N, seed=0, dim=n)
            row = {"N": N, "n": n, "n_vars": N * (N + 1) // 2 + n + n * (n + 1) // 2}
            for fmt, w in (("sdpa", write_sdpa), ("cbf", write_cbf)):
                t0 = time.perf_counter()
                p = w(inst.X, Path(tmp) / f"p{FORMATS[fmt]}", lam=inst.lam)
                row[f"{fmt}_bytes"] = p.stat().st_size
                row[f"{fmt}_write_s"] = time.perf_counter() - t0
                p.unlink()
            out.append(row)
            print(row, flush=True)
    return out


def _md(rows, solvers, families, Ns):
    lines = ["| family | N | " + " | ".join(solvers) + " |", "|---|---|" + "---|" * len(solvers)]
    for fam in families:
        for N in Ns:
            cells = []
            for s in solvers:
                r = next((r for r in rows if r["family"] == fam and r["N"] == N and r["solver"] == s), None)
                if r is None:
                    cells.append("-")
                else:
                    flag = "" if r["status"] in ("optimal", "pdOPT") else f" ({r['status']})"
                    cells.append(f"{r['rel_error']:.1e} / {r['time_s']:.2g} s{flag}")
            lines.append(f"| {fam} | {N} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", default="10,20,40,80,160")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="N = 10, 20 only")
    ap.add_argument("--sizes", default=None, help="only measure exported file sizes at these N (comma-separated)")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.sizes:
        sizes = file_sizes([int(v) for v in args.sizes.split(",")])
        (RESULTS / "relax_file_sizes.json").write_text(json.dumps({"sizes": sizes, "environment": environment()},
                                                                  indent=1))
        md = ["| N | variables m | SDPA .dat-s | CBF | write time (SDPA / CBF) |", "|---|---|---|---|---|"]
        for r in sizes:
            md.append(f"| {r['N']} | {r['n_vars']} | {r['sdpa_bytes'] / 1e6:.3g} MB | {r['cbf_bytes'] / 1e6:.3g} MB | "
                      f"{r['sdpa_write_s']:.2g} s / {r['cbf_write_s']:.2g} s |")
        (RESULTS / "relax_file_sizes.md").write_text("\n".join(md) + "\n")
        print("\n".join(md))
        return
    Ns = [10, 20] if args.quick else [int(v) for v in args.N.split(",")]
    families = args.families.split(",")
    cv, why = available_solvers()
    solvers = cv + (["SDPA (.dat-s)"] if "SDPA" in cv else []) + ["widelimit DNN"]
    print("solvers:", solvers, "unavailable:", why, flush=True)
    warm = make_bench_instance("random", 10, seed=1)
    run_dnn(warm)  # torch import and first-call set-up, not timed below
    for s in cv:
        run_cvxpy(warm, s)
    t0 = time.perf_counter()
    rows = leaderboard(Ns, families, args.seed, solvers)
    name = "relax_leaderboard_quick" if args.quick else "relax_leaderboard"
    with open(RESULTS / f"{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    payload = {"rows": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                        for r in rows],
               "solvers": solvers, "unavailable": why, "max_N": MAX_N, "total_s": time.perf_counter() - t0,
               "environment": environment(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=1))
    md = _md(rows, solvers, families, Ns)
    (RESULTS / f"{name}.md").write_text("relative error / wall time (status when not optimal)\n\n" + md)
    plot(rows, families, solvers).savefig(RESULTS / f"{name}.png", dpi=110)
    print(md)


if __name__ == "__main__":
    main()
