"""Peak memory of the allocations that grow with a parameter, measured, and the models fitted to them.

Each point runs in a fresh Python process: the data are made, the modules imported, the resident
set size read (the baseline), the call made, and the peak resident set size read back
(``VmHWM``; the recorded points were taken with ``ru_maxrss``, the same here, where the driver process
is small). The growth ``peak - baseline`` is what the call allocated at its peak. A model
``bytes = base + c * size^p`` (``size`` below; ``p`` = 1 for SCS and fit, 2 for Clarabel's dense
blocks) is fitted by least squares, and the
solvers refuse work whose fitted estimate, times the safety factor recorded with the fit, is above
the memory budget (:mod:`widelimit._memory`).

* ``relax`` per cone and solver, ``size = m``: the number of entries of the problem's matrix
  variables, ``d(d+1)/2`` for the LMI of side ``d = N + n`` plus ``N(N+1)/2`` for Q
  (:func:`widelimit.relax.cones.problem_entries`); few solver iterations (the solvers allocate
  their work space when they start, not as they iterate; checked by one point at 10x the iterations);
* ``dnn`` (widelimit's own DNN solver, ``relax --solver TORCH``, on the CPU), ``size = N^2``;
* ``fit`` (free codes, full batch), ``size = N * width`` (codes, scores and working sets per point
  and atom).

    PYTHONPATH=$PWD python3 benchmarks/memory_models.py            # a few minutes on 2 cores
    PYTHONPATH=$PWD python3 benchmarks/memory_models.py --quick    # the smallest points only
    PYTHONPATH=$PWD python3 benchmarks/memory_models.py --only fit # re-measure one family
    PYTHONPATH=$PWD python3 benchmarks/memory_models.py --refit    # refit the recorded points

Writes benchmarks/results/memory_models.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from _common import RESULTS, write

_CHILD = r"""
import json, sys, time
def peak_rss():  # VmHWM: this process's own high-water mark (ru_maxrss keeps a forking parent's across exec)
    return next(int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM"))
import numpy as np
spec = json.loads(sys.argv[1])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
rng = np.random.default_rng(0)
if spec["what"] == "relax":
    import cvxpy, scs, clarabel  # noqa: F401 - imported before the baseline
    from widelimit.relax.cones import relax
    X = rng.standard_normal((spec["N"], spec["n"]))
    base = rss()
    t0 = time.perf_counter()
    r = relax(X, lam=1.0, cone=spec["cone"], solver=spec["solver"], max_iter=spec["iters"], max_memory=2**50,
              horn_rounds=0)
elif spec["what"] == "dnn":
    import torch  # noqa: F401
    from widelimit.relax.dnn import solve_dnn
    X = rng.standard_normal((spec["N"], spec["n"]))
    base = rss()
    t0 = time.perf_counter()
    r = solve_dnn(X, lam=1.0, max_iter=spec["iters"], device="cpu")
elif spec["what"] == "fit":
    import torch  # noqa: F401
    from widelimit.learn.gradient import fit_dictionary
    X = rng.standard_normal((spec["N"], spec["n"])).astype(np.float32)
    base = rss()
    t0 = time.perf_counter()
    r = fit_dictionary(X, lam=0.5, width=spec["k"], max_iter=spec["iters"], device="cpu", init="data",
                       bias=np.zeros(spec["n"]))
peak = peak_rss()
print(json.dumps({"base": base, "peak": peak, "growth": peak - base, "time_s": time.perf_counter() - t0}))
"""


def measure(spec: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{spec}: {out.stderr.strip().splitlines()[-1:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    return {**spec, **json.loads(line)}


def fit_affine(size, growth, power: float) -> dict:
    """``growth ~ base + c * size^power`` by least squares (``base, c >= 0``); ``max_ratio``: the largest
    measured / fitted over the points (the safety factor the solvers use must cover it)."""
    s, g = np.asarray(size, float), np.asarray(growth, float)
    A = np.column_stack([np.ones_like(s), s ** power])
    (base, c), *_ = np.linalg.lstsq(A, g, rcond=None)
    if base < 0:
        base, c = 0.0, float(g @ s ** power / (s ** power @ s ** power))
    pred = base + c * s ** power
    return {"base": float(max(base, 0.0)), "c": float(c), "p": float(power), "max_ratio": float(np.max(g / pred))}


#: The power of the problem size each solver's work space grows with: SCS factors a sparse matrix
#: (linear in the entries), Clarabel a dense block per PSD cone (quadratic).
POWER = {"SCS": 1.0, "CLARABEL": 2.0}

GRID = {
    ("SCS", "nonneg"): [100, 200, 300, 400], ("SCS", "dnn"): [100, 200, 300, 400],
    ("SCS", "sdd"): [50, 100, 150, 200], ("SCS", "nndd"): [100, 200, 300, 400],
    ("SCS", "diagonal"): [100, 200, 300, 400],
    ("CLARABEL", "nonneg"): [20, 30, 40, 50], ("CLARABEL", "dnn"): [20, 30, 40, 50],
    ("CLARABEL", "sdd"): [20, 30, 40, 50], ("CLARABEL", "nndd"): [20, 30, 40, 50],
    ("CLARABEL", "diagonal"): [20, 40, 60, 80],
}
DNN_GRID = [500, 1000, 2000]
FIT_GRID = [(2000, 500), (8000, 1000), (8000, 2000), (16000, 1000)]


def measure_relax(quick: bool) -> list:
    from widelimit.relax.cones import problem_entries

    rows = []
    for (solver, cone), Ns in GRID.items():
        for N in (Ns[:2] if quick else Ns):
            r = measure({"what": "relax", "cone": cone, "solver": solver, "N": N, "n": 8, "iters": 20})
            r["size"] = problem_entries(N, 8, cone)
            rows.append(r)
            print(f"relax {solver:8s} {cone:8s} N={N:4d} m={r['size']:8d} growth {r['growth'] / 2**20:8.1f} MiB "
                  f"({r['time_s']:.1f} s)", flush=True)
    # the solvers allocate when they start: ten times the iterations at the largest SCS point changes little
    chk = measure({"what": "relax", "cone": "dnn", "solver": "SCS", "N": GRID[("SCS", "dnn")][1 if quick else -1],
                   "n": 8, "iters": 200})
    chk["size"] = problem_entries(chk["N"], 8, "dnn")
    chk["check"] = "10x iterations"
    rows.append(chk)
    return rows


def measure_fit(quick: bool) -> list:
    rows = []
    for N, k in (FIT_GRID[:2] if quick else FIT_GRID):
        r = measure({"what": "fit", "N": N, "k": k, "n": 16, "iters": 3})
        r["size"] = N * k
        rows.append(r)
        print(f"fit N={N} k={k} growth {r['growth'] / 2**20:.1f} MiB ({r['time_s']:.1f} s)", flush=True)
    return rows


def measure_dnn(quick: bool) -> list:
    rows = []
    for N in (DNN_GRID[:2] if quick else DNN_GRID):
        r = measure({"what": "dnn", "N": N, "n": 8, "iters": 30})
        r["size"] = N * N
        rows.append(r)
        print(f"dnn N={N} growth {r['growth'] / 2**20:.1f} MiB ({r['time_s']:.1f} s)", flush=True)
    return rows


def fit_models(rows: list) -> dict:
    fits = {}
    for (solver, cone) in GRID:
        pts = [r for r in rows if r["what"] == "relax" and r["solver"] == solver and r["cone"] == cone
               and "check" not in r]
        if len(pts) >= 2:
            fits[f"relax/{solver}/{cone}"] = fit_affine([r["size"] for r in pts], [r["growth"] for r in pts],
                                                        POWER[solver])
    for fam, name in (("fit", "fit/free"), ("dnn", "relax/TORCH/dnn")):
        pts = [r for r in rows if r["what"] == fam]
        if len(pts) >= 2:
            fits[name] = fit_affine([r["size"] for r in pts], [r["growth"] for r in pts], 1.0)
    return fits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the two smallest points of each model")
    ap.add_argument("--only", choices=["relax", "dnn", "fit"], default=None,
                    help="measure one family; the other's points are kept from the last results")
    ap.add_argument("--refit", action="store_true", help="measure nothing: fit the models to the recorded points")
    args = ap.parse_args()
    t0 = time.perf_counter()
    old = RESULTS / "memory_models.json"
    rows = json.loads(old.read_text())["points"] if old.exists() and (args.only or args.refit) else []
    if not args.refit:
        for fam, fn in (("relax", measure_relax), ("dnn", measure_dnn), ("fit", measure_fit)):
            if args.only in (None, fam):
                rows = [r for r in rows if r["what"] != fam] + fn(args.quick)
    fits = fit_models(rows)
    md = ["Peak memory added by a call, measured in a fresh process (`benchmarks/memory_models.py`), and the model "
          "`base + c * size^p` fitted to it (size: the problem's entries for relax, N^2 for the own DNN solver, N * width "
          "for fit).", "",
          "| model | base (MiB) | c (bytes) | p | largest measured / fitted |", "|---|---|---|---|---|"]
    md += [f"| {k} | {v['base'] / 2**20:.1f} | {v['c']:.4g} | {v['p']:g} | {v['max_ratio']:.2f} |"
           for k, v in fits.items()]
    md += ["", "| what | solver | cone | N | width | size | growth (MiB) | time (s) |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['what']}{' (' + r['check'] + ')' if 'check' in r else ''} | {r.get('solver', '')} | "
           f"{r.get('cone', '')} | {r['N']} | {r.get('k', '')} | {r['size']} | {r['growth'] / 2**20:.1f} | "
           f"{r['time_s']:.1f} |" for r in rows]
    md.append(f"\nThis run {time.perf_counter() - t0:.0f} s; other jobs were running on the machine (growth, not time, "
              "is what the models use).\n")
    write("memory_models", {"fits": fits, "points": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
