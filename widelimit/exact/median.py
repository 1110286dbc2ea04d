r"""Certified medians: the optimal bias of the wide-limit problem.

Two location problems over ``b`` in R^n with point weights ``w_i >= 0``:

* the **Huber median** (the optimal SAE bias, theory.md §3)

  .. math:: H(b) = \frac{1}{\sum w}\sum_i w_i\, h_\lambda(\|x_i - b\|),
            \quad h_\lambda(r) = r^2\ (r\le\lambda),\ 2\lambda r-\lambda^2\ (r>\lambda);

* the **geometric median** :math:`G(b) = \frac{1}{\sum w}\sum_i w_i \|x_i - b\|`.

Both are solved by a safeguarded Newton method: each iteration is one pass over
the data (value, gradient and the sums the certificate needs, accumulated in
float64 over row chunks, O(N n)); the Newton matrix comes from a fixed random
subsample of at most a few thousand rows, so no ``N x N`` or per-point
``n x n`` work is ever done. A rejected Newton step falls back to the
majorise-minimise (Weiszfeld / IRLS) step, which never increases the value.

**Certificate.** Both objectives are support functions, so each has a dual:

.. math::
    h_\lambda(\|v\|) = \max_{\|y\|\le\lambda} 2\langle y, v\rangle - \|y\|^2, \qquad
    \min_b \sum_i w_i h_\lambda(\|x_i-b\|) = \max_{\|y_i\|\le\lambda,\ \sum_i w_i y_i = 0}
        \sum_i w_i\big(2\langle y_i, x_i\rangle - \|y_i\|^2\big),

and likewise ``||v|| = max_{||y||<=1} <y, v>`` for the geometric median. At any
``b`` the clipped residuals ``y_i`` (``x_i - b`` shortened to length ``lam``;
unit vectors for the geometric median) are made dual feasible by removing their
weighted mean and shrinking, which gives a rigorous lower bound on the optimum
from the same pass. ``value - lower_bound`` bounds the suboptimality of the
returned point; it tends to 0 with the gradient.

**Collinear data** (all points on one line, including N = 1 and identical
points) are solved exactly in one dimension by sorting breakpoints; the optimal
set can then be a segment (e.g. ``{-5, 5}`` with ``lam = 1``: every
``b`` in ``[-4, 4]``), returned as ``segment``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import hashlib
import json

from .._validation import _finite_chunk, check_data, check_lam, check_vector, check_weights
from ..engine.kernels import median_rows
from ..engine import engine_for
from ..engine.local import (
    LocalEngine,
    Progress,
    data_fingerprint,
    load_checkpoint,
    one_blas_thread,
    raise_nonfinite,
    save_checkpoint,
    scratch,
)

__all__ = ["MedianResult", "huber_median", "geometric_median", "huber_value"]

_EPS = np.finfo(np.float64).eps


@dataclass(frozen=True)
class MedianResult:
    """A certified solution of a median problem.

    Attributes
    ----------
    point : ndarray (n,)
        The returned location (inside ``segment`` when the optimum is not unique).
    value : float
        Objective at ``point`` (weighted mean over points).
    lower_bound : float
        Certified lower bound on the minimum value (from a dual-feasible point).
    gap : float
        ``value - lower_bound`` (>= 0): a bound on the suboptimality of ``point``.
    segment : ndarray (2, n)
        Endpoints of the optimal set when the data are collinear (equal rows
        when the optimum is unique); for non-collinear data the optimum is
        unique and both rows equal ``point``.
    n_passes : int
        Passes over the data that were made.
    n_iter : int
        Newton / majorise-minimise iterations.
    converged : bool
        Whether the relative gap reached the requested tolerance.
    method : str
        ``"newton"`` or ``"collinear-exact"``.
    kind : str
        ``"huber"`` or ``"geometric"``.
    lam : float or None
        The threshold of the Huber median.
    """

    point: np.ndarray
    value: float
    lower_bound: float
    gap: float
    segment: np.ndarray
    n_passes: int
    n_iter: int
    converged: bool
    method: str
    kind: str
    lam: float | None = None
    history: list = field(default_factory=list, repr=False)

    @property
    def rel_gap(self) -> float:
        """``gap / max(value, tiny)``."""
        return self.gap / max(abs(self.value), 1e-300)

    @property
    def unique(self) -> bool:
        """Whether the optimal set is a single point (always for non-collinear data)."""
        return bool(np.allclose(self.segment[0], self.segment[1], rtol=0, atol=0))


# --------------------------------------------------------------------------------------
# one pass over the data
# --------------------------------------------------------------------------------------


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
    value, g, a, A, B, rmin, imin, w0, c0, dsum, rmax = median_rows(
        c, b, 0.0 if lam is None else float(lam), kind == "geometric", float(eps_r),
        _NO_W if w is None else w, bool(stats), VT, rows)
    if not np.isfinite(value):
        raise_nonfinite(c, s)
    if tap is not None:
        tap.store(rows, s)
    if not stats:
        return _Pass(value, g, a, A, B, rmin, s + int(imin), w0, c0)
    xmax = float(rmax) + float(np.linalg.norm(b))  # ||x_i|| <= ||x_i - b|| + ||b||
    return _Pass(value, g, a, A, B, rmin, s + int(imin), w0, c0, dsum, xmax)


def _merge_pass(p: _Pass, q: _Pass) -> _Pass:
    """Combine the sums of two row blocks (associative; ties of the nearest point go to the lower row)."""
    near = p if (p.rmin, p.imin) <= (q.rmin, q.imin) else q
    dsum = None if p.dsum is None else p.dsum + q.dsum
    return _Pass(p.value + q.value, p.g + q.g, p.a + q.a, p.A + q.A, p.B + q.B, near.rmin, near.imin,
                 p.w0 + q.w0, p.c0 + q.c0, dsum, max(p.xmax, q.xmax))


def _pass(X, w, b, lam, kind, eps_r, engine=None):
    """One pass over ``X`` at ``b`` (float64 accumulation over row chunks)."""
    engine = engine or LocalEngine(X)
    return engine.reduce(_pass_chunk, _merge_pass, b, lam, kind, eps_r, False, None, extras=(w,))


def _lower_bound(p: _Pass, W: float, mean_minus_b: np.ndarray, lam, kind) -> float:
    """Certified lower bound on ``min_b sum_i w_i phi(||x_i - b||)`` (not yet divided by W)."""
    if kind == "huber":
        gb = p.g / W
        ng = float(np.linalg.norm(gb))
        s_max = lam / (lam + ng)  # ||y_i - gbar|| <= lam + ||gbar||
        P1 = p.A - W * float(gb @ mean_minus_b)
        P2 = p.B - W * ng * ng
        s = s_max if P2 <= 0 else min(s_max, max(0.0, P1 / P2))
        return 2.0 * s * P1 - s * s * max(P2, 0.0)
    # geometric: coinciding points take the subgradient that best cancels the rest
    gr = p.g
    ngr = float(np.linalg.norm(gr))
    v = -gr / max(p.w0, ngr) if p.w0 > 0 and ngr > 0 else np.zeros_like(gr)
    g = gr + p.w0 * v
    gb = g / W
    s = 1.0 / (1.0 + float(np.linalg.norm(gb)))
    P1 = p.A + float(v @ p.c0) - W * float(gb @ mean_minus_b)
    return max(0.0, s * P1)


def _grad(p: _Pass, kind) -> np.ndarray:
    """``-grad`` of ``sum w phi`` (times 1/2 for Huber), with the best subgradient at coinciding points."""
    if kind == "huber" or p.w0 == 0.0:
        return p.g
    ng = float(np.linalg.norm(p.g))
    if ng <= p.w0:
        return np.zeros_like(p.g)
    return p.g * (1.0 - p.w0 / ng)


# --------------------------------------------------------------------------------------
# collinear data: exact 1-D solution
# --------------------------------------------------------------------------------------


def _solve_1d(t, w, lam, kind):
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
        lo = x0 + (x1 - x0) * (-f0) / (f1 - f0)
    k_hi = int(np.flatnonzero(F <= tol)[-1])
    if abs(F[k_hi]) <= tol or k_hi == bp.size - 1:
        hi = bp[k_hi]
    else:
        x0, x1, f0, f1 = bp[k_hi], bp[k_hi + 1], F[k_hi], F[k_hi + 1]
        hi = x0 + (x1 - x0) * (-f0) / (f1 - f0)
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


def _project_chunk(c, s, o, u):
    return (c - o) @ u


def _newton_step(Bm, g, floor):
    """``d`` solving ``Bm d = g`` with the eigenvalues of the symmetric ``Bm`` raised to at least ``floor``.

    A Cholesky factorisation of ``Bm`` (n^3 / 3 flops) when its smallest pivot clears ``floor``;
    the eigendecomposition (several times dearer, which matters for n in the thousands) only
    when ``Bm`` is nearly singular or indefinite.
    """
    from scipy.linalg import LinAlgError, cho_factor, cho_solve

    try:
        c, low = cho_factor(Bm, check_finite=False)
        if np.diag(c).min() ** 2 >= floor:
            return cho_solve((c, low), g, check_finite=False)
    except LinAlgError:
        pass
    mu, V = np.linalg.eigh(Bm)
    return V @ ((V.T @ g) / np.maximum(mu, floor))


def _line_min(Xs, ws, b, d, lam, kind) -> float:
    """``argmin_{t in [0, 1]}`` of the weighted objective of the rows ``Xs`` at ``b + t d``.

    The objective is convex in ``t``; bounded Brent search to a relative ``1e-12`` in ``t``
    (about 50 evaluations of O(m n) each, on the subsample held in memory).
    """
    from scipy.optimize import minimize_scalar

    D0 = Xs - b

    def f(t):
        r = np.sqrt(np.einsum("ij,ij->i", D0 - t * d, D0 - t * d))
        return float(ws @ (np.where(r <= lam, r * r, 2.0 * lam * r - lam * lam) if kind == "huber" else r))

    res = minimize_scalar(f, bounds=(0.0, 1.0), method="bounded", options={"xatol": 1e-12, "maxiter": 200})
    return float(res.x) if f(float(res.x)) < f(0.0) else 0.0


def _collinear(engine, rng_idx, tol_abs):
    """Detect data on one line (or one point): (origin, unit direction or None), or None."""
    N = engine.N
    if N > rng_idx.size:  # a random subsample that is not collinear rules it out cheaply
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


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------


_CKPT_VERSION = 1

#: Secant pairs of the last iterations that correct the subsample Newton matrix (BFGS updates).
SECANT_PAIRS = 2


def _solve(X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress=None, checkpoint=None, tap=None):
    """Solve a median problem on validated data ``X`` with validated weights ``w`` (or None).

    When the passes run on several threads, BLAS runs on one in between (see
    :func:`widelimit.engine.local.one_blas_thread`).
    """
    if getattr(engine_for(X), "threads", 1) > 1:
        with one_blas_thread():
            return _solve_passes(X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress, checkpoint, tap)
    return _solve_passes(X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress, checkpoint, tap)


def _solve_passes(X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress=None, checkpoint=None, tap=None):
    """:func:`_solve`'s iterations.

    ``tap`` (in-process engines only, e.g. :class:`widelimit.exact.rays.KeysTap`): its ``VT`` rows are
    projected in the passes that may be the last one (the collinear certificate, and Newton trials
    once the gap is below ``sqrt(tol)``), which hand ``[r, VT (x - b) / r]`` to
    ``tap.store(rows, start)`` and set ``tap.point`` to the point they were made at.
    """
    N, n = X.shape
    W = float(N) if w is None else float(w.sum())
    dtype_eps = float(np.finfo(X.dtype).eps)
    rng = np.random.default_rng(seed)
    m = min(N, hess_rows)
    sub = np.sort(rng.choice(N, size=m, replace=False)) if m < N else np.arange(N)
    engine = engine_for(X, progress)
    lam_out = lam if kind == "huber" else None

    def report(stage, val=None, lb=None):
        if progress is not None:
            progress(Progress(stage, engine.passes, N, N, value=val, lower_bound=lb, done=True))

    problem = None
    state = None
    if checkpoint is not None:
        problem = {
            "version": _CKPT_VERSION, "kind": kind, "lam": lam, "tol": tol, "xtol": xtol, "max_iter": max_iter,
            "hess_rows": hess_rows, "seed": seed, "data": data_fingerprint(X),
            "weights": None if w is None else hashlib.sha1(w.tobytes()).hexdigest(),
        }
        state = load_checkpoint(checkpoint)
        if state is not None and state[0].get("problem") != json.loads(json.dumps(problem)):
            raise ValueError(f"{checkpoint}: checkpoint of a different problem (data, lam, weights or "
                             "settings changed); delete it or choose another path")

    eps_r = 0.0
    if not isinstance(engine, LocalEngine):
        tap = None
    tap_now = False

    # Floating-point slack: the bound is lowered by the rounding level of N-term float64 sums,
    # so that it stays a lower bound of the exact minimum, and convergence allows for it.
    round_rel = 8 * _EPS * np.sqrt(N)

    def certify(b, stage="newton", stats=False):
        engine.stage = stage
        use_tap = tap is not None and tap_now
        p = engine.reduce(_pass_chunk, _merge_pass, b, lam, kind, eps_r, stats, tap if use_tap else None,
                          extras=(w,))
        if use_tap:
            tap.point = np.array(b, copy=True)
        mb = p.dsum / W if stats else mean - b
        lb = _lower_bound(p, W, mb, lam, kind) / W
        return p, p.value / W, lb - round_rel * abs(lb)

    tol = max(tol, 4 * round_rel)

    Xs = engine.take(sub)  # the Newton matrix's subsample (random access, not a pass)
    if not np.isfinite(Xs).all():  # streamed data are checked as they are read: find the first bad row
        engine.reduce(_finite_chunk, lambda a, b: None, stage="check")
    ws_sub = np.ones(m) if w is None else w[sub]
    wsum_sub = float(ws_sub.sum())
    mean_sub = ws_sub @ Xs / wsum_sub if wsum_sub > 0 else Xs.mean(axis=0)
    if kind == "geometric":  # distances below this count as coinciding with b
        eps_r = 8.0 * _EPS * max(1.0, float(np.abs(mean_sub).max()))
    if state is None:
        # warm start: solve on the subsample (in memory, cheap), then polish on all data
        if m < N:
            # the subsample's median is within about scale / sqrt(m) of the full one: a modest accuracy suffices
            warm = _solve(Xs, lam, None if w is None else w[sub], kind, 1e-8, 1e-6, max_iter, hess_rows, seed)
            b = warm.point.copy()
        else:
            b = mean_sub.copy()  # the subsample is all of X
        # first pass: the value, gradient and bound at the warm start, plus the weighted mean and
        # the data scale (it also checks that every row is finite)
        p, val, lb = certify(b, "mean", stats=True)
        mean = b + p.dsum / W
        tol_abs = 64.0 * dtype_eps * max(p.xmax, 1e-300)  # rounding level of distances between rows
        line = _collinear(engine, sub, tol_abs)
        report("mean", val, lb)
    else:
        meta, arr = state
        mean = arr["mean"]
        line = None

    if line is not None:
        o, u = line
        if u is None:  # all points identical
            b = o.copy()
            seg = np.stack([b, b])
        else:
            t = engine.map_rows(_project_chunk, o, u, stage="collinear")
            lo, hi = _solve_1d(t, w, lam, kind)
            seg = np.stack([o + lo * u, o + hi * u])
            b = o + 0.5 * (lo + hi) * u
        tap_now = True
        p, val, lb = certify(b, "certificate")
        report("certificate", val, lb)
        gap = max(0.0, val - lb)
        return MedianResult(
            point=b, value=val, lower_bound=lb, gap=gap, segment=seg, n_passes=engine.passes, n_iter=0,
            converged=gap <= tol * max(val, 1e-300),
            method="collinear-exact", kind=kind, lam=lam_out,
        )

    scale = max(1e-300, float(np.sqrt(np.mean(np.sum((Xs - Xs.mean(0)) ** 2, axis=1)))))
    if state is None:
        history = [(val, lb)]
        it = 0
        small_step = False
        prev_step = 0.0
        passes0 = 0
        pairs = np.zeros((0, 2, n))  # secant pairs (step, change of the gradient) of the last iterations
    else:
        b = arr["b"]
        p = _Pass(meta["value"], arr["g"], meta["a"], meta["A"], meta["B"], meta["rmin"], meta["imin"],
                  meta["w0"], arr["c0"])
        val, lb, it, small_step = meta["val"], meta["lb"], meta["it"], meta["small_step"]
        prev_step = float(meta.get("prev_step", 0.0))
        pairs = arr["pairs"] if "pairs" in arr else np.zeros((0, 2, n))
        history = [tuple(h) for h in arr["history"].tolist()]
        passes0 = meta["passes"]

    def save():
        if checkpoint is None:
            return
        save_checkpoint(checkpoint, {
            "problem": problem, "val": val, "lb": lb, "it": it, "small_step": bool(small_step), "prev_step": prev_step,
            "passes": passes0 + engine.passes, "value": p.value, "a": p.a, "A": p.A, "B": p.B,
            "rmin": p.rmin, "imin": int(p.imin), "w0": p.w0,
        }, {"mean": mean, "b": b, "g": p.g, "c0": p.c0, "history": np.asarray(history, dtype=np.float64),
            "pairs": pairs})

    save()
    report("newton", val, lb)
    converged = False
    while it < max_iter:
        gap = max(0.0, val - lb)
        if gap <= tol * max(val, 1e-300) and small_step:
            converged = True
            break
        if kind == "geometric" and p.w0 > 0 and float(np.linalg.norm(p.g)) <= p.w0:
            converged = True  # 0 is in the subdifferential: b is an optimal data point
            break
        it += 1
        tap_now = gap <= np.sqrt(tol) * max(val, 1e-300)  # the next pass may be the last one
        gdir = _grad(p, kind)
        # Newton step with the subsample Newton matrix:  (a I - M) d = g
        D = Xs - b
        r = np.sqrt(np.einsum("ij,ij->i", D, D))
        if kind == "huber":
            act = r > lam
            coef = np.where(act, lam / np.where(act, r, 1.0) ** 3, 0.0)
        else:
            act = r > eps_r
            coef = np.where(act, 1.0 / np.where(act, r, 1.0) ** 3, 0.0)
        cw = ws_sub * coef * (W / wsum_sub)
        # the subsample's Newton matrix is an approximation anyway (its sampling error is about
        # 1/sqrt(m)): float32 products halve its cost and change nothing that is certified
        cmax = float(cw.max()) if cw.size and cw.max() > 0 else 1.0  # keep float32 in range (1/r^3 can be huge)
        D32 = D.astype(np.float32)
        M = ((D32 * (cw / cmax).astype(np.float32)[:, None]).T @ D32).astype(np.float64) * cmax
        a = p.a
        # Newton matrix a I - M, corrected by BFGS updates with the secant pairs of the last steps:
        # exact curvature along recent steps turns the subsample's linear rate superlinear
        Bm = a * np.eye(n) - 0.5 * (M + M.T)
        for s_, y_ in pairs:
            sy = float(s_ @ y_)
            Bs = Bm @ s_
            sBs = float(s_ @ Bs)
            if sy > 1e-12 * np.linalg.norm(s_) * np.linalg.norm(y_) and sBs > 0:
                Bm += np.outer(y_, y_) / sy - np.outer(Bs, Bs) / sBs
        d = _newton_step(0.5 * (Bm + Bm.T), gdir, 1e-9 * a)
        if not np.isfinite(d).all():  # a degenerate Newton matrix: take the majorise-minimise direction
            d = gdir / a
        trial = b + d
        pt, vt, lbt = certify(trial)
        ok = vt < val or (vt <= val * (1 + 8 * round_rel) and np.linalg.norm(_grad(pt, kind)) < np.linalg.norm(gdir))
        if not ok and kind == "geometric" and p.w0 == 0 and p.rmin < np.linalg.norm(d):
            # converging onto a data point: try it
            trial = engine.take([p.imin])[0].copy()
            pt, vt, lbt = certify(trial)
            ok = vt <= val
        if not ok and kind == "huber" and vt > val * (1 + 8 * round_rel):
            # Overshoot: the Newton matrix jumps where points cross the lam sphere (and is nearly
            # singular when most points are beyond lam, e.g. nearly collinear data whose optimum
            # sits at such a crossing). Minimise along d on the in-memory subsample (exact when it
            # is all of X), then check the step on all data.
            t = _line_min(Xs, ws_sub, b, d, lam, kind)
            if 0.0 < t < 1.0:
                full = (trial, pt, vt, lbt)
                trial = b + t * d
                pt, vt, lbt = certify(trial)
                ok = vt < val
                if not ok:  # no gain on all data: backtrack from the full step as before
                    trial, pt, vt, lbt = full
        t = 1.0
        while not ok and t > 1.0 / 64 and vt > val * (1 + 8 * round_rel):
            # backtrack along the Newton direction
            t *= 0.25
            trial = b + t * d
            pt, vt, lbt = certify(trial)
            ok = vt < val
        if not ok:
            # majorise-minimise step: never increases the value
            if kind == "huber" or p.w0 == 0:
                mm = b + gdir / a
            else:  # Vardi-Zhang step for a point coinciding with b
                ng = float(np.linalg.norm(p.g))
                mm = b + (1.0 - min(1.0, p.w0 / ng)) * p.g / a
            pt, vt, lbt = certify(mm)
            if vt > val:  # rounding level: nothing left to gain
                small_step = True
                gap = max(0.0, val - lb)
                converged = gap <= tol * max(val, 1e-300)
                break
            trial = mm
        step = float(np.linalg.norm(trial - b))
        pair = np.stack([trial - b, gdir - _grad(pt, kind)])[None]  # (s, y): y = change of the gradient
        pairs = np.concatenate([pairs, pair])[-SECANT_PAIRS:]
        b, p, val, lb = trial, pt, vt, max(lb, lbt)  # any dual bound seen is valid
        history.append((val, lb))
        # the point is polished when this step is below xtol, or when the steps contract fast
        # enough that the next one (about step^2 / prev_step) would be
        small_step = step <= xtol * scale or (0 < step < 0.1 * prev_step and step * step <= xtol * scale * prev_step)
        prev_step = step
        save()
        report("newton", val, lb)
    gap = max(0.0, val - lb)
    converged = converged or gap <= tol * max(val, 1e-300)
    return MedianResult(
        point=b, value=val, lower_bound=lb, gap=gap, segment=np.stack([b, b]), n_passes=passes0 + engine.passes,
        n_iter=it, converged=converged, method="newton", kind=kind, lam=lam_out, history=history,
    )


def huber_median(X, *, lam, weights=None, tol=1e-12, xtol=1e-10, max_iter=100, hess_rows=4096, seed=0,
                 progress=None, checkpoint=None) -> MedianResult:
    r"""Certified minimiser of the Huber location objective: the optimal SAE bias.

    .. math:: b^\star \in \arg\min_b H(b), \quad H(b) = \frac{1}{\sum_i w_i}\sum_i w_i\, h_\lambda(\|x_i - b\|).

    ``min_b H`` is the wide-limit lower bound on the SAE objective for every
    width (theory.md §3). It equals the geometric median when no point lies
    within ``lam`` of it, and moves towards clusters of nearby points
    otherwise (``{0,0,0,10}``, ``lam = 1``: ``b = 1/3``, ``H = 14/3``).

    Parameters
    ----------
    X : array (N, n), ActivationSource or dask.array
        Points (float16/bfloat16/float32 accepted; accumulated in float64). An
        :class:`~widelimit.data.source.ActivationSource` is streamed chunk by chunk
        (memory independent of N); a ``dask.array`` runs each pass as one
        Dask reduction (:mod:`widelimit.engine.dask_engine`).
    lam : float
        Huber threshold ``lam > 0``.
    weights : array (N,), optional
        Nonnegative point weights (default all 1).
    tol : float
        Target relative certified gap ``(value - lower_bound) / value``.
    xtol : float
        Stop only once the last step is below ``xtol`` times the data scale
        (polishes the point itself, not just the value).
    max_iter : int
        Iteration cap (each iteration is about one pass over X).
    hess_rows : int
        Size of the random subsample used for the Newton matrix.
    seed : int
        Seed of that subsample.
    progress : callable, optional
        Called with a :class:`widelimit.engine.local.Progress` after every chunk
        and after every pass (with the current value and certified bound).
    checkpoint : str or Path, optional
        A file (``.npz``) holding the O(n) state after every completed pass
        (the current point, the sums at it, the pass count). If it exists
        when the call starts, the run resumes from it, and gives the same
        result as an uninterrupted run; a checkpoint of different data, ``lam``
        or settings is refused.

    Returns
    -------
    MedianResult
        ``n_passes`` counts passes over the data (including those made before
        a resume).
    """
    X = check_data(X, finite=False)  # the first pass checks every row (and names the first bad one)
    return _solve(X, check_lam(lam), check_weights(weights, X.shape[0]), "huber", tol, xtol, max_iter, hess_rows,
                  seed, progress, checkpoint)


def geometric_median(X, *, weights=None, tol=1e-12, xtol=1e-10, max_iter=100, hess_rows=4096, seed=0,
                     progress=None, checkpoint=None) -> MedianResult:
    r"""Certified geometric median :math:`\arg\min_b \frac{1}{\sum w}\sum_i w_i\|x_i - b\|`.

    Points may coincide with the median (handled with the optimal subgradient,
    as in Vardi and Zhang's modified Weiszfeld algorithm); collinear data are
    solved exactly and an optimal *segment* is returned when the weights split
    evenly (e.g. two points). See :func:`huber_median` for the parameters.
    """
    X = check_data(X, finite=False)
    return _solve(X, None, check_weights(weights, X.shape[0]), "geometric", tol, xtol, max_iter, hess_rows, seed,
                  progress, checkpoint)


def huber_value(X, b, *, lam, weights=None) -> float:
    """``H(b)``: the weighted mean of ``h_lam(||x_i - b||)`` (one pass, float64)."""
    X = check_data(X)
    lam = check_lam(lam)
    w = check_weights(weights, X.shape[0])
    b = check_vector(b, X.shape[1], "b")
    p = _pass(X, w, b, lam, "huber", 0.0, engine_for(X))
    return p.value / (X.shape[0] if w is None else float(w.sum()))
