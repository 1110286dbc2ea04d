"""Codes at an SAE's own L0, side by side: widelimit's pursuit against dictionary_learning's grad_pursuit
(nonnegative) and scikit-learn's OMP (signed, a reference), on the decoders of L0-trained SAEs that SAELens's
own training code trains on MiniLM activations (widelimit.lab.lm, offline).

    python3 benchmarks/l0_pursuit.py [--steps 1500] [--width 512] [--k 16] [--saes DIR]

For each architecture (SAELens TopK, BatchTopK, JumpReLU, Matryoshka BatchTopK) on the same tokens and the
same per-token budgets (k for TopK; the SAE's own count per token otherwise: grad_pursuit and OMP run on the
tokens of each count with that target): the SAE's own MSE, widelimit's bracket [lower bound, witness MSE],
grad_pursuit's MSE and OMP's, and the seconds of each (ratios to widelimit's). The SAEs are saved under
--saes (default benchmarks/results/l0_saes) for docs/sae_certification.md's worked example.
Writes benchmarks/results/l0_pursuit.json and .md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def activations(layer: int, cache: Path | None):
    """MiniLM token activations (float32), cached in ``cache`` when given."""
    if cache is not None and cache.exists():
        return np.load(cache)
    from widelimit.lab import lm

    X = np.asarray(lm.token_activations(lm.shipped_text(), layer=layer)[0], dtype=np.float32)
    if cache is not None:
        np.save(cache, X)
    return X


def train(arch: str, X, *, width: int, k: int, steps: int, l0_coefficient: float, seed: int = 0):
    """An SAE trained by SAELens's own training classes (its ``training_forward_pass`` loss, Adam)."""
    from widelimit.lab.saelens_train import train_saelens

    return train_saelens(X, arch, width=width, sparsity=l0_coefficient if arch == "jumprelu" else k, steps=steps,
                         seed=seed)


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
    ap.add_argument("--l0-coefficient", type=float, default=0.5)
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
           "steps": args.steps, "max_iter": args.max_iter, "note": "other jobs were running on the 2-core machine"}
    lines = ["| architecture | SAE MSE | widelimit bracket [lower, witness] | grad_pursuit | OMP (signed) | L0 | "
             "seconds widelimit / grad_pursuit / OMP |", "|---|---|---|---|---|---|---|"]
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
               "tokens_grad_pursuit_better": int((mse_gp < r.point_values - 1e-9).sum()),
               "seconds": {"widelimit": t_wl, "grad_pursuit": t_gp, "omp": t_omp},
               "time_ratio_grad_pursuit": t_gp / t_wl, "rounds": r.n_iter}
        assert row["witness_mse"] <= row["sae_mse"] and row["witness_mse"] <= row["grad_pursuit_mse"], row
        res[arch] = row
        lines.append(f"| {arch} | {sae_mse:.4g} | [{r.lower_bound:.4g}, {r.value:.4g}] | {mse_gp.mean():.4g} | "
                     f"{mse_omp.mean():.4g} | {own.mean():.4g} | {t_wl:.3g} / {t_gp:.3g} / {t_omp:.3g} |")
        print(lines[-1], flush=True)
        args.out.mkdir(parents=True, exist_ok=True)  # after each architecture: a cut run keeps what it did
        (args.out / "l0_pursuit.json").write_text(json.dumps(res, indent=2, default=float))
        (args.out / "l0_pursuit.md").write_text("\n".join(lines) + "\n\n(" + res["note"] + ")\n")


if __name__ == "__main__":
    main()
