"""Trained-looking SAEs at the widths people train, for benchmarks/certify_scale.py (no training needed).

Data from a sparse ground-truth dictionary: ``D`` (d_sae unit atoms in d_in dimensions, random), each
token ``x = b + sum_{j in S} a_j d_j + noise`` with ``|S| = L`` atoms drawn at random and amplitudes
``a_j ~ U(1, 3)``. The SAE: decoder a perturbed copy of ``D`` (each atom plus noise of norm ~0.1,
renormalised to norms ``U(0.8, 1.2)``), tied encoder ``W_enc = U^T`` (unit rows) with bias ``-theta``,
``theta`` chosen on a sample so that the SAE's L0 is about ``L`` (a realistic trained L0), ``b_dec = b``.
``lam`` is chosen on a sample so that the optimal codes' L0 is about ``L`` too.
"""

from __future__ import annotations

import numpy as np


def dictionary(d_in: int, d_sae: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    D = rng.standard_normal((d_sae, d_in), dtype=np.float32)
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    return D


def tokens(D: np.ndarray, N: int, L: int, seed: int = 1, noise: float = 0.05) -> np.ndarray:
    """``N`` tokens of ``L`` atoms of ``D`` each (float32)."""
    rng = np.random.default_rng(seed)
    k, n = D.shape
    b = np.linspace(-0.5, 0.5, n, dtype=np.float32)
    X = np.empty((N, n), dtype=np.float32)
    for s in range(0, N, 1024):
        m = min(1024, N - s)
        idx = np.argsort(rng.random((m, k), dtype=np.float32), axis=1)[:, :L] if k <= 4 * L else \
            rng.integers(0, k, (m, L))
        amp = rng.uniform(1.0, 3.0, (m, L)).astype(np.float32)
        X[s : s + m] = b + np.einsum("ml,mln->mn", amp, D[idx]) + noise * rng.standard_normal((m, n), dtype=np.float32)
    return X


def sae_weights(D: np.ndarray, X_sample: np.ndarray, L: int, seed: int = 2) -> dict:
    """Perturbed decoder, tied encoder with bias set for SAE L0 ~ ``L``."""
    rng = np.random.default_rng(seed)
    k, n = D.shape
    U = D + (0.1 / np.sqrt(n)) * rng.standard_normal((k, n), dtype=np.float32)
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    norms = rng.uniform(0.8, 1.2, (k, 1)).astype(np.float32)
    b = np.linspace(-0.5, 0.5, n, dtype=np.float32)
    pre = (X_sample - b) @ U.T
    theta = float(np.quantile(pre, 1.0 - L / k))
    W_dec = U * norms
    # tied encoder on unit atoms: f = relu(<u_d, x - b> - theta) / ||w_d|| so that f_d ||w_d|| is the unit code
    W_enc = (U / norms).T.copy()
    b_enc = (-theta / norms[:, 0]).astype(np.float32)
    return {k_: np.ascontiguousarray(v, dtype=np.float32)
            for k_, v in {"W_dec": W_dec, "b_dec": b, "W_enc": W_enc, "b_enc": b_enc}.items()}


def choose_lam(w: dict, X_sample: np.ndarray, L: int) -> float:
    """``lam`` with optimal-code L0 about ``L`` on the sample (bisection on log lam, certified codes)."""
    from widelimit.coding import optimal_codes

    lo, hi = 0.01, 3.0
    best = None
    for _ in range(7):
        mid = float(np.sqrt(lo * hi))
        res = optimal_codes(X_sample, w["W_dec"], w["b_dec"], lam=mid, device="cpu", tol=1e-4)
        l0 = res.codes.nnz / X_sample.shape[0]
        if best is None or abs(l0 - L) < abs(best[1] - L):
            best = (mid, l0)
        if abs(l0 - L) < 0.1 * L:
            break
        lo, hi = (mid, hi) if l0 > L else (lo, mid)
    return best[0]


def to_sae(w: dict, lam: float):
    from widelimit.sae.model import SAE

    return SAE(W_dec=w["W_dec"], b_dec=w["b_dec"], W_enc=w["W_enc"], b_enc=w["b_enc"], architecture="standard",
               l1_coefficient=2 * lam)
