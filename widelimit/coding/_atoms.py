r"""Unit atoms and the products the pursuit (:mod:`widelimit.coding.pursuit`) and the L0 bracket need: Gram blocks of
supports, residuals from codes, an upper estimate of ``||U||_2^2`` (theory.md §10)."""

from __future__ import annotations

import numpy as np
import torch

from ._nnls import gram_batch
from .working_set import gather_rows

__all__ = ["spectral_norm_sq", "residuals", "Atoms", "GRAM_ATOMS"]


def spectral_norm_sq(U: torch.Tensor, iters: int = 30) -> float:
    """An upper estimate of ``||U||_2^2``: Lanczos on ``U^T U`` (``iters`` products with ``U`` and ``U^T``, full
    reorthogonalisation), its largest Ritz value padded by 1 % for safety of the step.

    Lanczos, not power iteration: on a decoder of random-like atoms the top of ``U^T U``'s spectrum has no gap
    (a Marchenko-Pastur edge), and 50 power steps stopped 1.5 % low at 65,536 x 768, below the padding;
    30 Lanczos steps stop ~3e-5 low there (for ``iters`` at least ``d_in`` the Ritz value is exact).
    """
    g = torch.Generator(device="cpu").manual_seed(0)
    n = U.shape[1]
    v = torch.randn(n, dtype=U.dtype, generator=g).to(U.device)
    v = v / torch.linalg.norm(v)
    m = max(1, min(int(iters), n))
    Q = torch.zeros(m, n, dtype=U.dtype, device=U.device)
    alpha, beta = [], []
    for j in range(m):
        Q[j] = v
        w = U.T @ (U @ v)
        alpha.append(float(v @ w))
        for _ in range(2):  # full reorthogonalisation, twice (the basis stays orthonormal to rounding)
            w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)
        b = float(torch.linalg.norm(w))
        if j == m - 1 or b <= 1e-12 * max(abs(alpha[0]), 1e-300):
            break
        beta.append(b)
        v = w / b
    if alpha[0] == 0.0 and not beta:
        return 1.0
    T = np.diag(alpha) + np.diag(beta[: len(alpha) - 1], 1) + np.diag(beta[: len(alpha) - 1], -1)
    return 1.01 * float(np.linalg.eigvalsh(T)[-1])


#: Widest dictionary whose Gram matrix ``U U^T`` the pursuit forms (128 MiB in float64); wider ones gather atoms.
GRAM_ATOMS = 4096


class Atoms:
    """Unit atoms ``U`` (k, n) with the products the pursuit needs: Gram blocks of supports (from the full Gram
    ``U U^T`` when ``k <= GRAM_ATOMS``, else gathered per support) and residuals from codes."""

    def __init__(self, U: torch.Tensor, U32: torch.Tensor | None = None):
        self.U = U
        self.k = U.shape[0]
        self.G = U @ U.T if self.k <= GRAM_ATOMS else None
        self.U32 = U.to(torch.float32) if U32 is None else U32  # (a float32 copy held elsewhere: shared)

    def corr(self, R):
        """``R U^T`` in float32: the correlations that only choose atoms (every value is then refit and
        evaluated in float64)."""
        return (R.to(torch.float32) @ self.U32.T).to(R.dtype)

    def gram(self, S, valid, xt=None):
        """``G_SS`` per token (B, s, s), zero outside ``valid``; with ``xt`` (B, n) also ``q = U_S x_t`` (B, s)."""
        if self.G is None:
            G, q = gram_batch(gather_rows(self.U, S), torch.zeros(S.shape[0], self.U.shape[1], dtype=self.U.dtype,
                                                                  device=self.U.device) if xt is None else xt, valid)
            return G if xt is None else (G, q)
        m = valid.to(self.G.dtype)
        G = self.G[S[:, :, None], S[:, None, :]] * (m[:, :, None] * m[:, None, :])
        return G if xt is None else (G, torch.einsum("bsn,bn->bs", gather_rows(self.U, S), xt) * m)

    def rows(self, j):
        """``<u_j, u_d>`` for every atom ``d`` (B, k), one row per entry of ``j``."""
        return self.G[j] if self.G is not None else self.U[j] @ self.U.T

    def dense(self, S, valid, y):
        """The codes as a dense (B, k) tensor."""
        Y = torch.zeros(S.shape[0], self.k, dtype=self.U.dtype, device=self.U.device)
        return Y.scatter_add_(1, S, y * valid)


def residuals(A: Atoms, xt: torch.Tensor, S: torch.Tensor, y: torch.Tensor, valid=None) -> torch.Tensor:
    """``R = x_t - sum_j y_j U[S_j]`` per token (float64, from the codes: the witness's own residual), in
    ``O(s n)`` per token (the atoms gathered in chunks of tokens)."""
    R = xt.clone()
    if S.shape[1] == 0:
        return R
    yv = y if valid is None else y * valid
    step = max(1, (1 << 22) // max(1, S.shape[1] * A.U.shape[1]))
    for b0 in range(0, S.shape[0], step):
        R[b0 : b0 + step] -= torch.einsum("bs,bsn->bn", yv[b0 : b0 + step], gather_rows(A.U, S[b0 : b0 + step]))
    return R
