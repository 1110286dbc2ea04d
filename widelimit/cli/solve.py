"""``widelimit solve``: the exact wide-limit optimum with its certificate."""

from __future__ import annotations

from pathlib import Path

from ._common import (_console, _solution_rows, _write_solution, atomic_outputs, certificate_table,
                      check_out_dir, lam_float, load_data, moved, nonneg_float, only_with, print_json,
                      progress_display)
from ..exact.solve import solve
from .._params import TOL, cli_type
from .solve_width import parse_width, write_finite_solution


# --------------------------------------------------------------------------------------
# solve
# --------------------------------------------------------------------------------------


def _add_solve(sub):
    p = sub.add_parser("solve", help="solve the wide-limit problem exactly, with a certificate")
    p.add_argument("data", help="data file (.npy .npz .csv .safetensors .pt) or a built-in dataset name")
    p.add_argument("--lam", type=lam_float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="array name inside .npz / .safetensors / .pt")
    p.add_argument("--header", action="store_true", help="text tables: the first row is a header (default: only "
                   "when none of its fields is a number)")
    p.add_argument("--ray-tol", type=nonneg_float, default=None, help="direction tolerance for grouping rays")
    p.add_argument("--signed", action="store_true", help="signed codes (atoms are lines, not rays)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", type=Path, default=None, help="write solution.npz, solution.json, solution.png here")
    p.add_argument("--width", default=None, help="certified global optimum at this finite width (branch and bound)")
    p.add_argument("--time-limit", type=nonneg_float, default=None,
                   help="with --width: seconds for the search, >= 0 (default 600)")
    p.add_argument("--tol", type=cli_type(TOL), default=None,
                   help="relative gap at which the solution counts as certified (default 1e-9; with --width, "
                   "in (0, 1), default 1e-6)")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr (shown on terminals only)")


#: Defaults of the options that apply only with --width (default=None above tells "given" from "not given").
WIDTH_DEFAULTS = {"time_limit": 600.0}


def _check_width_options(args) -> None:
    """Options of the --width search given without --width, or combined with what it cannot do, are refused."""
    only_with({"--time-limit": args.time_limit}, args.width is not None, "--width")
    if args.width is None:
        return
    if args.signed:
        raise ValueError("--width and --signed cannot be combined: the finite-width search supports nonnegative "
                         "codes only")
    if args.tol is not None and not 0 < args.tol < 1:
        raise ValueError(f"--tol must be a finite number in (0, 1) with --width, got {args.tol!r}")
    for dest, default in WIDTH_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)


def _run_solve(args) -> int:

    _check_width_options(args)
    check_out_dir(args.out)
    # no separate scan: the wide solve's first pass refuses NaN / Inf and too large rows, naming the shard and row
    X, lam0, label = load_data(args.data, args.key, header=args.header or None, scan=False)
    lam = args.lam if args.lam is not None else lam0
    if lam is None:
        raise ValueError("--lam is required for data files")
    from rich.console import Console

    k = None if args.width is None else parse_width(args.width)
    err = Console(stderr=True)
    with progress_display(err, enabled=not args.no_progress and err.is_terminal) as cb:  # terminals only
        sol = solve(X, lam=lam, ray_tol=args.ray_tol, signed=args.signed, tol=args.tol, width=k,
                    time_limit=args.time_limit, progress=cb)
    files = []
    if args.out:
        with atomic_outputs(args.out) as tmp:
            written = (_write_solution(tmp, X, sol) if k is None
                       else write_finite_solution(tmp, X, sol, f"{label}: width {sol.width}, lam = {sol.lam:g}"))
            files = moved(written, tmp, args.out)
    if args.json:
        d = sol.as_dict()
        d["data"] = label
        d["files"] = [str(f) for f in files]
        print_json(d)
    else:
        con = _console()
        title = f"widelimit solve{'' if k is None else f' --width {k}'}: {label}"
        con.print(certificate_table(title, _solution_rows(sol)))
        for f in files:
            con.print(f"wrote {f}")
    return 0
