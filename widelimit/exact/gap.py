"""What "certified" means: one relative gap and one test, shared by every certificate (docs/theory.md §8).

A certificate bounds the distance of a value to the global optimum by a ``gap`` (value minus a
certified lower bound, plus the rounding bound of §8.3); it certifies when that gap is within a
relative tolerance of the value. These three functions are the only place that says how.
"""

from __future__ import annotations

import math

import numpy as np

from ..results import InconsistentBound  # noqa: F401 (re-exported: one error for every bound above its value)

__all__ = ["is_certified", "allowed_gap", "relative_gap", "check_consistent", "InconsistentBound"]

_TINY = float(np.finfo(np.float64).tiny)  # 2^-1022, the smallest normal float64


def is_certified(gap: float, value: float, *, tol: float, atol: float = 0.0) -> bool:
    """The one definition of "certified": ``gap <= tol * |value| + atol``, with ``gap`` and ``value`` finite.

    ``gap`` is a certified upper bound on the distance of ``value`` to the global
    optimum (``value - lower_bound``, plus any rounding bound the caller adds);
    used by :func:`verify`, :func:`widelimit.certify_sae` and the finite-width search. An
    infinite value (an objective that overflowed) certifies nothing: ``inf <= tol * inf`` would
    hold for any gap. Every normal value is judged relatively, ``1e-307`` like ``1``; only a value
    below the smallest normal float64 (``2^-1022``, where float64 has no relative precision left)
    counts as ``2^-1022``, so that an exactly zero objective with an underflow-sized rounding bound
    certifies. (A floor of ``1e-300`` once certified any gap below ``tol * 1e-300``.)
    """
    if not (math.isfinite(gap) and math.isfinite(value)):
        return False
    return bool(gap <= allowed_gap(value, tol=tol, atol=atol))


def allowed_gap(value: float, *, tol: float, atol: float = 0.0) -> float:
    """The largest certified gap :func:`is_certified` accepts at ``value``: ``tol * max(|value|, 2^-1022) + atol``."""
    return tol * max(abs(value), _TINY) + atol


def relative_gap(gap: float, value: float) -> float:
    """``gap / |value|``, the one relative gap of the toolkit: 0 for a zero gap, ``inf`` for a positive gap at a
    zero value and for a non-finite gap or value (never a small number from an absolute floor)."""
    gap, value = float(gap), float(value)
    if not (math.isfinite(gap) and math.isfinite(value)):
        return math.inf
    if gap == 0.0:
        return 0.0
    return gap / abs(value) if value != 0.0 else math.inf


def check_consistent(value: float, value_error: float, lower_bound: float, what: str, hint: str = "") -> None:
    """Raise :class:`InconsistentBound` if ``value + value_error < lower_bound``.

    ``value`` is a computed objective whose exact value lies within ``value_error`` of it and
    is >= the exact minimum >= ``lower_bound`` (rigorous): a larger bound proves that the bound
    belongs to other data (or a bug), and is reported, never clipped.
    """
    if value + value_error < lower_bound:
        raise InconsistentBound(
            f"inconsistent certificate: {what} {value:.17g} is below the certified lower bound "
            f"{lower_bound:.17g} by more than its rounding error {value_error:.3g}{hint}")
