"""Worked example for docs/sae_certification.md: real MiniLM activations, a trained SAE, widelimit's certificate,
and the same SAE through SAELens' own evals, offline.

    python3 benchmarks/sae_minilm_example.py [--width 256] [--time-limit 90]

Writes benchmarks/results/sae_minilm_example.json and .md (the certify table and the comparison).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--lam", type=float, default=2.0)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=90.0)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()

    import torch
    from rich.console import Console

    import widelimit as wl
    from widelimit.cli._common import certificate_table
    from widelimit.lab import lm
    from widelimit.sae.downstream import embedding_distortion
    from widelimit.sae.formats import save_saelens
    from widelimit.sae.report import certificate_rows
    from widelimit.sae.saelens_evals import saelens_sparsity_and_variance

    torch.manual_seed(0)
    t0 = time.perf_counter()
    texts = lm.shipped_text()
    X, _ = lm.token_activations(texts, layer=args.layer)
    X = np.asarray(X, dtype=np.float32)
    out = {"layer": args.layer, "n_tokens": int(X.shape[0]), "d_in": int(X.shape[1]), "lam": args.lam,
           "width": args.width, "seconds_activations": time.perf_counter() - t0}
    buf = io.StringIO()
    con = Console(file=buf, width=150, force_terminal=False)
    import tempfile

    folder = Path(tempfile.mkdtemp()) / "sae"  # the SAELens folder (not kept)
    for name, kw in (("standard", {"encoder": "standard", "lr": 3e-3}),
                     ("topk", {"encoder": "topk", "topk": args.topk, "lr": 3e-3})):
        t1 = time.perf_counter()
        fit = wl.fit_dictionary(X, lam=args.lam, width=args.width, seed=0, device="cpu", time_limit=args.time_limit, **kw)
        sae = fit.to_sae()
        t_fit = time.perf_counter() - t1
        t1 = time.perf_counter()
        # the standard SAE is certified at its own lam (recorded as l1_coefficient); the TopK one without a lam:
        # calibrated at equal L0
        cert = wl.certify_sae(X, sae if name == "standard" else _without_l1(sae), device="cpu")
        t_cert = time.perf_counter() - t1
        con.print(certificate_table(f"widelimit certify: MiniLM layer {args.layer}, {name} SAE, width {args.width}",
                                    certificate_rows(cert)))
        rec = {"fit_seconds": t_fit, "certify_seconds": t_cert, "flat": cert.as_flat_dict(),
               "objective": cert.objective}
        if name == "standard":
            save_saelens(sae, folder)
            import sae_lens

            sl = sae_lens.SAE.load_from_disk(folder)
            per = 16 * 8
            ref = saelens_sparsity_and_variance(sl, X, ctx=16, batch_prompts=8)
            n = ref["n_tokens"]
            ours = wl.certify_sae(X[:n], sae, device="cpu").metrics
            rec["saelens_evals"] = {k: ref[k] for k in ("mse", "explained_variance", "cossim", "l2_ratio",
                                                       "relative_reconstruction_bias", "l0", "l1")}
            rec["widelimit_same_tokens"] = {k: ours[k] for k in rec["saelens_evals"]}
            rec["saelens_n_tokens"] = n
            tok, model = lm._load(str(lm.minilm_path()), "cpu")
            rec["embedding_distortion"] = embedding_distortion(model, tok, texts[:200], sae, layer=args.layer)
            con.print(f"SAELens evals on the same {n} tokens ({n // per} batches of {per}):")
            for k, v in rec["saelens_evals"].items():
                con.print(f"  {k:30s} SAELens {v:.6g}   widelimit {rec['widelimit_same_tokens'][k]:.6g}")
            con.print(f"MiniLM sentence embeddings with the SAE spliced after block {args.layer}: "
                      f"{rec['embedding_distortion']}")
        out[name] = rec
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sae_minilm_example.json").write_text(json.dumps(out, indent=2, default=float))
    (args.out / "sae_minilm_example.md").write_text("```\n" + buf.getvalue() + "```\n")
    print(buf.getvalue())


def _without_l1(sae):
    from dataclasses import replace

    return replace(sae, l1_coefficient=None, warnings=list(sae.warnings))


if __name__ == "__main__":
    main()
