r"""The fixed-dictionary optimum: optimal codes and the optimal bias for a fixed dictionary, certified.

The objective of theory.md §1 minimised over ``Z >= 0`` and ``b`` with ``W`` held fixed (a convex
problem). One algorithm, compiled: coordinate descent on the codes alternated with the exact bias step
``b = mean(x - z W)`` (:func:`fixed_dictionary_optimum`; the finite-width branch and bound runs it at the
caps' centres without the GIL, :mod:`widelimit.finite._taylor`). :func:`fixed_dictionary_objective`
adds the exact step on the final supports and the certified joint dual bound, to compare dictionaries
exactly (e.g. the absorption experiment, theory.md §6).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp

from .fista import fista_codes
from .lasso import dictionary_codes, gap_floor, token_gap, unit_atoms

__all__ = ["fixed_dictionary_objective", "fixed_dictionary_optimum", "codes_then_bias", "residual",
           "objective_from_residual"]

_JIT = dict(nogil=True, cache=True)


@nb.njit(**_JIT)
def residual(X, W, b, Z, R):  # pragma: no cover - compiled
    """``R = X - b - Z W`` in place."""
    N, n = X.shape
    k = W.shape[0]
    for i in range(N):
        for d in range(n):
            s = X[i, d] - b[d]
            for j in range(k):
                s -= Z[i, j] * W[j, d]
            R[i, d] = s


@nb.njit(**_JIT)
def codes_then_bias(X, lam, W, b, Z, R, code_sweeps):  # pragma: no cover - compiled
    """Coordinate-descent sweeps on the codes (``z_ij = max(0, <r_i + z_ij w_j, w_j> - lam)``, exact for
    unit atoms), then the optimal bias, in place on ``b, Z`` and the residual ``R``.

    Returns the largest change of a code or a bias coordinate.
    """
    N, n = X.shape
    k = W.shape[0]
    move = 0.0
    for _ in range(code_sweeps):
        for i in range(N):
            for j in range(k):
                a = 0.0
                for d in range(n):
                    a += (R[i, d] + Z[i, j] * W[j, d]) * W[j, d]
                z = a - lam if a > lam else 0.0
                dz = z - Z[i, j]
                if dz != 0.0:
                    for d in range(n):
                        R[i, d] -= dz * W[j, d]
                    Z[i, j] = z
                    move = max(move, abs(dz))
    for d in range(n):
        m = 0.0
        for i in range(N):
            m += R[i, d]
        m /= N
        b[d] += m
        move = max(move, abs(m))
        for i in range(N):
            R[i, d] -= m
    return move


@nb.njit(**_JIT)
def objective_from_residual(lam, Z, R):  # pragma: no cover - compiled
    """``(1/N) (sum ||r_i||^2 + 2 lam sum z_ij)``."""
    N, n = R.shape
    val = 0.0
    for i in range(N):
        for d in range(n):
            val += R[i, d] * R[i, d]
        for j in range(Z.shape[1]):
            val += 2.0 * lam * Z[i, j]
    return val / N


@nb.njit(**_JIT)
def fixed_dictionary_optimum(X, lam, W, b, Z, max_sweeps, tol):  # pragma: no cover - compiled
    """Exact minimisation over ``(Z >= 0, b)`` at a fixed dictionary ``W`` of unit atoms, in place on ``b``, ``Z``.

    Coordinate descent on the codes alternated with the optimal bias (:func:`codes_then_bias`),
    until nothing moves by more than ``tol`` times the largest code (at least 1), or ``max_sweeps``.
    Returns the objective.
    """
    R = np.empty(X.shape)
    residual(X, W, b, Z, R)
    for _ in range(max_sweeps):
        move = codes_then_bias(X, lam, W, b, Z, R, 1)
        zmax = 1.0
        for i in range(Z.shape[0]):
            for j in range(Z.shape[1]):
                zmax = max(zmax, Z[i, j])
        if move <= tol * zmax:
            break
    return objective_from_residual(lam, Z, R)


def fixed_dictionary_objective(X, W, b=None, *, lam: float, tol: float = 1e-9, max_iter: int = 20,
                               device: str = "cpu") -> dict:
    r"""Objective of a fixed dictionary with optimal codes (and optimal bias when ``b`` is None), certified.

    With ``b`` given this is :func:`widelimit.coding.fista.fista_codes` (per-point
    duality gaps). With ``b = None`` the convex problem ``min_{Z >= 0, b}`` is solved by
    :func:`fixed_dictionary_optimum` (warm-started from the last round), then made exact on
    the final supports (:func:`_polish_support`). The certified lower bound is the joint dual:
    for residuals ``r_i`` with ``sum_i r_i = 0`` (true after the bias step) and a scale ``s >= 0``
    with ``s <w_d, r_i> <= lam ||w_d||``,

    .. math:: \min_{Z\ge0,b} N L \ \ge\ \sum_i 2 s\langle r_i, x_i\rangle - s^2\|r_i\|^2

    (``||a||^2 >= 2<theta, a> - ||theta||^2`` per point with ``theta_i = s r_i``; the
    penalty dominates ``2 sum_d z_d <w_d, theta_i>``; the ``b`` terms cancel
    because ``sum_i theta_i = 0``), maximised over ``s``: the lasso dual gap of
    :mod:`widelimit.coding.lasso` on the sums over points.

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
        Rounds of the compiled solver and the exact step (free bias).
    device : str
        For the code solver (fixed bias).

    Returns
    -------
    dict
        ``value``, ``gap`` (certified, absolute), ``bias``, ``codes`` (CSR), ``rounds``.
    """
    X = np.asarray(X, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    N, n = X.shape
    if b is not None:
        res = fista_codes(X, W, np.asarray(b, dtype=np.float64), lam=lam, tol=tol, device=device, dtype="float64")
        return {"value": res.value, "gap": res.gap, "bias": np.asarray(b, dtype=np.float64), "codes": res.codes,
                "rounds": 0}
    norms, live, U = unit_atoms(W)
    U = np.ascontiguousarray(U)
    Y = np.zeros((N, live.size))  # codes of the unit atoms
    bias = X.mean(axis=0)
    best = None
    for rounds in range(1, max_iter + 1):
        fixed_dictionary_optimum(X, lam, U, bias, Y, 100_000, 1e-15)
        Z, bb = dictionary_codes(Y, live, norms, W.shape[0]), bias.copy()
        polished = _polish_support(X, W, norms, sp.csr_array(Z), lam)
        if polished is not None:
            Z, bb = polished[0].toarray(), polished[1]
        value, gap = _joint_gap(X, W, U, Z, bb, lam, norms)
        if best is None or gap < best["gap"]:
            best = {"value": value, "gap": gap, "bias": bb, "codes": sp.csr_array(Z), "rounds": rounds}
        if gap <= tol * max(value, gap_floor(lam)):
            break
    return best


def _joint_gap(X, W, U, Z, b, lam, norms):
    """``(value, gap)`` of ``(Z, b)``: the objective and the joint dual bound's gap (docstring above), per point."""
    N = X.shape[0]
    R = X - b - Z @ W  # sums to zero over the points (the optimal bias for Z)
    rr, rx = float(np.einsum("ij,ij->", R, R)), float(np.einsum("ij,ij->", R, X))
    C = R @ U.T
    cmax = float(C.max()) if C.size else 0.0
    P, gap = token_gap(rr, rx, cmax, float(Z.sum(axis=0) @ norms), lam)
    return P / N, gap / N


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
