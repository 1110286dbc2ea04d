"""Helpers of :func:`widelimit.sae.certify.certify_sae`: the rounding tolerance, token sampling, decoder pairs."""

from __future__ import annotations

import numpy as np

__all__ = ["violation_tolerance", "sample_rows", "pair_candidates"]


def violation_tolerance(lam: float, kkt_tol: float, scale: float, dtypes) -> float:
    r"""Threshold above which a first-order violation is real, not rounding.

    ``kkt_tol * lam + 8 * eps * scale`` with ``eps`` the machine epsilon of the
    coarsest storage dtype among ``dtypes`` (activations and SAE weights; float32:
    ``1.2e-7``, bfloat16: ``7.8e-3``) and ``scale`` the size of the quantity
    compared (``max_i ||x_i - b||`` for ``<u_d, r_i>``). A model trained in float32
    cannot meet a condition more tightly than its inputs are rounded.
    """
    eps = 0.0
    for dt in dtypes:
        try:
            eps = max(eps, float(np.finfo(np.dtype(str(dt).replace("torch.", "").replace("bfloat16", "float16"))).eps))
        except TypeError:
            continue
        if "bfloat16" in str(dt):
            eps = max(eps, 2.0 ** -7)
    return float(kkt_tol * lam + 8.0 * eps * scale)


def sample_rows(acts, max_tokens: int, seed: int = 0):
    """``max_tokens`` rows drawn without replacement (sorted, reproducible from ``seed``), or ``acts`` if fewer."""
    N = int(acts.shape[0])
    if max_tokens is None or max_tokens >= N:
        return acts
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    idx = np.sort(np.random.default_rng(seed).choice(N, size=int(max_tokens), replace=False))
    return np.asarray(acts[idx])


def pair_candidates(U, lo: float, hi: float, max_pairs: int, device):
    """Pairs (a, b), a != b, with cos(u_a, u_b) >= hi or <= lo, computed in row blocks."""
    import torch

    k = U.shape[0]
    Ut = torch.as_tensor(U, dtype=torch.float32, device=device)
    rows = max(1, (1 << 24) // max(1, k))
    pa, pb, pc = [], [], []
    for s in range(0, k, rows):
        G = Ut[s : s + rows] @ Ut.T
        idx = torch.arange(s, min(k, s + rows), device=device)
        G[torch.arange(G.shape[0], device=device), idx] = 0.0
        m = (G >= hi) | (G <= lo)
        r, c = torch.nonzero(m, as_tuple=True)
        if r.numel():
            pa.append((r + s).cpu().numpy())
            pb.append(c.cpu().numpy())
            pc.append(G[r, c].cpu().numpy())
    if not pa:
        return np.zeros(0, int), np.zeros(0, int), np.zeros(0)
    a, b, c = np.concatenate(pa), np.concatenate(pb), np.concatenate(pc).astype(np.float64)
    # exact cosines in float64 for the candidates
    c = np.einsum("ij,ij->i", U[a], U[b])
    if a.size > max_pairs:
        keep = np.argsort(-np.abs(c), kind="stable")[:max_pairs]
        a, b, c = a[keep], b[keep], c[keep]
    return a, b, c
