"""``widelimit relax``: the convex Q-problem over a CP-cone approximation."""

from __future__ import annotations

import argparse

from ._common import (_console, certificate_table, check_device, in_memory, load_data, only_with, positive_float,
                      positive_int, print_json)
from ..relax.cones import CONES
from ..exact.solve import solve
from .._runtime import resolve_device
from ..relax.dnn import solve_dnn
from ..relax.cones import check_relax_memory, relax
from ..relax.cpfactor import refine


# --------------------------------------------------------------------------------------
# relax
# --------------------------------------------------------------------------------------

#: ``--solver`` values (any case): the cvxpy conic solvers and widelimit's own DNN solver.
SOLVERS = ("SCS", "CLARABEL", "TORCH")


def _solver(text: str) -> str:
    """argparse type: a solver name in any case, upper-cased; an unknown one is echoed as typed."""
    if text.upper() not in SOLVERS:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(SOLVERS)}, any case)")
    return text.upper()


def _add_relax(sub):

    p = sub.add_parser("relax", help="solve the convex Q-problem over a CP-cone approximation; compare with the exact optimum")
    p.add_argument("data", help="data file (.npy .npz .csv .safetensors .pt) or a built-in dataset name")
    p.add_argument("--lam", type=positive_float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="array name inside .npz / .safetensors / .pt")
    p.add_argument("--header", action="store_true", help="text tables: the first row is a header")
    p.add_argument("--cone", default="dnn", choices=list(CONES),
                   help="outer: nonneg, dnn, dnn_horn (lower bounds); inner: sdd, nndd, diagonal (upper bounds)")
    p.add_argument("--solver", default="SCS", type=_solver, metavar="{SCS,CLARABEL,TORCH}",
                   help="conic solver via cvxpy, or TORCH (widelimit's own first-order DNN solver; cone dnn)")
    p.add_argument("--tol", type=positive_float, default=1e-6, help="solver tolerance (TORCH: certified relative gap)")
    p.add_argument("--max-iter", type=positive_int, default=None, help="solver iteration cap")
    p.add_argument("--device", default=None,
                   help="with --solver TORCH: auto, cpu, cuda or cuda:N (default auto); the cvxpy solvers run on the CPU")
    p.add_argument("--refine", action="store_true",
                   help="factor the solver's Q (CP factorisation) into (W, Z, b) and evaluate the true objective")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _run_relax(args) -> int:

    only_with({"--device": args.device}, args.solver == "TORCH", "--solver TORCH",
              why=f" ({args.solver} runs on the CPU through cvxpy)")
    if args.solver == "TORCH" and args.cone != "dnn":
        raise ValueError(f"--solver TORCH solves the dnn cone only, got --cone {args.cone}")
    check_device(args.device)
    X, lam0, label = load_data(args.data, args.key, header=args.header or None)
    X = in_memory(X)
    lam = args.lam if args.lam is not None else lam0
    if lam is None:
        raise ValueError("--lam is required for data files")
    # the solver's memory is estimated (and refused above the budget) before any work, the exact solve included
    if args.solver != "TORCH" or resolve_device(args.device or "auto").type == "cpu":  # (a GPU's memory is its own)
        check_relax_memory(X.shape[0], X.shape[1], args.cone, args.solver, names={s: f"--solver {s}" for s in SOLVERS})
    exact = solve(X, lam=lam).value
    if args.solver == "TORCH":

        r = solve_dnn(X, lam=lam, tol=args.tol, device=args.device or "auto", **{} if args.max_iter is None else {"max_iter": args.max_iter})
        status = "optimal" if r.certified else "not_converged"
        value = r.lower_bound if r.certified else float("nan")
        d = {"value": value, "status": status, "cone": "dnn", "kind": "outer", "solver": "TORCH",
             "time_s": r.time_s, "upper_value": r.value, "rel_gap": r.rel_gap, "n_iter": r.n_iter,
             "device": r.device, "b": r.b}
        Q, b = r.Q, r.b
    else:

        r = relax(X, lam=lam, cone=args.cone, solver=args.solver, tol=args.tol, max_iter=args.max_iter)
        d = r.as_dict()
        d["value"] = r.value
        Q, b = r.Q, r.b
    ok = d["status"] == "optimal"
    err = d["value"] - exact if ok else float("nan")
    d.update({"data": label, "lam": lam, "n_points": int(X.shape[0]), "dim": int(X.shape[1]), "exact_value": exact,
              "error": err, "rel_error": abs(err) / max(abs(exact), 1e-300) if ok else float("nan")})
    if args.refine:

        if Q is None or b is None:
            raise ValueError(f"cannot refine: the solver returned no Q (status {d['status']})")
        ref = refine(X, Q, b, lam=lam)
        d["refined"] = {"value": ref.value, "width": ref.width, "factor_width": ref.factor_width,
                        "factor_residual": ref.factorization.residual,
                        "factor_success": ref.factorization.success, "rel_gap": ref.certificate.rel_gap,
                        "exact_width": solve(X, lam=lam).width}
    if args.json:
        print_json(d)
        return 0
    rows = [
        ("points N x dims n", f"{d['n_points']} x {d['dim']}", "data size"),
        ("lam", lam, "sparsity"),
        ("cone", f"{d['cone']} ({d['kind']})", "outer: lower bound; inner: upper bound"),
        ("solver", d["solver"], ""),
        ("status", d["status"], "a bound only when optimal"),
        ("value", d["value"], "optimal value over the cone"),
        ("exact value", exact, "closed-form optimum (widelimit solve)"),
        ("relative error", d["rel_error"], "|value - exact| / exact"),
        ("time (s)", d["time_s"], "model building and solve"),
    ]
    if "refined" in d:
        rf = d["refined"]
        rows += [("refined value", rf["value"], "true objective of (W, Z, b) from a CP factor of Q"),
                 ("refined width", rf["width"], f"atoms after merging (exact optimum: {rf['exact_width']})")]
    _console().print(certificate_table(f"widelimit relax: {label}", rows))
    return 0
