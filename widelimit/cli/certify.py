"""``widelimit certify``: certify a trained SAE against its own objective (or the stand-in the report names)."""

from __future__ import annotations

from pathlib import Path

from ..data.source import open_activations
from ._common import (_console, atomic_outputs, certificate_table, check_out_dir, lam_float, moved, nonneg_float,
                      nonneg_int, positive_float, positive_int, print_json, progress_display,
                      threads_int)
from ..sae.report import certificate_rows
from ..sae.certify import certify_sae, write_sae_certificate
from ..sae.formats import load_sae

# --------------------------------------------------------------------------------------
# certify (trained SAEs)
# --------------------------------------------------------------------------------------


def _add_certify(sub):
    p = sub.add_parser(
        "certify",
        help="certify a trained SAE (SAELens / dictionary_learning / sparsify / plain file) on activations",
        description="Measure how far a trained SAE is from the global optimum of the objective "
        "mean ||x - x_hat||^2 + l1_coefficient * mean sum_d f_d ||W_dec,d||  (l1_coefficient = 2 lam). "
        "Without --lam: the SAE's recorded l1_coefficient, or, for TopK / BatchTopK / JumpReLU SAEs, "
        "lam calibrated at equal L0.",
    )
    p.add_argument("sae", help="SAE folder (SAELens, sparsify, dictionary_learning) or file (ae.pt, "
                               "sae_weights.safetensors with its cfg.json, .npz, .safetensors)")
    p.add_argument("acts", help="activations (N, d_in): .npy, .safetensors, .pt, .npz, a folder of shards, "
                                "a datasets Arrow cache")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lam", type=lam_float, help="sparsity lam > 0 of the objective")
    g.add_argument("--l1-coefficient", type=positive_float, help="SAELens / dictionary_learning L1 coefficient (= 2 lam)")
    p.add_argument("--architecture", default=None,
                   choices=["standard", "jumprelu", "topk", "batchtopk", "gated", "matryoshka"],
                   help="the encoder, when the SAE's files do not name it")
    p.add_argument("--max-tokens", type=positive_int, default=None, help="certify a random sample of this many tokens")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the --max-tokens sample")
    p.add_argument("--key", default=None, help="tensor name inside the activations file")
    p.add_argument("--column", default=None, help="column of a datasets / Arrow cache (default: its float column)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", type=Path, default=None,
                   help="write certificate.json, metrics.json, features.csv, feature_frequency.png, "
                        "feature_violations.png here")
    p.add_argument("--tol", type=nonneg_float, default=1e-6, help="certified_optimal iff global gap <= tol * objective")
    p.add_argument("--coding-tol", type=positive_float, default=1e-6, help="relative duality gap of the optimal coding per token")
    p.add_argument("--batch-size", type=positive_int, default=4096, help="tokens per batch")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=threads_int, default=None,
                   help="threads for torch, numba and BLAS (default: the usable cores, 1 on an overloaded machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")
    p.add_argument("--norm-scaling-factor", type=positive_float, default=None,
                   help="SAELens expected_average_only_in: the input scaling factor to fold into the weights")
    p.add_argument("--stability", action="store_true",
                   help="also check every feature's optimality conditions (theory.md §5) with witnesses")
    p.add_argument("--same-width-steps", type=nonneg_int, default=0,
                   help="also run the gradient solver from the decoder at the same width for this many steps")


def _certify_rows(c):

    return certificate_rows(c)


def _run_certify(args) -> int:

    check_out_dir(args.out)
    sae = load_sae(args.sae, architecture=args.architecture, norm_scaling_factor=args.norm_scaling_factor)
    acts = open_activations(args.acts, key=args.key, column=args.column)
    from rich.console import Console

    err = Console(stderr=True)
    with progress_display(err, enabled=not args.no_progress and err.is_terminal) as cb:  # terminals only
        cert = certify_sae(acts, sae, lam=args.lam, l1_coefficient=args.l1_coefficient, tol=args.tol,
                           coding_tol=args.coding_tol, batch_size=args.batch_size, device=args.device,
                           threads=args.threads, progress=cb, max_tokens=args.max_tokens, seed=args.seed,
                           stability=args.stability, same_width_steps=args.same_width_steps)
    files = []
    if args.out:
        with atomic_outputs(args.out) as tmp:
            files = moved(write_sae_certificate(cert, tmp), tmp, args.out)
    if args.json:
        d = cert.as_dict()
        d["flat"] = cert.as_flat_dict()
        d["files"] = [str(f) for f in files]
        print_json(d)
        return 0
    con = _console()
    con.print(certificate_table(f"widelimit certify: {args.sae}", _certify_rows(cert)))
    for v in cert.violations[:10]:
        con.print(f"feature {v['feature']}: {v['condition']} violated by {v['value']:.3g}")
    if len(cert.violations) > 10:
        con.print(f"... {len(cert.violations) - 10} more violations (see features.csv with --out)")
    for note in cert.notes:  # the SAE's own warnings are among them
        con.print(f"note: {note}")
    for f in files:
        con.print(f"wrote {f}")
    return 0
