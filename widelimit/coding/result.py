"""The one result type of optimal coding (:class:`CodingResult`), returned by every coder of this package.

:func:`widelimit.coding.optimal_codes` (whatever the algorithm), :func:`widelimit.coding.fista.fista_codes`,
:func:`widelimit.coding.working_set.optimal_codes_working_set` and
:meth:`widelimit.coding.cd.GramCoder.solve` all return it, with the same per-point certificate
(:mod:`widelimit.coding.lasso`, theory.md §8.6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .lasso import gap_floor
import scipy.sparse as sp

from ..results import CertifiedResult, shared_dict, status_of

__all__ = ["CodingResult"]


@dataclass(frozen=True)
class CodingResult(CertifiedResult):
    """Optimal nonnegative codes for a fixed dictionary and bias, with their certificate.

    Attributes
    ----------
    codes : scipy.sparse.csr_array (N, k) float64, or None
        The codes ``Z`` in the units of the given ``W`` (``None`` when
        ``return_codes=False``).
    value : float
        ``mean_i P_i(z_i)``: the objective ``sae_objective(X, W, codes, b, lam)``, in float64.
    reconstruction, penalty : float
        The two parts of ``value`` (means over points).
    gap : float
        Certified mean duality gap: ``value - gap <= min_Z sae_objective(X, W, Z, b, lam)``.
    max_gap : float
        Largest per-point gap.
    point_values, point_gaps : ndarray (N,)
        ``P_i`` and ``gap_i`` per point (float64).
    n_iter : int
        Largest number of iterations (FISTA) or working-set rounds (the Gram coders) any point needed.
    certified : bool
        Every point met ``gap_i <= tol * max(P_i, gap_floor(lam))``.
    n_unconverged : int
        Points that did not (:meth:`unconverged_rows` lists them).
    device : str
        Where the iterations ran.
    lam, tol : float
    residuals : ndarray (N, n) or None
        ``x_i - b - z_i W`` of the returned codes, float64, when the coder keeps them
        (:meth:`widelimit.coding.cd.GramCoder.solve`); else ``None``.
    correlations : ndarray (N, k) or None
        ``<u_d, r_i>`` of those residuals, each within ``correlation_error[i]`` of the exact value
        (:class:`~widelimit.coding.cd.GramCoder` with Gram updates); else ``None``.
    correlation_error : ndarray (N,) or None
    time_s : float or None
        Wall-clock seconds (set by :func:`widelimit.optimal_codes`).
    lower_bound, rel_gap, status
        ``value - gap``; ``gap / |value|``; ``"optimal"`` when certified, else ``"not_certified"``.
    """

    codes: sp.csr_array | None
    value: float
    reconstruction: float
    penalty: float
    gap: float
    max_gap: float
    point_values: np.ndarray = field(repr=False)
    point_gaps: np.ndarray = field(repr=False)
    n_iter: int
    certified: bool
    n_unconverged: int
    device: str
    lam: float
    tol: float
    residuals: np.ndarray | None = field(default=None, repr=False)
    correlations: np.ndarray | None = field(default=None, repr=False)
    correlation_error: np.ndarray | None = field(default=None, repr=False)
    time_s: float | None = None

    @classmethod
    def from_points(cls, codes, point_values, point_gaps, *, penalty_sum: float, n_iter: int, device, lam: float,
                    tol: float, return_codes: bool = True, **arrays) -> "CodingResult":
        """The result for per-point values and certified gaps; ``penalty_sum = 2 lam sum_i sum_d z_id ||w_d||``.

        ``arrays``: ``residuals``, ``correlations``, ``correlation_error`` when the coder has them.
        """
        P, gap = np.asarray(point_values, dtype=np.float64), np.asarray(point_gaps, dtype=np.float64)
        N = max(P.size, 1)
        value = float(P.sum()) / N
        penalty = float(penalty_sum) / N
        n_bad = int(np.sum(gap > tol * np.maximum(P, gap_floor(lam))))
        return cls(codes=codes if return_codes else None, value=value, reconstruction=value - penalty,
                   penalty=penalty, gap=float(gap.sum()) / N, max_gap=float(gap.max(initial=0.0)), point_values=P,
                   point_gaps=gap, n_iter=int(n_iter), certified=n_bad == 0, n_unconverged=n_bad, device=str(device),
                   lam=float(lam), tol=float(tol), **arrays)

    def unconverged_rows(self) -> np.ndarray:
        """Indices of the points whose gap misses ``tol * max(P_i, gap_floor(lam))``."""
        return np.flatnonzero(self.point_gaps > self.tol * np.maximum(self.point_values, gap_floor(self.lam)))

    @property
    def lower_bound(self) -> float:
        """Certified lower bound on the optimal mean coding objective: ``value - gap``."""
        return self.value - self.gap

    @property
    def status(self) -> str:
        return status_of(self.certified, self.value)

    @property
    def rel_gap(self) -> float:
        """``gap / value``."""
        return self.gap / max(abs(self.value), 1e-300)

    def as_dict(self) -> dict:
        """Summary as plain Python (JSON-serialisable); codes and per-point arrays are left out."""
        return {
            **shared_dict(self), "reconstruction": self.reconstruction, "penalty": self.penalty,
            "max_gap": self.max_gap, "n_unconverged": self.n_unconverged, "device": self.device, "lam": self.lam, "tol": self.tol,
            "nnz": None if self.codes is None else int(self.codes.nnz),
        }
