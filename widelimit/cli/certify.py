"""``widelimit certify``: certify a trained SAE against its own objective (or the stand-in the report names)."""

from __future__ import annotations

import contextlib
import csv
import functools
import json
from pathlib import Path

import numpy as np

from .._json import to_jsonable
from ..sae.sparsity import SparsityOptions
from ._guard import call_interruptibly, line_progress, stdout_to_stderr

from ..data.source import open_activations
from ._common import (_console, atomic_outputs, certificate_table, check_out_dir, lam_float, moved, nonneg_float,
                      nonneg_int, only_with, positive_float, positive_int, print_json, progress_display,
                      threads_int)
from ..sae._util import sample_rows
from ..sae.downstream import downstream_loss, downstream_loss_transformer_lens, hooked_transformer_from_folder
from ..sae.report import certificate_rows, sig
from ..sae.sweep import SWEEP_COLUMNS, decoder_frontier, plot_sweep, sweep_row
from ..sae.certify import certify_sae, write_sae_certificate
from ..sae.formats import load_sae, looks_like_sae

# --------------------------------------------------------------------------------------
# certify (trained SAEs)
# --------------------------------------------------------------------------------------


def _add_certify(sub):
    p = sub.add_parser(
        "certify",
        help="certify trained SAEs (SAELens / dictionary_learning / sparsify / plain file) on activations",
        description="Measure what a trained SAE could gain against its own objective. Every SAE: the best MSE of "
        "codes of its own decoder and bias at its own sparsity, bracketed (a verified witness and a proven lower "
        "bound). L1-trained SAEs (or --objective l1 / --lam): the L1 objective mean ||x - x_hat||^2 + "
        "l1_coefficient * mean sum_d f_d ||W_dec,d|| (l1_coefficient = 2 lam) and its wide-limit bound. "
        "Several SAEs (or a folder of checkpoints): one sweep table and an MSE-L0 plot.",
    )
    p.add_argument("acts", help="activations (N, d_in): .npy, .safetensors, .pt, .npz, a folder of shards, "
                                "a datasets Arrow cache")
    p.add_argument("sae", nargs="+", help="SAE folder (SAELens, sparsify, dictionary_learning) or file (ae.pt, "
                                          "sae_weights.safetensors with its cfg.json, .npz, .safetensors); several, or "
                                          "a folder of SAE folders, for a sweep")
    p.add_argument("--objective", choices=["auto", "l1", "l0"], default="auto",
                   help="auto: the SAE's own (L1 for L1-trained SAEs, the L0 bracket alone for TopK / BatchTopK / "
                        "JumpReLU / Matryoshka); l1: also the L1 objective (lam calibrated at equal L0 if not given); "
                        "l0: the L0 bracket alone")
    p.add_argument("--pursuit-rounds", type=nonneg_int, default=8, help="rounds of the pursuit per batch")
    p.add_argument("--pursuit-time", type=nonneg_float, default=None,
                   help="seconds for the pursuit (default: at most what the rest of the certification takes)")
    p.add_argument("--calibration-time", type=nonneg_float, default=60.0,
                   help="seconds for calibrating lam at equal L0 (--objective l1 without --lam)")
    p.add_argument("--model", type=Path, default=None,
                   help="a local Hugging Face causal LM folder: add SAELens's CE loss score and the KL with the SAE "
                        "spliced in at --hook, on the token ids of --tokens")
    p.add_argument("--hook", default=None, help="with --model: the submodule whose output the SAE reads "
                                                "(e.g. transformer.h.1), or a TransformerLens hook name "
                                                "(e.g. blocks.1.hook_resid_post; with transformer_lens installed)")
    p.add_argument("--tokens", type=Path, default=None, help="with --model: token ids (n_seq, seq_len), .npy")
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
    p.add_argument("--tol", type=nonneg_float, default=1e-6, help="certified iff global gap <= tol * objective")
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


def _sae_paths(specs, **load) -> list[str]:
    """The SAEs named on the command line: each argument, or the SAE folders inside a folder that is none itself."""
    out = []
    for spec in specs:
        path = Path(spec)
        if not path.is_dir():
            out.append(spec)
            continue
        try:
            load_sae(path, **load)
            out.append(spec)
        except (ValueError, OSError):  # not an SAE itself: its SAE sub-folders, or its own error
            subs = sorted(str(d) for d in path.iterdir() if d.is_dir() and _is_sae(d, load))
            if not subs:
                raise
            out += subs
    return out


def _is_sae(path: Path, load: dict) -> bool:
    try:
        load_sae(path, **load)
    except (ValueError, OSError):
        return False
    return True


def _progress(args, err):
    """A rich bar on a terminal, progress lines otherwise (logs, pipes), nothing with --no-progress."""
    if args.no_progress:
        return contextlib.nullcontext(None)
    if err.is_terminal:
        return progress_display(err, enabled=True, unit="tokens")
    return contextlib.nullcontext(line_progress(unit="tokens"))


def _certify_one(args, path, acts, cb, model=None):
    sae = load_sae(path, architecture=args.architecture, norm_scaling_factor=args.norm_scaling_factor)
    cert = call_interruptibly(
        certify_sae, acts, sae, lam=args.lam, l1_coefficient=args.l1_coefficient, tol=args.tol,
        coding_tol=args.coding_tol, batch_size=args.batch_size, device=args.device, threads=args.threads,
        progress=cb, max_tokens=args.max_tokens, seed=args.seed, stability=args.stability,
        same_width_steps=args.same_width_steps, objective=args.objective,
        sparsity=SparsityOptions(max_iter=args.pursuit_rounds, time_limit=args.pursuit_time),
        calibration_time=args.calibration_time)
    if model is not None:
        cert.downstream = call_interruptibly(model[0], sae, model[1])
    return sae, cert


def _model(args):
    """``(run, token ids)`` of --model, --hook and --tokens, each checked (one line naming the flag): ``run(sae, ids)``
    is :func:`downstream_loss` at a submodule of the Hugging Face model, or
    :func:`downstream_loss_transformer_lens` at a TransformerLens hook name of the same model."""
    if not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model}: not a local folder (a hub name would need the network; save the "
                         "model with save_pretrained and pass its folder)")
    try:
        import transformers
    except ImportError:
        raise ValueError("--model needs the transformers package (pip install transformers)") from None
    transformers.utils.logging.disable_progress_bar()  # no loading bars on stderr
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(args.model), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"--model {args.model}: not a Hugging Face causal LM folder ({str(e).splitlines()[0]})") from None
    ids = _token_ids(args, model.config.vocab_size)
    try:
        return functools.partial(downstream_loss, model, module=model.get_submodule(args.hook)), ids
    except AttributeError:
        pass
    tl_model, why = _transformer_lens(args, model)
    if tl_model is not None and args.hook in tl_model.hook_dict:
        return functools.partial(downstream_loss_transformer_lens, tl_model, hook_name=args.hook), ids
    raise ValueError(f"--hook {args.hook!r}: neither a submodule of the model at {args.model} (e.g. transformer.h.0 "
                     f"for a GPT-2) nor a TransformerLens hook name of it (e.g. blocks.0.hook_resid_post{why})")


def _transformer_lens(args, model):
    """``(HookedTransformer or None, why not)`` of the model at --model."""
    try:
        import transformer_lens  # noqa: F401
    except ImportError:
        return None, "; transformer_lens is not installed"
    try:
        return hooked_transformer_from_folder(args.model, model), ""
    except (ValueError, KeyError, AttributeError, NotImplementedError, TypeError) as e:
        return None, f"; TransformerLens cannot build it: {str(e).splitlines()[0][:120]}"


def _token_ids(args, vocab_size: int) -> np.ndarray:
    try:
        ids = np.load(args.tokens, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"--tokens {args.tokens}: cannot read token ids ({e})") from None
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise ValueError(f"--tokens {args.tokens}: need integer token ids of shape (n_seq, seq_len), "
                         f"got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"--tokens {args.tokens}: token ids must lie in [0, {vocab_size})")
    return ids.astype(np.int64)


def _run_certify(args) -> int:

    if looks_like_sae(args.acts) and not any(looks_like_sae(s) for s in args.sae):
        raise ValueError(f"the activations come first: widelimit certify ACTS SAE (as certify_sae(acts, sae)); "
                         f"{args.acts!r} is an SAE and {args.sae[0]!r} is not")
    check_out_dir(args.out)
    only_with({"--hook": args.hook, "--tokens": args.tokens}, args.model is not None, "--model")
    if args.model is not None and (args.hook is None or args.tokens is None):
        raise ValueError("--model needs --hook (the submodule the SAE reads) and --tokens (token ids, .npy)")
    paths = _sae_paths(args.sae, architecture=args.architecture, norm_scaling_factor=args.norm_scaling_factor)
    model = _model(args) if args.model is not None else None  # its errors before any work
    acts = open_activations(args.acts, key=args.key, column=args.column)
    from rich.console import Console

    err = Console(stderr=True)
    if len(paths) > 1:
        return _run_sweep(args, paths, acts, err)
    with stdout_to_stderr(args.json), _progress(args, err) as cb:  # --json: fd 1 carries nothing but the JSON
        sae, cert = _certify_one(args, paths[0], acts, cb, model)
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
    con.print(certificate_table(f"widelimit certify: {paths[0]}", _certify_rows(cert)))
    for v in cert.violations[:10] if _flags_shown(cert) else []:
        con.print(f"feature {v['feature']}: {v['condition']} violated by {v['value']:.3g}")
    if _flags_shown(cert) and len(cert.violations) > 10:
        con.print(f"... {len(cert.violations) - 10} more violations (see features.csv with --out)")
    for note in cert.notes:  # the SAE's own warnings are among them
        con.print(f"note: {note}")
    for f in files:
        con.print(f"wrote {f}")
    return 0


def _flags_shown(cert) -> bool:
    """The first-order flags assume the L1 objective: listed only when it is the SAE's own."""
    return cert.lam is not None and not (cert.objective or {}).get("stand_in")


def _run_sweep(args, paths, acts, err) -> int:
    """Several SAEs on the same activations: one table (sweep.csv / JSON) and the MSE-L0 plot (sweep.png)."""
    if args.model is not None:
        raise ValueError("--model applies to one SAE at a time, got a sweep of several")
    rows, curves, names = [], [], [str(Path(p).name) or str(p) for p in paths]
    with stdout_to_stderr(args.json), _progress(args, err) as cb:
        for name, path in zip(names, paths):
            sae, cert = _certify_one(args, path, acts, cb)
            rows.append(sweep_row(name, cert))
            X = sae.preprocess(np.asarray(sample_rows(acts, min(2048, int(acts.shape[0])), args.seed), dtype=np.float64))
            curves.append(call_interruptibly(decoder_frontier, X, sae, max_iter=min(2, args.pursuit_rounds),
                                             time_limit=args.pursuit_time))
    files = []
    if args.out:
        with atomic_outputs(args.out) as tmp:
            js = Path(tmp) / "sweep.json"
            js.write_text(json.dumps(to_jsonable({"rows": rows, "curves": curves}), indent=2))
            cs = Path(tmp) / "sweep.csv"
            with open(cs, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(SWEEP_COLUMNS))
                w.writeheader()
                w.writerows(rows)
            files = moved([js, cs, plot_sweep(rows, curves, Path(tmp) / "sweep.png")], tmp, args.out)
    if args.json:
        print_json({"rows": rows, "curves": curves, "files": [str(f) for f in files]})
        return 0
    con = _console()
    con.print(_sweep_table(rows, SWEEP_COLUMNS))
    for f in files:
        con.print(f"wrote {f}")
    return 0


def _sweep_table(rows, columns):
    from rich.table import Table

    t = Table(title="widelimit certify: sweep (gain at L0 = SAE mse - best mse found at its L0; upper: proven)")
    for c in columns:
        t.add_column(c, justify="left" if c in ("sae", "architecture") else "right")
    for r in rows:
        t.add_row(*["" if r[c] is None else (r[c] if isinstance(r[c], str) else sig(r[c])) for c in columns])
    return t
