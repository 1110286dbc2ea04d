r"""Optimal codes, and the optimal bias, for a fixed dictionary: value with a certified gap.

Used to compare dictionaries exactly (e.g. the absorption experiment, theory.md §6): the objective
of theory.md §1 minimised over ``Z >= 0`` (and ``b``) with ``W`` held fixed, which is convex.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .fista import fista_codes as optimal_codes

__all__ = ["fixed_dictionary_objective"]


def fixed_dictionary_objective(X, W, b=None, *, lam: float, tol: float = 1e-9, max_iter: int = 20,
                               device: str = "cpu") -> dict:
    r"""Objective of a fixed dictionary with optimal codes (and optimal bias when ``b`` is None), certified.

    With ``b`` given this is :func:`widelimit.coding.fista.fista_codes` (per-point
    duality gaps). With ``b = None`` the convex problem ``min_{Z >= 0, b}`` is
    first solved by cvxpy (Clarabel), then polished by rounds of optimal codes
    and the exact bias step ``b = mean(x - z W)``. The certified lower bound is
    the joint dual: for residuals ``r_i`` with ``sum_i r_i = 0`` (true after the
    bias step) and a scale ``s >= 0`` with ``s <w_d, r_i> <= lam ||w_d||``,

    .. math:: \min_{Z\ge0,b} N L \ \ge\ \sum_i 2 s\langle r_i, x_i\rangle - s^2\|r_i\|^2

    (``||a||^2 >= 2<theta, a> - ||theta||^2`` per point with ``theta_i = s r_i``; the
    penalty dominates ``2 sum_d z_d <w_d, theta_i>``; the ``b`` terms cancel
    because ``sum_i theta_i = 0``), maximised over ``s``.

    Parameters
    ----------
    X : array (N, n)
    W : array (k, n)
        The dictionary (rows; their norms enter the penalty, as in :func:`widelimit.sae_objective`).
    b : array (n,), optional
        Fixed bias; ``None`` optimises it.
    lam : float
    tol : float
        Relative target of the certified gap.
    max_iter : int
        Polishing rounds (free bias).
    device : str
        For the code solver.

    Returns
    -------
    dict
        ``value``, ``gap`` (certified, absolute), ``bias``, ``codes`` (CSR), ``rounds``.
    """
    X = np.asarray(X, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    N, n = X.shape
    if b is not None:
        res = optimal_codes(X, W, np.asarray(b, dtype=np.float64), lam=lam, tol=tol, device=device, dtype="float64")
        return {"value": res.value, "gap": res.gap, "bias": np.asarray(b, dtype=np.float64), "codes": res.codes,
                "rounds": 0}
    import cvxpy as cp

    norms = np.linalg.norm(W, axis=1)
    Zv = cp.Variable((N, W.shape[0]), nonneg=True)
    bv = cp.Variable(n)
    obj = cp.sum_squares(Zv @ W + np.ones((N, 1)) @ cp.reshape(bv, (1, n), order="C") - X) \
        + 2 * lam * cp.sum(Zv @ norms)
    cp.Problem(cp.Minimize(obj / N)).solve(solver=cp.CLARABEL)
    b = np.asarray(bv.value, dtype=np.float64)
    Z = None
    best = None
    unit = W / np.where(norms > 0, norms, 1.0)[:, None]
    for rounds in range(1, max_iter + 1):
        res = optimal_codes(X, W, b, lam=lam, tol=tol * 1e-2, device=device, dtype="float64", Z0=Z)
        Z = res.codes
        b = (X - Z @ W).mean(axis=0)
        polished = _polish_support(X, W, norms, Z, lam)
        if polished is not None:
            Z, b = polished
        R = X - b - Z @ W  # sums to zero
        rr, rx = float(np.einsum("ij,ij->", R, R)), float(np.einsum("ij,ij->", R, X))
        value = (rr + 2 * lam * float(np.asarray(Z.sum(axis=0)).ravel() @ norms)) / N
        C = R @ unit[norms > 0].T
        cmax = float(C.max()) if C.size else 0.0
        smax = lam / cmax if cmax > 0 else np.inf
        s = float(np.clip(rx / rr, 0.0, smax)) if rr > 0 else 0.0
        gap = max(0.0, value - (2 * s * rx - s * s * rr) / N)
        if best is None or gap < best["gap"]:
            best = {"value": value, "gap": gap, "bias": b.copy(), "codes": Z, "rounds": rounds}
        if gap <= tol * max(value, lam * lam):
            break
    return best


def _polish_support(X, W, norms, Z, lam):
    r"""Exact codes and bias on the current supports: the KKT equations there are linear.

    With support ``S_i`` of point ``i`` and ``A_i = W_S W_S^T``, the active-code
    conditions ``W_S r_i = lam ||w_S||`` give ``z_i = A_i^{-1}(W_S (x_i - b) - lam ||w_S||)``
    and ``r_i = (I - P_i)(x_i - b) + lam W_S^T A_i^{-1} ||w_S||`` (``P_i`` the projector on
    the span of ``W_S``); ``sum_i r_i = 0`` is then an ``n x n`` linear system for ``b``.
    Returns ``(Z, b)`` or None when the supports do not give a nonnegative solution.
    First-order methods leave code errors whose duality gap is quadratic but whose
    dual-feasibility violation is linear; this step removes both to rounding level.
    """
    N, n = X.shape
    Zd = Z.toarray() if hasattr(Z, "toarray") else np.asarray(Z)
    groups: dict = {}
    for i in range(N):
        groups.setdefault(tuple(np.flatnonzero(Zd[i] > 0)), []).append(i)
    M = np.zeros((n, n))
    rhs = np.zeros(n)
    parts = []
    for S, idx in groups.items():
        idx = np.asarray(idx)
        S = np.asarray(S, dtype=int)
        Xi = X[idx]
        if S.size == 0:
            M += idx.size * np.eye(n)
            rhs += Xi.sum(axis=0)
            parts.append((S, idx, None, None))
            continue
        WS = W[S]
        A = WS @ WS.T
        try:
            Ainv = np.linalg.inv(A)
        except np.linalg.LinAlgError:
            return None
        Pm = WS.T @ Ainv @ WS
        IP = np.eye(n) - Pm
        M += idx.size * IP
        c = lam * (WS.T @ (Ainv @ norms[S]))
        rhs += IP @ Xi.sum(axis=0) + idx.size * c
        parts.append((S, idx, WS, Ainv))
    try:
        b = np.linalg.solve(M, rhs)
    except np.linalg.LinAlgError:
        return None
    Zn = np.zeros_like(Zd)
    for S, idx, WS, Ainv in parts:
        if WS is None:
            continue
        Zn[np.ix_(idx, S)] = ((X[idx] - b) @ WS.T - lam * norms[S]) @ Ainv.T
    if Zn.min() < 0:
        return None
    return sp.csr_array(Zn), b
