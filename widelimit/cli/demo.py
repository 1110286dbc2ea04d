"""``widelimit demo``: the built-in 2-D example, its certificate and its plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._common import (_console, _solution_rows, _write_solution, atomic_outputs, certificate_table, check_out_dir,
                      moved, print_json)
from ..data.datasets import BUILTIN, rays2d
from ..exact.solve import solve
from ..exact.median import geometric_median


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------


def _add_demo(sub):
    p = sub.add_parser("demo", help="solve the built-in 2-D rays dataset, print its certificate, plot it")
    p.add_argument("--out", type=Path, default=Path("widelimit-demo"), help="folder for the plot and files")
    p.add_argument("--json", action="store_true")


def _run_demo(args) -> int:

    check_out_dir(args.out)
    X, truth = rays2d()
    lam = BUILTIN["rays2d"][1]
    sol = solve(X, lam=lam)
    geo = geometric_median(X)
    with atomic_outputs(args.out) as tmp:
        files = moved(_write_solution(tmp, X, sol, geo, stem="demo"), tmp, args.out)
    if args.json:
        d = sol.as_dict()
        d["geometric_median"] = geo.point
        d["files"] = [str(f) for f in files]
        print_json(d)
        return 0
    con = _console()
    con.print(
        f"[bold]widelimit demo[/bold]: {X.shape[0]} points in 2-D on six rays around a centre, "
        f"plus a core of 20 points; lam = {lam}"
    )
    con.print(certificate_table("certificate of the exact wide-limit solution", _solution_rows(sol, geo)))
    con.print(f"optimal bias b* = {np.array2string(sol.bias, precision=6)}   "
              f"geometric median = {np.array2string(geo.point, precision=6)}")
    for f in files:
        con.print(f"wrote {f}")
    return 0
