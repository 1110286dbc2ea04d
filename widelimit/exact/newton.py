r"""The Newton direction of the median solvers, from a subsample held in memory.

The half-Hessian of ``sum_i w_i phi(||x_i - b||)`` is ``sum_i w_i c_i (I - (1 - t_i) u_i u_i^T)``
with ``c_i = min(1, lam / r_i)`` (Huber; ``1 / r_i`` geometric), ``u_i`` the unit residual,
``t_i = 1`` within ``lam``, else 0: the matrix ``a I - M`` with ``a = sum_i w_i c_i`` from the pass
and ``M`` from a random subsample (theory.md §4.2). Secant pairs of the last steps correct it (BFGS).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular
from scipy.optimize import minimize_scalar

from .._memory import check_memory, memory_budget
from .._runtime import matmul
from .median_bound import norm

__all__ = ["newton_direction", "line_min", "dense_newton", "newton_bytes", "median_bytes", "subsample_rows"]


def newton_direction(Xs, ws, b, lam, kind, eps_r, a_all, a_in, pairs, gdir, precise):
    """``d`` with ``Bm d = gdir``: ``Bm`` the subsample Newton matrix (weights ``ws`` scaled to the full data).

    ``a_all`` is the pass's ``sum_i w_i c_i``; ``a_in`` the weight within ``lam`` (Huber).
    ``precise``: form ``M`` in float64 with the far part's isotropic term from the same subsample.
    """
    n = b.size
    D = Xs - b
    r = np.sqrt(np.einsum("ij,ij->i", D, D))
    if kind == "huber":
        act = r > lam
        coef = np.where(act, lam / np.where(act, r, 1.0) ** 3, 0.0)
    else:
        act = r > eps_r
        coef = np.where(act, 1.0 / np.where(act, r, 1.0) ** 3, 0.0)
    cw = ws * coef
    if not dense_newton(D.shape[0], n, len(pairs)):  # few rows in many dimensions: never form n x n
        a = a_all if not precise else a_in + float(cw @ (r * r))
        return _low_rank_step(D, cw, a, pairs, gdir, (1e-14 * n if precise else 1e-9) * a)
    # the subsample's Newton matrix is an approximation anyway (its sampling error is about
    # 1/sqrt(m)): float32 products halve its cost and change nothing that is certified. But
    # a I - M cancels where the residuals are nearly parallel (nearly collinear data: its
    # small eigenvalues are a * angle^2); once a step was rejected, or when n is small, it
    # is formed in float64 and its eigenvalues are floored far lower
    cmax = float(cw.max()) if cw.size and cw.max() > 0 else 1.0  # keep float32 in range (1/r^3 can be huge)
    dmax = float(np.abs(D).max()) or 1.0  # and the products of residuals
    Dn = D / dmax if precise else (D / dmax).astype(np.float32)
    M = matmul((Dn * (cw / cmax).astype(Dn.dtype)[:, None]).T, Dn).astype(np.float64) * (cmax * dmax) * dmax
    a = a_all
    if precise:
        # a I - M = a_in I + sum_far c_i (I - u_i u_i^T): the far part from the subsample as a whole, so
        # that its isotropic part cancels M's where the u_i are parallel (its error there is then
        # small, not the subsample's error in sum_far c_i); a_in (points within lam) is exact
        a = a_in + float(cw @ (r * r))
    # Newton matrix a I - M, corrected by BFGS updates with the secant pairs of the last steps:
    # exact curvature along recent steps turns the subsample's linear rate superlinear
    Bm = M + M.T
    Bm *= -0.5
    Bm.flat[:: n + 1] += a  # a I - (M + M^T) / 2
    for s_, y_ in pairs:
        sy = float(s_ @ y_)
        Bs = Bm @ s_
        sBs = float(s_ @ Bs)
        if sy > 1e-12 * norm(s_) * norm(y_) and sBs > 0:
            Bm += np.outer(y_, y_ / sy)
            Bm -= np.outer(Bs, Bs / sBs)
    Bm += Bm.T
    Bm *= 0.5
    return _newton_step(Bm, gdir, (1e-14 * n if precise else 1e-9) * a)


def dense_newton(m: int, n: int, n_pairs: int = 2) -> bool:
    """Whether the Newton matrix is formed as a dense ``n x n`` matrix (else in low-rank form).

    The matrix is ``a I`` plus a correction of rank at most ``k = m + 2 n_pairs`` (``m`` subsample
    rows, two BFGS terms per secant pair). Dense costs ``n^2`` memory and ``2 m n^2 + n^3 / 3``
    flops; the low-rank form ``n k`` memory and about ``2 n k^2 + 10 k^3`` flops: dense only when
    ``3 k > n`` (the two costs cross near there).
    """
    return 3 * (m + 2 * n_pairs) > n


def newton_bytes(m: int, n: int, n_pairs: int = 2) -> int:
    """Peak bytes of one Newton direction from ``m`` subsample rows in dimension ``n`` (float64).

    Dense: the matrix, its symmetrised copy and a factor or eigenvector matrix, ``3 n^2``, next to
    the centred rows; low rank: the basis, its orthonormal factor and the centred rows,
    ``2 n k + 2 m n``, with ``k^2`` terms of the small eigenproblem.
    """
    k = m + 2 * n_pairs
    if dense_newton(m, n, n_pairs):
        return 8 * (3 * n * n + 2 * m * n)
    return 8 * (2 * n * k + 2 * m * n + 3 * k * k)


def _low_rank_step(D, cw, a, pairs, g, floor):
    """``d`` solving ``Bm d = g`` for ``Bm = a I - D^T diag(cw) D`` plus BFGS terms, without forming ``Bm``.

    ``Bm = a I + U C U^T`` with ``U = [D^T, y_j, B s_j]`` (n x k) and ``C`` diagonal. With ``U = Q R``
    (thin QR) and ``R C R^T = V diag(mu) V^T``, ``Bm``'s eigenvalues are ``a + mu`` on ``Q V`` and
    ``a`` on the rest; each is raised to at least ``floor``, as the dense solve does (theory.md §4.2).
    """
    dmax = float(np.abs(D).max()) or 1.0
    cols = [D.T / dmax]
    coef = [-cw * dmax * dmax]
    U, C = cols[0], coef[0]

    def apply(v):  # Bm v with the terms so far
        return a * v + U @ (C * (U.T @ v))

    for s_, y_ in pairs:
        sy = float(s_ @ y_)
        Bs = apply(s_)
        sBs = float(s_ @ Bs)
        if sy > 1e-12 * norm(s_) * norm(y_) and sBs > 0:
            U = np.column_stack([U, y_, Bs])
            C = np.concatenate([C, [1.0 / sy, -1.0 / sBs]])
    # torch's Householder QR and products: its LAPACK runs on the OpenMP pool of the passes (as in
    # _newton_step); numpy's separate BLAS threads fought them for the cores (4x slower on 2 busy cores)
    import torch

    Q, R = (t.numpy() for t in torch.linalg.qr(torch.from_numpy(np.ascontiguousarray(U))))
    S = R @ (C[:, None] * R.T)
    mu, V = np.linalg.eigh(0.5 * (S + S.T))
    QV = matmul(Q, V)
    h = QV.T @ g
    return QV @ (h / np.maximum(a + mu, floor)) + (g - QV @ h) / max(a, floor)


def _newton_step(Bm, g, floor):
    """``d`` solving ``Bm d = g`` with the eigenvalues of the symmetric ``Bm`` raised to at least ``floor``.

    A Cholesky factorisation of ``Bm`` (n^3 / 3 flops) when its smallest pivot clears ``floor``;
    the eigendecomposition (several times dearer, which matters for n in the thousands) only
    when ``Bm`` is nearly singular or indefinite.
    """
    # torch's Cholesky, not scipy's: its LAPACK runs on the OpenMP pool of the products before it
    # (widelimit._runtime.matmul); scipy's separate BLAS fought their still-spinning threads for
    # the cores (measured 0.3 s instead of 0.002 s for n = 384 on 2 cores)
    import torch

    L, info = torch.linalg.cholesky_ex(torch.from_numpy(Bm))
    if int(info) == 0:
        L = L.numpy()
        if np.diag(L).min() ** 2 >= floor:
            return solve_triangular(L, solve_triangular(L, g, lower=True, check_finite=False), lower=True,
                                    trans="T", check_finite=False)
    mu, V = np.linalg.eigh(Bm)
    return V @ ((V.T @ g) / np.maximum(mu, floor))


def line_min(Xs, ws, b, d, lam, kind) -> float:
    """``argmin_{t in [0, 1]}`` of the weighted objective of the rows ``Xs`` at ``b + t d``.

    The objective is convex in ``t``; bounded Brent search to a relative ``1e-12`` in ``t``
    (about 50 evaluations of O(m n) each, on the subsample held in memory).
    """
    D0 = Xs - b

    def f(t):
        r = np.sqrt(np.einsum("ij,ij->i", D0 - t * d, D0 - t * d))
        return float(ws @ (np.where(r <= lam, r * r, 2.0 * lam * r - lam * lam) if kind == "huber" else r))

    res = minimize_scalar(f, bounds=(0.0, 1.0), method="bounded", options={"xatol": 1e-12, "maxiter": 200})
    return float(res.x) if f(float(res.x)) < f(0.0) else 0.0


#: Float64 copies of the ``m x n`` subsample the Newton phase holds at its peak besides the Newton
#: step's own arrays (the subsample, its warm-start solve, the line search's residuals): fitted to the
#: peak resident memory added by ``huber_median`` at (N, n) = (300, 16384), (600, 4096), (6000, 2048)
#: (measured 427, 222, 620 MB; this model 435, 225, 705 MB).
SUBSAMPLE_COPIES = 7


def median_bytes(m: int, n: int) -> int:
    """Peak bytes of the median's Newton phase with ``m`` subsample rows in dimension ``n`` (theory.md §9;
    two secant pairs, ``widelimit.exact.median.SECANT_PAIRS``)."""
    return newton_bytes(m, n, 2) + 8 * SUBSAMPLE_COPIES * m * n


def subsample_rows(N: int, n: int, hess_rows: int, budget=None) -> int:
    """Rows of the Newton matrix's subsample: ``min(N, hess_rows)``, fewer when that would not fit the memory budget.

    The subsample only shapes the Newton steps (every bound is computed on all rows), so a smaller
    one costs iterations, not correctness. Even one row in dimension ``n`` above the budget is refused.
    """
    m = min(N, hess_rows)
    cap = memory_budget(budget)
    if median_bytes(m, n) <= cap:
        return m
    check_memory(median_bytes(1, n), f"the median's Newton step in dimension n = {n}", budget=budget,
                 hint="the data have too many columns for this budget")
    lo, hi = 1, m  # the largest m that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if median_bytes(mid, n) <= cap else (lo, mid - 1)
    return lo
