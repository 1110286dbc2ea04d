r"""Cross-validation of the gradient solver against the exact wide-limit optimum.

Two independent computations of the same minimum: :func:`widelimit.solve` (closed
form, certified) and :func:`widelimit.fit_dictionary` (torch gradient descent on the
nonconvex objective at a finite width). For every width and every ``(W, Z, b)``,
``L(W, Z, b) >= lower_bound`` (theory.md §3), so a gradient solution *below* the
certified bound would prove a bug in one of them; at width >= number of rays the
two must meet, and :func:`widelimit.verify` must certify the gradient solution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._params import LAM, POSITIVE_INT, SEED, TOL, Data, InstanceOf, Passed, validate_params
from .._validation import check_data, check_int, check_lam, check_seed
from ..exact.certificate import Certificate, verify
from ..exact.solve import WideLimitSolution, solve
from .gradient import FitResult, fit_dictionary

__all__ = ["CrossValidation", "crossvalidate", "atom_match", "best_fit"]


def atom_match(learned: np.ndarray, optimal: np.ndarray, used=None) -> dict:
    """Cosines between learned atoms and the optimal rays.

    Returns ``per_ray`` (for each optimal atom, the best cosine with a learned atom),
    ``per_atom`` (for each used learned atom, the best cosine with an optimal atom) and
    their minima ``min_ray_cosine`` / ``min_atom_cosine`` (1.0 means every ray is
    matched exactly / every atom lies on a ray).
    """
    L = np.asarray(learned, dtype=np.float64)
    O = np.asarray(optimal, dtype=np.float64)
    if used is not None:
        L = L[np.asarray(used, dtype=bool)]
    if L.shape[0] == 0 or O.shape[0] == 0:
        return {"per_ray": [], "per_atom": [], "min_ray_cosine": float("nan"), "min_atom_cosine": float("nan")}
    Ln = L / np.linalg.norm(L, axis=1, keepdims=True)
    On = O / np.linalg.norm(O, axis=1, keepdims=True)
    C = On @ Ln.T
    per_ray = C.max(axis=1)
    per_atom = C.max(axis=0)
    return {"per_ray": per_ray.tolist(), "per_atom": per_atom.tolist(),
            "min_ray_cosine": float(per_ray.min()), "min_atom_cosine": float(per_atom.min())}


def best_fit(X, *, lam, width, n_restarts: int = 3, seed: int = 0, inits=("rays",), **fit_kwargs):
    """Run :func:`fit_dictionary` ``n_restarts`` times (seeds ``seed, seed+1, ...``, cycling through
    ``inits``) and return ``(best, all_fits)`` with ``best`` the lowest objective."""
    n_restarts, seed = check_int(n_restarts, "n_restarts", low=1), check_seed(seed)
    if isinstance(inits, str):
        inits = (inits,)
    fits = [fit_dictionary(X, lam=lam, width=width, init=inits[i % len(inits)], seed=seed + i, **fit_kwargs)
            for i in range(int(n_restarts))]
    return min(fits, key=lambda f: f.value), fits


@dataclass(frozen=True)
class CrossValidation:
    """Gradient solver vs exact optimum at one width.

    Attributes
    ----------
    value : float
        Best objective of the gradient solver over the restarts.
    lower_bound : float
        Certified global lower bound (all widths).
    exact_value : float
        Objective of the exact solution.
    gap, rel_gap : float
        ``value - lower_bound`` and ``gap / value``.
    width, n_rays : int
        Gradient width and the number of rays (narrowest optimal width).
    respects_bound : bool
        ``value >= lower_bound - 1e-9 |lower_bound|`` for every restart (a violation is a bug).
    certified : bool
        :func:`widelimit.verify` certifies the gradient ``(W, Z, b)`` at ``tol``.
    certificate : Certificate
    match : dict
        :func:`atom_match` of the learned atoms (used ones) against the optimal rays.
    restart_values : list of float
    fit : FitResult
    exact : WideLimitSolution
    """

    value: float
    lower_bound: float
    exact_value: float
    gap: float
    rel_gap: float
    width: int
    n_rays: int
    respects_bound: bool
    certified: bool
    certificate: Certificate = field(repr=False)
    match: dict = field(repr=False)
    restart_values: list
    fit: FitResult = field(repr=False)
    exact: WideLimitSolution = field(repr=False)

    def as_dict(self) -> dict:
        """Plain-Python summary (JSON-serialisable)."""
        return {
            "value": self.value, "lower_bound": self.lower_bound, "exact_value": self.exact_value,
            "gap": self.gap, "rel_gap": self.rel_gap, "width": self.width, "n_rays": self.n_rays,
            "respects_bound": self.respects_bound, "certified": self.certified,
            "min_ray_cosine": self.match["min_ray_cosine"], "min_atom_cosine": self.match["min_atom_cosine"],
            "restart_values": self.restart_values, "bias_distance": float(np.linalg.norm(self.fit.bias - self.exact.bias)),
            "certificate": self.certificate.as_dict(), "fit": self.fit.as_dict(),
        }


@validate_params({"X": Data(), "lam": LAM, "width": [POSITIVE_INT, None], "n_restarts": POSITIVE_INT, "seed": SEED,
                  "inits": InstanceOf(list, tuple, allowed="a list of inits"), "tol": TOL, "exact": [InstanceOf(WideLimitSolution), None],
                  "fit_kwargs": Passed("widelimit.fit_dictionary")})
def crossvalidate(X, *, lam, width=None, n_restarts: int = 3, seed: int = 0, inits=("rays", "data"),
                  tol: float = 1e-4, exact: WideLimitSolution | None = None, **fit_kwargs) -> CrossValidation:
    """Run the gradient solver and the exact solver on the same data and compare them.

    Parameters
    ----------
    X : array (N, n)
    lam : float
    width : int, optional
        Gradient width; default the number of rays of the exact solution.
    n_restarts : int
        Independent fits (different seeds, cycling through ``inits``); the best counts.
    seed : int
    inits : sequence of str
        Initialisations to cycle through (see :func:`widelimit.fit_dictionary`).
    tol : float
        Relative gap at which :func:`widelimit.verify` certifies the gradient solution.
    exact : WideLimitSolution, optional
        A precomputed :func:`widelimit.solve` result for the same ``X`` and ``lam``.
    **fit_kwargs
        Passed to :func:`widelimit.fit_dictionary` (``device``, ``max_iter``, ``encoder``, ...).

    Returns
    -------
    CrossValidation
    """
    X = check_data(X)
    lam = check_lam(lam)
    check_int(n_restarts, "n_restarts", low=1), check_seed(seed), check_int(width, "width", low=1, none_ok=True)
    ex = solve(X, lam=lam) if exact is None else exact
    if width is None:
        width = max(1, ex.width)
    best, fits = best_fit(X, lam=lam, width=width, n_restarts=n_restarts, seed=seed, inits=inits, **fit_kwargs)
    cert = verify(X, best.dictionary, best.codes, best.bias, lam=lam, tol=tol, median=ex.median)
    lb = float(ex.lower_bound)
    slack = 1e-9 * max(abs(lb), 1e-300)
    used = np.asarray(best.codes.sum(axis=0)).ravel() > 0
    return CrossValidation(
        value=best.value, lower_bound=lb, exact_value=ex.value, gap=best.value - lb,
        rel_gap=(best.value - lb) / max(abs(best.value), 1e-300), width=int(width), n_rays=ex.width,
        respects_bound=all(f.value >= lb - slack for f in fits), certified=cert.certified, certificate=cert,
        match=atom_match(best.dictionary, ex.dictionary, used), restart_values=[f.value for f in fits],
        fit=best, exact=ex,
    )
