r"""The per-token nonnegative lasso of optimal coding: its checks and its certified dual gap (theory.md §8.6).

For a dictionary ``W`` (k, n) and a bias ``b``, each point's best code solves, on unit atoms
``u_d = w_d / ||w_d||`` (codes ``y_d = z_d ||w_d||``) and ``xt = x - b``,

.. math:: P(y) = \|xt - y U\|^2 + 2\lambda \textstyle\sum_d y_d, \qquad y \ge 0 .

**Certificate.** For any ``theta`` with ``<u_d, theta> <= lam`` for all ``d``,

.. math:: P(y) \ \ge\ D(\theta) = 2\langle\theta, xt\rangle - \|\theta\|^2 \quad (y \ge 0),

because ``||a||^2 >= 2<theta, a> - ||theta||^2`` and the penalty dominates
``2 sum_d y_d <u_d, theta>``. The dual point is the residual ``r = xt - y U`` scaled by
``s = clip(<r, xt> / ||r||^2, 0, lam / max_d <u_d, r>)``, the best feasible multiple
(:func:`dual_scale`); at the optimum ``s = 1`` and ``D = P`` (strong duality). So
``gap = P - D(s r) >= P(y) - min P`` bounds the suboptimality of ``y``; it needs only
``||r||^2``, ``<r, xt>``, ``max_d <u_d, r>`` and ``sum_d y_d`` (:func:`lasso_gap`).

One definition, three back-ends of the same arithmetic: :func:`token_gap` (one token, numba,
called from the compiled coders), :func:`lasso_gap` on numpy arrays (a compiled loop over
:func:`token_gap`) or on torch tensors (elementwise, any device).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .._validation import check_data, check_dictionary, check_lam, check_vector, row_norms

__all__ = ["gap_floor", "check_problem", "unit_atoms", "unit_codes", "dictionary_codes", "dual_scale", "token_gap", "lasso_gap",
           "point_gaps"]

_JIT = dict(nogil=True, cache=True)


def gap_floor(lam: float) -> float:
    r"""The floor of the per-token gap test ``gap_i <= tol * max(P_i, gap_floor(lam))``: ``lam^2 2^-52``.

    The test is relative to the token's own objective ``P_i``: since ``gap_i >= P_i - min P``, it
    gives ``P_i <= min P / (1 - tol)``. The floor (float64's epsilon times ``lam^2``) only keeps a
    token at the bias (``P = gap = 0``) from dividing by zero. It was ``lam^2`` itself, which let a
    ``lam`` far above the data's scale pass any code as optimal (an SAE's encoder gap read 7.6e-6
    where it was 5.6e10; theory.md §8.6).
    """
    return float(lam) * float(lam) * 2.0 ** -52


def check_problem(X, W, b, lam, tol):
    """Validate a coding problem: data (N, n), dictionary (k, n), bias (n,), lam > 0, tol > 0."""
    X = check_data(X)
    n = X.shape[1]
    W = check_dictionary(W, n)
    b = check_vector(b, n, "b")
    lam = check_lam(lam)
    tol = float(tol)
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r}")
    return X, W, b, lam, tol


def unit_atoms(W):
    """``(norms, live, U)``: the atoms' norms (float64), the indices of the nonzero atoms and their unit rows.

    Atoms of norm 0 get code 0; the lasso is solved on ``U`` (``len(live)`` rows).
    """
    norms = row_norms(W)  # float64 even for float32 atoms
    live = np.flatnonzero(norms > 0)
    return norms, live, W[live] / norms[live, None]


def unit_codes(Z, live, norms):
    """Codes in the units of ``W`` (dense or scipy.sparse rows) as dense codes ``y = z ||w||`` of the unit atoms."""
    Z = Z.toarray() if hasattr(Z, "toarray") else np.asarray(Z)
    return Z[:, live] * norms[live]


def dictionary_codes(Y, live, norms, k):
    """Dense codes ``Y`` of the unit atoms back in the units of ``W`` (``(m, k)``, zero for the norm-0 atoms)."""
    Z = np.zeros((Y.shape[0], k))
    Z[:, live] = Y / norms[live]
    return Z


@nb.njit(**_JIT)
def dual_scale(rr, rx, mx, lam):  # pragma: no cover - compiled
    """The best feasible multiple ``s`` of the residual as dual point: ``clip(rx / rr, 0, lam / mx)``.

    ``rr = ||r||^2``, ``rx = <r, xt>``, ``mx = max_d <u_d, r>`` (no upper cap when ``mx <= 0``).
    """
    s = rx / rr if rr > 0.0 else 0.0
    if s < 0.0:
        s = 0.0
    if mx > 0.0 and s > lam / mx:
        s = lam / mx
    return s


@nb.njit(**_JIT)
def token_gap(rr, rx, mx, l1, lam):  # pragma: no cover - compiled
    """``(P, gap)`` of one token: ``P = rr + 2 lam l1`` and ``gap = max(P - D(s r), 0)`` (module docstring)."""
    P = rr + 2.0 * lam * l1
    s = dual_scale(rr, rx, mx, lam)
    gap = P - (2.0 * s * rx - s * s * rr)
    return P, (gap if gap > 0.0 else 0.0)


@nb.njit(**_JIT)
def _gaps(rr, rx, mx, l1, lam, P, gap):  # pragma: no cover - compiled
    for i in range(rr.shape[0]):
        P[i], gap[i] = token_gap(rr[i], rx[i], mx[i], l1[i], lam)


def lasso_gap(rr, rx, mx, l1, lam):
    """Per-token ``(P, gap)`` from ``||r||^2``, ``<r, xt>``, ``max_d <u_d, r>`` and ``sum_d y_d`` (float64).

    numpy arrays (or scalars): computed by :func:`token_gap`; torch tensors: the same arithmetic
    elementwise on their device (:func:`_lasso_gap_torch`).
    """
    if type(rr).__module__.startswith("torch"):
        return _lasso_gap_torch(rr, rx, mx, l1, float(lam))
    rr, rx, mx, l1 = (np.ascontiguousarray(a, dtype=np.float64) for a in np.broadcast_arrays(rr, rx, mx, l1))
    shape = rr.shape
    P, gap = np.empty(rr.size), np.empty(rr.size)
    _gaps(rr.ravel(), rx.ravel(), mx.ravel(), l1.ravel(), float(lam), P, gap)
    return P.reshape(shape), gap.reshape(shape)


def _lasso_gap_torch(rr, rx, mx, l1, lam):
    """:func:`token_gap` elementwise on torch tensors (same operations, same order)."""
    import torch

    P = rr + 2.0 * lam * l1
    one = torch.ones_like(rr)
    s = torch.where(rr > 0, rx / torch.where(rr > 0, rr, one), torch.zeros_like(rr)).clamp(min=0.0)
    s = torch.where((mx > 0) & (s > lam / torch.where(mx > 0, mx, one)), lam / torch.where(mx > 0, mx, one), s)
    return P, (P - (2.0 * s * rx - s * s * rr)).clamp(min=0.0)


def point_gaps(xt, U, y, lam):
    """Per-point ``(P, gap, ||r||^2)`` of codes ``y`` (m, k) >= 0 on unit atoms ``U`` (k, n), ``xt = X - b``.

    torch tensors (all of one dtype and device) or numpy arrays.
    """
    torch_in = type(xt).__module__.startswith("torch")
    r = xt - y @ U if U.shape[0] else xt * 1.0
    rr = (r * r).sum(1)
    rx = (r * xt).sum(1)
    if U.shape[0]:
        mx = (r @ U.T).amax(1) if torch_in else (r @ U.T).max(1)
    else:
        mx = rr * 0.0
    P, gap = lasso_gap(rr, rx, mx, y.sum(1), lam)
    return P, gap, rr
