"""One pass of the median solvers over the data: value, gradient, curvature and bound sums at a point.

The sums of :class:`_Pass` are what a Newton iteration and the certified lower bound of
:mod:`widelimit.exact.median` need at ``b`` (docs/theory.md §4); one fused compiled sweep per row block
(:func:`widelimit.engine.kernels.median_rows`), merged associatively over blocks by the data's engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.kernels import median_rows
from ..engine.local import LocalEngine, raise_nonfinite, scratch
from .median_bound import norm

@dataclass
class _Pass:
    value: float  # sum_i w_i phi(r_i)
    g: np.ndarray  # sum_i w_i y_i  (minus the gradient, /2 for Huber)
    a: float  # sum_i w_i c_i  (isotropic curvature of the majoriser)
    A: float  # sum_i w_i <y_i, x_i - b>
    B: float  # sum_i w_i ||y_i||^2
    rmin: float
    imin: int
    w0: float = 0.0  # geometric: weight of points coinciding with b
    c0: np.ndarray | None = None  # geometric: sum over coinciding points of w_i (x_i - b)
    dsum: np.ndarray | None = None  # with stats: sum_i w_i (x_i - b) (gives the weighted mean)
    xmax: float = 0.0  # with stats: an upper bound on max_i ||x_i|| (the data scale)
    rmax: float = 0.0  # max_i ||x_i - b|| (as computed)
    a_in: float = 0.0  # Huber: sum of the weights of the points within lam of b


def centered(c, b, slot: str = "a") -> np.ndarray:
    """``c - b`` in float64, in this thread's scratch array ``slot`` (one widening copy, then in place).

    For float32 ``c`` and float64 ``b`` the result is exact up to one float64 rounding per entry.
    """
    D = scratch(c.shape, slot)
    if c.dtype == np.float64:
        np.subtract(c, b, out=D)
    else:
        np.copyto(D, c)
        D -= b
    return D


_NO_V = np.zeros((0, 0))
_NO_W = np.zeros(0)


def _pass_chunk(c, s, b, lam, kind, eps_r, stats, tap, w):
    """What one iteration and the certificate need at ``b``, from rows ``s:s+len(c)``.

    One fused sweep over the block (:func:`widelimit.engine.kernels.median_rows`, float64
    arithmetic). With ``stats`` it also returns the weighted column sums and ``max |x_ij|``
    (the first pass of a solve needs the mean and the data scale, so it makes no separate pass
    for them). ``tap``, if given, receives each block's ``[r, V^T (x - b) / r]`` rows through
    ``tap.store(rows, start)`` (the exact solver takes the rays' sort keys from the median's
    last pass this way).
    """
    m, n = c.shape
    VT = _NO_V.reshape(0, n) if tap is None else tap.VT
    rows = np.empty((m, VT.shape[0] + 1)) if tap is not None else _NO_V
    value, g, a, A, B, rmin, imin, w0, c0, dsum, rmax, a_in = median_rows(
        c, b, 0.0 if lam is None else float(lam), kind == "geometric", float(eps_r),
        _NO_W if w is None else w, bool(stats), VT, rows)
    if not np.isfinite(value):
        raise_nonfinite(c, s)
    if tap is not None:
        tap.store(rows, s)
    if not stats:
        return _Pass(value, g, a, A, B, rmin, s + int(imin), w0, c0, None, 0.0, float(rmax), a_in)
    xmax = float(rmax) + norm(b)  # ||x_i|| <= ||x_i - b|| + ||b||
    return _Pass(value, g, a, A, B, rmin, s + int(imin), w0, c0, dsum, xmax, float(rmax), a_in)


def _merge_pass(p: _Pass, q: _Pass) -> _Pass:
    """Combine the sums of two row blocks (associative; ties of the nearest point go to the lower row)."""
    near = p if (p.rmin, p.imin) <= (q.rmin, q.imin) else q
    dsum = None if p.dsum is None else p.dsum + q.dsum
    return _Pass(p.value + q.value, p.g + q.g, p.a + q.a, p.A + q.A, p.B + q.B, near.rmin, near.imin,
                 p.w0 + q.w0, p.c0 + q.c0, dsum, max(p.xmax, q.xmax), max(p.rmax, q.rmax), p.a_in + q.a_in)


def _pass(X, w, b, lam, kind, eps_r, engine=None):
    """One pass over ``X`` at ``b`` (float64 accumulation over row chunks)."""
    engine = engine or LocalEngine(X)
    return engine.reduce(_pass_chunk, _merge_pass, b, lam, kind, eps_r, False, None, extras=(w,))


def _grad(p: _Pass, kind) -> np.ndarray:
    """``-grad`` of ``sum w phi`` (times 1/2 for Huber), with the best subgradient at coinciding points."""
    if kind == "huber" or p.w0 == 0.0:
        return p.g
    ng = norm(p.g)
    if ng <= p.w0:
        return np.zeros_like(p.g)
    return p.g * (1.0 - p.w0 / ng)
