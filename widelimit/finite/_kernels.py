r"""Compiled kernels of the finite-width branch and bound (docs/theory_finite_width.md).

The node relaxation (theory §F.2): with atom ``j`` known to lie in a spherical cap of centre
``c_j`` and angle ``theta_j < pi/2`` (or anywhere, ``free``), replace each product
``y_ij = z_ij w_j`` by a free vector of the cap's convex cone ``K_j``:

.. math:: R = \min_{b,\; y_{ij}\in K_j} \frac1N\sum_i \Big\|\sum_j y_{ij} + b - x_i\Big\|^2
          + \frac{2\lambda}{N}\sum_{ij}\|y_{ij}\| .

:func:`node_solve` runs exact block-coordinate descent on it (each block ``y_ij`` has the
closed-form minimiser ``shrink_lam(P_Kj(t))``), and certifies a lower bound from the dual
point ``u_i = x_i - b - sum_j y_ij`` made feasible (theory §F.3):

.. math:: R \ge \frac1N\sum_i 2\langle x_i, u_i\rangle - \|u_i\|^2
          \quad\text{for any } u \text{ with } \sum_i u_i = 0,\ \|P_{K_j} u_i\| \le \lambda .

Everything is float64, no fastmath: the dual value is a certificate.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

_JIT = dict(nogil=True, cache=True)


@nb.njit(**_JIT)
def _proj_cone(t, c, cth, sth, free, out):  # pragma: no cover - compiled
    """Euclidean projection of ``t`` onto the circular cone {y: angle(y, c) <= theta} (or R^n if free)."""
    n = t.size
    if free:
        for d in range(n):
            out[d] = t[d]
        return
    a = 0.0
    for d in range(n):
        a += t[d] * c[d]
    rho2 = 0.0
    for d in range(n):
        p = t[d] - a * c[d]
        rho2 += p * p
    rho = math.sqrt(rho2)
    if a >= 0.0 and rho * cth <= a * sth:  # inside the cone
        for d in range(n):
            out[d] = t[d]
        return
    coef = a * cth + rho * sth  # <t, d> with d the boundary generator in the plane of c and t
    if coef <= 0.0 or rho == 0.0:  # in the polar cone (rho == 0 here means a < 0)
        for d in range(n):
            out[d] = 0.0
        return
    for d in range(n):
        out[d] = coef * (cth * c[d] + sth * (t[d] - a * c[d]) / rho)


@nb.njit(**_JIT)
def _cone_norm(t, c, cth, sth, free, tmp):  # pragma: no cover - compiled
    """``||P_K t||`` = max over unit w in K of <w, t> (when positive)."""
    _proj_cone(t, c, cth, sth, free, tmp)
    s = 0.0
    for d in range(t.size):
        s += tmp[d] * tmp[d]
    return math.sqrt(s)


@nb.njit(**_JIT)
def certify(X, lam, C, cth, sth, free, Y):  # pragma: no cover - compiled
    """Primal value of the relaxation at ``Y`` (optimal bias) and a certified dual lower bound.

    Returns ``(primal, dual, b)``. The dual point is the negated residual, recentred to sum to
    zero and scaled by ``alpha = min(1, lam / max_ij ||P_Kj u_i||)`` (theory §F.3).
    """
    N, n = X.shape
    k = C.shape[0]
    S = np.zeros((N, n))
    pen = 0.0
    for i in range(N):
        for j in range(k):
            s = 0.0
            for d in range(n):
                S[i, d] += Y[i, j, d]
                s += Y[i, j, d] * Y[i, j, d]
            pen += math.sqrt(s)
    b = np.zeros(n)
    for i in range(N):
        for d in range(n):
            b[d] += X[i, d] - S[i, d]
    for d in range(n):
        b[d] /= N
    U = np.empty((N, n))
    rec = 0.0
    mu = np.zeros(n)
    for i in range(N):
        for d in range(n):
            u = X[i, d] - b[d] - S[i, d]
            U[i, d] = u
            rec += u * u
            mu[d] += u
    primal = (rec + 2.0 * lam * pen) / N
    for d in range(n):
        mu[d] /= N
    for i in range(N):
        for d in range(n):
            U[i, d] -= mu[d]
    hmax = 0.0
    tmp = np.empty(n)
    for i in range(N):
        for j in range(k):
            h = _cone_norm(U[i], C[j], cth[j], sth[j], free[j], tmp)
            if h > hmax:
                hmax = h
    alpha = 1.0 if hmax <= lam else lam / hmax
    dual = 0.0
    for i in range(N):
        for d in range(n):
            u = alpha * U[i, d]
            dual += 2.0 * X[i, d] * u - u * u
    return primal, dual / N, b


@nb.njit(**_JIT)
def node_solve(X, lam, C, cth, sth, free, Y, target, tol_abs, max_sweeps, check_every):  # pragma: no cover
    """Block-coordinate descent on the node relaxation, in place on ``Y`` (N, k, n).

    Stops when the certified dual reaches ``target`` (the node is pruned), when the
    primal-dual gap is below ``tol_abs``, when the primal is clearly below ``target``
    (the node must be branched anyway), or after ``max_sweeps``.
    Returns ``(dual, primal, sweeps)``.
    """
    N, n = X.shape
    k = C.shape[0]
    S = np.zeros((N, n))
    for i in range(N):
        for j in range(k):
            for d in range(n):
                S[i, d] += Y[i, j, d]
    b = np.zeros(n)
    for i in range(N):
        for d in range(n):
            b[d] += X[i, d] - S[i, d]
    for d in range(n):
        b[d] /= N
    t = np.empty(n)
    p = np.empty(n)
    primal, dual = np.inf, -np.inf
    sweeps = 0
    while sweeps < max_sweeps:
        for _ in range(check_every):
            for i in range(N):
                for j in range(k):
                    for d in range(n):
                        t[d] = X[i, d] - b[d] - S[i, d] + Y[i, j, d]
                    _proj_cone(t, C[j], cth[j], sth[j], free[j], p)
                    s = 0.0
                    for d in range(n):
                        s += p[d] * p[d]
                    s = math.sqrt(s)
                    f = 1.0 - lam / s if s > lam else 0.0
                    for d in range(n):
                        v = f * p[d]
                        S[i, d] += v - Y[i, j, d]
                        Y[i, j, d] = v
            for d in range(n):
                b[d] = 0.0
            for i in range(N):
                for d in range(n):
                    b[d] += X[i, d] - S[i, d]
            for d in range(n):
                b[d] /= N
            sweeps += 1
        primal, dual, _b = certify(X, lam, C, cth, sth, free, Y)
        g = primal - dual
        if dual >= target or g <= tol_abs:
            break
        if primal < target and g <= 0.5 * (target - primal):
            break
    return dual, primal, sweeps


@nb.njit(**_JIT)
def polish(X, lam, W, b, Z, iters, code_sweeps):  # pragma: no cover - compiled
    """Alternating minimisation of the objective from ``(W, b)``, in place on W (k, n), b, Z (N, k).

    Codes by coordinate descent (``z_ij = max(0, <r, w_j> - lam)``), then the optimal bias,
    then each unit atom ``w_j ∝ sum_i z_ij r_ij``. Every step does not increase the objective.
    Returns the objective of the final ``(W, Z, b)``.
    """
    N, n = X.shape
    k = W.shape[0]
    R = np.empty((N, n))  # residual x - b - z W
    for it in range(iters + 1):
        for i in range(N):
            for d in range(n):
                s = X[i, d] - b[d]
                for j in range(k):
                    s -= Z[i, j] * W[j, d]
                R[i, d] = s
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
        for d in range(n):
            m = 0.0
            for i in range(N):
                m += R[i, d]
            m /= N
            b[d] += m
            for i in range(N):
                R[i, d] -= m
        if it == iters:
            break
        for j in range(k):
            v = np.zeros(n)
            for i in range(N):
                if Z[i, j] > 0.0:
                    for d in range(n):
                        v[d] += Z[i, j] * (R[i, d] + Z[i, j] * W[j, d])
            nv = 0.0
            for d in range(n):
                nv += v[d] * v[d]
            nv = math.sqrt(nv)
            if nv > 0.0:
                for i in range(N):
                    if Z[i, j] > 0.0:
                        for d in range(n):
                            R[i, d] += Z[i, j] * (W[j, d] - v[d] / nv)
                for d in range(n):
                    W[j, d] = v[d] / nv
    val = 0.0
    for i in range(N):
        for d in range(n):
            val += R[i, d] * R[i, d]
        for j in range(k):
            val += 2.0 * lam * Z[i, j]
    return val / N
