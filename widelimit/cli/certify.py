"""``widelimit certify``: certify a trained SAE against its own objective."""

from __future__ import annotations

from pathlib import Path


from ._common import (load_data, _console, print_json, _fmt, certificate_table, _dual_round, _solution_rows, _write_solution, progress_display, open_source)  # noqa: F401


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
    p.add_argument("--threads", type=int, default=None,
                   help="threads for torch, numba and BLAS (default: the usable cores, 1 on an overloaded machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")
    p.add_argument("--norm-scaling-factor", type=float, default=None,
                   help="SAELens expected_average_only_in: the input scaling factor to fold into the weights")
    p.add_argument("--stability", action="store_true",
                   help="also check every feature's optimality conditions (theory.md section 5) with witnesses")
    p.add_argument("--same-width-steps", type=int, default=0,
                   help="also run the gradient solver from the decoder at the same width for this many steps")


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
    if c.stability is not None:
        n = c.stability["counts"]
        rows.insert(-3, ("feature stability", f"{n['stable']} stable, {n['unstable']} unstable, {n['violated']} violated, {n.get('undecided', 0)} undecided",
                         "unstable: a verified lower objective was found"))
    if c.same_width is not None:
        rows.insert(-3, ("same-width dictionary", c.same_width["value_found"], c.same_width["message"]))
    return rows


def _run_certify(args) -> int:
    from ..data.source import load_activations
    from ..sae.model import load_sae
    from ..sae.certify import certify_sae, write_sae_certificate

    sae = load_sae(args.sae, norm_scaling_factor=args.norm_scaling_factor)
    acts = load_activations(args.acts, key=args.key)
    from rich.console import Console

    err = Console(stderr=True)
    with progress_display(err, enabled=not args.no_progress and err.is_terminal) as cb:  # terminals only
        cert = certify_sae(acts, sae, lam=args.lam, l1_coefficient=args.l1_coefficient, tol=args.tol,
                           coding_tol=args.coding_tol, batch_size=args.batch_size, device=args.device,
                           threads=args.threads, progress=cb, stability=args.stability,
                           same_width_steps=args.same_width_steps)
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
