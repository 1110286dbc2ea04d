"""The result of the certified medians (:func:`widelimit.huber_median`, :func:`widelimit.geometric_median`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..results import CertifiedResult, shared_dict, status_of
from .gap import relative_gap

__all__ = ["MedianResult"]


@dataclass(frozen=True)
class MedianResult(CertifiedResult):
    """A certified solution of a median problem.

    Attributes
    ----------
    point : ndarray (n,)
        The returned location (inside ``segment`` when the optimum is not unique).
    value : float
        Objective at ``point`` (weighted mean over points).
    lower_bound : float
        Certified lower bound on the exact minimum value of the data as stored (from a dual
        point, lowered by a rigorous bound on the rounding error: docs/theory.md §8).
    gap : float
        ``value - lower_bound``: a bound on the suboptimality of ``point`` (never clipped; a
        negative gap beyond the rounding error raises instead).
    segment : ndarray (2, n)
        Endpoints of the optimal set when the data are collinear (equal rows
        when the optimum is unique); for non-collinear data the optimum is
        unique and both rows equal ``point``.
    n_passes : int
        Passes over the data that were made.
    n_iter : int
        Newton / majorise-minimise iterations.
    certified : bool
        Whether the relative gap reached the requested tolerance ``tol``.
    method : str
        ``"newton"`` or ``"collinear-exact"``.
    kind : str
        ``"huber"`` or ``"geometric"``.
    lam : float or None
        The threshold of the Huber median.
    fingerprint : str or None
        Content fingerprint of the data it was computed on (XXH3-128 of every row, taken in the
        first pass: :mod:`widelimit.engine.fingerprint`); :func:`widelimit.verify` refuses a
        median whose fingerprint is not that of its data.
    rounding : float
        What the last pass's bound was lowered by for floating-point rounding.
    weighted : bool
        Computed with point weights other than all ones: the median of another problem, which
        :func:`widelimit.solve` and :func:`widelimit.verify` refuse
        (:func:`widelimit.exact.certificate.check_given_median`).
    tol : float
        The relative gap asked for.
    time_s : float or None
        Wall-clock seconds of the computation (of this call; a resumed run counts its own).
    rel_gap, status
        ``gap / |value|``; ``"optimal"`` when certified, else ``"not_certified"`` (the iterations ran out).
    """

    point: np.ndarray
    value: float
    lower_bound: float
    gap: float
    segment: np.ndarray
    n_passes: int
    n_iter: int
    certified: bool
    method: str
    kind: str
    lam: float | None = None
    history: list = field(default_factory=list, repr=False)
    fingerprint: str | None = None
    rounding: float = 0.0
    radius: float = 0.0  #: max_i ||x_i - point|| (as computed)
    weighted: bool = False
    tol: float = 0.0
    time_s: float | None = None

    @property
    def rel_gap(self) -> float:
        """``gap / |value|`` (:func:`widelimit.exact.gap.relative_gap`)."""
        return relative_gap(self.gap, self.value)

    @property
    def status(self) -> str:
        return status_of(self.certified, self.value)

    def as_dict(self) -> dict:
        """Summary as plain Python (JSON-serialisable); the history is left out."""
        return {**shared_dict(self), "point": [float(v) for v in self.point],
                "segment": [[float(v) for v in row] for row in self.segment], "unique": self.unique,
                "n_passes": int(self.n_passes), "method": self.method, "kind": self.kind, "lam": self.lam,
                "fingerprint": self.fingerprint, "rounding": self.rounding, "radius": self.radius,
                "weighted": bool(self.weighted)}

    @property
    def unique(self) -> bool:
        """Whether the optimal set is a single point (always for non-collinear data)."""
        return bool(np.allclose(self.segment[0], self.segment[1], rtol=0, atol=0))
