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
"""

from __future__ import annotations

import math

__all__ = ["CertifiedResult", "SHARED_FIELDS", "shared_dict", "status_of"]

#: The names every certified result carries (fields or properties), in the order ``as_dict()`` lists them.
SHARED_FIELDS = ("value", "lower_bound", "gap", "rel_gap", "certified", "tol", "status", "n_iter", "time_s")


class CertifiedResult:
    """Base of every certified result (:data:`SHARED_FIELDS` and ``as_dict()``; module docstring).

    A plain class without fields, so that frozen and mutable dataclasses alike derive from it and keep
    their own field order; each subclass provides the shared names as fields or properties.
    """

    __slots__ = ()

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
