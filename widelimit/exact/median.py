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

import contextlib
import dataclasses
import time

import numpy as np


from .._params import LAM, NONNEG, POSITIVE_INT, PROGRESS, SEED, TOL, ArrayLike, Data, PathLike, validate_params
from .._validation import _finite_chunk, check_vector, check_weights
from .median_result import MedianResult
from .collinear import collinear_fit, project_chunk, solve_1d
from .newton import line_min, newton_direction, subsample_rows
from .median_bound import ETA, check_consistent, gamma, lower_bound, norm, sum_depth
from .median_pass import _grad, _merge_pass, _pass, _pass_chunk
from .median_checkpoint import load_problem_state, saved_state, verified_mean
from .scaling import full_normaliser, normaliser, on_scaled_data, unscale_median
from ..engine.checkpoint import checkpoint_lock
from ..engine.fingerprint import mismatch_error
from ..engine import engine_for
from ..engine.local import (
    FloatOverflow,
    LocalEngine,
    Progress,
    save_checkpoint,
)

__all__ = ["MedianResult", "huber_median", "geometric_median", "huber_value"]

_EPS = np.finfo(np.float64).eps


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------



#: Secant pairs of the last iterations that correct the subsample Newton matrix (BFGS updates).
SECANT_PAIRS = 2


def _solve(X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress=None, checkpoint=None, tap=None):
    """Solve a median problem on validated data ``X`` with validated weights ``w`` (or None).

    When the passes run on several threads, BLAS runs on one in between (see
    :func:`widelimit.engine.local.one_blas_thread`). Data far from unit magnitude are solved
    as ``f X`` with an exact power of two ``f`` (:mod:`widelimit.exact.scaling`).
    """
    t0 = time.perf_counter()

    def run(f):
        return on_scaled_data(X, lam, lambda Xf, lam_f, _: _solve_passes(
            Xf, lam_f, w, kind, tol, xtol, max_iter, hess_rows, seed, progress, checkpoint, tap),
            lambda res, f_: unscale_median(res, f_, lam), f=f)

    f = normaliser(X)
    with contextlib.nullcontext() if checkpoint is None else checkpoint_lock(checkpoint):  # one writer at a time
        try:
            res = run(f)
        except FloatOverflow:  # the sampled rows missed the largest: scale from all of them, once
            f_all = full_normaliser(X)
            if f_all == f:
                raise
            res = run(f_all)
    weighted = w is not None and not bool(np.all(w == 1.0))
    return dataclasses.replace(res, weighted=weighted, tol=float(tol), time_s=time.perf_counter() - t0)



def _solve_passes(X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress=None, checkpoint=None, tap=None):
    """:func:`_solve`'s iterations: the start (a warm start on the subsample, or a checkpoint), the exact
    solution of collinear data, then certified Newton iterations (:class:`_Run`).

    ``tap`` (in-process engines only, e.g. :class:`widelimit.exact.rays.KeysTap`): its ``VT`` rows are
    projected in the passes that may be the last one (the collinear certificate, and Newton trials
    once the gap is below ``sqrt(tol)``), which hand ``[r, VT (x - b) / r]`` to
    ``tap.store(rows, start)`` and set ``tap.point`` to the point they were made at.
    """
    run = _Run(X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress, checkpoint, tap)
    b, p, val, lb, line = run.start()
    if line is not None:
        out = run.collinear(line, b, p, val, lb)
        if isinstance(out, MedianResult):
            return out
        b, p, val, lb = out
    return run.iterate(b, p, val, lb)


class _Run:
    """One median solve on all data: its engine, subsample, rounding bounds, checkpoint and passes."""

    def __init__(self, X, lam, w, kind, tol, xtol, max_iter, hess_rows, seed, progress, checkpoint, tap):
        N, n = X.shape
        self.X, self.lam, self.w, self.kind, self.tol, self.xtol = X, lam, w, kind, tol, xtol
        self.max_iter, self.hess_rows, self.seed, self.progress, self.checkpoint = max_iter, hess_rows, seed, \
            progress, checkpoint
        self.N, self.n = N, n
        self.W = float(N) if w is None else float(w.sum())
        rng = np.random.default_rng(seed)
        self.m = subsample_rows(N, n, hess_rows)
        self.sub = np.sort(rng.choice(N, size=self.m, replace=False)) if self.m < N else np.arange(N)
        self.engine = engine_for(X, progress)
        self.lam_out = lam if kind == "huber" else None
        self.tap = tap if isinstance(self.engine, LocalEngine) else None
        self.tap_now = False
        self.eps_r = 0.0
        # rounding level of the sums (for the step tests); the bounds subtract a rigorous bound instead
        self.round_rel = 8 * _EPS * np.sqrt(N)
        self.K = sum_depth(self.engine)
        self.gK = gamma(self.K)
        self.mean = None
        self.e_mean = 0.0  # bound on the rounding error of `mean` (norm)
        self.err_now = 0.0  # what the last bound was lowered by for rounding (median_bound.lower_bound)
        self.best_lb = -np.inf
        self.problem, self.state = self._load()

    def _load(self):
        """The checkpoint's problem description and saved state (``None`` when there is none)."""
        if self.checkpoint is None:
            return None, None
        return load_problem_state(self.checkpoint, self.kind, self.lam, self.tol, self.xtol, self.max_iter,
                                  self.hess_rows, self.seed, self.N, self.n, self.w)

    def report(self, stage, val=None, lb=None):
        if self.progress is not None:
            self.progress(Progress(stage, self.engine.passes, self.N, self.N, value=val, lower_bound=lb, done=True))

    def certify(self, b, stage="newton", stats=False):
        """Value and rigorous lower bound at ``b`` (one pass; the first pass also hashes every row)."""
        engine, gK = self.engine, self.gK
        engine.stage = stage
        use_tap = self.tap is not None and self.tap_now
        p = engine.reduce(_pass_chunk, _merge_pass, b, self.lam, self.kind, self.eps_r, stats,
                          self.tap if use_tap else None, extras=(self.w,), fingerprint=stats)
        if use_tap:
            self.tap.point = np.array(b, copy=True)
        if stats:
            mb = p.dsum / self.W
            e_mb = 4.0 * gK * (p.rmax + norm(mb))
        else:
            mb = self.mean - b
            e_mb = self.e_mean + 4.0 * gK * (norm(self.mean) + norm(b))
        lb, self.err_now = lower_bound(p, self.W, mb, e_mb, self.lam, self.kind, self.K)
        val = p.value / self.W
        self.best_lb = max(self.best_lb, lb)  # every bound seen is a bound of the same minimum
        check_consistent(val, 4.0 * gK * val + 4.0 * self.N * ETA / self.W, self.best_lb, "the median's objective")
        return p, val, max(lb, 0.0)  # the objective is >= 0

    def done(self, gap, val):
        """The requested tolerance, floored at the rounding level of the bound."""
        return gap <= max(self.tol * max(val, 1e-300), 4.0 * self.err_now)

    def start(self):
        """The subsample in memory, then the first certified point: a warm start solved on the subsample
        (or its mean), or the checkpoint's point. Returns ``(b, p, val, lb, line)`` with ``line`` the
        data's line when they are collinear (``None`` otherwise or on resume)."""
        w, sub, engine = self.w, self.sub, self.engine
        Xs = self.Xs = engine.take(sub)  # the Newton matrix's subsample (random access, not a pass)
        if not np.isfinite(Xs).all():  # streamed data are checked as they are read: find the first bad row
            engine.reduce(_finite_chunk, lambda a, b: None, stage="check")
        self.ws_sub = np.ones(self.m) if w is None else w[sub]
        wsum_sub = self.wsum_sub = float(self.ws_sub.sum())
        mean_sub = self.ws_sub @ Xs / wsum_sub if wsum_sub > 0 else Xs.mean(axis=0)
        if self.kind == "geometric":  # distances below this count as coinciding with b
            self.eps_r = 8.0 * _EPS * max(1.0, float(np.abs(mean_sub).max()))
        if self.state is not None:
            # resume: one certifying pass at the saved point re-reads (and hashes) every row; nothing saved is
            # trusted for what certifies: the bound is this pass's, the saved mean is checked against the
            # mean this pass computes (docs/theory.md §8.5)
            meta, arr = self.state
            N, W, gK = self.N, self.W, self.gK
            b = saved_state(self.checkpoint, meta, arr, self.n, lambda v: 4.0 * gK * abs(v) + 4.0 * N * ETA / W)
            p, val, lb = self.certify(b, "resume", stats=True)
            if engine.fingerprint != meta["fingerprint"]:
                raise mismatch_error(f"{self.checkpoint}: the checkpoint", meta["fingerprint"], engine.fingerprint)
            self.mean, self.e_mean = verified_mean(self.checkpoint, arr["mean"], meta["e_mean"], b + p.dsum / W,
                                                   4.0 * gK * (p.rmax + norm(b)))
            return b, p, val, lb, None
        # warm start: solve on the subsample (in memory, cheap), then polish on all data
        if self.m < self.N:
            # the subsample's median is within about scale / sqrt(m) of the full one: a modest accuracy suffices
            warm = _solve(Xs, self.lam, None if w is None else w[sub], self.kind, 1e-8, 1e-6, self.max_iter,
                          self.hess_rows, self.seed)
            b = warm.point.copy()
        else:
            b = mean_sub.copy()  # the subsample is all of X
        # first pass: the value, gradient and bound at the warm start, plus the weighted mean and
        # the data scale (it also checks that every row is finite)
        p, val, lb = self.certify(b, "mean", stats=True)
        self.mean = b + p.dsum / self.W
        self.e_mean = 4.0 * self.gK * (p.rmax + norm(b))
        tol_abs = 64.0 * float(np.finfo(self.X.dtype).eps) * max(p.xmax, 1e-300)  # distances between rows
        line = collinear_fit(engine, sub, tol_abs)
        self.report("mean", val, lb)
        return b, p, val, lb, line

    def collinear(self, line, b, p, val, lb):
        """Data on one line: the 1-D optimum (docs/theory.md §3.1), certified on all data. Returns the
        :class:`MedianResult` when it meets the tolerance, else ``(b, p, val, lb)`` to polish by Newton."""
        o, u = line
        if u is None:  # all points identical
            b = o.copy()
            seg = np.stack([b, b])
        else:
            t = self.engine.map_rows(project_chunk, o, u, stage="collinear")
            lo, hi = solve_1d(t, self.w, self.lam, self.kind)
            seg = np.stack([o + lo * u, o + hi * u])
            b = o + 0.5 * (lo + hi) * u
        self.tap_now = True
        lb0 = lb
        p, val, lb = self.certify(b, "certificate")
        self.report("certificate", val, lb)
        gap = val - lb
        if self.done(gap, val):
            return MedianResult(
                point=b, value=val, lower_bound=lb, gap=gap, segment=seg, n_passes=self.engine.passes, n_iter=0,
                certified=True, method="collinear-exact", kind=self.kind, lam=self.lam_out,
                fingerprint=self.engine.fingerprint, rounding=self.err_now, radius=p.rmax,
            )
        # safeguard: collinear only to the data's precision (float32: up to ~64 eps |x| off the line), and
        # the 1-D optimum is not certified: polish it with the Newton iterations below
        self.tap_now = False
        return b, p, val, max(lb, lb0)

    def step(self, b, p, val, gdir, pairs, precise):
        """One safeguarded Newton step from ``b``: the subsample Newton direction, then a line search on the
        subsample, backtracking, or the majorise-minimise step. Returns ``(trial, pt, vt, lbt, precise)``,
        or ``None`` when even the majorise-minimise step does not lower the value (the rounding level)."""
        kind, round_rel, a = self.kind, self.round_rel, p.a  # a: the majoriser's isotropic curvature
        # Newton step with the subsample Newton matrix (a I - M, secant-corrected): Bm d = g
        d = newton_direction(self.Xs, self.ws_sub * (self.W / self.wsum_sub), b, self.lam, kind, self.eps_r, p.a,
                             p.a_in, pairs, gdir, precise)
        if not np.isfinite(d).all():  # a degenerate Newton matrix: take the majorise-minimise direction
            d = gdir / a
        trial = b + d
        pt, vt, lbt = self.certify(trial)
        ok = vt < val or (vt <= val * (1 + 8 * round_rel) and norm(_grad(pt, kind)) < norm(gdir))
        if not ok and kind == "geometric" and p.w0 == 0 and p.rmin < norm(d):
            # converging onto a data point: try it
            trial = self.engine.take([p.imin])[0].copy()
            pt, vt, lbt = self.certify(trial)
            ok = vt <= val
        if not ok and kind == "huber" and vt > val * (1 + 8 * round_rel):
            # Overshoot: the Newton matrix jumps where points cross the lam sphere (and is nearly
            # singular when most points are beyond lam, e.g. nearly collinear data whose optimum
            # sits at such a crossing). Minimise along d on the in-memory subsample (exact when it
            # is all of X), then check the step on all data.
            t = line_min(self.Xs, self.ws_sub, b, d, self.lam, kind)
            if 0.0 < t < 1.0:
                full = (trial, pt, vt, lbt)
                trial = b + t * d
                pt, vt, lbt = self.certify(trial)
                ok = vt < val
                if not ok:  # no gain on all data: backtrack from the full step as before
                    trial, pt, vt, lbt = full
        t = 1.0
        while not ok and t > 1.0 / 64 and vt > val * (1 + 8 * round_rel):
            # backtrack along the Newton direction
            t *= 0.25
            trial = b + t * d
            pt, vt, lbt = self.certify(trial)
            ok = vt < val
        if ok:
            return trial, pt, vt, lbt, precise
        # majorise-minimise step: never increases the value (the float32 Newton matrix may be what failed)
        if kind == "huber" or p.w0 == 0:
            mm = b + gdir / a
        else:  # Vardi-Zhang step for a point coinciding with b
            mm = b + (1.0 - min(1.0, p.w0 / norm(p.g))) * p.g / a
        pt, vt, lbt = self.certify(mm)
        return None if vt > val else (mm, pt, vt, lbt, True)

    def iterate(self, b, p, val, lb):
        """Newton iterations from ``b`` until the certified gap meets ``tol`` and the steps are below ``xtol``
        (saving the checkpoint after each); returns the :class:`MedianResult`."""
        n, kind = self.n, self.kind
        scale = max(1e-300, float(np.sqrt(np.mean(np.sum((self.Xs - self.Xs.mean(0)) ** 2, axis=1)))))
        if self.state is None:
            history, it, small_step, prev_step, passes0 = [(val, lb)], 0, False, 0.0, 0
            pairs = np.zeros((0, 2, n))  # secant pairs (step, change of the gradient) of the last iterations
        else:  # the saved trajectory (iterations, secant pairs, history) steers the iterations; it certifies nothing
            meta, arr = self.state
            it, small_step = meta["it"], meta["small_step"]
            prev_step = float(meta["prev_step"])
            pairs = arr["pairs"] if "pairs" in arr else np.zeros((0, 2, n))
            history = [tuple(h) for h in arr["history"].tolist()]
            passes0 = meta["passes"]

        def save():
            if self.checkpoint is not None:
                save_checkpoint(self.checkpoint, {
                    "problem": self.problem, "fingerprint": self.engine.fingerprint, "e_mean": self.e_mean,
                    "lb": lb, "it": it, "small_step": bool(small_step), "prev_step": prev_step,
                    "passes": passes0 + self.engine.passes,
                }, {"mean": self.mean, "b": b, "history": np.asarray(history, dtype=np.float64), "pairs": pairs})
                # ("lb" is kept for people reading the file; a resume recomputes the bound, never reads it)

        save()
        self.report("newton", val, lb)
        converged = False
        precise = n <= 64  # Newton matrix in float64 (cheap for small n)
        while it < self.max_iter:
            gap = val - lb
            if self.done(gap, val) and small_step:
                converged = True
                break
            if kind == "geometric" and p.w0 > 0 and norm(p.g) <= p.w0:
                converged = True  # 0 is in the subdifferential: b is an optimal data point
                break
            it += 1
            self.tap_now = gap <= np.sqrt(self.tol) * max(val, 1e-300)  # the next pass may be the last one
            gdir = _grad(p, kind)
            out = self.step(b, p, val, gdir, pairs, precise)
            if out is None:  # rounding level: nothing left to gain
                small_step = True
                converged = self.done(val - lb, val)
                break
            trial, pt, vt, lbt, precise = out
            step = norm(trial - b)
            pair = np.stack([trial - b, gdir - _grad(pt, kind)])[None]  # (s, y): y = change of the gradient
            pairs = np.concatenate([pairs, pair])[-SECANT_PAIRS:]
            b, p, val, lb = trial, pt, vt, max(lb, lbt)  # any dual bound seen is valid
            history.append((val, lb))
            # the point is polished when this step is below xtol, or when the steps contract fast
            # enough that the next one (about step^2 / prev_step) would be
            xs = self.xtol * scale
            small_step = step <= xs or (0 < step < 0.1 * prev_step and step * step <= xs * prev_step)
            prev_step = step
            save()
            self.report("newton", val, lb)
        gap = val - lb
        check_consistent(val, 4.0 * self.gK * val + 4.0 * self.N * ETA / self.W, lb, "the median's objective")
        return MedianResult(
            point=b, value=val, lower_bound=lb, gap=gap, segment=np.stack([b, b]),
            n_passes=passes0 + self.engine.passes, n_iter=it, certified=converged or self.done(gap, val),
            method="newton", kind=kind, lam=self.lam_out, history=history, fingerprint=self.engine.fingerprint,
            rounding=self.err_now, radius=p.rmax,
        )


_MEDIAN_CONSTRAINTS = {
    "X": Data(finite=False), "weights": [ArrayLike(), None], "tol": TOL, "xtol": NONNEG, "max_iter": POSITIVE_INT,
    "hess_rows": POSITIVE_INT, "seed": SEED, "progress": PROGRESS, "checkpoint": [PathLike(), None],
}


@validate_params({**_MEDIAN_CONSTRAINTS, "lam": LAM})
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
    # X is checked without its rows: the first pass checks every row (and names the first bad one)
    return _solve(X, lam, check_weights(weights, X.shape[0]), "huber", tol, xtol, max_iter, hess_rows, seed,
                  progress, checkpoint)


@validate_params(_MEDIAN_CONSTRAINTS)
def geometric_median(X, *, weights=None, tol=1e-12, xtol=1e-10, max_iter=100, hess_rows=4096, seed=0,
                     progress=None, checkpoint=None) -> MedianResult:
    r"""Certified geometric median :math:`\arg\min_b \frac{1}{\sum w}\sum_i w_i\|x_i - b\|`.

    Points may coincide with the median (handled with the optimal subgradient,
    as in Vardi and Zhang's modified Weiszfeld algorithm); collinear data are
    solved exactly and an optimal *segment* is returned when the weights split
    evenly (e.g. two points). See :func:`huber_median` for the parameters.
    """
    return _solve(X, None, check_weights(weights, X.shape[0]), "geometric", tol, xtol, max_iter, hess_rows, seed,
                  progress, checkpoint)


@validate_params({"X": Data(), "b": ArrayLike(), "lam": LAM, "weights": [ArrayLike(), None]})
def huber_value(X, b, *, lam, weights=None) -> float:
    """``H(b)``: the weighted mean of ``h_lam(||x_i - b||)`` (one pass, float64)."""
    w = check_weights(weights, X.shape[0])
    b = check_vector(b, X.shape[1], "b")
    p = _pass(X, w, b, lam, "huber", 0.0, engine_for(X))
    return p.value / (X.shape[0] if w is None else float(w.sum()))
