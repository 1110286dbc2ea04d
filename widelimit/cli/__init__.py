"""The ``widelimit`` command line.

Each subcommand is a pair ``_add_<name>(subparsers)`` / ``_run_<name>(args)``
listed in :data:`COMMANDS`. Solvers never print; this module does. Errors in
the input become one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .._json import to_jsonable as _jsonable

__all__ = ["main", "load_data"]


# --------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------


def load_data(spec: str, key: str | None = None, seed: int = 0):
    """``(X, default_lam, label)`` from a file path or a built-in dataset name."""
    from ..data import datasets
    from ..data.source import load_array

    if spec in datasets.BUILTIN and not Path(spec).exists():
        X, _ = datasets.load_builtin(spec, seed=seed)
        return X, datasets.BUILTIN[spec][1], f"built-in dataset {spec!r}"
    return load_array(spec, key=key), None, spec


def _console():
    from rich.console import Console

    return Console()


def print_json(obj) -> None:
    """Print exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(_jsonable(obj)) + "\n")


def _fmt(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "NO"
    if isinstance(v, (float, np.floating)):
        return f"{v:.10g}"
    return str(v)


def certificate_table(title: str, rows: list[tuple[str, object, str]]):
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("meaning", style="dim")
    for name, val, meaning in rows:
        t.add_row(name, _fmt(val), meaning)
    return t


def _dual_round(c) -> float:
    """Rounding level of ``min G = (lam/N)(1 - max ||e||^2 / lam^2)``: residuals of length lam give +-this."""
    return 8 * np.finfo(np.float64).eps * c.lam / c.n_points


def _solution_rows(sol, geo=None):
    c = sol.certificate
    rows = [
        ("points N x dims n", f"{c.n_points} x {c.dim}", "data size"),
        ("lam", sol.lam, "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("value", c.value, "objective of the returned (W, Z, b)"),
        ("lower bound", c.lower_bound, "certified: no width, dictionary or code does better"),
        ("gap", c.gap, "value - lower bound"),
        ("relative gap", c.rel_gap, f"certified if <= {c.tol:g}"),
        ("width", sol.width, "atoms = rays beyond lam (narrowest optimum)"),
        ("points within lam", int(np.count_nonzero(sol.rays < 0)), "code 0"),
        ("bias stationarity", c.bias_stationarity, "||mean residual||, 0 at the optimal bias"),
        ("min dual entry", c.dual_min, f"min_ij G_ij, >= 0 at an optimum (rounding level {_dual_round(c):.0e})"),
        ("complementarity", c.complementarity, "<G, Q>, 0 at an optimum"),
        ("median passes", sol.median.n_passes, f"passes over X ({sol.median.method})"),
        ("solve passes", sol.n_passes, "passes over X in all (median, rays, dictionary + certificate)"),
    ]
    if not np.array_equal(sol.bias_segment[0], sol.bias_segment[1]):
        rows.append(("optimal bias set", "segment", "collinear data: every b on the segment is optimal"))
    if sol.excess > 1e-12 * max(1.0, abs(sol.value)):
        rows.append(("excess from merging", sol.excess, "ray_tol merged non-identical directions"))
    if geo is not None:
        rows.append(("||b* - geometric median||", float(np.linalg.norm(sol.bias - geo.point)),
                     "0 when no point is within lam of the geometric median"))
    rows.append(("certified", c.certified, "gap within tolerance"))
    return rows


def _write_solution(out: Path, X, sol, geo=None, stem="solution") -> list[Path]:
    from ..plot import plot_solution

    out.mkdir(parents=True, exist_ok=True)
    npz = out / f"{stem}.npz"
    np.savez(npz, bias=sol.bias, bias_segment=sol.bias_segment, dictionary=sol.dictionary,
             rays=sol.rays, code_values=sol.code_values, lam=sol.lam)
    js = out / f"{stem}.json"
    js.write_text(json.dumps(_jsonable(sol.as_dict()), indent=2))
    png = plot_solution(X, sol, out / f"{stem}.png", geometric_median=None if geo is None else geo.point)
    return [npz, js, png]


# --------------------------------------------------------------------------------------
# solve
# --------------------------------------------------------------------------------------


def _add_solve(sub):
    p = sub.add_parser("solve", help="solve the wide-limit problem exactly, with a certificate")
    p.add_argument("data", help="data file (.npy .npz .csv .safetensors .pt) or a built-in dataset name")
    p.add_argument("--lam", type=float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="array name inside .npz / .safetensors / .pt")
    p.add_argument("--ray-tol", type=float, default=None, help="direction tolerance for grouping rays")
    p.add_argument("--signed", action="store_true", help="signed codes (atoms are lines, not rays)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", type=Path, default=None, help="write solution.npz, solution.json, solution.png here")


def _run_solve(args) -> int:
    from ..exact.solve import solve

    X, lam0, label = load_data(args.data, args.key)
    lam = args.lam if args.lam is not None else lam0
    if lam is None:
        raise ValueError("--lam is required for data files")
    sol = solve(X, lam, ray_tol=args.ray_tol, signed=args.signed)
    files = _write_solution(args.out, X, sol) if args.out else []
    if args.json:
        d = sol.as_dict()
        d["data"] = label
        d["files"] = [str(f) for f in files]
        print_json(d)
    else:
        con = _console()
        con.print(certificate_table(f"widelimit solve: {label}", _solution_rows(sol)))
        for f in files:
            con.print(f"wrote {f}")
    return 0


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------


def _add_demo(sub):
    p = sub.add_parser("demo", help="solve the built-in 2-D rays dataset, print its certificate, plot it")
    p.add_argument("--out", type=Path, default=Path("widelimit-demo"), help="folder for the plot and files")
    p.add_argument("--json", action="store_true")


def _run_demo(args) -> int:
    from ..data.datasets import BUILTIN, rays2d
    from ..exact.solve import solve
    from ..exact.median import geometric_median

    X, truth = rays2d()
    lam = BUILTIN["rays2d"][1]
    sol = solve(X, lam)
    geo = geometric_median(X)
    files = _write_solution(args.out, X, sol, geo, stem="demo")
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


# --------------------------------------------------------------------------------------
# relax
# --------------------------------------------------------------------------------------


def _add_relax(sub):
    from ..relax.cones import CONES

    p = sub.add_parser("relax", help="solve the convex Q-problem over a CP-cone approximation; compare with the exact optimum")
    p.add_argument("data", help="data file (.npy .npz .csv .safetensors .pt) or a built-in dataset name")
    p.add_argument("--lam", type=float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="array name inside .npz / .safetensors / .pt")
    p.add_argument("--cone", default="dnn", choices=list(CONES),
                   help="outer: nonneg, dnn, dnn_horn (lower bounds); inner: sdd, nndd, diagonal (upper bounds)")
    p.add_argument("--solver", default="SCS", type=str.upper, choices=["SCS", "CLARABEL", "TORCH"],
                   help="conic solver via cvxpy, or TORCH (widelimit's own first-order DNN solver; cone dnn)")
    p.add_argument("--tol", type=float, default=1e-6, help="solver tolerance (TORCH: certified relative gap)")
    p.add_argument("--max-iters", type=int, default=None, help="solver iteration cap")
    p.add_argument("--device", default="auto", help="TORCH only: auto, cpu, cuda")
    p.add_argument("--refine", action="store_true",
                   help="factor the solver's Q (CP factorisation) into (W, Z, b) and evaluate the true objective")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _run_relax(args) -> int:
    from ..exact.solve import solve

    X, lam0, label = load_data(args.data, args.key)
    lam = args.lam if args.lam is not None else lam0
    if lam is None:
        raise ValueError("--lam is required for data files")
    exact = solve(X, lam).value
    if args.solver == "TORCH":
        from ..relax.dnn import solve_dnn

        if args.cone != "dnn":
            raise ValueError(f"--solver TORCH solves the dnn cone only, got --cone {args.cone}")
        r = solve_dnn(X, lam, tol=args.tol, device=args.device,
                      **({} if args.max_iters is None else {"max_iter": args.max_iters}))
        status = "optimal" if r.converged else "not_converged"
        value = r.lower_bound if r.converged else float("nan")
        d = {"value": value, "status": status, "cone": "dnn", "kind": "outer", "solver": "TORCH",
             "time_s": r.time_s, "upper_value": r.value, "rel_gap": r.rel_gap, "n_iter": r.n_iter,
             "device": r.device, "b": r.b}
        Q, b = r.Q, r.b
    else:
        from ..relax.cones import relax

        r = relax(X, lam, args.cone, solver=args.solver, tol=args.tol, max_iters=args.max_iters)
        d = r.as_dict()
        d["value"] = r.value
        Q, b = r.Q, r.b
    ok = d["status"] == "optimal"
    err = d["value"] - exact if ok else float("nan")
    d.update({"data": label, "lam": lam, "N": int(X.shape[0]), "n": int(X.shape[1]), "exact_value": exact,
              "error": err, "rel_error": abs(err) / max(abs(exact), 1e-300) if ok else float("nan")})
    if args.refine:
        from ..relax.cpfactor import refine

        if Q is None or b is None:
            raise ValueError(f"cannot refine: the solver returned no Q (status {d['status']})")
        ref = refine(X, lam, Q, b)
        d["refined"] = {"value": ref.value, "width": ref.width, "factor_width": ref.factor_width,
                        "factor_residual": ref.factorization.residual,
                        "factor_success": ref.factorization.success, "rel_gap": ref.certificate.rel_gap,
                        "exact_width": solve(X, lam).width}
    if args.json:
        print_json(d)
        return 0
    rows = [
        ("points N x dims n", f"{d['N']} x {d['n']}", "data size"),
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


# --------------------------------------------------------------------------------------
# experiment
# --------------------------------------------------------------------------------------


def _add_experiment(sub):
    p = sub.add_parser("experiment", help="run a named experiment (writes PNG plots and JSON)")
    p.add_argument("name", nargs="?", default=None, help="experiment name; omit to list them")
    p.add_argument("--out", type=Path, default=None, help="folder for plots and JSON (default: ./experiments/NAME)")
    p.add_argument("--quick", action="store_true", help="small sizes (as in the test suite)")
    p.add_argument("--json", action="store_true", help="print the numbers as one JSON object")


def _run_experiment(args) -> int:
    from ..lab import experiments

    if args.name is None:
        for name, doc in experiments.names().items():
            print(f"{name:28s} {doc}")
        return 0
    fn = experiments.get(args.name)
    out = args.out if args.out is not None else Path("experiments") / args.name
    result = fn(out, quick=args.quick)
    if args.json:
        print_json(result)
    else:
        _console().print(f"experiment {args.name}: results in {out}")
    return 0


# --------------------------------------------------------------------------------------
# bound: the certified wide-limit bound, streamed from disk or run on a Dask cluster
# --------------------------------------------------------------------------------------


def progress_display(console=None, enabled: bool = True):
    """A context manager yielding ``(callback, None)``: a rich progress bar driven by solver events.

    The callback accepts :class:`widelimit.engine.local.Progress` events (rows of
    the current pass; value and certified bound after each iteration).
    """
    import contextlib

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def ctx():
        if not enabled:
            yield None
            return
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.fields[status]}"), console=console, transient=True)
        with bar:
            task = bar.add_task("pass 0", total=None, status="")
            state = {"status": ""}

            def cb(ev):
                if ev.value is not None:
                    gap = ev.value - (ev.lower_bound if ev.lower_bound is not None else ev.value)
                    state["status"] = f"value {ev.value:.10g}  bound {ev.lower_bound:.10g}  gap {gap:.2e}"
                bar.update(task, description=f"pass {ev.pass_index} ({ev.stage})", completed=ev.rows_done,
                           total=ev.rows_total, status=state["status"])

            yield cb

    return ctx()


def open_source(spec: str, key: str | None = None, column: str | None = None):
    """An :class:`~widelimit.data.source.ActivationSource` for a path (file, folder of shards, datasets cache),
    or ``None`` for a built-in dataset name / in-memory formats (.npz .csv .pt)."""
    from ..data.source import ActivationSource

    p = Path(spec)
    if p.is_dir() or p.suffix.lower() in (".npy", ".safetensors", ".arrow"):
        return ActivationSource.open(p, key=key, column=column)
    return None


def _add_bound(sub):
    p = sub.add_parser(
        "bound",
        help="certified wide-limit lower bound (Huber median), streamed from disk or run on a Dask cluster",
        description="Compute min_b H(b), the lower bound on the SAE objective for every width, with its "
                    "certificate. Files are streamed in chunks (memory independent of N).",
    )
    p.add_argument("data", help=".npy / .safetensors / .arrow file, a folder of shards, a Hugging Face "
                                "datasets cache (SAELens), another data file, or a built-in dataset name")
    p.add_argument("--lam", type=float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="tensor name inside .safetensors / .npz / .pt")
    p.add_argument("--column", default=None, help="column of a datasets / Arrow cache (default: its float column)")
    p.add_argument("--geometric", action="store_true", help="geometric median instead (no lam)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint file: written after every pass; an interrupted run resumes from it")
    p.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="run the passes on a Dask cluster: a scheduler address (tcp://host:8786) or "
                        "'local' / 'local:N' for a LocalCluster of N worker processes")
    p.add_argument("--rows", type=int, default=None, help="rows per Dask block (default: a 32 MiB float64 block)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _dask_client(spec: str):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ValueError("--dask needs dask[distributed]: pip install 'widelimit[dask]'") from None
    if spec == "local" or spec.startswith("local:"):
        nw = int(spec.split(":", 1)[1]) if ":" in spec else None
        cluster = LocalCluster(n_workers=nw, threads_per_worker=1, processes=True, dashboard_address=None)
        return Client(cluster), cluster
    return Client(spec), None


def _run_bound(args) -> int:
    import time

    from ..exact.median import geometric_median, huber_median

    src = open_source(args.data, args.key, args.column)
    if src is not None:
        X, lam0, label = src, None, repr(src)
    else:
        X, lam0, label = load_data(args.data, args.key)
    lam = args.lam if args.lam is not None else lam0
    if lam is None and not args.geometric:
        raise ValueError("--lam is required for data files (or use --geometric)")
    client = cluster = None
    if args.dask:
        from ..engine.dask_engine import from_source
        from ..data.source import ActivationSource

        client, cluster = _dask_client(args.dask)
        X = from_source(X if src is not None else ActivationSource.from_array(X), rows=args.rows)
    con = _console()
    import sys as _sys

    from rich.console import Console

    err = Console(stderr=True)
    try:
        t0 = time.perf_counter()
        with progress_display(err, enabled=not args.no_progress) as cb:
            if args.geometric:
                res = geometric_median(X, progress=cb, checkpoint=args.checkpoint)
            else:
                res = huber_median(X, lam, progress=cb, checkpoint=args.checkpoint)
        secs = time.perf_counter() - t0
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    N, n = X.shape
    d = {
        "data": label, "n_points": int(N), "dim": int(n), "kind": res.kind, "lam": res.lam,
        "lower_bound": res.lower_bound, "value": res.value, "gap": res.gap, "rel_gap": res.rel_gap,
        "converged": bool(res.converged), "n_passes": res.n_passes, "n_iter": res.n_iter, "method": res.method,
        "seconds": secs, "backend": "dask" if args.dask else "local", "bias": res.point,
    }
    if args.json:
        print_json(d)
        return 0
    what = "geometric median" if args.geometric else "wide-limit bound (Huber median)"
    con.print(certificate_table(f"widelimit bound: {label}", [
        ("points N x dims n", f"{N} x {n}", "data size"),
        ("lam", res.lam if res.lam is not None else "-", "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("lower bound", res.lower_bound, f"certified {what}: no width, dictionary or code does better"
         if not args.geometric else "certified lower bound on the mean distance"),
        ("value at b", res.value, "objective at the returned bias (an upper bound)"),
        ("gap", res.gap, "value - lower bound"),
        ("relative gap", res.rel_gap, "certificate quality"),
        ("passes", res.n_passes, f"passes over the data ({res.method})"),
        ("seconds", secs, f"{'Dask ' + args.dask if args.dask else 'single process'}"),
        ("converged", res.converged, "gap within tolerance"),
    ]))
    _sys.stdout.flush()
    return 0


# --------------------------------------------------------------------------------------
# certify (trained SAEs)
# --------------------------------------------------------------------------------------


def _add_certify(sub):
    p = sub.add_parser(
        "certify",
        help="certify a trained SAE (SAELens / dictionary_learning / sparsify / plain file) on activations",
        description="Measure how far a trained SAE is from the global optimum of its own objective "
        "mean ||x - x_hat||^2 + l1_coefficient * mean sum_d f_d ||W_dec,d||  (l1_coefficient = 2 lam).",
    )
    p.add_argument("sae", help="SAE folder (SAELens, sparsify, dictionary_learning) or file (ae.pt, .npz, .safetensors)")
    p.add_argument("acts", help="activations (N, d_in): .npy (memory-mapped), .safetensors, .pt, .npz")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--lam", type=float, help="sparsity lam > 0 of the objective")
    g.add_argument("--l1-coefficient", type=float, help="SAELens / dictionary_learning L1 coefficient (= 2 lam)")
    p.add_argument("--key", default=None, help="tensor name inside the activations file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", type=Path, default=None,
                   help="write certificate.json, features.csv, feature_frequency.png, feature_violations.png here")
    p.add_argument("--tol", type=float, default=1e-6, help="certified_optimal iff global gap <= tol * max(1, objective)")
    p.add_argument("--coding-tol", type=float, default=1e-6, help="relative duality gap of the optimal coding per token")
    p.add_argument("--batch-size", type=int, default=4096, help="tokens per batch")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--norm-scaling-factor", type=float, default=None,
                   help="SAELens expected_average_only_in: the input scaling factor to fold into the weights")


def _certify_rows(c):
    m = c.metrics
    rows = [
        ("tokens x d_in, d_sae", f"{c.n_tokens} x {c.d_in}, {c.d_sae}", f"{c.sae_info['architecture']} SAE ({c.sae_info['source_format']})"),
        ("lam (l1_coefficient)", f"{c.lam:.6g} ({c.l1_coefficient:.6g})", "l1_coefficient = 2 lam"),
        ("SAE objective", c.sae_objective, "with the SAE's own encoder codes"),
        ("optimal-code objective", c.optimal_code_objective, "best codes for its decoder and bias (nonnegative lasso)"),
        ("coding duality gap", c.coding_gap, "certified: the optimal-code objective is within this of exact"),
        ("encoder gap", c.encoder_gap, "amortisation gap: SAE - optimal codes"),
        ("bound at own bias H(b_dec)", c.lower_bound_at_bias, "best any width/dictionary can do with this bias"),
        ("wide-limit lower bound", c.lower_bound, "certified: best any width, dictionary, bias, code can do"),
        ("global gap", c.global_gap, "SAE objective - lower bound"),
        ("MSE", m["mse"], "mean over tokens of sum over dims of (x - x_hat)^2"),
        ("explained variance", m["explained_variance"], "1 - E||x - x_hat||^2 / (E||x||^2 - ||E x||^2)"),
        ("L0", m["l0"], "mean number of firing features per token"),
        ("L1", m["l1"], "mean sum_d f_d"),
        ("dead / dense features", f"{m['dead_features']} / {m['dense_features']}", "never fire / fire often"),
        ("antipodal pairs", m["antipodal_pairs"], "decoder cosine near -1"),
        ("absorbed-looking features", m["absorbed_looking"], "firing set inside another's, similar atom"),
        ("features violating 1st-order", len(c.violating_features()), "theory.md section 5 conditions"),
        ("bias stationarity", c.bias_stationarity, "||mean residual||, 0 at a stationary bias"),
        ("max residual norm", c.max_residual_norm, f"<= lam = {c.lam:.6g} at a global optimum"),
        ("tokens / second", c.n_tokens / c.seconds if c.seconds > 0 else float("nan"), f"whole certification on {c.device}"),
        ("certified optimal", c.certified_optimal, f"global gap <= {c.tol:g} * max(1, objective)"),
    ]
    return rows


def _run_certify(args) -> int:
    from ..data.source import load_activations
    from ..sae.model import load_sae
    from ..sae.certify import certify_sae, write_sae_certificate

    sae = load_sae(args.sae, norm_scaling_factor=args.norm_scaling_factor)
    acts = load_activations(args.acts, key=args.key)
    cert = certify_sae(sae, acts, lam=args.lam, l1_coefficient=args.l1_coefficient, tol=args.tol,
                       coding_tol=args.coding_tol, batch_size=args.batch_size, device=args.device)
    files = write_sae_certificate(cert, args.out) if args.out else []
    if args.json:
        d = cert.as_dict()
        d["files"] = [str(f) for f in files]
        print_json(d)
        return 0
    con = _console()
    con.print(certificate_table(f"widelimit certify: {args.sae}", _certify_rows(cert)))
    for v in cert.violations[:10]:
        con.print(f"feature {v['feature']}: {v['condition']} violated by {v['value']:.3g}")
    if len(cert.violations) > 10:
        con.print(f"... {len(cert.violations) - 10} more violations (see features.csv with --out)")
    for note in cert.notes + list(sae.warnings):
        con.print(f"note: {note}")
    for f in files:
        con.print(f"wrote {f}")
    return 0


# --------------------------------------------------------------------------------------
# fit / frontier (gradient solver)
# --------------------------------------------------------------------------------------


def _add_fit_options(p):
    p.add_argument("data", help="data file (.npy .npz .csv .safetensors .pt) or a built-in dataset name")
    p.add_argument("--lam", type=float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="array name inside .npz / .safetensors / .pt")
    p.add_argument("--encoder", default="none", choices=["none", "relu", "jumprelu", "topk"],
                   help="free codes (dictionary learning) or an amortised SAE encoder")
    p.add_argument("--topk", type=int, default=None, help="active features per point for --encoder topk")
    p.add_argument("--init", default="rays", choices=["rays", "data", "random"], help="initial atoms")
    p.add_argument("--restarts", type=int, default=1, help="independent runs; the best is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--max-steps", type=int, default=None, help="step budget")
    p.add_argument("--max-time", type=float, default=None, help="time budget per run, seconds")
    p.add_argument("--rtol", type=float, default=1e-8, help="stop when the relative improvement per step is below this")
    p.add_argument("--batch-size", type=int, default=None, help="minibatch size (default: full batch)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (encoders)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _lam_of(args, lam0):
    lam = args.lam if args.lam is not None else lam0
    if lam is None:
        raise ValueError("--lam is required for data files")
    return lam


def _fit_kwargs(args):
    kw = {"encoder": args.encoder, "device": args.device, "max_steps": args.max_steps, "max_time": args.max_time,
          "rtol": args.rtol, "batch_size": args.batch_size, "lr": args.lr}
    if args.topk is not None:
        kw["topk"] = args.topk
    return kw


class _Progress:
    """A rich progress display on stderr (stdout stays clean for --json)."""

    def __init__(self, enabled=True):
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), disable=not enabled, transient=True)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def say(self, text):
        self.progress.update(self.task, description=text)


def _add_fit(sub):
    p = sub.add_parser("fit", help="gradient dictionary learning at a given width, compared with the certified bound")
    _add_fit_options(p)
    p.add_argument("--width", type=int, required=True, help="number of atoms k >= 1")
    p.add_argument("--out", type=Path, default=None, help="write fit.npz (dictionary, bias, codes) and fit.json here")


def _run_fit(args) -> int:
    import scipy.sparse as sp

    from ..exact.certificate import verify
    from ..learn.crossval import best_fit

    X, lam0, label = load_data(args.data, args.key)
    lam = _lam_of(args, lam0)
    with _Progress(enabled=True) as prog:
        run = {"i": 0}

        def cb(h):
            prog.say(f"run {run['i'] + 1}/{args.restarts}: step {h['step']}  objective {h['value']:.8g}")

        kw = _fit_kwargs(args)
        kw["callback"] = cb
        fits = []
        for i in range(max(1, args.restarts)):
            run["i"] = i
            best, _ = best_fit(X, lam, args.width, n_restarts=1, seed=args.seed + i, inits=(args.init,), **kw)
            fits.append(best)
        prog.say("certifying")
        fit = min(fits, key=lambda f: f.value)
        cert = verify(X, lam, fit.dictionary, fit.codes, fit.bias, tol=1e-4)
    d = fit.as_dict()
    d.update({"data": label, "value": cert.value, "lower_bound": cert.lower_bound, "gap": cert.gap,
              "rel_gap": cert.rel_gap, "certified": cert.certified, "width": fit.width,
              "restart_values": [f.value for f in fits], "bias": fit.bias, "certificate": cert.as_dict()})
    files = []
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        npz = args.out / "fit.npz"
        np.savez(npz, dictionary=fit.dictionary, bias=fit.bias, lam=lam,
                 **{f"enc_{k}": v for k, v in fit.encoder_params.items()})
        cz = args.out / "fit_codes.npz"
        sp.save_npz(cz, sp.csr_matrix(fit.codes))
        js = args.out / "fit.json"
        js.write_text(json.dumps(_jsonable({**d, "history": fit.history}), indent=2))
        files = [npz, cz, js]
    d["files"] = [str(f) for f in files]
    if args.json:
        print_json(d)
        return 0
    rows = [
        ("points N x dims n", f"{cert.n_points} x {cert.dim}", "data size"),
        ("lam", lam, "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("width", fit.width, f"atoms ({fit.live_atoms} used)"),
        ("encoder", fit.encoder, "none = free codes (dictionary learning)"),
        ("value", cert.value, "objective of the learned (W, Z, b), float64"),
        ("lower bound", cert.lower_bound, "certified wide-limit bound: no width does better"),
        ("gap", cert.gap, "value - lower bound"),
        ("relative gap", cert.rel_gap, "0 once the width reaches the number of rays"),
        ("coding gap", fit.coding_gap, "certified gap of the codes for this dictionary"),
    ]
    if fit.encoder_value is not None:
        rows.append(("encoder value", fit.encoder_value, "objective of the encoder's own codes"))
    rows += [("steps", fit.n_steps, f"stopped by {fit.stop_reason}"), ("time (s)", round(fit.time_s, 3), fit.device),
             ("certified", cert.certified, "relative gap <= 1e-4")]
    con = _console()
    con.print(certificate_table(f"widelimit fit: {label}", rows))
    for f in files:
        con.print(f"wrote {f}")
    return 0


def _add_frontier(sub):
    p = sub.add_parser("frontier", help="best gradient objective per width vs the wide-limit bound (PNG + JSON)")
    _add_fit_options(p)
    p.add_argument("--widths", required=True, help="comma-separated widths, e.g. 1,2,4,8")
    p.add_argument("--out", type=Path, default=Path("widelimit-frontier"), help="folder for frontier.png/json")


def _run_frontier(args) -> int:
    from ..learn.frontier import frontier

    X, lam0, label = load_data(args.data, args.key)
    lam = _lam_of(args, lam0)
    try:
        widths = [int(w) for w in args.widths.split(",") if w.strip()]
    except ValueError:
        raise ValueError(f"--widths must be comma-separated integers, got {args.widths!r}") from None
    inits = (args.init,) if args.init != "rays" else ("rays", "data")
    with _Progress() as prog:
        fr = frontier(X, lam, widths, n_restarts=max(1, args.restarts), seed=args.seed, inits=inits,
                      out=args.out / "frontier.png", callback=lambda w, v: prog.say(f"width {w}: {v:.8g}"),
                      **_fit_kwargs(args))
    d = fr.as_dict()
    d["data"] = label
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontier.json").write_text(json.dumps(_jsonable(d), indent=2))
    if args.json:
        print_json(d)
        return 0
    from rich.table import Table

    t = Table(title=f"widelimit frontier: {label}, lam = {lam:g}")
    for c in ("width", "best value", "relative gap to bound"):
        t.add_column(c, justify="right")
    for w, v, g in zip(fr.widths, fr.values, d["rel_gaps"]):
        t.add_row(str(w), f"{v:.10g}", f"{g:.3e}")
    con = _console()
    con.print(t)
    con.print(f"bound {fr.lower_bound:.10g}; rays {fr.n_rays}; saturation width {fr.saturation_width}; "
              f"all runs above the bound: {_fmt(fr.respects_bound)}")
    con.print(f"wrote {args.out / 'frontier.png'} and {args.out / 'frontier.json'}")
    return 0


#: (name, add-parser function, run function) for every subcommand.
COMMANDS = [
    ("solve", _add_solve, _run_solve),
    ("demo", _add_demo, _run_demo),
    ("experiment", _add_experiment, _run_experiment),
    ("bound", _add_bound, _run_bound),
    ("certify", _add_certify, _run_certify),
    ("fit", _add_fit, _run_fit),
    ("frontier", _add_frontier, _run_frontier),
    ("relax", _add_relax, _run_relax),
]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="widelimit",
        description="Exact, certified wide-limit sparse dictionary learning and SAE certification.",
    )
    parser.add_argument("--version", action="version", version=f"widelimit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for _, add, _ in COMMANDS:
        add(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = {name: fn for name, _, fn in COMMANDS}[args.command]
    try:
        return int(run(args) or 0)
    except (ValueError, MemoryError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"widelimit {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
