r"""The medians' dual lower bound, made rigorous in floating point.

Both median objectives are support functions, so each has a dual (docs/theory.md §4.1; with
the rounding accounted for, docs/theory.md §8.2):

.. math::
    \min_b \sum_i w_i h_\lambda(\|x_i-b\|) \;\ge\; \sum_i w_i\big(2\langle y_i, x_i-b\rangle-\|y_i\|^2\big)
    - 2\Big\|\sum_i w_i y_i\Big\| \max_i\|x_i - b\|
    \qquad\text{for all } \|y_i\|\le\lambda,

(the last term vanishes for dual-feasible ``y``, ``sum w y = 0``; it also covers the ``y``
that rounding leaves slightly infeasible, because the minimiser lies in the convex hull of
the points), and likewise with ``||y_i|| <= 1`` and the linear term for the geometric median.
At any ``b`` the clipped residuals minus their weighted mean, shrunk by ``s``, are such a
``y``; the bound is maximised over ``s`` in closed form from the sums of one pass.

**Rounding.** The sums are float64 sums whose rounding error is bounded under the standard
model ``fl(a op b) = (a op b)(1 + d)``, ``|d| <= u = 2^-53`` (docs/theory.md §8): a
sum or dot product through at most ``K`` roundings of nonnegative terms is off by at most
``gamma_K = K u / (1 - K u)`` times its value. :func:`lower_bound` subtracts a bound on
every error of the computed bound (the sums, the infeasibility of ``y`` and the final
arithmetic), so it is a lower bound of the exact minimum of the data as stored, not only of
a float64 approximation of it.
"""

from __future__ import annotations

import math

import numpy as np

from ..engine.local import chunk_rows
from .gap import InconsistentBound, check_consistent  # noqa: F401 (re-exported; defined with "certified")

__all__ = ["U", "ETA", "gamma", "sum_depth", "lower_bound", "norm"]

#: Unit roundoff of float64.
U = 2.0**-53
#: Underflow: a product or quotient is off by at most half the smallest subnormal, 2^-1075, absolutely; that
#: half is not a float64 (``2.0**-1075`` is 0.0), so the bounds use the smallest subnormal itself.
ETA = 2.0**-1074


def norm(v) -> float:
    """Euclidean norm without under- or overflow of the squares (``np.linalg.norm`` returns 0 for ``[1e-200] * n``)."""
    v = np.asarray(v, dtype=np.float64)
    m = float(np.abs(v).max()) if v.size else 0.0
    if m == 0.0 or not math.isfinite(m):
        return m
    q = v / m
    return m * math.sqrt(float(q @ q))


def gamma(k: float) -> float:
    """``gamma_k = k u / (1 - k u)``: the relative error bound of ``k`` float64 roundings (Higham, §3.1)."""
    ku = float(k) * U
    return ku / (1.0 - ku) if ku < 0.5 else math.inf


def sum_depth(engine) -> int:
    """A bound ``K`` on the roundings any one term of a pass's float64 sums goes through.

    Within a chunk of ``rows`` rows a kernel adds row terms one after another (SIMD lanes
    reassociate, which does not lengthen any chain beyond ``rows``); chunk partial sums are
    merged in a chain (in-process engine) or a tree of blocks of chunks (Dask), which adds at
    most the number of chunks plus the number of blocks. Each row term itself is an
    ``n``-term dot product plus a few operations; 64 covers those and the final divisions.
    """
    N, n = int(engine.N), int(engine.n)
    rows = int(getattr(engine, "rows", 0) or chunk_rows(n))
    blocks = len(getattr(engine, "offsets", [0, 0])) - 1
    return min(rows, N) + -(-N // rows) + blocks + n + 64


def lower_bound(p, W: float, mb: np.ndarray, e_mb: float, lam, kind: str, K: int) -> tuple[float, float]:
    """Rigorous lower bound on ``min_b mean_w phi(||x_i - b||)`` from the sums ``p`` of one pass at ``b``.

    Parameters
    ----------
    p : median_pass._Pass
        Sums at ``b`` (``value, g, A, B, w0, c0, rmax``).
    W : float
        Sum of the weights (``N`` for unit weights), as computed.
    mb : ndarray (n,)
        Weighted mean of the points minus ``b``, as computed; ``e_mb`` bounds its error (norm).
    lam : float or None
    kind : {"huber", "geometric"}
    K : int
        :func:`sum_depth` of the pass.

    Returns
    -------
    (lower_bound, rounding) : float, float
        The bound (already lowered) and the amount it was lowered by (both per unit weight).
    """
    g = gamma(K)
    R = p.rmax * (1.0 + g)  # max_i ||x_i - b||, exact, bounded
    nmb = norm(mb)
    if kind == "huber":
        gb = p.g / W
        ng = norm(gb)
        s_max = lam / (lam + ng) * (1.0 - 4.0 * g)  # ||c_i d_i|| <= lam (1 + g), ||gb|| <= ng (1 + g)
        P1 = p.A - W * float(gb @ mb)
        P2 = max(p.B - W * ng * ng, 0.0)
        s = s_max if P2 <= 0 else min(s_max, max(0.0, P1 / P2))
        lb = 2.0 * s * P1 - s * s * P2
        delta = 4.0 * g * W * (min(lam, R) * (1.0 + g) + ng)  # ||sum_i w_i c_i d_i - W gb||; c_i r_i <= min(lam, r_i)
        eP1 = 4.0 * g * p.A + 2.0 * W * ng * (e_mb + 4.0 * g * nmb)
        eP2 = 4.0 * g * (p.B + W * ng * ng) + 2.0 * ng * delta
        err = 2.0 * s * eP1 + s * s * eP2 + 4.0 * U * (2.0 * s * abs(P1) + s * s * P2) + 2.0 * s * delta * R
    else:
        gr = p.g
        ngr = norm(gr)
        v = -gr / max(p.w0, ngr) if p.w0 > 0 and ngr > 0 else np.zeros_like(gr)
        gb = (gr + p.w0 * v) / W
        ng = norm(gb)
        s = 1.0 / (1.0 + ng) * (1.0 - 4.0 * g)
        P1 = p.A + float(v @ p.c0) - W * float(gb @ mb)
        lb = s * P1
        nc0 = norm(p.c0)
        delta = 4.0 * g * W * (1.0 + ng)
        eP1 = 4.0 * g * (p.A + nc0) + 2.0 * W * ng * (e_mb + 4.0 * g * nmb)
        err = s * eP1 + 4.0 * U * s * abs(P1) + 2.0 * s * delta * R
    out = lb / W
    # underflow: each product or quotient of the pass may be off by ETA absolutely (subnormal sums are exact)
    err = (err + 64.0 * K * ETA * (p.rmax + 1.0)) / W + 4.0 * g * abs(out)  # + the weights' sum, the division
    return out - err, err
