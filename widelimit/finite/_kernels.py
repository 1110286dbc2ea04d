r"""Compiled kernels of the finite-width branch and bound (docs/theory.md §7).

The node relaxation (docs/theory.md §7.2): with atom ``j`` known to lie in a spherical cap of centre
``c_j`` and angle ``theta_j < pi/2`` (or anywhere, ``free``), replace each product
``y_ij = z_ij w_j`` by a free vector of the cap's convex cone ``K_j``:

.. math:: R = \min_{b,\; y_{ij}\in K_j} \frac1N\sum_i \Big\|\sum_j y_{ij} + b - x_i\Big\|^2
          + \frac{2\lambda}{N}\sum_{ij}\|y_{ij}\| .

:func:`node_solve` runs exact block-coordinate descent on it (each block ``y_ij`` has the
closed-form minimiser ``shrink_lam(P_Kj(t))``), and certifies a lower bound from the dual
point ``u_i = x_i - b - sum_j y_ij`` made feasible (docs/theory.md §7.3):

.. math:: R \ge \frac1N\sum_i 2\langle x_i, u_i\rangle - \|u_i\|^2
          \quad\text{for any } u \text{ with } \sum_i u_i = 0,\ \|P_{K_j} u_i\| \le \lambda .

Everything is float64, no fastmath: the dual value is a certificate.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..coding.fixed_dictionary import codes_then_bias, objective_from_residual, residual

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
def _optimal_bias(X, S, b):  # pragma: no cover - compiled
    """``b = mean_i (x_i - s_i)``: the optimal bias for the summed products ``S`` (N, n), in place."""
    N, n = X.shape
    for d in range(n):
        m = 0.0
        for i in range(N):
            m += X[i, d] - S[i, d]
        b[d] = m / N


@nb.njit(**_JIT)
def recentre(U):  # pragma: no cover - compiled
    """Subtract the column means in place, so that ``sum_i u_i = 0`` (the bias's dual constraint)."""
    N, n = U.shape
    for d in range(n):
        m = 0.0
        for i in range(N):
            m += U[i, d]
        m /= N
        for i in range(N):
            U[i, d] -= m


@nb.njit(**_JIT)
def certify(X, lam, C, cth, sth, free, Y):  # pragma: no cover - compiled
    """Primal value of the relaxation at ``Y`` (optimal bias) and a certified dual lower bound.

    Returns ``(primal, dual, b)``. The dual point is the negated residual, recentred to sum to
    zero and scaled by ``alpha = min(1, lam / max_ij ||P_Kj u_i||)`` (docs/theory.md §7.3).
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
    _optimal_bias(X, S, b)
    U = np.empty((N, n))
    rec = 0.0
    for i in range(N):
        for d in range(n):
            u = X[i, d] - b[d] - S[i, d]
            U[i, d] = u
            rec += u * u
    primal = (rec + 2.0 * lam * pen) / N
    recentre(U)
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
    _optimal_bias(X, S, b)
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
            _optimal_bias(X, S, b)
            sweeps += 1
        primal, dual, _b = certify(X, lam, C, cth, sth, free, Y)
        g = primal - dual
        if dual >= target or g <= tol_abs:
            break
        if primal < target < np.inf and g <= 0.5 * (target - primal):
            break
    return dual, primal, sweeps


@nb.njit(**_JIT)
def polish(X, lam, W, b, Z, iters, code_sweeps):  # pragma: no cover - compiled
    """Alternating minimisation of the objective from ``(W, b)``, in place on W (k, n), b, Z (N, k).

    Codes by coordinate descent, then the optimal bias (:func:`codes_then_bias`), then each unit atom
    ``w_j ∝ sum_i z_ij r_ij``. Every step does not increase the objective.
    Returns the objective of the final ``(W, Z, b)``.
    """
    N, n = X.shape
    k = W.shape[0]
    R = np.empty((N, n))  # residual x - b - z W
    for it in range(iters + 1):
        residual(X, W, b, Z, R)
        codes_then_bias(X, lam, W, b, Z, R, code_sweeps)
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
    return objective_from_residual(lam, Z, R)


@nb.njit(**_JIT)
def _face_vec(face, p, n, out):  # pragma: no cover - compiled
    """Unit vector of cube face ``face`` at face coordinates ``p`` (n-1,)."""
    axis = face // 2
    sign = -1.0 if face % 2 else 1.0
    q = 0
    s = 0.0
    for d in range(n):
        if d == axis:
            out[d] = sign
        else:
            out[d] = p[q]
            q += 1
        s += out[d] * out[d]
    s = math.sqrt(s)
    for d in range(n):
        out[d] /= s


@nb.njit(**_JIT)
def box_cap(face, lo, hi, n, c):  # pragma: no cover - compiled
    """Centre (written to ``c``) and angle of a cap containing the directions of a face box (docs/theory.md §7.1).

    The minimum of ``<w, c>`` over the box's directions is at a corner (quasi-concavity);
    the angle gets a 1e-12 rad margin for rounding.
    """
    m = n - 1
    mid = np.empty(m)
    for q in range(m):
        mid[q] = 0.5 * (lo[q] + hi[q])
    _face_vec(face, mid, n, c)
    corner = np.empty(m)
    v = np.empty(n)
    cmin = 1.0
    for mask in range(1 << m):
        for q in range(m):
            corner[q] = hi[q] if (mask >> q) & 1 else lo[q]
        _face_vec(face, corner, n, v)
        s = 0.0
        for d in range(n):
            s += v[d] * c[d]
        if s < cmin:
            cmin = s
    if cmin < -1.0:
        cmin = -1.0
    return math.acos(cmin) + 1e-12


@nb.njit(**_JIT)
def heuristic(X, lam, Y, C, iters):  # pragma: no cover - compiled
    """Upper bound from a node: atoms along the relaxed products' sums (cap centre if none), polished.

    Returns ``(value, W, Z, b)``.
    """
    N, n = X.shape
    k = C.shape[0]
    W = np.empty((k, n))
    b = np.zeros(n)
    for d in range(n):
        for i in range(N):
            b[d] += X[i, d]
    for j in range(k):
        s = 0.0
        for d in range(n):
            v = 0.0
            for i in range(N):
                v += Y[i, j, d]
            W[j, d] = v
            s += v * v
            b[d] -= v
        s = math.sqrt(s)
        for d in range(n):
            W[j, d] = W[j, d] / s if s > 0 else C[j, d]
    for d in range(n):
        b[d] /= N
    Z = np.zeros((N, k))
    val = polish(X, lam, W, b, Z, iters, 3)
    return val, W, Z, b


@nb.njit(**_JIT)
def symmetric_ok(faces, lo0, hi0):  # pragma: no cover - compiled
    """Can boxes hold atoms ordered by (face, first face coordinate)? (docs/theory.md §7.4)

    ``lo0, hi0``: the boxes' first coordinate ranges (ignored for n = 1). Unassigned atoms
    (face -1) follow the assigned prefix. Within a run of one face, a nondecreasing choice
    exists iff ``lo_i <= hi_l`` for every ``i < l`` of the run.
    """
    k = faces.size
    for j in range(1, k):
        if faces[j] < 0:
            break
        if faces[j] < faces[j - 1]:
            return False
        if faces[j] == faces[j - 1] and lo0.size:
            i = j - 1
            while i >= 0 and faces[i] == faces[j]:
                if lo0[i] > hi0[j]:
                    return False
                i -= 1
    return True
