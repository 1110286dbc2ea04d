"""Codes at an SAE's own L0, side by side: widelimit's pursuit against dictionary_learning's grad_pursuit
(nonnegative) and scikit-learn's OMP (signed, a reference), on the decoders of L0-trained SAEs that SAELens's
own training code trains on MiniLM activations (widelimit.lab.lm, offline).

    python3 benchmarks/l0_pursuit.py [--steps 1500] [--width 512] [--k 16] [--saes DIR]

For each architecture (SAELens TopK, BatchTopK, JumpReLU, Matryoshka BatchTopK) on the same tokens and the
same per-token budgets (k for TopK; the SAE's own count per token otherwise: grad_pursuit and OMP run on the
tokens of each count with that target): the SAE's own MSE, widelimit's bracket [lower bound, witness MSE],
grad_pursuit's MSE and OMP's, the number of tokens on which grad_pursuit's codes are better than widelimit's
witness (target 0: widelimit's pursuit starts from gradient pursuit's support too), and the seconds of each. The SAEs are saved under
--saes (default benchmarks/results/l0_saes) for docs/sae_certification.md's worked example.
Writes benchmarks/results/l0_pursuit.json and .md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def command(name: str) -> str:
    """The command line that reproduces a run (``--cache``, which only saves the MiniLM pass, left out)."""
    argv, out, skip = sys.argv[1:], [], False
    for a in argv:
        if skip or a == "--cache" or a.startswith("--cache="):
            skip = a == "--cache" and not skip
            continue
        out.append(a)
    return " ".join(["python3", f"benchmarks/{name}.py"] + out)


def activations(layer: int, cache: Path | None):
    """MiniLM token activations (float32), cached in ``cache`` when given."""
    if cache is not None and cache.exists():
        return np.load(cache)
    from widelimit.lab import lm

    X = np.asarray(lm.token_activations(lm.shipped_text(), layer=layer)[0], dtype=np.float32)
    if cache is not None:
        np.save(cache, X)
    return X


#: JumpReLU's initial threshold: with l0_coefficient 5, Adam at 1e-3 and 300 steps on these tokens, 0.05 leaves
#: L0 near 300 (the threshold moves at most ~lr per step), 0.3 kills every feature; 0.23 gives L0 near 50.
JUMPRELU_INIT_THRESHOLD = 0.23


def train(arch: str, X, *, width: int, k: int, steps: int, l0_coefficient: float, seed: int = 0):
    """An SAE trained by SAELens's own training classes (its ``training_forward_pass`` loss, Adam)."""
    from widelimit.lab.saelens_train import train_saelens

    jr = arch == "jumprelu"
    return train_saelens(X, arch, width=width, sparsity=l0_coefficient if jr else k, steps=steps, seed=seed, lr=1e-3,
                         config={"jumprelu_init_threshold": JUMPRELU_INIT_THRESHOLD} if jr else None)


def grad_pursuit_module():
    """dictionary_learning's grad_pursuit.py (its package __init__ needs nnsight: loaded from the file itself)."""
    spec = importlib.util.find_spec("dictionary_learning")
    path = Path(spec.submodule_search_locations[0]) / "grad_pursuit.py"
    s = importlib.util.spec_from_file_location("dictionary_learning_grad_pursuit", path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def peers(X, sae, budget):
    """grad_pursuit's and OMP's per-token MSE at the same budgets (grouped by budget), and their seconds."""
    import torch
    from sklearn.linear_model import orthogonal_mp

    gp = grad_pursuit_module()
    W, b = np.asarray(sae.W_dec, dtype=np.float64), np.asarray(sae.b_dec, dtype=np.float64)
    xt = np.asarray(X, dtype=np.float64) - b
    mse_gp, mse_omp = np.empty(len(X)), np.empty(len(X))
    t_gp = t_omp = 0.0
    U = W / np.linalg.norm(W, axis=1, keepdims=True)
    for s in np.unique(budget):
        idx = np.flatnonzero(budget == s)
        if s == 0:
            mse_gp[idx] = mse_omp[idx] = (xt[idx] ** 2).sum(1)
            continue
        t = time.perf_counter()
        w = gp.grad_pursuit(torch.as_tensor(xt[idx], dtype=torch.float32), torch.as_tensor(W.T, dtype=torch.float32),
                            target_l0=int(s)).double().numpy()
        t_gp += time.perf_counter() - t
        assert ((w > 0).sum(1) <= s).all()
        r = xt[idx] - w @ W
        mse_gp[idx] = (r * r).sum(1)
        t = time.perf_counter()
        c = orthogonal_mp(U.T, xt[idx].T, n_nonzero_coefs=int(min(s, U.shape[1])))
        t_omp += time.perf_counter() - t
        r = xt[idx] - np.asarray(c).reshape(U.shape[0], -1).T @ U
        mse_omp[idx] = (r * r).sum(1)
    return mse_gp, t_gp, mse_omp, t_omp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--l0-coefficient", type=float, default=5.0,
                    help="JumpReLU's L0 coefficient (5: an L0 near the TopK SAEs' k at width 512)")
    ap.add_argument("--max-iter", type=int, default=8)
    ap.add_argument("--archs", default="topk,batchtopk,jumprelu,matryoshka")
    ap.add_argument("--cache", type=Path, default=None, help="cache the activations here (.npy)")
    ap.add_argument("--saes", type=Path, default=HERE / "results" / "l0_saes")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()

    import scipy.sparse as sp

    from widelimit.coding.pursuit import PursuitOptions, sparse_codes
    from widelimit.sae.formats import load_sae
    from widelimit.sae.sparsity import budget_rule

    X = activations(args.layer, args.cache)
    res = {"n_tokens": int(X.shape[0]), "d_in": int(X.shape[1]), "width": args.width, "k": args.k,
           "steps": args.steps, "max_iter": args.max_iter, "l0_coefficient": args.l0_coefficient,
           "command": command("l0_pursuit"),
           "note": "seconds on a shared 2-core CPU machine with other jobs running: ratios only roughly"}
    head = (f"Codes at the SAE's own L0 on the same decoder and per-token budgets (MiniLM layer {args.layer}, "
            f"{X.shape[0]:,} tokens, d_in {X.shape[1]}; SAELens SAEs of width {args.width}, k {args.k}, JumpReLU "
            f"l0_coefficient {args.l0_coefficient:g}, {args.steps} training steps; widelimit's pursuit with "
            f"{args.max_iter} rounds). Produced by\n\n    {res['command']}\n\n")
    lines = ["| architecture | SAE MSE | widelimit bracket [lower, witness] | grad_pursuit | OMP (signed) | L0 | "
             "tokens where grad_pursuit is better | seconds widelimit / grad_pursuit / OMP |",
             "|---|---|---|---|---|---|---|---|"]
    for arch in args.archs.split(","):
        t = time.perf_counter()
        m = train(arch, X, width=args.width, k=args.k, steps=args.steps, l0_coefficient=args.l0_coefficient)
        t_train = time.perf_counter() - t
        folder = args.saes / arch
        m.save_inference_model(folder)
        sae = load_sae(folder)
        Xp = sae.preprocess(X.astype(np.float64))
        f = sae.encode(Xp)
        own = (f != 0).sum(1)
        kk, _ = budget_rule(sae)
        budget = np.full(len(X), kk) if kk is not None else own
        t = time.perf_counter()
        r = sparse_codes(Xp, sae.W_dec, sae.b_dec, budget=budget, Z0=sp.csr_array(f),
                         opts=PursuitOptions(max_iter=args.max_iter), device="cpu")
        t_wl = time.perf_counter() - t
        mse_gp, t_gp, mse_omp, t_omp = peers(Xp, sae, budget)
        sae_mse = float(((Xp - sae.decode(f)) ** 2).sum(1).mean())
        row = {"architecture": arch, "saved_as": sae.architecture, "train_seconds": t_train, "sae_mse": sae_mse,
               "sae_l0": float(own.mean()), "witness_mse": r.value, "lower_bound": r.lower_bound, "bound": r.status,
               "witness_l0": r.l0, "grad_pursuit_mse": float(mse_gp.mean()), "omp_signed_mse": float(mse_omp.mean()),
               # per token, beyond the rounding of an NNLS refit (relative 1e-10)
               "tokens_grad_pursuit_better": int((mse_gp * (1 + 1e-10) < r.point_values).sum()),
               "tokens_omp_signed_better": int((mse_omp * (1 + 1e-10) < r.point_values).sum()),
               "seconds": {"widelimit": t_wl, "grad_pursuit": t_gp, "omp": t_omp},
               "time_ratio_grad_pursuit": t_gp / t_wl, "rounds": r.n_iter}
        assert row["witness_mse"] <= row["sae_mse"] and row["witness_mse"] <= row["grad_pursuit_mse"], row
        res[arch] = row
        lines.append(f"| {arch} | {sae_mse:.4g} | [{r.lower_bound:.4g}, {r.value:.4g}] | {mse_gp.mean():.4g} | "
                     f"{mse_omp.mean():.4g} | {own.mean():.4g} | {row['tokens_grad_pursuit_better']} of {len(X)} | "
                     f"{t_wl:.3g} / {t_gp:.3g} / {t_omp:.3g} |")
        print(lines[-1], flush=True)
        args.out.mkdir(parents=True, exist_ok=True)  # after each architecture: a cut run keeps what it did
        (args.out / "l0_pursuit.json").write_text(json.dumps(res, indent=2, default=float))
        (args.out / "l0_pursuit.md").write_text(head + "\n".join(lines) + "\n\n(" + res["note"] + ")\n")


if __name__ == "__main__":
    main()
