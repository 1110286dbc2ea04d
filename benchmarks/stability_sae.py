"""Benchmark: feature_stability on an SAE-sized problem against an SAE forward pass + metrics, side by side.

Problem (the SAE issue's size by default): d_sae = 4096 unit atoms (random directions) in d_in = 768,
N = 20,000 tokens ``x = b + sum of 20 atoms with Exp(1) + lam magnitudes + 0.05 N(0, I)``, lam = 0.2,
codes = the generating magnitudes minus lam (sparse, 20 per token; not optimal, so most features
fail a condition and the witness search runs for ``--witnesses`` of them).

Peer: one SAE forward pass in torch float32 on the CPU (encoder ``relu(x W_enc + b_enc)`` with
``W_enc = W_dec^T``, decoder, then MSE, L0, L1, explained variance), the work a certification does
at least once. Both are timed in the same run; the ratio is reported. The machine is shared (2 cores,
other jobs), so single timings are noisy; the ratio of one side-by-side run is what counts.

Run:  PYTHONPATH=. python3 benchmarks/stability_sae.py [--tokens 20000] [--d-sae 4096] [--d-in 768]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp

from _common import write


def make(N, k, n, active, lam, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((k, n)).astype(np.float32)
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    b = rng.standard_normal(n).astype(np.float32) * 0.1
    cols = np.stack([rng.choice(k, active, replace=False) for _ in range(N)])
    mags = rng.exponential(1.0, (N, active)) + lam
    S = sp.csr_array((mags.ravel(), cols.ravel(), np.arange(0, N * active + 1, active)), shape=(N, k))
    X = (S @ W + b + 0.05 * rng.standard_normal((N, n))).astype(np.float32)
    Z = sp.csr_array((np.maximum(mags - lam, 0).ravel(), cols.ravel(), np.arange(0, N * active + 1, active)),
                     shape=(N, k))
    return X, W, Z, b


def forward(X, W, b, batch=4096):
    import torch

    Wd = torch.as_tensor(W)
    We = Wd.T.contiguous()
    be = torch.zeros(W.shape[0])
    bt = torch.as_tensor(b)
    mse = l0 = l1 = 0.0
    for s in range(0, X.shape[0], batch):
        x = torch.as_tensor(X[s:s + batch])
        f = torch.relu((x - bt) @ We + be - 0.5)
        xh = f @ Wd + bt
        mse += float(((xh - x) ** 2).sum())
        l0 += float((f > 0).sum())
        l1 += float(f.sum())
    N = X.shape[0]
    var = float(((X - X.mean(0)) ** 2).sum(1).mean())
    return {"mse": mse / N, "l0": l0 / N, "l1": l1 / N, "explained_variance": 1 - mse / N / var}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--d-sae", type=int, default=4096)
    ap.add_argument("--d-in", type=int, default=768)
    ap.add_argument("--active", type=int, default=20)
    ap.add_argument("--lam", type=float, default=0.2)
    ap.add_argument("--witnesses", type=int, default=8)
    a = ap.parse_args()
    import widelimit as wl

    X, W, Z, b = make(a.tokens, a.d_sae, a.d_in, a.active, a.lam)
    forward(X[:256], W, b)  # warm-up (torch threads)
    t0 = time.perf_counter()
    m = forward(X, W, b)
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = wl.feature_stability(X, W, Z, b, lam=a.lam, max_witnesses=a.witnesses, keep_witnesses=False, max_lp=8)
    t_stab = time.perf_counter() - t0
    counts = res.as_dict()["counts"]
    payload = {"tokens": a.tokens, "d_sae": a.d_sae, "d_in": a.d_in, "active": a.active, "lam": a.lam,
               "witnesses_searched": a.witnesses, "forward_s": t_fwd, "feature_stability_s": t_stab,
               "ratio": t_stab / t_fwd, "counts": counts, "forward_metrics": m,
               "n_witnesses": len(res.witness_values)}
    md = (f"| tokens | d_sae | d_in | SAE forward + metrics (s) | feature_stability (s) | ratio | verdicts |\n"
          f"|---|---|---|---|---|---|---|\n"
          f"| {a.tokens} | {a.d_sae} | {a.d_in} | {t_fwd:.2f} | {t_stab:.2f} | {t_stab / t_fwd:.1f} | {counts} |\n")
    write(f"stability_sae_{a.tokens}_{a.d_sae}", payload, md)


if __name__ == "__main__":
    main()
