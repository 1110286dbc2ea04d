r"""Instance families of the relaxation benchmark, each with a known optimum at any ``N``.

Every instance is data ``X`` (``N x n``) and ``lam > 0``. Its problem is the
Q-form of docs/theory.md §2,

.. math::

    \min_{Q \in K,\ b}\ \frac{\lambda}{N}\Big(\operatorname{tr}\big(\tilde X^\top (Q + \lambda I)^{-1}
    \tilde X\big) + \mathbf 1^\top Q \mathbf 1\Big), \qquad \tilde X = X - \mathbf 1 b^\top ,

over the completely positive cone ``K = CP_N`` or any cone between ``CP_N`` and
the entrywise-nonnegative symmetric matrices (``dnn``, ``nonneg``): all of them
have the same optimal value, ``min_b (1/N) sum_i h_lam(||x_i - b||)``
(docs/theory.md §3-4: the gradient at the closed-form optimum is entrywise
nonnegative, so it certifies optimality over every such cone). That value is
``widelimit.solve(X, lam=lam).value``, certified to a relative gap of ``1e-9`` or
better, and stored as ``optimum``.

Every family except ``random`` is point-symmetric about a known centre ``c``
(``x -> 2c - x`` maps the data onto itself). ``H(b) = mean_i h_lam(||x_i - b||)``
is convex and symmetric about ``c``, so ``c`` is an optimal bias and the optimum
is ``H(c)`` in closed form, with no solver at all: ``truth["centre"]`` and
``truth["closed_form"]`` record it, and the tests compare it with ``optimum``.

Families and the parameters that make them harder
-------------------------------------------------
``random``
    Standard normal points (not symmetric: the optimal bias is a genuine Huber
    median). ``lam`` (default 0.5): a larger ``lam`` puts more points within
    ``lam`` of the bias, where ``Q*_ii = 0`` and the PSD constraint becomes active.
``rays``
    ``n_rays`` antipodal rays (even, default 4) through ``c``, points at distance
    ``[1.5, 5] lam`` on them. Points on one ray share one atom, so the optimal
    ``Q`` is far from unique (a face of optimal solutions). Fewer rays at the
    same ``N`` (``n_rays=2``) make the optimal face larger; ``n_rays = N`` makes
    every point its own ray (unique, diagonal ``Q*``).
``collinear``
    Points on one line, symmetric about ``c``, at distance ``gap + [0, spread]``
    on both sides (``gap`` default ``2 lam``). When ``gap > lam`` the optimal
    bias is a whole segment of length ``2 (gap - lam)``: the optimal ``b`` is
    not unique and the dual is degenerate. ``gap`` below ``lam`` gives a unique bias.
``inside``
    A fraction ``frac_inside`` (default 0.5) of the points lies within
    ``inner_radius * lam`` of ``c`` (``inner_radius`` default 0.9), the rest at
    distance ``[1.5, 4] lam`` in random directions. Every inside point has
    ``Q*_ii = 0``, so ``Q*`` is singular: it lies on the boundary of the PSD
    cone, where the constraint is active (not needed for the value, though:
    the ``nonneg`` relaxation has the same optimum).
    Larger ``frac_inside`` = more zero rows; ``inner_radius`` near 1 puts the
    points near the kink of the Huber function, where the objective changes
    from quadratic to linear.
``ties``
    A fraction ``frac_tie`` (default 0.5) of the points lies at distance exactly
    ``lam`` from ``c`` (to rounding): ``Q*_ii = 0`` **and** the dual entry
    ``G_ii = 0`` there, so strict complementarity fails at these points. The
    others are far points repeated ``copies`` times (default 2): duplicates
    share atoms, so ``Q*`` is not unique. Interior-point methods lose their
    fast local convergence without strict complementarity.
``scaled``
    Symmetric Gaussian points whose coordinate ``j`` is multiplied by
    ``10^(decades (j/(n-1) - 1/2))`` (``decades`` default 4), and the whole
    instance (data and ``lam``) by ``10^magnitude`` (default 0; the optimum
    scales by ``10^(2 magnitude)``). ``lam = lam_rel`` times the median distance
    to ``c`` (``lam_rel`` default 0.5). More decades = worse conditioned LMI.

The tests and the benchmark scripts draw their instances from here (one generator per family).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np

from ..data import datasets
from ..exact.solve import solve

__all__ = ["FAMILIES", "FAMILY_PARAMS", "PARAM_RANGES", "INT_PARAMS", "MIN_N", "check_params", "BenchInstance",
           "make_bench_instance", "closed_form"]

#: Instance families, in the order of the docs page.
FAMILIES = ("random", "rays", "collinear", "inside", "ties", "scaled")

#: Each family's parameters and their defaults (``dim`` is the ambient dimension ``n``).
FAMILY_PARAMS: dict[str, dict] = {
    "random": {"dim": 5, "lam": 0.5},
    "rays": {"dim": 5, "lam": 0.5, "n_rays": 4},
    "collinear": {"dim": 5, "lam": 1.0, "gap": 2.0, "spread": 3.0},
    "inside": {"dim": 5, "lam": 1.0, "frac_inside": 0.5, "inner_radius": 0.9},
    "ties": {"dim": 5, "lam": 1.0, "frac_tie": 0.5, "copies": 2},
    "scaled": {"dim": 5, "lam_rel": 0.5, "decades": 4.0, "magnitude": 0.0},
}

#: Smallest ``N`` of each family (a family needs enough points for its structure).
MIN_N = {"random": 2, "rays": 4, "collinear": 2, "inside": 4, "ties": 4, "scaled": 2}


@dataclass(frozen=True)
class BenchInstance:
    """One benchmark instance: data, ``lam`` and its known optimum.

    Attributes
    ----------
    family : str
    X : ndarray (N, n), float64
    lam : float
    optimum : float
        ``widelimit.solve(X, lam=lam).value``: the optimal value of the Q-problem over
        CP, DNN and the nonnegative cone alike (docs/theory.md §4).
    certified_gap : float
        Relative gap of widelimit's certificate for ``optimum``.
    seed : int
    params : dict
        The family parameters used (defaults filled in).
    truth : dict
        What the data were built from; ``centre`` (an optimal bias) and
        ``closed_form`` (``H(centre)``) for the symmetric families.
    """

    family: str
    X: np.ndarray
    lam: float
    optimum: float
    certified_gap: float
    seed: int
    params: dict
    truth: dict = field(default_factory=dict)

    @property
    def N(self) -> int:
        return int(self.X.shape[0])

    @property
    def n(self) -> int:
        return int(self.X.shape[1])

    @property
    def name(self) -> str:
        """``<family>-N<N>-n<n>-s<seed>``, plus ``-p<hash>`` of the parameters when they are not the defaults."""
        base = f"{self.family}-N{self.N}-n{self.n}-s{self.seed}"
        defaults = dict(FAMILY_PARAMS[self.family], dim=self.n)
        if all(self.params.get(k) == v for k, v in defaults.items()):
            return base
        key = json.dumps(sorted((k, float(v)) for k, v in self.params.items()))
        return f"{base}-p{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def closed_form(X, centre, *, lam) -> float:
    r"""``H(c) = (1/N) sum_i h_lam(||x_i - c||)``, written out with numpy (theory.md §3).

    For point-symmetric data this is the optimum: ``H`` is convex and
    ``H(c + d) = H(c - d)``, so ``H(c) <= (H(c + d) + H(c - d)) / 2 = H(c + d)``.
    """
    r = np.linalg.norm(np.asarray(X, dtype=np.float64) - np.asarray(centre, dtype=np.float64), axis=1)
    h = np.where(r <= lam, r * r, 2.0 * lam * r - lam * lam)
    return float(np.mean(h))


def _unit(rng, k, n):
    U = rng.standard_normal((k, n))
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def _symmetric(c, H, N):
    """``c + H``, ``c - H`` and, for odd ``N``, ``c`` itself: ``N`` point-symmetric points."""
    parts = [c + H, c - H]
    if N % 2:
        parts.append(c[None, :])
    return np.vstack(parts)


#: Valid range of each numeric parameter: ``(low, high, low_open, high_open)``. The bounds keep
#: the data, ``lam`` and the optimum finite and normal in float64 and each family's structure
#: intact (at ``lam`` below ``1e-3`` the points ``c +- lam u`` of ``ties`` no longer lie at distance
#: ``lam`` to rounding; ``decades`` and ``magnitude`` at their bounds give data and optima between
#: about ``1e-200`` and ``1e300``). ``dim`` has no upper bound here (``widelimit relax-bench`` sets one).
PARAM_RANGES: dict[str, tuple] = {
    "dim": (1, math.inf, False, True),
    "lam": (1e-3, 1e3, False, False),
    "lam_rel": (1e-3, 1e3, False, False),
    "n_rays": (2, math.inf, False, True),
    "gap": (0.0, 1e3, False, False),
    "spread": (0.0, 1e3, True, False),
    "frac_inside": (0.0, 1.0, False, False),
    "inner_radius": (0.0, 1.0, True, True),
    "frac_tie": (0.0, 1.0, False, False),
    "copies": (1, math.inf, False, True),
    "decades": (0.0, 100.0, False, False),
    "magnitude": (-100.0, 100.0, False, False),
}

#: Parameters that are integers (an integral float such as ``2.0`` is taken as the integer).
INT_PARAMS = frozenset({"dim", "n_rays", "copies"})


def _show(v) -> str:
    """A parameter value for a message: integral floats without ``.0``, others as ``repr``."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    return repr(v)


def _range_text(key: str) -> str:
    lo, hi, lo_open, hi_open = PARAM_RANGES[key]
    if key in INT_PARAMS:
        return f"an integer >= {lo}" if hi == math.inf else f"an integer in [{lo}, {hi}]"
    if hi == math.inf:
        return f"a number {'>' if lo_open else '>='} {lo:g}"
    return f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def check_params(family: str, params: dict, N: int | None = None) -> dict:
    """The family's parameters with the defaults filled in, each checked; a one-line ``ValueError`` otherwise.

    Every message starts with the parameter's name and ends with the value given (``n_rays must be
    an integer, got 2.5``). With ``N``, parameters that need more points than ``N`` are refused
    naming both (``n_rays`` rays need ``n_rays`` points; ``copies`` copies need as many).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    known = FAMILY_PARAMS[family]
    bad = sorted(set(params) - set(known))
    if bad:
        raise ValueError(f"family {family!r} has no parameter {bad[0]!r}; its parameters are {', '.join(known)}")
    p = dict(known)
    p.update({k: v for k, v in params.items() if v is not None})
    for k in known:
        v = p[k]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"{k} must be a number, got {v!r}")
        v = int(v) if isinstance(v, np.integer) else float(v) if isinstance(v, np.floating) else v
        if k in INT_PARAMS:
            if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
                raise ValueError(f"{k} must be an integer, got {_show(v)}")
            v = int(v)
        lo, hi, lo_open, hi_open = PARAM_RANGES[k]
        inside = (math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi))
        if not inside:
            raise ValueError(f"{k} must be {_range_text(k)}, got {_show(v)}")
        p[k] = v
    if family == "rays":
        if p["n_rays"] % 2:
            raise ValueError(f"n_rays must be an even integer >= 2 (antipodal pairs), got {p['n_rays']}")
        if N is not None and p["n_rays"] > N:
            raise ValueError(f"n_rays must be at most N = {N} (each ray needs a point of its own), "
                             f"got {p['n_rays']}")
    if family == "ties" and N is not None and p["copies"] > N:
        raise ValueError(f"copies must be at most N = {N} (each copy is one of the N points), got {p['copies']}")
    return p


def make_bench_instance(family: str, N: int, *, seed: int = 0, **params) -> BenchInstance:
    r"""An instance of ``N`` points from one family, with its optimum.

    Parameters
    ----------
    family : str
        One of :data:`FAMILIES`.
    N : int
        Number of points, at least :data:`MIN_N` of the family.
    seed : int
    **params
        Family parameters (:data:`FAMILY_PARAMS`; ``None`` means the default), each within
        :data:`PARAM_RANGES` (:func:`check_params`).

    Returns
    -------
    BenchInstance
        ``optimum = widelimit.solve(X, lam=lam).value`` (docs/theory.md §3-4).

    Raises
    ------
    ValueError
        Unknown family or parameter, ``N`` too small, a parameter out of range, not an integer
        (``dim``, ``n_rays``, ``copies``) or needing more than ``N`` points (``n_rays``, ``copies``).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)):
        raise ValueError(f"N must be an integer, got {N!r}")
    N = int(N)
    if N < MIN_N[family]:
        raise ValueError(f"N = {N} is too small for family {family!r} (needs N >= {MIN_N[family]})")
    p = check_params(family, params, N)
    n = p["dim"]
    rng = np.random.default_rng(seed)
    h = N // 2
    truth: dict = {}
    if family == "random":
        X, _ = datasets.gaussian(N, n, seed=seed)
        lam = float(p["lam"])
    else:
        c = rng.standard_normal(n)
        if family == "rays":
            lam = float(p["lam"])
            k = min(p["n_rays"] // 2, h)
            U = _unit(rng, k, n)
            ray = np.arange(h) % k
            H = rng.uniform(1.5, 5.0, h)[:, None] * lam * U[ray]
            truth["n_rays"] = 2 * k
        elif family == "collinear":
            lam = float(p["lam"])
            u = _unit(rng, 1, n)[0]
            t = p["gap"] * lam + rng.uniform(0.0, p["spread"] * lam, h)
            t[: min(1, h)] = p["gap"] * lam  # the innermost points fix the bias segment
            H = t[:, None] * u
            truth["direction"] = u
            truth["bias_segment_halflength"] = 0.0 if N % 2 else max(0.0, (p["gap"] - 1.0) * lam)
        elif family == "inside":
            lam = float(p["lam"])
            m = int(round(p["frac_inside"] * h))
            r = np.concatenate([p["inner_radius"] * lam * np.sqrt(rng.uniform(0, 1, m)),
                                rng.uniform(1.5, 4.0, h - m) * lam])
            H = r[:, None] * _unit(rng, h, n)
            truth["n_inside"] = 2 * m + (N % 2)
        elif family == "ties":
            lam = float(p["lam"])
            m = int(round(p["frac_tie"] * h))
            far = h - m
            k = max(1, -(-far // p["copies"]))  # distinct far points
            F = rng.uniform(1.5, 4.0, (k, 1)) * lam * _unit(rng, k, n)
            H = np.vstack([lam * _unit(rng, m, n), np.repeat(F, p["copies"], axis=0)[:far]])
            truth["n_at_lam"] = 2 * m
        else:  # scaled
            scales = 10.0 ** (p["decades"] * ((np.arange(n) / (n - 1) if n > 1 else np.zeros(1)) - 0.5))
            H = rng.standard_normal((h, n)) * scales
            mag = 10.0 ** p["magnitude"]
            H = H * mag
            c = c * scales * mag
            d = np.linalg.norm(H, axis=1)
            lam = float(p["lam_rel"] * np.median(np.concatenate([d, d, np.zeros(N % 2)])))
            truth["column_scales"] = scales * mag
        X = _symmetric(c, H, N)
        truth["centre"] = c
        truth["closed_form"] = closed_form(X, c, lam=lam)
    X = np.ascontiguousarray(X, dtype=np.float64)
    sol = solve(X, lam=lam)
    if not (math.isfinite(sol.value) and sol.certificate.certified):  # the ranges above should prevent it
        raise ValueError(f"family {family!r} with {p} at N = {N} gives no certified optimum in float64 "
                         f"(value {sol.value!r}, relative gap {sol.certificate.rel_gap:.1e}); choose parameters "
                         "nearer the defaults")
    truth["width"] = int(sol.width)
    truth["n_within_lam"] = int(np.count_nonzero(sol.rays < 0))
    return BenchInstance(family=family, X=X, lam=float(lam), optimum=float(sol.value),
                         certified_gap=float(sol.certificate.rel_gap), seed=int(seed), params=p, truth=truth)
