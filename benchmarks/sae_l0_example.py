"""Worked example of docs/sae_certification.md ("L0-trained SAEs"): a TopK and a JumpReLU SAE trained by
SAELens's own training classes on MiniLM activations (offline), saved as SAELens folders and certified by
``widelimit certify`` against their own sparsity.

    python3 benchmarks/sae_l0_example.py [--steps 600] [--width 512] [--k 16] [--l0-coefficient 5]

Writes benchmarks/results/sae_l0_example.json (the certificates' JSON) and .md (the tables as printed).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


def why_no_bound(sae, X) -> dict:
    """The two tests of theory.md §10.3 at the SAE's largest per-token budget ``s``: Babel ``mu_1(s - 1)`` (the
    restricted-eigenvalue bound needs it below 1) and the number of supports ``C(d_sae, s)`` (enumerated only up
    to ``SparsityOptions().max_subsets``)."""
    import math

    import torch

    from widelimit.coding.sparse_bound import babel
    from widelimit.sae.sparsity import SparsityOptions, budget_rule

    k, _ = budget_rule(sae)
    s = int(k) if k is not None else int((sae.encode(sae.preprocess(np.asarray(X, dtype=np.float64))) != 0)
                                         .sum(1).max())
    mu = babel(torch.as_tensor(sae.unit_dictionary()), s)
    return {"budget": s, "babel_mu1_s_minus_1": float(mu[s]), "subsets": float(math.comb(int(sae.d_sae), s)),
            "max_subsets": SparsityOptions().max_subsets}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--l0-coefficient", type=float, default=5.0)
    ap.add_argument("--pursuit-rounds", type=int, default=4)
    ap.add_argument("--cache", type=Path, default=None, help="cache the activations here (.npy)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()

    from rich.console import Console

    import widelimit as wl
    from l0_pursuit import activations, command, train
    from widelimit._json import to_jsonable
    from widelimit.cli._common import certificate_table
    from widelimit.sae.formats import load_sae
    from widelimit.sae.report import certificate_rows
    from widelimit.sae.sparsity import SparsityOptions

    X = activations(args.layer, args.cache)
    buf = io.StringIO()
    con = Console(file=buf, width=160, force_terminal=False)
    out = {"layer": args.layer, "n_tokens": int(X.shape[0]), "d_in": int(X.shape[1]), "width": args.width,
           "k": args.k, "steps": args.steps, "l0_coefficient": args.l0_coefficient,
           "command": command("sae_l0_example")}
    root = Path(tempfile.mkdtemp())
    for arch in ("topk", "jumprelu"):
        t = time.perf_counter()
        m = train(arch, X, width=args.width, k=args.k, steps=args.steps, l0_coefficient=args.l0_coefficient)
        t_train = time.perf_counter() - t
        m.save_inference_model(root / arch)
        sae = load_sae(root / arch)
        t = time.perf_counter()
        # a time limit well above the pass: the rounds, not the clock, decide the result (reproducible)
        cert = wl.certify_sae(X, sae, device="cpu",
                              sparsity=SparsityOptions(max_iter=args.pursuit_rounds, time_limit=3600.0))
        t_cert = time.perf_counter() - t
        con.print(certificate_table(f"widelimit certify acts.npy {arch}/  (SAELens {arch}, width {args.width})",
                                    certificate_rows(cert)))
        for note in cert.notes:
            con.print(f"note: {note}")
        out[arch] = {"train_seconds": t_train, "certify_seconds": t_cert, "certificate": cert.as_dict(),
                     "flat": cert.as_flat_dict(), "why_no_bound": why_no_bound(sae, X)}
        con.print(f"why no lower bound: {out[arch]['why_no_bound']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sae_l0_example.json").write_text(json.dumps(to_jsonable(out), indent=2))
    (args.out / "sae_l0_example.md").write_text("```\n" + buf.getvalue() + "```\n")
    print(buf.getvalue())


if __name__ == "__main__":
    main()
