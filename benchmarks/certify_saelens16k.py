"""certify_sae on SAEs trained by SAELens's own training code at d_sae 16,384 on MiniLM activations (issue 31, item 1).

* **Activations**: all-MiniLM-L6-v2 layer 3 on the text scikit-learn ships (``certify_speed.activations``:
  :func:`widelimit.lab.lm.token_activations`, offline, 5,667 tokens, d_in 384).
* **SAEs**: d_sae 16,384, trained by :func:`widelimit.lab.saelens_train.train_saelens` (SAELens's own
  ``TrainingSAE`` classes and loss, Adam): a standard ReLU SAE (L1, ``lam = 2``: ``l1_coefficient = 4``; ``--lam``) and
  a TopK SAE (``k = 32``), ``--steps`` minibatches of ``--batch`` tokens each. Saved with SAELens's
  ``save_inference_model`` under ``--cache`` and trained in a child process (so that the training's memory
  does not hide the certification's peak).
* **Side by side**, in one child process per SAE, on the same tokens and the same threads (``--threads``,
  torch, numba and BLAS): the SAE's own forward pass (SAELens's ``encode`` / ``decode`` of the saved inference
  SAE, float32 torch) + the standard metrics (``certify_speed.forward_metrics``, the baseline of
  ``benchmarks/certify_scale.py``) against :func:`widelimit.certify_sae` with default settings, for each
  ``--tokens`` count (the first ``N`` tokens).
* **One-off vs per-token cost**: the per-SAE stages are timed inside the certification (wrapped, not
  changed): the decoder-pair search (``decoder_pairs``), the objective resolution (``resolve_objective``:
  ``lam`` calibration when there is one), the Babel function of the sparsity bracket's lower bound
  (``babel``: its row sample, and the full pass where the sample cannot decide); the per-token cost is the slope of the remaining time between the two largest ``N``.
* ``--diagnose standard``: the L1 optimal coding alone on the standard SAE: the screened coder from the SAE's
  own codes and from zero codes, its restricted solves finished by Lawson-Hanson or by the gradient iteration
  (then the float64 FISTA on tokens left uncertified), to ``results/certify_saelens16k_coder_standard.json``.
* **Memory**: peak resident memory growth (``ru_maxrss``) of the child during forward+metrics and during
  the certifications.

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=. python3 benchmarks/certify_saelens16k.py --archs topk --tokens 100,500,2000
    OMP_NUM_THREADS=1 PYTHONPATH=. python3 benchmarks/certify_saelens16k.py --diagnose standard --tokens 20

(``--archs standard`` runs too, but its certification takes about 20 s per token at d_sae 16,384: see
docs/sae_certification.md, "SAELens-trained SAEs at d_sae 16,384".)

Writes ``benchmarks/results/certify_saelens16k.{json,md}``. The machine is shared: the ratios measured side by
side in one process are the measurement, absolute times are not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import environment, write  # noqa: E402
from certify_speed import activations, forward_metrics  # noqa: E402

WIDTH = 16384
#: architecture -> SAELens training sparsity (lam for standard: l1_coefficient = 2 lam; k for topk)
SPARSITY = {"standard": 2.0, "topk": 32}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _folder(cache: Path, arch: str, steps: int, batch: int, width: int = WIDTH) -> Path:
    return cache / f"saelens_{arch}_{width}_s{SPARSITY[arch]}_steps{steps}_batch{batch}_seed0"


def train(cache: Path, arch: str, steps: int, batch: int, width: int = WIDTH) -> dict:
    """Train with SAELens's own training code and save the inference SAE; returns the training record."""
    from widelimit.lab.saelens_train import train_saelens

    X = activations(cache)
    t = time.perf_counter()
    m = train_saelens(X, arch, width=width, sparsity=SPARSITY[arch], steps=steps, batch_size=batch, seed=0)
    rec = {"arch": arch, "width": width, "steps": steps, "batch": batch, "train_s": time.perf_counter() - t}
    folder = _folder(cache, arch, steps, batch, width)
    m.save_inference_model(folder)
    (folder / "train.json").write_text(json.dumps(rec))
    return rec


class _Timed:
    """Wrap ``module.name`` to add its wall time to ``self.s`` (the call itself unchanged)."""

    def __init__(self, module, name):
        self.module, self.name, self.orig, self.s = module, name, getattr(module, name), 0.0

    def __enter__(self):
        def wrapped(*a, **kw):
            t = time.perf_counter()
            try:
                return self.orig(*a, **kw)
            finally:
                self.s += time.perf_counter() - t

        setattr(self.module, self.name, wrapped)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.orig)


def certify_timed(X, folder, threads):
    """``certify_sae`` with default settings, with its per-SAE stages timed; (certificate, seconds, stages)."""
    import widelimit.sae.certify as C
    import widelimit.sae.sparsity as S
    from widelimit import certify_sae

    with _Timed(C, "decoder_pairs") as tp, _Timed(C, "resolve_objective") as to, _Timed(S, "babel") as tb:
        t = time.perf_counter()
        cert = certify_sae(X, str(folder), threads=threads)
        total = time.perf_counter() - t
    return cert, total, {"pair_search_s": tp.s, "objective_calibration_s": to.s, "babel_s": tb.s}


def measure(cache: Path, arch: str, steps: int, batch: int, Ns: list[int], threads: int, width: int = WIDTH) -> dict:
    """One SAE, in this (child) process: forward+metrics vs certification for every N; peak memory growth."""
    import torch
    from sae_lens import SAE

    from widelimit._runtime import limit_threads

    folder = _folder(cache, arch, steps, batch, width)
    X = activations(cache)
    sl = SAE.load_from_disk(str(folder), device="cpu")
    w = {k: getattr(sl, k).detach().numpy() for k in ("W_enc", "b_enc", "W_dec", "b_dec")}

    def own_forward(x):  # the SAE's own forward pass (SAELens's encode / decode)
        f = sl.encode(x)
        return f, sl.decode(f)

    rows = []
    with limit_threads(threads):
        torch.set_num_threads(threads)
        forward_metrics(w, X[:64], forward=own_forward)  # warm-up
        certify_timed(X[:64], folder, threads)  # compiled kernels, imports
        rss0 = _rss_mb()
        fwd = {N: forward_metrics(w, X[:N], forward=own_forward) for N in Ns[:1]}
        rss_fwd = _rss_mb() - rss0
        for N in Ns:
            xs = X[:N]
            t = time.perf_counter()
            fm = forward_metrics(w, xs, forward=own_forward)
            t_fwd = time.perf_counter() - t
            rss1 = _rss_mb()
            cert, t_cert, stages = certify_timed(xs, folder, threads)
            one_off = sum(stages.values())
            row = {"arch": arch, "tokens": N, "sae_l0": fm["l0"], "sae_mse": fm["mse"],
                   "explained_variance": fm["explained_variance"], "forward_metrics_s": t_fwd, "certify_s": t_cert,
                   "ratio": t_cert / t_fwd, "tokens_per_s": N / t_cert, "forward_tokens_per_s": N / t_fwd,
                   **stages, "one_off_s": one_off, "ratio_without_one_off": (t_cert - one_off) / t_fwd,
                   "certify_rss_growth_mb": _rss_mb() - rss1, "lam": cert.lam, "coding_gap": cert.coding_gap,
                   "coding_max_gap": cert.coding_max_gap, "coding_certified": cert.coding_certified,
                   "optimal_l0": cert.metrics.get("optimal_l0"), "global_gap": cert.global_gap,
                   "certified_l0_mse": None if cert.metrics.get("mse") is None else cert.metrics["mse"]}
            if cert.sparsity is not None:
                sp = cert.sparsity
                row.update({"l0_bracket": [sp["lower_bound"], sp["value"]], "l0_bracket_sae_mse": sp["sae_value"],
                            "l0_bracket_gain": sp["gain"], "l0_bracket_status": sp["status"],
                            "l0_bracket_time_s": sp["time_s"], "l0_bracket_batches_stopped": sp["batches_stopped_by_time"]})
            rows.append(row)
            print(json.dumps(row, default=float), file=sys.stderr, flush=True)
    a, b = rows[-2] if len(rows) > 1 else rows[-1], rows[-1]
    per_token = ((b["certify_s"] - b["one_off_s"]) - (a["certify_s"] - a["one_off_s"])) / max(1, b["tokens"] - a["tokens"])
    fwd_per_token = (b["forward_metrics_s"] - a["forward_metrics_s"]) / max(1, b["tokens"] - a["tokens"])
    train_rec = json.loads((folder / "train.json").read_text())
    return {"arch": arch, "train": train_rec, "rows": rows, "forward_rss_growth_mb": rss_fwd,
            "certify_peak_rss_growth_mb": _rss_mb() - rss0, "threads": threads,
            "per_token_certify_s": per_token, "per_token_forward_s": fwd_per_token,
            "asymptotic_ratio": per_token / fwd_per_token if fwd_per_token > 0 else None}


def coder_diagnosis(cache: Path, arch: str, steps: int, batch: int, tokens: int, threads: int, width: int = WIDTH,
                    fista_tokens: int = 3) -> dict:
    """What the L1 optimal coding of ``certify_sae`` does on this SAE, per variant of the screened coder (its
    default above d_sae 8,192) on ``tokens`` tokens: from the SAE's own codes or from zero codes, restricted
    solves finished by Lawson-Hanson (the default) or by the gradient iteration alone (``"newton"``) -- time,
    rounds, tokens left uncertified, largest relative gap, objective -- and the float64 FISTA that finishes
    the uncertified ones, on ``fista_tokens`` of them (of the last variant that left any)."""
    import scipy.sparse as sp
    import torch

    from widelimit._runtime import limit_threads
    from widelimit.coding.fista import fista_codes
    from widelimit.coding.screened import ScreenedCoder
    from widelimit.sae.formats import as_sae
    from widelimit.sae.objective import resolve_objective

    sae = as_sae(str(_folder(cache, arch, steps, batch, width)))
    X = sae.preprocess(activations(cache)[:tokens].astype(np.float64))
    lam = resolve_objective(sae, X).lam
    U, b = sae.unit_dictionary(), np.asarray(sae.b_dec, dtype=np.float64)
    f = sae.encode(X)
    out = {"arch": arch, "lam": lam, "tokens": tokens, "sae_l0": float((f != 0).sum(1).mean()), "variants": []}
    left = None
    with limit_threads(threads):
        torch.set_num_threads(threads)
        for start in ("sae", "zero"):
            for restricted in ("newton", "lawson_hanson"):
                coder = ScreenedCoder(U, lam=lam, tol=1e-6, device="cpu", restricted=restricted)
                Y0 = sp.csr_array(f * sae.decoder_norms()) if start == "sae" else None
                t = time.perf_counter()
                res = coder.solve(torch.as_tensor(X - b), Y0)
                rows = res.unconverged_rows()
                left = rows if rows.size else left
                out["variants"].append({
                    "start": start, "restricted": restricted, "screened_s": time.perf_counter() - t,
                    "rounds": int(res.n_iter), "uncertified": int(rows.size), "objective": float(res.point_values.sum()),
                    "optimal_l0": float(np.diff(res.codes.indptr).mean()),
                    "max_rel_gap": float(np.max(res.point_gaps / np.maximum(res.point_values, 1e-300)))})
        if left is not None:
            r = left[:fista_tokens]
            t = time.perf_counter()
            fr = fista_codes(X[r], U, b, lam=lam, tol=1e-6, return_codes=True, dtype="float64", max_iter=20000)
            out.update(fista_tokens=int(r.size), fista_s=time.perf_counter() - t, fista_iterations=int(fr.n_iter),
                       fista_certified=bool(fr.certified), fista_l0=float(np.diff(fr.codes.indptr).mean()))
    return out


def _child(args, *extra) -> subprocess.CompletedProcess:
    cmd = [sys.executable, __file__, "--cache", str(args.cache), "--steps", str(args.steps), "--batch",
           str(args.batch), "--tokens", args.tokens, "--threads", str(args.threads), "--width", str(args.width), "--lam", str(args.lam), "--k", str(args.k), *extra]
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)


def table(results: list[dict]) -> str:
    cols = ["SAE", "steps", "tokens", "SAE L0", "EV", "forward+metrics s", "certify s", "**ratio**",
            "pair search s", "babel s", "calib. s", "ratio w/o one-off", "cert tok/s", "coding gap", "L0 bracket [lower, witness]",
            "cert RSS MB"]
    fmt = (lambda v: "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
    md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    for res in results:
        for r in res["rows"]:
            br = r.get("l0_bracket")
            vals = [f"{r['arch']} ({'lam' if r['arch'] == 'standard' else 'k'} {SPARSITY[r['arch']]})",
                    res["train"]["steps"], r["tokens"], r["sae_l0"], r["explained_variance"], r["forward_metrics_s"],
                    r["certify_s"], r["ratio"], r["pair_search_s"], r["babel_s"], r["objective_calibration_s"],
                    r["ratio_without_one_off"], r["tokens_per_s"], r["coding_gap"],
                    None if br is None else f"[{br[0]:.4g}, {br[1]:.4g}] (SAE {r['l0_bracket_sae_mse']:.4g})",
                    r["certify_rss_growth_mb"]]
            md += "| " + " | ".join(fmt(v) for v in vals) + " |\n"
    md += "\n| SAE | train s | per-token certify ms | per-token forward ms | asymptotic ratio | forward RSS MB | certify peak RSS MB |\n"
    md += "|---|---|---|---|---|---|---|\n"
    for res in results:
        md += (f"| {res['arch']} | {res['train']['train_s']:.0f} | {1e3 * res['per_token_certify_s']:.3g} | "
               f"{1e3 * res['per_token_forward_s']:.3g} | {fmt(res['asymptotic_ratio'])} | "
               f"{res['forward_rss_growth_mb']:.0f} | {res['certify_peak_rss_growth_mb']:.0f} |\n")
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="100,500,2000", help="comma-separated token counts (the first N tokens)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--archs", default="topk", help="comma-separated: topk, standard")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lam", type=float, default=SPARSITY["standard"], help="the standard SAE's lam (l1_coefficient / 2)")
    ap.add_argument("--k", type=int, default=SPARSITY["topk"], help="the TopK SAE's k")
    ap.add_argument("--width", type=int, default=WIDTH, help="d_sae (16,384; smaller only to check the script)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "widelimit-certify-speed")
    ap.add_argument("--train", help=argparse.SUPPRESS)  # child: train this architecture
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # child: measure this architecture
    ap.add_argument("--diagnose", metavar="ARCH", help="only the L1 coder diagnosis of this SAE (--tokens: its first "
                    "count), written to results/certify_saelens16k_coder_<ARCH>.json")
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    Ns = [int(v) for v in args.tokens.split(",")]
    SPARSITY.update(standard=args.lam, topk=args.k)
    if args.train:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(train(args.cache, args.train, args.steps, args.batch, args.width)))
        return
    if args.diagnose:
        d = coder_diagnosis(args.cache, args.diagnose, args.steps, args.batch, Ns[0], args.threads, args.width)
        d.update(command=" ".join(sys.argv), threads=args.threads, width=args.width, steps=args.steps,
                 environment=environment())
        (HERE / "results" / f"certify_saelens16k_coder_{args.diagnose}.json").write_text(json.dumps(d, indent=2))
        print(json.dumps(d, indent=2))
        return
    if args.measure:
        print(json.dumps(measure(args.cache, args.measure, args.steps, args.batch, Ns, args.threads, args.width), default=float))
        return
    results = []
    for arch in args.archs.split(","):
        if not (_folder(args.cache, arch, args.steps, args.batch, args.width) / "train.json").exists():
            _child(args, "--train", arch)
        results.append(json.loads(_child(args, "--measure", arch).stdout))
    name = "certify_saelens16k" + ("" if args.width == WIDTH else f"_w{args.width}")
    write(name, {"environment": environment(), "threads": args.threads, "width": args.width,
                                 "sparsity": SPARSITY, "tokens": Ns, "command": " ".join(sys.argv), "results": results},
          table(results))


if __name__ == "__main__":
    main()
