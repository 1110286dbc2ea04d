r"""Collinear data: the median problems solved exactly in one dimension.

When all points lie on one line ``o + t u`` (N = 1 and identical points included), both the
Huber and the geometric median reduce to minimising ``sum_i w_i phi(|t - t_i|)`` over ``t``:
a convex piecewise-quadratic (Huber) or piecewise-linear (geometric) function whose optimal
set, an interval, is found exactly by sorting the breakpoints (docs/theory.md §3.1). The
detection is a pass (the largest distance from the fitted line) after a cheap test on a
subsample.
"""

from __future__ import annotations

import numpy as np

__all__ = ["collinear_fit", "solve_1d", "project_chunk"]


def solve_1d(t, w, lam, kind):
    """Exact optimal interval ``[lo, hi]`` of ``sum_i w_i phi(|t - t_i|)`` over t."""
    order = np.argsort(t, kind="stable")
    ts = t[order]
    ws = np.ones_like(ts) if w is None else w[order]
    W = float(ws.sum())
    if kind == "geometric":
        cw = np.cumsum(ws)
        k = int(np.searchsorted(cw, 0.5 * W - 1e-12 * W))  # first index with cw >= W/2
        k = min(k, ts.size - 1)
        lo = ts[k]
        hi = ts[k + 1] if (abs(cw[k] - 0.5 * W) <= 1e-12 * W and k + 1 < ts.size) else lo
        return float(lo), float(hi)
    cw = np.concatenate([[0.0], np.cumsum(ws)])
    cwt = np.concatenate([[0.0], np.cumsum(ws * ts)])
    bp = np.unique(np.concatenate([ts - lam, ts + lam]))

    def dF(x):  # half the derivative: sum_i w_i clip(x - t_i, -lam, lam)
        i_lo = np.searchsorted(ts, x - lam, side="right")  # t_i <= x - lam: clipped at +lam
        i_hi = np.searchsorted(ts, x + lam, side="left")  # t_i >= x + lam: clipped at -lam
        wm = cw[i_hi] - cw[i_lo]
        sm = cwt[i_hi] - cwt[i_lo]
        return wm * x - sm + lam * (cw[i_lo] - (W - cw[i_hi]))

    F = dF(bp)
    tol = 1e-12 * lam * W
    k_lo = int(np.argmax(F >= -tol))
    if abs(F[k_lo]) <= tol or k_lo == 0:
        lo = bp[k_lo]
    else:
        x0, x1, f0, f1 = bp[k_lo - 1], bp[k_lo], F[k_lo - 1], F[k_lo]
        lo = x0 + (x1 - x0) * ((-f0) / (f1 - f0))  # ratio first: x and f can be near 1e300
    k_hi = int(np.flatnonzero(F <= tol)[-1])
    if abs(F[k_hi]) <= tol or k_hi == bp.size - 1:
        hi = bp[k_hi]
    else:
        x0, x1, f0, f1 = bp[k_hi], bp[k_hi + 1], F[k_hi], F[k_hi + 1]
        hi = x0 + (x1 - x0) * ((-f0) / (f1 - f0))  # ratio first: x and f can be near 1e300
    lo, hi = float(lo), float(hi)
    if hi < lo:  # unique optimum: the two interpolations agree up to rounding
        lo = hi = 0.5 * (lo + hi)
    return lo, hi


def _line_of(P, tol_abs):
    """Try to fit a line through the rows of ``P``: returns (origin, direction) or None if not collinear."""
    o = P[0]
    D = P - o
    d2 = np.einsum("ij,ij->i", D, D)
    j = int(np.argmax(d2))
    if d2[j] <= tol_abs * tol_abs:
        return o, None  # all identical so far
    u = D[j] / np.sqrt(d2[j])
    off = D - np.outer(D @ u, u)
    if np.sqrt(np.einsum("ij,ij->i", off, off)).max() > tol_abs:
        return None
    return o, u


def _far_chunk(c, s, o):
    """The row of a block farthest from ``o``: ``(distance, row, x - o)``."""
    D = c - o
    d = np.sqrt(np.einsum("ij,ij->i", D, D))
    j = int(np.argmax(d))
    return float(d[j]), s + j, D[j]


def _merge_far(p, q):
    return p if (p[0], -p[1]) >= (q[0], -q[1]) else q


def _offline_chunk(c, s, o, u):
    """Largest distance of a block's rows from the line ``o + t u``."""
    D = c - o
    off = D - np.outer(D @ u, u)
    return float(np.sqrt(np.einsum("ij,ij->i", off, off)).max())


def project_chunk(c, s, o, u):
    return (c - o) @ u


def collinear_fit(engine, rng_idx, tol_abs):
    """Detect data on one line (or one point): (origin, unit direction or None), or None."""
    N = engine.N
    # rows off one line rule collinearity out: a few first (cheap), then a random subsample
    head = engine.take(np.arange(min(N, 32)))
    if _line_of(head, tol_abs) is None:
        return None
    if N > rng_idx.size:
        if _line_of(engine.take(rng_idx), tol_abs) is None:
            return None
    fit = _line_of(engine.take(np.arange(min(N, 4096))), tol_abs)
    if fit is None:
        return None
    o, u = fit
    if u is None:  # the first rows coincide: the direction is that of the farthest point
        d, _i, D = engine.reduce(_far_chunk, _merge_far, o, stage="collinear")
        if d <= tol_abs:
            return o, None
        u = D / d
    if engine.reduce(_offline_chunk, max, o, u, stage="collinear") > tol_abs:
        return None
    return o, u
