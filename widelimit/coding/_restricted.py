r"""The restricted solve of :mod:`widelimit.coding.cd`: coordinate descent and Newton steps on one token's working set.

Per token, on the working atoms ``W`` with Gram block ``G_WW`` and correlations ``c_W = U_W r``
(theory.md §8.6), minimise ``||xt - y U_W||^2 + 2 lam sum_a y_a`` over ``y >= 0``: cyclic
coordinate descent (a sweep costs ``|W|^2`` flops) and, every few sweeps, a Newton step on the
current support ``A`` (``G_AA y_A = q_A - lam`` by Cholesky), accepted when positive and better;
it stops at a restricted duality gap. Compiled with numba, called per token from
:func:`widelimit.coding.cd._round` (inside its ``prange``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .lasso import token_gap

__all__ = ["solve_token", "solve_blocks"]

_JIT = dict(nogil=True, cache=True)


@nb.njit(**_JIT)
def _cholesky_solve(A, rhs):  # pragma: no cover - compiled
    """Solve ``A z = rhs`` for symmetric ``A`` by Cholesky; returns ``(z, ok)`` (``ok`` False if not PD).

    The factor from LAPACK (``np.linalg.cholesky``: 5x the former loops at order 300, the Newton steps of supports
    of 300 atoms); a pivot ``L_jj^2 <= 1e-12 A_jj`` counts as not positive definite, as before."""
    m = A.shape[0]
    try:
        L = np.linalg.cholesky(A)
    except Exception:  # not positive definite
        return rhs.copy(), False
    for j in range(m):
        d = L[j, j]
        if not (d * d > 1e-12 * A[j, j]) or not (d > 0.0):
            return rhs.copy(), False
    z = rhs.copy()
    for i in range(m):
        t = z[i]
        for p in range(i):
            t -= L[i, p] * z[p]
        z[i] = t / L[i, i]
    for i in range(m - 1, -1, -1):
        t = z[i]
        for p in range(i + 1, m):
            t -= L[p, i] * z[p]
        z[i] = t / L[i, i]
    return z, True


@nb.njit(**_JIT)
def _restricted_gap(xx, q, y, c, w, lam):  # pragma: no cover - compiled
    """``(P, gap)`` of the restricted problem on the first ``w`` working atoms, from ``||xt||^2``, the
    products ``q = G_w y``, the codes ``y`` and the correlations ``c``."""
    qy = 0.0
    yc = 0.0
    l1 = 0.0
    mx = -np.inf
    for a in range(w):
        qy += q[a] * y[a]
        yc += y[a] * c[a]
        l1 += y[a]
        if c[a] > mx:
            mx = c[a]
    rr = xx - qy - yc
    if rr < 0.0:
        rr = 0.0
    return token_gap(rr, xx - qy, mx, l1, lam)


@nb.njit(**_JIT)
def _gather_row(G, w_idx, a, Gw):  # pragma: no cover - compiled
    """``Gw[a, :] = G[w_idx[a], w_idx]``."""
    row = w_idx[a]
    for bb in range(w_idx.shape[0]):
        Gw[a, bb] = G[row, w_idx[bb]]


@nb.njit(**_JIT)
def solve_token(G, c, xx, w_idx, y, lam, tol, floor, max_sweeps, newton_every):  # pragma: no cover - compiled
    """Coordinate descent + Newton on the working set ``w_idx`` (codes ``y`` and ``c`` updated in place).

    ``c = U_W r`` (float64) for the current residual ``r``; returns the sweeps used.
    """
    w = w_idx.shape[0]
    # rows of G_WW are gathered when first needed (an atom that never moves off zero needs only
    # its diagonal entry): the gathers are cache misses in the large Gram
    Gw = np.empty((w, w))
    have = np.zeros(w, np.bool_)
    diag = np.empty(w)
    for a in range(w):
        diag[a] = G[w_idx[a], w_idx[a]]
        if y[a] != 0.0:
            _gather_row(G, w_idx, a, Gw)
            have[a] = True
    q = c.copy()  # q = c + G y
    for a in range(w):
        ya = y[a]
        if ya != 0.0:
            for bb in range(w):
                q[bb] += ya * Gw[a, bb]
    sweeps = 0
    changed = True  # the support changed in the last sweep
    tried = False  # a Newton step was tried on the current support
    for sweep in range(max_sweeps):
        # restricted certificate
        P, gap = _restricted_gap(xx, q, y, c, w, lam)
        if gap <= tol * max(P, floor):
            break
        if changed:
            tried = False
        if newton_every > 0 and sweep > 0 and (sweep % newton_every == 0 if newton_every > 1 else not (changed or tried)):
            tried = True
            if _newton_step(Gw, q, c, y, xx, gap, lam, tol, floor):
                sweeps = sweep + 1
                break
        changed = False
        for a in range(w):
            new = y[a] + (c[a] - lam) / diag[a]
            if new < 0.0:
                new = 0.0
            delta = new - y[a]
            if delta != 0.0:
                if (new == 0.0) != (y[a] == 0.0):
                    changed = True
                if not have[a]:
                    _gather_row(G, w_idx, a, Gw)
                    have[a] = True
                y[a] = new
                for bb in range(w):
                    c[bb] -= delta * Gw[a, bb]
        sweeps = sweep + 1
    return sweeps


@nb.njit(**_JIT)
def _newton_step(Gw, q, c, y, xx, gap, lam, tol, floor):  # pragma: no cover - compiled
    """Newton step on the current support ``A``: solve ``G_AA y_A = q_A - lam`` (Cholesky) and accept the
    solution (``y``, ``c`` in place) when it is positive and its restricted gap is below ``gap``.

    ``q = c + G_WW y`` (the correlations at ``y = 0``). Returns True when the accepted step certifies.
    """
    w = y.shape[0]
    na = 0
    for a in range(w):
        if y[a] > 0.0:
            na += 1
    if na == 0:
        return False
    act = np.empty(na, np.int64)
    j = 0
    for a in range(w):
        if y[a] > 0.0:
            act[j] = a
            j += 1
    GA = np.empty((na, na))
    rhs = np.empty(na)
    for i in range(na):
        rhs[i] = q[act[i]] - lam
        for jj in range(na):
            GA[i, jj] = Gw[act[i], act[jj]]
    z, ok = _cholesky_solve(GA, rhs)
    if not ok:
        return False
    for i in range(na):
        if not (z[i] > 0.0):
            return False
    y2 = np.zeros(w)
    for i in range(na):
        y2[act[i]] = z[i]
    c2 = q.copy()
    for i in range(na):
        zi = z[i]
        row = act[i]
        for bb in range(w):
            c2[bb] -= zi * Gw[row, bb]
    P2, gap2 = _restricted_gap(xx, q, y2, c2, w, lam)
    if not (gap2 < gap):
        return False
    for a in range(w):
        y[a] = y2[a]
        c[a] = c2[a]
    return gap2 <= tol * max(P2, floor)


@nb.njit(parallel=True, **_JIT)
def solve_blocks(G, q, xx, y, width, lam, tol, floor, max_sweeps, newton_every):  # pragma: no cover - compiled
    r""":func:`solve_token` on a batch of per-token Gram blocks (the wide coder's restricted solves).

    Token ``t`` has ``width[t]`` working atoms, the first slots of ``G[t]`` (its block ``G_WW``, (w, w)) and
    ``q[t] = U_W xt`` (float64); its codes ``y[t]`` (the start, updated in place) solve
    ``min_{y >= 0} y^T G_WW y - 2 (q - lam)^T y`` to the restricted gap ``tol`` (relative, as
    :func:`solve_token`). Returns the sweeps each token used (``max_sweeps``: not settled). Tokens run in
    parallel (numba ``prange``).
    """
    used = np.zeros(G.shape[0], np.int64)
    for t in nb.prange(G.shape[0]):
        w = width[t]
        if w == 0:
            continue
        Gt = G[t]
        yt = y[t, :w].copy()
        c = q[t, :w].copy()  # c = q - G y: the correlations of the start's residual
        for a in range(w):
            ya = yt[a]
            if ya != 0.0:
                for b in range(w):
                    c[b] -= ya * Gt[a, b]
        used[t] = solve_token(Gt, c, xx[t], np.arange(w), yt, lam, tol, floor, max_sweeps, newton_every)
        for a in range(w):
            y[t, a] = yt[a]
    return used
