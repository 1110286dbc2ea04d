r"""The exact wide-limit solver: closed-form global optimum with its certificate.

For every width ``k`` at least the number of rays, the global minimum of the
sparse dictionary-learning objective is (theory.md §3)

.. math:: \min_{W, Z\ge 0, b} L = \min_b H(b) = \min_b \frac1N\sum_i h_\lambda(\|x_i - b\|),

attained by the Huber median ``b*``, one unit atom per ray of points farther
than ``lam`` from ``b*``, and the 1-sparse codes ``z_i = r_i - lam`` on each
point's own ray. :func:`solve` builds that solution, picks the bias in the
optimal segment that needs the fewest atoms when the data are collinear, and
certifies it with :func:`widelimit.verify`'s machinery.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..engine.kernels import solution_rows
from .._params import (LAM, MAX_ITER, NONNEG, POSITIVE_INT, PROGRESS, SEED, THREADS, TIME_LIMIT, TOL, Boolean, Data,
                       InstanceOf, PathLike, validate_params)
from .._validation import chunk_rows
from ..results import CertifiedResult, shared_dict
from .certificate import (Certificate, _certificate, _sq_over_lam, check_given_median, make_certificate,
                          split_signed, verify_checked)
from .median_bound import sum_depth
from .median import MedianResult
from .median import _solve as _median
from .rays import KeysTap, RayGroups, _group_rays, default_ray_tol
from ..engine import engine_for
from ..engine.local import LocalEngine, raise_nonfinite
from ..engine.fingerprint import mismatch_error
from .scaling import (on_scaled_data, scale_median, unscale_certificate, unscale_finite, unscale_median,
                      unscaled_value)
from ..finite import FiniteLimits, solve_finite

if TYPE_CHECKING:  # the finite-width search imports this module
    from ..finite import FiniteSolution

__all__ = ["WideLimitSolution", "solve"]

#: Dense ``codes`` are built only up to this many entries; use ``sparse_codes`` beyond.
DENSE_CODES_LIMIT = 200_000_000


@dataclass(frozen=True)
class WideLimitSolution(CertifiedResult):
    """The narrowest globally optimal (W, Z, b) of the wide-limit problem.

    Attributes
    ----------
    value : float
        Objective of the returned ``(dictionary, codes, bias)`` (evaluated, not assumed).
    bias : ndarray (n,)
        Optimal bias ``b*`` (the Huber median; for collinear data the point of
        the optimal segment that needs the fewest atoms).
    bias_segment : ndarray (2, n)
        Endpoints of the set of optimal biases (equal rows when unique).
    dictionary : ndarray (k, n)
        Unit-norm atoms, one per ray (float32 for float32 data, else float64).
    rays : ndarray (N,) of int
        Atom used by each point, ``-1`` for points within ``lam`` of ``b*``.
    code_values : ndarray (N,)
        Each point's single nonzero code (0 for points within ``lam``).
    certificate : Certificate
        Lower bound, gap, dual quantities, ``certified``.
    median : MedianResult
        The certified Huber median behind the lower bound.
    lam : float
    ray_tol : float
    excess : float
        ``value - H(bias)``: loss added by merging directions that were not
        identical (0 up to rounding when the tolerance only grouped identical rays).
    signed : bool
        Whether codes are signed (atoms are lines).
    n_passes : int
        Passes over X the whole solve made (the median's, the rays' sort keys unless they
        came from the median's last pass, and the one that builds and certifies the solution).
    time_s : float or None
        Wall-clock seconds of the solve.
    lower_bound, gap, rel_gap, certified, tol, status
        The certificate's (:class:`~widelimit.results.CertifiedResult`).
    n_iter : int
        The Huber median's Newton iterations (the solve iterates nothing else).
    """

    value: float
    bias: np.ndarray
    bias_segment: np.ndarray
    dictionary: np.ndarray
    rays: np.ndarray
    code_values: np.ndarray
    certificate: Certificate
    median: MedianResult
    lam: float
    ray_tol: float
    excess: float
    signed: bool = False
    n_passes: int = 0
    time_s: float | None = None

    @property
    def width(self) -> int:
        """Number of atoms ``k`` (= number of distinct rays beyond ``lam``)."""
        return int(self.dictionary.shape[0])

    @property
    def lower_bound(self) -> float:
        return self.certificate.lower_bound

    @property
    def gap(self) -> float:
        return self.certificate.gap

    @property
    def rel_gap(self) -> float:
        return self.certificate.rel_gap

    @property
    def certified(self) -> bool:
        return self.certificate.certified

    @property
    def tol(self) -> float:
        return self.certificate.tol

    @property
    def status(self) -> str:
        return self.certificate.status

    @property
    def n_iter(self) -> int:
        return self.median.n_iter

    @property
    def sparse_codes(self) -> sp.csr_array:
        """Codes ``(N, k)`` as a CSR matrix with at most one nonzero per row."""
        N = self.rays.size
        on = np.flatnonzero(self.rays >= 0)
        return sp.csr_array(
            (self.code_values[on], (on, self.rays[on])), shape=(N, self.width), dtype=np.float64
        )

    @property
    def codes(self) -> np.ndarray:
        """Codes ``(N, k)`` as a dense array (use :attr:`sparse_codes` for large ``N * k``)."""
        N = self.rays.size
        if N * self.width > DENSE_CODES_LIMIT:
            raise MemoryError(
                f"dense codes would have {N}x{self.width} entries; use solution.sparse_codes "
                "or solution.rays / solution.code_values"
            )
        Z = np.zeros((N, self.width))
        on = np.flatnonzero(self.rays >= 0)
        Z[on, self.rays[on]] = self.code_values[on]
        return Z

    @property
    def Q(self) -> np.ndarray:
        """The optimal Q-form matrix ``Zb Zb^T`` (N x N; diagonal when each ray holds one point)."""
        Z = self.sparse_codes
        col = np.asarray(Z.sum(axis=0)).ravel()
        scale = np.where(col > 0, 1.0 / np.sqrt(np.where(col > 0, col, 1.0)), 0.0)
        Zb = Z @ sp.diags(scale)
        return np.asarray((Zb @ Zb.T).toarray())

    def as_dict(self) -> dict:
        """Summary as plain Python (JSON-serialisable); arrays other than the bias are left out."""
        c = self.certificate
        return {
            **shared_dict(self),
            "width": self.width,
            "bias": [float(v) for v in self.bias],
            "bias_segment": [[float(v) for v in row] for row in self.bias_segment],
            "bias_unique": bool(np.array_equal(self.bias_segment[0], self.bias_segment[1])),
            "lam": self.lam,
            "n_points": int(self.rays.size),
            "dim": int(self.bias.size),
            "n_within_lam": int(np.count_nonzero(self.rays < 0)),
            "ray_tol": self.ray_tol,
            "excess": self.excess,
            "signed": self.signed,
            "n_passes": self.n_passes,
            "certificate": c.as_dict(),
            "median": {
                "value": self.median.value,
                "lower_bound": self.median.lower_bound,
                "gap": self.median.gap,
                "n_passes": self.median.n_passes,
                "n_iter": self.median.n_iter,
                "method": self.median.method,
            },
        }


def _narrowest_bias(X, med: MedianResult, lam, tol, signed, tap=None) -> tuple[np.ndarray, RayGroups, int]:
    """Among the optimal biases (a segment for collinear data), one with the fewest rays (and the passes made)."""
    seg = med.segment
    if np.array_equal(seg[0], seg[1]):
        rk = None if tap is None else tap.keys_at(med.point)
        g = _group_rays(X, med.point, lam, tol, signed, 0, rk)
        return med.point, g, g.n_passes
    best, passes = None, 0
    for cand in (med.point, seg[0], seg[1]):
        g = _group_rays(X, cand, lam, tol, signed, 0)
        passes += g.n_passes
        if best is None or g.width < best[1].width:
            best = (cand, g)
    return best[0], best[1], passes


#: ``tol`` of :func:`solve` when none is given: the wide limit's, and the finite-width search's.
TOL_WIDE, TOL_WIDTH = 1e-9, 1e-6


@validate_params({
    "X": Data(finite=False), "lam": LAM, "ray_tol": [NONNEG, None], "tol": [TOL, None], "signed": Boolean(),
    "progress": PROGRESS, "checkpoint": [PathLike(), None],
    "median": [InstanceOf(MedianResult, allowed="a MedianResult (widelimit.huber_median)"), None],
    "width": [POSITIVE_INT, None], "time_limit": TIME_LIMIT, "max_iter": MAX_ITER, "seed": [SEED, None],
    "threads": THREADS, "limits": [InstanceOf(FiniteLimits), None],
})
def solve(X, *, lam, ray_tol: float | None = None, tol: float | None = None, signed: bool = False,
          progress=None, checkpoint=None, median: MedianResult | None = None, width: int | None = None,
          time_limit: float | None = None, max_iter: int | None = None, seed: int | None = None,
          threads: int | None = None, limits: FiniteLimits | None = None) -> WideLimitSolution | FiniteSolution:
    r"""Solve the wide-limit sparse dictionary-learning problem exactly, with a certificate.

    Minimises ``mean_i ||z_i W + b - x_i||^2 + 2 lam ||z_i||_1`` over unit-norm
    dictionaries of any width, ``Z >= 0`` and ``b`` (theory.md §3), returning
    the *narrowest* global optimum: one atom per ray beyond ``lam`` from the
    Huber median. Cost: a few passes over X (O(N n) each) plus sorting.

    Parameters
    ----------
    X : array (N, n)
        Data, one point per row (float32 accepted).
    lam : float
        Sparsity parameter (SAELens ``l1_coefficient = 2 lam``).
    ray_tol : float, optional
        Directions ``u_i, u_j`` (unit vectors from the bias) within ``ray_tol`` of a
        ray's leader share its atom. Default: the data's precision (``1e-8`` for
        float64 data, ``32 eps32 = 3.8e-6`` for float32), lowered where merging
        could cost more than a tenth of ``tol`` (:func:`auto_ray_tol`). A tolerance that merges genuinely different
        directions is allowed: ``value`` is then the true objective of the
        returned triple and ``excess`` the loss it adds.
    tol : float, optional
        Relative gap at which the solution counts as certified (default ``1e-9``; with ``width``,
        the search's, default ``1e-6``).
    signed : bool
        Signed codes (``z`` in R with penalty ``|z|``): atoms are lines, not
        rays, so antipodal rays share one atom. The lower bound is the same.

    width : int, optional
        Solve at this finite width instead (``k`` unit atoms): the certified global optimum
        by branch and bound over the atoms' directions (docs/theory.md §7), a
        :class:`widelimit.finite.FiniteSolution`, with the options below.
    time_limit, max_iter, seed, threads, limits : optional, with ``width`` only
        The search's budget in seconds (default 600) and in nodes (default none), the seed of its
        starting points (default 0), its threads and its size and memory limits
        (:class:`widelimit.finite.FiniteLimits`); see :func:`widelimit.finite.solve_finite`.
    progress : callable, optional
        Receives :class:`widelimit.engine.local.Progress` events of the passes (with ``width``, then
        the branch and bound's, see :func:`widelimit.finite.solve_finite`).
    checkpoint : str or Path, optional
        Checkpoint file of the Huber median (resumable; see :func:`widelimit.huber_median`).
    median : MedianResult, optional
        The Huber median of this ``X`` at this ``lam``, already computed (a
        :class:`widelimit.Problem` passes its cached one); saves the median's passes.
        It must have been computed on the same data: the certificate re-checks it.

    Returns
    -------
    WideLimitSolution or FiniteSolution
        Both carry ``.certificate`` and the shared fields of :class:`~widelimit.results.CertifiedResult`.

    Notes
    -----
    ``X`` may be an :class:`~widelimit.data.source.ActivationSource`: it is streamed;
    memory is O(N) scalars (each point's ray and code, which the solution
    returns) plus a chunk, never O(N n).

    Examples
    --------
    >>> import numpy as np, widelimit as wl
    >>> sol = wl.solve(np.array([[0.0], [0.0], [0.0], [10.0]]), lam=1.0)
    >>> round(sol.value, 12), sol.width, round(float(sol.bias[0]), 12)
    (4.666666666667, 1, 0.333333333333)
    """
    t0 = time.perf_counter()
    if width is not None:
        if signed:
            raise ValueError("width= cannot be combined with signed=True: the finite-width search supports "
                             "nonnegative codes only")
        if tol is not None and not 0 < tol < 1:  # a search judged at tol = 0 would never stop
            raise ValueError(f"tol must be a finite number in (0, 1) with width=, got {tol!r}")
        options = {k: v for k, v in (("time_limit", time_limit), ("max_iter", max_iter), ("seed", seed),
                                     ("threads", threads), ("limits", limits)) if v is not None}
        sol = _solve_width(X, lam, width, ray_tol=ray_tol, tol=TOL_WIDTH if tol is None else tol, progress=progress,
                           checkpoint=checkpoint, median=median, **options)
    else:
        given = [k for k, v in (("time_limit", time_limit), ("max_iter", max_iter), ("seed", seed),
                                ("threads", threads), ("limits", limits)) if v is not None]
        if given:
            raise ValueError(f"{given[0]} applies only with width= (the finite-width search)")
        sol = _solve_wide(X, lam, ray_tol, TOL_WIDE if tol is None else tol, signed, progress, checkpoint, median)
    return dataclasses.replace(sol, time_s=time.perf_counter() - t0)


def _solve_wide(X, lam, tol_dir, tol, signed, progress, checkpoint, median) -> WideLimitSolution:
    """:func:`solve` without ``width``, on checked arguments (data far from unit magnitude solved rescaled)."""
    def run(Xf, lam_f, f):  # data far from unit magnitude: solved as f X, f an exact power of two
        med = median if median is None or f == 1.0 else scale_median(median, f, lam_f)
        return _solve_exact(Xf, lam_f, tol_dir, tol, signed, progress, checkpoint, med)

    return on_scaled_data(X, lam, run, lambda sol, f: _rescaled(sol, f, lam))


def _rescaled(sol: WideLimitSolution, f: float, lam: float) -> WideLimitSolution:
    """The solution of ``X`` at ``lam`` from that of ``f X`` at ``f lam`` (``f`` an exact power of two; with
    ``1 / f`` the other way)."""
    return dataclasses.replace(
        sol, value=unscaled_value(sol.value, f), bias=sol.bias / f, bias_segment=sol.bias_segment / f,
        code_values=sol.code_values / f, certificate=unscale_certificate(sol.certificate, f, lam, 0.0),
        median=unscale_median(sol.median, f, lam), lam=lam, excess=sol.excess / f / f)


def auto_ray_tol(dtype, lam, radius, tol) -> float:
    r"""The default direction tolerance: the data's precision, capped by what the certificate can afford.

    Merging a point at distance ``r`` onto an atom at angle ``theta`` from its direction adds at
    most ``r^2 theta^2`` to its objective (about ``2 lam r``); a group has radius ``2 ray_tol``, so
    ``ray_tol = sqrt(tol lam / (40 R))`` (``R`` the largest distance from the bias) keeps the
    excess below a tenth of ``tol`` times the value. The precision part is
    :func:`~widelimit.exact.rays.default_ray_tol`.
    """
    cap = float(np.sqrt(0.025 * tol * lam / max(radius, lam)))
    return min(default_ray_tol(dtype), cap)


def _solve_width(X, lam, width, *, ray_tol, tol, progress, checkpoint, median, **options):
    """:func:`solve` at a finite width (the search lives in :mod:`widelimit.finite`): the wide-limit solve
    (its bound holds at every width; ``checkpoint`` and ``median`` serve it; its first pass checks every
    row), then the search; ``progress`` gets the events of both. The solution's ``certificate`` is that of
    the returned ``(W, Z, b)`` against the wide-limit bound (:func:`widelimit.verify`)."""
    if int(width) > X.shape[0]:  # before anything of size width is made; width >= the rays is the closed form
        raise ValueError(f"width={int(width)} exceeds the number of points N = {X.shape[0]} (width must be <= N)")
    wide = _solve_wide(X, lam, ray_tol, tol, False, progress, checkpoint, median)
    X = np.asarray(X, dtype=np.float64)

    # the search's tolerances, kernels and squared norms work near unit scale: it runs on f X (f an exact power of
    # two; data near 1e-153 were judged against an absolute 1e-300, data near 1e154 overflowed the atoms' norms)
    def run(Xf, lam_f, f):
        if f == 1.0:
            return solve_finite(X, lam, int(width), tol=tol, wide=wide, progress=progress, **options)
        events = None if progress is None else (lambda ev: progress(dataclasses.replace(
            ev, value=None if ev.value is None else unscaled_value(ev.value, f),
            lower_bound=None if ev.lower_bound is None else ev.lower_bound / f / f)))
        return solve_finite(Xf[:], lam_f, int(width), tol=tol, wide=_rescaled(wide, 1.0 / f, lam_f), progress=events,
                            **options)

    sol = on_scaled_data(X, lam, run, lambda sol, f: unscale_finite(sol, f, lam), one_blas=False)
    return _with_certificate(sol, X, lam, wide.median, tol)


def _with_certificate(sol: FiniteSolution, X, lam, median, tol) -> FiniteSolution:
    """``sol`` with the certificate of its ``(W, Z, b)`` against the wide-limit bound (one pass over ``X``)."""
    cert = verify_checked(X, sol.dictionary, sol.codes, sol.bias, lam=lam, tol=tol, median=median)
    return dataclasses.replace(sol, certificate=cert)


def _solve_exact(X, lam, tol_dir, tol, signed, progress, checkpoint, median=None) -> WideLimitSolution:
    """:func:`solve` on validated input."""
    # the rays' sort keys are taken inside the median's last pass when it can tell which one that is
    if median is not None:
        check_given_median(median, lam=lam, n=X.shape[1])
        tap, med = None, median
    else:
        tap = KeysTap(X.shape[0], X.shape[1], signed) if isinstance(engine_for(X), LocalEngine) else None
        med = _median(X, lam, None, "huber", min(1e-11, 0.01 * tol), 1e-10, 100, 4096, 0, progress, checkpoint, tap)
    if tol_dir is None:
        tol_dir = auto_ray_tol(X.dtype, lam, med.radius, tol)
    b, groups, passes = _narrowest_bias(X, med, lam, tol_dir, signed, tap)
    del tap
    # atoms keep float32 for float32 data (as scikit-learn estimators do) when that costs nothing
    # the certificate can see: rounding each entry to float32 moves a unit atom by at most eps32 / 2, an
    # angle below eps32, which adds up to r^2 eps32^2 to a point's objective of about 2 lam r; for small
    # lam / r the atoms are float64.
    # The certificate evaluates the returned atoms in float64 either way, so it stays rigorous.
    dtype = np.float64
    if X.dtype == np.float32:
        R = float(groups.radii.max()) if groups.radii.size else 0.0
        angle = float(np.finfo(np.float32).eps)
        if angle * angle * R <= 0.1 * tol * lam:
            dtype = np.float32
    engine = engine_for(X, progress)
    if not signed and isinstance(engine, LocalEngine):
        Wd, z, cert = _build_and_certify(engine, groups, lam, med, tol, dtype, check=median is not None)
        passes += 1
    else:
        passes += 3  # atoms (random access), codes, certificate
        Wd = groups.atoms(X, dtype=dtype)
        z = groups.code_values(X, Wd)
        N = X.shape[0]
        on = np.flatnonzero(groups.rays >= 0)
        Zs = sp.csr_array((z[on], (on, groups.rays[on])), shape=(N, Wd.shape[0]))
        if signed:
            cert = _certificate(X, *split_signed(Wd, Zs), b, lam, med, tol, 0.0)
        else:
            cert = _certificate(X, Wd, Zs, b, lam, med, tol, 0.0, progress)
    excess = cert.value - cert.lower_bound_at_bias
    return WideLimitSolution(
        value=cert.value, bias=b, bias_segment=med.segment, dictionary=Wd, rays=groups.rays,
        code_values=z, certificate=cert, median=med, lam=lam, ray_tol=tol_dir,
        excess=float(excess), signed=signed, n_passes=med.n_passes + passes,
    )


def _solution_chunk(c, s, b, lam, W, z_out, ray, lead, single):
    """One block of the pass that builds the solution and certifies it.

    Writes the atoms of the rays whose leader is in the block into ``W`` and the codes of
    points alone on their ray into ``z_out``, and returns the certificate's sums over the
    points within ``lam`` and the points alone on their ray (points on shared rays are
    settled afterwards, once every atom exists): ``(sum ||e||^2, sum e, max ||e||^2,
    sum h(||x - b||), <G, Q> part, penalty part, atoms used)``. One fused sweep
    (:func:`widelimit.engine.kernels.solution_rows`).
    """
    rec, esum, emax, hub, comp, pen, width = solution_rows(c, b, float(lam), W, z_out, s, ray, lead, single)
    if not np.isfinite(hub):
        raise_nonfinite(c, s)
    return float(rec), esum, float(emax), float(hub), float(comp), float(pen), int(width)


def _merge_solution(p, q):
    return (p[0] + q[0], p[1] + q[1], max(p[2], q[2]), p[3] + q[3], p[4] + q[4], p[5] + q[5], p[6] + q[6])


def _build_and_certify(engine, groups: RayGroups, lam, med, tol, dtype, check=False):
    """Atoms, codes and certificate of the narrowest solution in one pass over X.

    Equivalent to ``groups.atoms``, ``groups.code_values`` and :func:`widelimit.verify`'s
    certificate of the resulting ``(W, Z, b)`` (which the tests check), without reading X
    three times. Points on rays shared with other points are settled after the pass from
    their rows alone (random access), atom by atom, so memory stays O(chunk).
    """
    X, b = engine.X, groups.bias
    N, n = X.shape
    rays, leaders = groups.rays, groups.leaders
    k = leaders.size
    W = np.empty((k, n), dtype=dtype)
    z = np.zeros(N)
    count = np.bincount(rays[rays >= 0], minlength=k)
    lead = np.zeros(N, dtype=bool)
    lead[leaders] = True
    single = np.zeros(N, dtype=bool)
    single[leaders[count == 1]] = True
    engine.stage = "certificate"
    rec, esum, emax, hub, comp, pen, width = engine.reduce(
        _solution_chunk, _merge_solution, b, lam, W, z, extras=(rays, lead, single), fingerprint=check)
    if check and engine.fingerprint != med.fingerprint:  # a median handed in: it must be of these data
        raise mismatch_error("median", med.fingerprint, engine.fingerprint)
    # points on shared rays, grouped by ray (a ray split across two batches is carried over)
    multi = np.flatnonzero((rays >= 0) & ~single)
    multi = multi[np.argsort(rays[multi], kind="stable")]
    carry = None  # (atom, sum z, sum z e)
    step = chunk_rows(n)

    def settle(cs, ez):
        q = ez / lam
        return float(cs - (q @ q) / cs) if cs > 0 else 0.0

    for a0 in range(0, multi.size, step):
        idx = multi[a0 : a0 + step]
        atom = rays[idx]
        D = engine.take(idx) - b
        w = W[atom].astype(np.float64)
        norms = np.sqrt(np.einsum("ij,ij->i", w, w))
        zz = np.maximum(np.einsum("ij,ij->i", D, w) - lam, 0.0)
        z[idx] = zz
        D -= zz[:, None] * w
        ee = np.einsum("ij,ij->i", D, D)
        rec += float(ee.sum())
        esum = esum + D.sum(axis=0)
        emax = max(emax, float(ee.max()))
        zn = zz * norms
        pen += float(zn.sum())
        starts = np.flatnonzero(np.r_[True, atom[1:] != atom[:-1]])
        cs = np.add.reduceat(zn, starts)
        ez = np.add.reduceat(zn[:, None] * D, starts, axis=0)
        if carry is not None and carry[0] == atom[0]:
            cs[0] += carry[1]
            ez[0] += carry[2]
        elif carry is not None:
            comp += settle(carry[1], carry[2])
            width += int(carry[1] > 0)
        done, ezd = cs[:-1], ez[:-1]  # rays complete in this batch
        live = done > 0
        comp += float(np.sum(done[live] - _sq_over_lam(ezd[live], lam) / done[live]))
        width += int(np.count_nonzero(live))
        carry = (atom[starts[-1]], cs[-1], ez[-1])
    if carry is not None:
        comp += settle(carry[1], carry[2])
        width += int(carry[1] > 0)
    cert = make_certificate(N, n, rec, 2.0 * lam * pen, esum, emax, hub, (lam / N) * comp, width, lam, med,
                            tol, 0.0, depth=sum_depth(engine) + 1)
    return W, z, cert
