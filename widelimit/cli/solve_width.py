"""``widelimit solve DATA --width K``: the certified global optimum at a finite width (widelimit.finite)."""

from __future__ import annotations

import numpy as np

from ..exact.solve import solve
from .._json import write_json
from ..plot import plot_finite_solution
from ._common import (_console, atomic_outputs, certificate_table, moved, print_json,
                      progress_display)


def _parse_width(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"--width must be a positive integer, got {text!r}") from None
    if k <= 0:
        raise ValueError(f"--width must be a positive integer, got {text!r}")
    return k


def run_solve_width(args, X, lam, label) -> int:
    """``solve --width K``: the certified optimum at width K (widelimit.finite)."""
    from rich.console import Console

    k = _parse_width(args.width)
    err = Console(stderr=True)
    with progress_display(err, enabled=not args.no_progress and err.is_terminal) as cb:  # terminals only
        sol = solve(X, lam=lam, width=k, ray_tol=args.ray_tol, signed=args.signed, time_limit=args.time_limit,
                    rel_tol=args.rel_tol, progress=cb)
    files = []
    if args.out:
        with atomic_outputs(args.out) as tmp:
            np.savez(tmp / "solution.npz", dictionary=sol.dictionary, codes=sol.codes, bias=sol.bias)
            write_json(tmp / "solution.json", sol.as_dict())
            plot_finite_solution(X, sol, tmp / "solution.png", title=f"{label}: width {sol.width}, lam = {sol.lam:g}")
            files = moved([tmp / "solution.npz", tmp / "solution.json", tmp / "solution.png"], tmp, args.out)
    if args.json:
        d = sol.as_dict()
        d["data"] = label
        d["files"] = [str(f) for f in files]
        print_json(d)
        return 0
    rows = [
        ("points N x dims n", f"{X.shape[0]} x {X.shape[1]}", "data size"),
        ("lam", sol.lam, "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("width k", sol.width, "unit atoms"),
        ("value", sol.value, "objective of the returned (W, Z, b)"),
        ("lower bound", sol.lower_bound, "certified: no width-k dictionary does better"),
        ("relative gap", sol.rel_gap, f"certified when <= {sol.rel_tol:g}"),
        ("certified", sol.certified, sol.status),
        ("wide-limit bound", sol.wide_lower_bound, f"the optimum at width >= {sol.n_rays} (number of rays)"),
        ("nodes, seconds", f"{sol.n_nodes}, {sol.elapsed:.2f}", "branch and bound"),
    ]
    con = _console()
    con.print(certificate_table(f"widelimit solve --width {sol.width}: {label}", rows))
    for f in files:
        con.print(f"wrote {f}")
    return 0
