r"""Internal normalisation: the solvers are scale-equivariant, whatever the magnitude of the data.

The problem is scale-equivariant: ``solve(c X, lam = c lam)`` has the optimal value
``c^2 v``, the bias ``c b``, the same atoms and codes ``c z``. Floating point is not: squared
distances overflow for data near ``1e154`` and lose their precision near ``1e-154``. So data
whose magnitude (from a few rows read at random access, no pass) is outside
``[2^-64, 2^64]`` are read as ``f X`` with ``f`` a power of two that brings them to about 1
(:class:`widelimit.engine.local.ScaledRows`; the fingerprint is still that of ``X``), ``lam``
becomes ``f lam``, and the results are mapped back. Multiplying by a power of two is exact
(away from the ends of the float64 range), so the scaled computation *is* the original one in
other units, and its certificate carries over exactly (docs/theory.md §8.4). The
ratio ``lam / scale`` is unchanged; the kernels avoid ``lam^2`` where it could under- or
overflow, so tiny and huge ``lam`` work too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from ..engine import engine_for
from ..engine.local import ScaledRows, is_dask_array, one_blas_thread

__all__ = ["normaliser", "on_scaled_data", "unscale_median", "unscale_certificate", "unscale_finite", "scaled_lam",
           "unscaled_value"]

#: Data whose largest sampled |entry| lies in [2^-LIMIT, 2^LIMIT] are used as they are.
LIMIT = 64


def normaliser(X, *, limit: int = LIMIT, centre=None) -> float:
    """A power of two ``f`` with ``max |f (x_ij - centre_j)|`` about 1 (from up to 257 evenly spaced rows), or 1.0 when
    that maximum already lies in ``[2^-limit, 2^limit]``.

    The float64 solvers use ``limit = LIMIT`` and no centre; the float32 gradient fit uses a
    narrower range around its starting bias (float32 squares overflow near ``1.8e19``).
    """
    if isinstance(X, ScaledRows):
        return 1.0
    N = int(X.shape[0])
    idx = np.unique(np.linspace(0, N - 1, min(N, 257)).astype(np.int64))
    S = X[idx].compute() if is_dask_array(X) else X[idx]
    S = np.asarray(S, dtype=np.float64)
    if centre is not None:
        S = S - np.asarray(centre, dtype=np.float64)
    S = np.abs(S)
    S = S[np.isfinite(S)]  # non-finite rows are reported by the first pass
    sigma = float(S.max()) if S.size else 0.0
    if sigma == 0.0:
        return 1.0
    e = math.frexp(sigma)[1]
    if -limit <= e <= limit:
        return 1.0
    return math.ldexp(1.0, max(-1022, min(1022, -e)))


def on_scaled_data(X, lam, run, unscale, *, f: float | None = None, one_blas: bool = True):
    """``run(Xf, lam_f, f)`` on the data read as ``Xf = f X`` at ``lam_f = f lam``, its result mapped back.

    The one place of the solvers' normalisation (module docstring): ``f`` is :func:`normaliser`'s power
    of two unless given; for ``f = 1`` the data and ``lam`` pass unchanged and nothing is mapped back,
    else ``Xf`` is a :class:`~widelimit.engine.local.ScaledRows` (``Xf[:]`` the scaled array),
    ``lam_f = scaled_lam(lam, f)`` (``None`` stays ``None``) and the result is ``unscale(result, f)``.
    With ``one_blas`` and a data engine on several threads, BLAS runs on one thread meanwhile
    (:func:`~widelimit.engine.local.one_blas_thread`: the passes' threads use the cores).
    """
    f = normaliser(X) if f is None else f
    Xf, lam_f = (X, lam) if f == 1.0 else (ScaledRows(X, f), None if lam is None else scaled_lam(lam, f))
    threaded = one_blas and getattr(engine_for(X), "threads", 1) > 1
    with one_blas_thread() if threaded else contextlib.nullcontext():
        res = run(Xf, lam_f, f)
    return res if f == 1.0 else unscale(res, f)


def _absmax_chunk(c, s):
    return float(np.abs(c).max()) if c.size else 0.0


def full_normaliser(X) -> float:
    """Like :func:`normaliser`, from every row (one pass): for data whose sampled rows missed the largest."""
    sigma = engine_for(X).reduce(_absmax_chunk, max, stage="scale")
    if not (sigma > 0 and math.isfinite(sigma)):
        return 1.0
    return math.ldexp(1.0, max(-1022, min(1022, -math.frexp(sigma)[1])))


def scaled_lam(lam: float, f: float) -> float:
    """``f lam``, refused when it leaves the float64 range (a ratio lam / data beyond about 1e300)."""
    out = lam * f
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"lam = {lam!r} is out of range for data of magnitude about {1.0 / f:.3g} "
                         "(their ratio must lie within the float64 range)")
    return out


def _div2(v, f):
    """``v / f^2`` without forming ``f^2`` (which may overflow)."""
    return v / f / f


def unscaled_value(v, f: float) -> float:
    """An objective value of ``f X`` mapped back to ``X`` (``v / f^2``), refused where that leaves the float64 range.

    The scaled computation is exact, but a value above about ``1.8e308`` has no float64: returned as
    ``inf`` it would make a certificate (``gap <= tol |value|``) hold for any gap.
    """
    out = _div2(v, f)
    if math.isfinite(v) and not math.isfinite(out):
        e10 = math.log10(v) - 2.0 * math.log10(f)
        raise ValueError(f"the objective of these data is about {10 ** (e10 % 1):.2g}e+{int(e10)}, beyond the "
                         "float64 range (1.8e308): divide X and lam by the same power of two (the value scales by "
                         "its square; docs/theory.md §8.4)")
    return out


def unscale_median(res, f: float, lam):
    """The :class:`~widelimit.exact.median.MedianResult` of ``X`` from that of ``f X`` (lam ``f lam``)."""
    return dataclasses.replace(
        res, point=res.point / f, value=unscaled_value(res.value, f), lower_bound=_div2(res.lower_bound, f),
        gap=_div2(res.gap, f), segment=res.segment / f, lam=lam,
        history=[(_div2(v, f), _div2(b, f)) for v, b in res.history], rounding=_div2(res.rounding, f),
        radius=res.radius / f)


def scale_median(res, f: float, lam_f):
    """The median result of ``f X`` from that of ``X`` (the inverse of :func:`unscale_median`)."""
    return unscale_median(res, 1.0 / f, lam_f)


def unscale_finite(sol, f: float, lam):
    """The :class:`~widelimit.finite.bnb.FiniteSolution` of ``X`` from that of ``f X`` (same atoms, relative gap
    and verdict)."""
    return dataclasses.replace(
        sol, value=unscaled_value(sol.value, f), lower_bound=_div2(sol.lower_bound, f), gap=_div2(sol.gap, f),
        codes=sol.codes / f, bias=sol.bias / f, lam=lam, wide_lower_bound=_div2(sol.wide_lower_bound, f),
        history=tuple((t, _div2(lb, f), _div2(v, f)) for t, lb, v in sol.history))


def unscale_certificate(c, f: float, lam, atol):
    """The :class:`~widelimit.exact.certificate.Certificate` of the data ``X`` from that of ``f X``."""
    return dataclasses.replace(
        c, value=unscaled_value(c.value, f), reconstruction=_div2(c.reconstruction, f), penalty=_div2(c.penalty, f),
        lower_bound=_div2(c.lower_bound, f), lower_bound_error=_div2(c.lower_bound_error, f),
        lower_bound_at_bias=_div2(c.lower_bound_at_bias, f), gap=_div2(c.gap, f),
        bias_stationarity=c.bias_stationarity / f, dual_min=c.dual_min / f,
        complementarity=_div2(c.complementarity, f), max_residual_norm=c.max_residual_norm / f, lam=lam,
        atol=atol, rounding_error=_div2(c.rounding_error, f))
