"""The one base of the certified results: the shared fields every certified result carries (docs/api.md).

A certified result says how far its ``value`` may be from the global optimum of its problem, and
every one says it with the same names (the glossary of docs/api.md):

=============== =========================================================================================
``value``       the objective of what is returned (mean over points)
``lower_bound`` a certified lower bound on the optimum
``gap``         ``value - lower_bound`` (plus the rounding bound where the result adds one)
``rel_gap``     ``gap / |value|`` (:func:`widelimit.exact.gap.relative_gap`)
``certified``   ``gap <= tol * |value|`` (:func:`widelimit.exact.gap.is_certified`)
``tol``         the relative tolerance ``certified`` was judged at
``status``      why the computation stopped (``"optimal"``, ``"time_limit"``, ``"iteration_limit"``, ...)
``n_iter``      iterations, rounds, nodes or passes made (``None`` when the result made none)
``time_s``      wall-clock seconds (``None`` when not measured)
=============== =========================================================================================

and ``as_dict()``, a plain-Python (JSON-ready) summary holding at least these keys. A result class
derives from :class:`CertifiedResult` and holds each shared name as a dataclass field or a property
(``WideLimitSolution.lower_bound`` is its certificate's); :func:`shared_dict` makes the common part of
its ``as_dict()``.

Every certified result is checked when it is made (:func:`check_order`): its ``lower_bound`` is not above
its ``value`` and its ``gap`` is not negative. A bound above a value by more than rounding proves that the
two are not of the same problem (a bug, or a saved value edited): :class:`InconsistentBound` is raised,
never a clipped number. Within rounding (``ORDER_RTOL`` of the larger magnitude, plus the result's own
rigorous rounding bound where it has one) the bound is lowered to the value and the gap is 0: an exactly
optimal answer reports a zero gap, not ``-4.4e-16`` (docs/theory.md §8.5). :func:`ordered_bound` is the
same rule for a pair that is not a result's shared fields (the parts of an SAE certificate's gap).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["CertifiedResult", "SHARED_FIELDS", "shared_dict", "status_of", "InconsistentBound", "ordered_bound",
           "check_order", "ORDER_RTOL"]

#: The rounding allowed between a value and its lower bound computed by different sums, relative to the
#: larger magnitude: ``2^-32`` (float64 sums of up to about ``2^20`` sequential terms, docs/theory.md §8.5).
ORDER_RTOL = 2.0**-32


class InconsistentBound(ValueError):
    """An objective below a certified lower bound by more than its rounding error: the bound is not of these data."""


def ordered_bound(value, lower_bound, *, rounding=0.0, what: str = "value", bound: str = "lower bound"):
    """``lower_bound``, checked to be at most ``value``; lowered to ``value`` where it is above by rounding only.

    With ``slack = ORDER_RTOL * max(|value|, |lower_bound|) + rounding`` (``rounding``: a bound on the error
    of the two numbers, where the caller has one): ``lower_bound <= value`` returns it as it is,
    ``value < lower_bound <= value + slack`` returns ``value`` (so ``value - result`` is an exact 0), and
    beyond that :class:`InconsistentBound` is raised, naming ``what`` and ``bound`` (and the first entry
    beyond, for arrays). Elementwise on arrays (a float for scalars); a non-finite number is returned as it
    is (nothing to order). docs/theory.md §8.5.
    """
    v, lb = np.asarray(value, dtype=np.float64), np.asarray(lower_bound, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        slack = ORDER_RTOL * np.maximum(np.abs(v), np.abs(lb)) + np.maximum(np.asarray(rounding, np.float64), 0.0)
        above = np.isfinite(v) & np.isfinite(lb) & (lb > v)
        beyond = above & (lb - v > slack)
    if beyond.any():
        at = int(np.flatnonzero(np.broadcast_to(beyond, np.broadcast_shapes(v.shape, lb.shape)).ravel())[0])
        b1, v1, s1 = (float(np.broadcast_to(a, beyond.shape).ravel()[at]) for a in (lb, v, slack))
        where = f" at entry {at}" if beyond.ndim else ""
        raise InconsistentBound(f"inconsistent result{where}: the {bound} {b1:.17g} is above the {what} {v1:.17g} "
                                f"by {b1 - v1:.3g}, more than rounding ({s1:.3g}); the two are not of the same problem")
    out = np.where(above, v, lb)
    return float(out) if out.ndim == 0 else out


def _fields(result) -> set:
    return {f.name for f in dataclasses.fields(result)} if dataclasses.is_dataclass(result) else set()


def check_order(result) -> None:
    """Check a certified result when it is made: ``lower_bound <= value`` and ``gap >= 0`` (module docstring).

    Beyond rounding (:func:`ordered_bound`, with the result's own ``rounding_error`` or ``rounding`` added)
    :class:`InconsistentBound` is raised naming the result; within rounding the result's ``lower_bound``
    field is set to its value and its ``gap`` (``rel_gap``) fields to 0. Fields that are properties
    (computed from other fields, checked where those are made) are only checked.
    """
    name = type(result).__name__
    rounding = sum(float(getattr(result, a, 0.0) or 0.0) for a in ("rounding_error", "rounding"))
    value, lb, gap = (getattr(result, a, None) for a in ("value", "lower_bound", "gap"))
    fields = _fields(result)
    if value is None:
        return
    if lb is not None:
        new = ordered_bound(value, lb, rounding=rounding, what=f"{name} value", bound=f"{name} lower_bound")
        if new != float(lb) and "lower_bound" in fields:
            object.__setattr__(result, "lower_bound", new)
    if gap is not None and math.isfinite(float(gap)) and float(gap) < 0.0:
        ordered_bound(float(value), float(value) - float(gap), rounding=rounding, what=f"{name} value",
                      bound=f"{name} value - gap")  # raises beyond rounding
        for a in ("gap", "rel_gap"):
            if a in fields:
                object.__setattr__(result, a, 0.0)

#: The names every certified result carries (fields or properties), in the order ``as_dict()`` lists them.
SHARED_FIELDS = ("value", "lower_bound", "gap", "rel_gap", "certified", "tol", "status", "n_iter", "time_s")


class CertifiedResult:
    """Base of every certified result (:data:`SHARED_FIELDS` and ``as_dict()``; module docstring).

    A plain class without fields, so that frozen and mutable dataclasses alike derive from it and keep
    their own field order; each subclass provides the shared names as fields or properties.
    """

    __slots__ = ()

    def __post_init__(self):
        check_order(self)

    def as_dict(self) -> dict:
        """The shared fields as plain Python (subclasses add their own keys)."""
        return shared_dict(self)


def _plain(v):
    """A NumPy scalar as the Python scalar it holds; anything else as it is."""
    return v.item() if hasattr(v, "item") and getattr(v, "ndim", None) == 0 else v


def shared_dict(result) -> dict:
    """``{name: value}`` of the :data:`SHARED_FIELDS` of ``result``, as plain Python scalars."""
    out = {name: _plain(getattr(result, name)) for name in SHARED_FIELDS}
    out["certified"] = bool(out["certified"])
    return out


def status_of(certified: bool, value: float | None = None) -> str:
    """The ``status`` of a result that ran to its end: ``"optimal"`` when certified, else
    ``"not_certified"`` (``"overflow"`` when the value is not finite)."""
    if certified:
        return "optimal"
    if value is not None and not math.isfinite(value):
        return "overflow"
    return "not_certified"
