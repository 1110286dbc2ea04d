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

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ._validation import check_data, check_lam
from .certificate import Certificate, _certificate
from .median import MedianResult
from .median import _solve as _median
from .rays import RayGroups, _group_rays, default_ray_tol

__all__ = ["WideLimitSolution", "solve"]

#: Dense ``codes`` are built only up to this many entries; use ``sparse_codes`` beyond.
DENSE_CODES_LIMIT = 200_000_000


@dataclass(frozen=True)
class WideLimitSolution:
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
    def certified(self) -> bool:
        return self.certificate.certified

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
            "value": self.value,
            "lower_bound": c.lower_bound,
            "gap": c.gap,
            "rel_gap": c.rel_gap,
            "certified": bool(c.certified),
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


def _narrowest_bias(X, med: MedianResult, lam, tol, signed) -> tuple[np.ndarray, RayGroups]:
    """Among the optimal biases (a segment for collinear data), one with the fewest rays."""
    seg = med.segment
    if np.array_equal(seg[0], seg[1]):
        return med.point, _group_rays(X, med.point, lam, tol, signed, 0)
    best = None
    for cand in (med.point, seg[0], seg[1]):
        g = _group_rays(X, cand, lam, tol, signed, 0)
        if best is None or g.width < best[1].width:
            best = (cand, g)
    return best


def solve(X, lam, *, ray_tol: float | None = None, tol: float = 1e-9, signed: bool = False) -> WideLimitSolution:
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
        ray's leader share its atom. Default: ``1e-8`` for float64 data,
        ``1e-4`` for float32. A tolerance that merges genuinely different
        directions is allowed: ``value`` is then the true objective of the
        returned triple and ``excess`` the loss it adds.
    tol : float
        Relative gap at which the solution counts as certified.
    signed : bool
        Signed codes (``z`` in R with penalty ``|z|``): atoms are lines, not
        rays, so antipodal rays share one atom. The lower bound is the same.

    Returns
    -------
    WideLimitSolution

    Examples
    --------
    >>> import numpy as np, widelimit as wl
    >>> sol = wl.solve(np.array([[0.0], [0.0], [0.0], [10.0]]), lam=1.0)
    >>> round(sol.value, 12), sol.width, round(float(sol.bias[0]), 12)
    (4.666666666667, 1, 0.333333333333)
    """
    X = check_data(X)
    lam = check_lam(lam)
    tol_dir = default_ray_tol(X.dtype) if ray_tol is None else float(ray_tol)
    if not (tol_dir >= 0 and np.isfinite(tol_dir)):
        raise ValueError(f"ray_tol must be a finite number >= 0, got {ray_tol!r}")
    med = _median(X, lam, None, "huber", min(1e-12, tol), 1e-11, 100, 4096, 0)
    b, groups = _narrowest_bias(X, med, lam, tol_dir, signed)
    # atoms keep float32 for float32 data (as scikit-learn estimators do): the certificate
    # below evaluates the returned float32 atoms in float64, so it stays rigorous
    Wd = groups.atoms(X, dtype=np.float32 if X.dtype == np.float32 else np.float64)
    z = groups.code_values(X, Wd)
    N = X.shape[0]
    on = np.flatnonzero(groups.rays >= 0)
    Zs = sp.csr_array((z[on], (on, groups.rays[on])), shape=(N, Wd.shape[0]))
    if signed:
        cert = _signed_certificate(X, Wd, Zs, b, lam, med, tol)
    else:
        cert = _certificate(X, Wd, Zs, b, lam, med, tol, 0.0)
    excess = cert.value - cert.lower_bound_at_bias
    return WideLimitSolution(
        value=cert.value, bias=b, bias_segment=med.segment, dictionary=Wd, rays=groups.rays,
        code_values=z, certificate=cert, median=med, lam=lam, ray_tol=tol_dir,
        excess=float(excess), signed=signed,
    )


def _signed_certificate(X, W, Zs, b, lam, med, tol):
    """Certificate for signed codes: ``Z = Z+ - Z-`` on the doubled dictionary ``[W; -W]``."""
    pos = Zs.maximum(0)
    neg = (-Zs).maximum(0)
    W2 = np.vstack([W, -W])
    Z2 = sp.hstack([pos, neg]).tocsr()
    return _certificate(X, W2, Z2, b, lam, med, tol, 0.0)
