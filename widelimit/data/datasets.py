r"""Seeded dataset generators with known ground truth, and loaders for data shipped by installed packages.

Every generator takes a ``seed`` and returns ``(X, truth)``: ``X`` is ``(N, n)``
float64 and ``truth`` a dict of what the data were built from (centre, ray
directions, labels, ...). Names registered in :data:`BUILTIN` can be passed to
the CLI in place of a file.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = [
    "symmetric_rays",
    "rays2d",
    "balanced_rays2d",
    "gaussian",
    "collinear",
    "hierarchical",
    "sparse_variable",
    "dense_symmetric",
    "exclusive_categories",
    "digits",
    "iris",
    "BUILTIN",
    "load_builtin",
]


def _unit_rows(rng, k, n):
    U = rng.standard_normal((k, n))
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def symmetric_rays(n_rays: int = 6, dim: int = 10, points_per_ray: int = 20, *, radius=(1.0, 5.0),
                   centre=None, n_core: int = 0, core_radius: float = 0.1, seed: int = 0):
    r"""Points on rays symmetric about a known centre, so the optimal bias is known.

    ``n_rays`` must be even: directions come in antipodal pairs ``±u_j`` and the
    same radii are used on both, so the data are symmetric under
    ``x -> 2c - x`` and the (unique, for ``n_rays >= 4``) Huber median is ``c``
    for every ``lam``. ``n_core`` extra points are placed symmetrically within
    ``core_radius`` of ``c``.

    Returns
    -------
    X : ndarray (n_rays * points_per_ray + n_core, dim)
    truth : dict
        ``centre`` (= b*), ``directions`` (n_rays, dim), ``labels`` (ray of each point, -1 for core),
        ``radii`` (distance of each point from the centre).
    """
    if n_rays < 2 or n_rays % 2:
        raise ValueError(f"n_rays must be an even number >= 2, got {n_rays}")
    if n_core % 2:
        raise ValueError(f"n_core must be even (core points come in symmetric pairs), got {n_core}")
    rng = np.random.default_rng(seed)
    half = _unit_rows(rng, n_rays // 2, dim)
    U = np.vstack([half, -half])
    c = rng.standard_normal(dim) if centre is None else np.asarray(centre, dtype=np.float64)
    t = rng.uniform(radius[0], radius[1], size=(n_rays // 2, points_per_ray))
    t = np.vstack([t, t])
    X = (c + t[:, :, None] * U[:, None, :]).reshape(-1, dim)
    labels = np.repeat(np.arange(n_rays), points_per_ray)
    radii = t.ravel()
    if n_core:
        v = rng.standard_normal((n_core // 2, dim))
        v *= (core_radius * rng.uniform(0, 1, (n_core // 2, 1))) / np.linalg.norm(v, axis=1, keepdims=True)
        X = np.vstack([X, c + v, c - v])
        labels = np.concatenate([labels, -np.ones(n_core, dtype=int)])
        radii = np.concatenate([radii, np.linalg.norm(np.vstack([v, v]), axis=1)])
    return X, {"centre": c, "directions": U, "labels": labels, "radii": radii}


def rays2d(seed: int = 0):
    """The default demo dataset: 2-D points on six rays around a centre plus a core of 20 points.

    Three antipodal pairs of rays (angles 10, 75 and 140 degrees and their
    opposites) carry the same radii on both sides and the core is point
    symmetric, so the optimal bias is exactly the centre ``(1, -0.5)`` and, for
    ``lam = 1``, the narrowest optimal dictionary has exactly six atoms.
    """
    rng = np.random.default_rng(seed)
    c = np.array([1.0, -0.5])
    angles = np.deg2rad([10.0, 75.0, 140.0])
    half = np.c_[np.cos(angles), np.sin(angles)]
    U = np.vstack([half, -half])
    pts, labels = [], []
    for j, m in enumerate([12, 8, 10]):
        t = rng.uniform(1.5, 3.0 + j, m)
        pts += [c + t[:, None] * half[j], c - t[:, None] * half[j]]
        labels += [[j] * m, [j + 3] * m]
    v = 0.35 * rng.standard_normal((10, 2))
    X = np.vstack(pts + [c + v, c - v])
    labels = np.concatenate(labels + [[-1] * 20])
    return X, {"centre": c, "directions": U, "labels": labels, "lam": 1.0}


def balanced_rays2d(lam: float = 1.0, *, n_core: int = 30, seed: int = 0):
    r"""2-D rays of unequal sizes around a centre ``c``, balanced by a core so that ``b* = c`` at this ``lam``.

    Six rays of different lengths and counts start at ``c`` (every ray point at
    distance ``>= 1.5 lam``), so the ray directions do not cancel and the
    geometric median is pulled away from ``c``. ``n_core`` points inside the
    ``lam``-ball of ``c`` are placed so that ``sum_core (x - c) = -lam sum_rays u_i``:
    that is exactly the stationarity of the Huber objective at ``b = c``, and
    since it is strictly convex the Huber median at this ``lam`` is ``c``. The
    narrowest optimum is then the six ray directions (width 6), with the core's
    codes all zero: the narrowest optimum of theory.md §3, one atom per ray
    (pictured in docs/experiments/rays.md).

    Returns
    -------
    X : ndarray (sum of counts + n_core, 2)
    truth : dict
        ``centre`` (= b* at ``lam``), ``directions`` (6, 2), ``labels`` (ray, -1 for core), ``lam``.
    """
    lam = float(lam)
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    rng = np.random.default_rng(seed)
    c = np.array([1.0, -0.5])
    angles = np.deg2rad([10.0, 75.0, 140.0, 200.0, 250.0, 310.0])
    U = np.c_[np.cos(angles), np.sin(angles)]
    counts = [30, 8, 6, 12, 4, 10]
    pts, labels = [], []
    for j, (u, m) in enumerate(zip(U, counts)):
        t = lam * rng.uniform(1.5, 4.0 + j * 0.4, m)
        pts.append(c + t[:, None] * u)
        labels += [j] * m
    S = np.asarray(counts, dtype=np.float64) @ U
    ang = rng.uniform(0, 2 * np.pi, n_core)
    V = 0.3 * lam * np.sqrt(rng.uniform(0, 1, n_core))[:, None] * np.c_[np.cos(ang), np.sin(ang)]
    V += -V.mean(axis=0) - lam * S / n_core
    if np.max(np.linalg.norm(V, axis=1)) >= lam:
        raise ValueError(f"n_core={n_core} is too small to balance the rays inside the lam-ball; use more core points")
    X = np.vstack(pts + [c + V])
    return X, {"centre": c, "directions": U, "labels": np.array(labels + [-1] * n_core), "lam": lam}


def gaussian(n_points: int = 500, dim: int = 16, *, seed: int = 0):
    """Standard normal points: every point is its own ray (width = N for small lam)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n_points, dim)), {}


def collinear(n_points: int = 50, dim: int = 5, *, seed: int = 0):
    """Points on one line in ``dim`` dimensions: the optimal bias can be a segment, width <= 2."""
    rng = np.random.default_rng(seed)
    o = rng.standard_normal(dim)
    u = _unit_rows(rng, 1, dim)[0]
    t = rng.standard_normal(n_points) * 3
    return o + t[:, None] * u, {"origin": o, "direction": u, "t": t}


def hierarchical(n_children: int = 3, dim: int = 10, points_per_child: int = 30, *, parent_scale: float = 2.0,
                 child_scale=(0.5, 2.0), n_parent_only: int = 0, n_inactive: int = 0, seed: int = 0):
    r"""Hierarchical data: a parent direction always active whenever any child is.

    Child point ``x = a u_parent + c u_child`` with a fixed parent magnitude
    ``a = parent_scale`` and a child magnitude ``c`` uniform in ``child_scale``
    (``(c, c)`` for a fixed one); the parent and child directions are orthonormal.
    ``n_parent_only`` points ``a u_parent`` (parent without any child: "a dog that
    is no labrador") and ``n_inactive`` points at 0 (nothing active) are appended.
    The child frequency among parent points is
    ``n_children * points_per_child / (n_children * points_per_child + n_parent_only)``.
    Absorption (theory.md §6): one atom along ``a u_parent + c u_child`` costs
    ``h(sqrt(a^2 + c^2))`` on a child point (bias 0), never more than ``h(a) + h(c)`` for
    the parent and child atoms, and strictly less when ``sqrt(a^2 + c^2) > lam``.

    Returns
    -------
    X : ndarray (n_children * points_per_child + n_parent_only + n_inactive, dim)
    truth : dict
        ``parent`` (dim,), ``children`` (n_children, dim), ``labels`` (child index; -1 parent only,
        -2 inactive), ``parent_mag``, ``child_mag``.
    """
    if dim < n_children + 1:
        raise ValueError(f"dim must be >= n_children + 1 = {n_children + 1}, got {dim}")
    if not 0 <= child_scale[0] <= child_scale[1]:
        raise ValueError(f"child_scale must be (low, high) with 0 <= low <= high, got {child_scale}")
    if n_parent_only < 0 or n_inactive < 0:
        raise ValueError(f"n_parent_only and n_inactive must be >= 0, got {n_parent_only}, {n_inactive}")
    rng = np.random.default_rng(seed)
    Qm = np.linalg.qr(rng.standard_normal((dim, n_children + 1)))[0].T
    parent, children = Qm[0], Qm[1:]
    labels = np.repeat(np.arange(n_children), points_per_child)
    c = rng.uniform(child_scale[0], child_scale[1], labels.size)
    X = parent_scale * parent + c[:, None] * children[labels]
    a = np.full(labels.size, parent_scale)
    if n_parent_only or n_inactive:
        X = np.vstack([X, np.tile(parent_scale * parent, (n_parent_only, 1)), np.zeros((n_inactive, dim))])
        labels = np.concatenate([labels, np.full(n_parent_only, -1), np.full(n_inactive, -2)])
        a = np.concatenate([a, np.full(n_parent_only, parent_scale), np.zeros(n_inactive)])
        c = np.concatenate([c, np.zeros(n_parent_only + n_inactive)])
    return X, {"parent": parent, "children": children, "labels": labels, "parent_mag": a, "child_mag": c}


def _magnitudes(rng, size, low, high, distribution):
    if not (0 < low <= high):
        raise ValueError(f"need 0 < low <= high for the active values, got low={low}, high={high}")
    if distribution == "uniform":
        return rng.uniform(low, high, size)
    if distribution == "exponential":
        return low + rng.exponential(high - low, size)
    raise ValueError(f"distribution must be 'uniform' or 'exponential', got {distribution!r}")


def sparse_variable(n_points: int = 400, dim: int = 8, p: float = 0.3, *, low: float = 1.0, high: float = 3.0,
                    distribution: str = "uniform", n_active: int | None = None, seed: int = 0):
    r"""A sparse 1-D variable embedded in ``dim`` dimensions: ``x = s u``.

    ``s = 0`` with probability ``1 - p`` and otherwise ``s > 0`` drawn from the
    active distribution: ``"uniform"`` on ``[low, high]`` or ``"exponential"``
    (``low`` plus an exponential of mean ``high - low``). ``u`` is a random unit
    vector. This is the dense-antipodal-feature setting of theory.md §6: for
    ``p`` below a threshold ``p*(lam)`` (``= 1/2`` when every active value is
    ``>= 2 lam``) the optimum has one atom ``+u``; above it, the bias moves into
    the active values and the zeros need the antipodal atom ``-u``.

    Parameters
    ----------
    n_points, dim : int
    p : float in [0, 1]
        Activity: probability that a point is active (ignored when ``n_active`` is given).
    low, high : float
        Parameters of the active distribution (``0 < low <= high``).
    distribution : {"uniform", "exponential"}
    n_active : int, optional
        Exact number of active points instead of Bernoulli(``p``) draws. The
        active values are drawn first, so for a fixed ``seed`` and ``n_active``
        they are the same whatever ``n_points`` is: adding zeros changes only the
        activity. Active points come first in ``X``.
    seed : int

    Returns
    -------
    X : ndarray (n_points, dim)
    truth : dict
        ``direction`` u (dim,), ``values`` s (n_points,), ``active`` (bool mask),
        ``p`` (the activity used: ``p`` or ``n_active / n_points``).
    """
    if n_points < 1 or dim < 1:
        raise ValueError(f"n_points and dim must be >= 1, got {n_points}, {dim}")
    rng = np.random.default_rng(seed)
    u = _unit_rows(rng, 1, dim)[0]
    if n_active is not None:
        if not 0 <= n_active <= n_points:
            raise ValueError(f"n_active must be in [0, n_points={n_points}], got {n_active}")
        s = np.zeros(n_points)
        s[:n_active] = _magnitudes(rng, n_active, low, high, distribution)
        p = n_active / n_points
    else:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p}")
        on = rng.random(n_points) < p
        s = np.zeros(n_points)
        s[on] = _magnitudes(rng, int(on.sum()), low, high, distribution)
    return s[:, None] * u, {"direction": u, "values": s, "active": s > 0, "p": float(p)}


def dense_symmetric(n_points: int = 200, dim: int = 8, *, scale: float = 1.0, distribution: str = "normal",
                    seed: int = 0):
    r"""A dense symmetric 1-D variable embedded in ``dim`` dimensions: ``x = s u``.

    ``s`` is drawn from ``N(0, scale^2)`` (``"normal"``) or uniform on
    ``[-scale, scale]`` (``"uniform"``), and the sample is mirrored (``s`` and
    ``-s`` both present, ``n_points`` must be even), so ``b* = 0`` is an optimal
    bias for every ``lam``. With nonnegative codes the optimum needs the
    antipodal pair ``+u, -u`` (width 2); with signed codes one line (width 1).

    Returns
    -------
    X : ndarray (n_points, dim)
    truth : dict
        ``direction`` u, ``values`` s, ``centre`` (zeros: an optimal bias).
    """
    if n_points < 2 or n_points % 2:
        raise ValueError(f"n_points must be an even number >= 2 (the sample is mirrored), got {n_points}")
    rng = np.random.default_rng(seed)
    u = _unit_rows(rng, 1, dim)[0]
    if distribution == "normal":
        h = scale * rng.standard_normal(n_points // 2)
    elif distribution == "uniform":
        h = rng.uniform(-scale, scale, n_points // 2)
    else:
        raise ValueError(f"distribution must be 'normal' or 'uniform', got {distribution!r}")
    s = np.concatenate([h, -h])
    return s[:, None] * u, {"direction": u, "values": s, "centre": np.zeros(dim)}


def simplex_directions(k: int, dim: int, rng) -> np.ndarray:
    """``k`` unit vectors in ``dim >= k - 1`` dimensions with pairwise cosine ``-1/(k-1)`` (sum zero), randomly rotated."""
    E = np.eye(k) - 1.0 / k
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    B = np.linalg.svd(E)[2][: k - 1]  # orthonormal basis of the simplex's span (k-1, k)
    C = E @ B.T  # (k, k-1) coordinates
    R = np.linalg.qr(rng.standard_normal((dim, k - 1)))[0]  # (dim, k-1) orthonormal
    return C @ R.T


def exclusive_categories(n_categories: int = 4, dim: int = 8, points_per_category: int = 30, *,
                         magnitude=(1.0, 3.0), n_inactive: int = 0, centre=None, seed: int = 0):
    r"""Mutually exclusive categories: each point is ``c + s u_j`` for exactly one category ``j``.

    The category directions ``u_j`` form a regular simplex (pairwise cosine
    ``-1/(K-1)``, summing to zero) in a random ``K-1``-dimensional subspace, and
    every category uses the *same* magnitudes ``s`` (uniform on ``magnitude``),
    so the data are invariant under permuting the categories. With that symmetry
    the unique Huber median is the centre ``c`` for every ``lam`` (``K >= 3``),
    and for ``lam < min s`` the narrowest optimum is exactly the category
    directions, width ``K``. ``n_inactive`` points sit at ``c`` (no category).

    Returns
    -------
    X : ndarray (K * points_per_category + n_inactive, dim)
    truth : dict
        ``centre`` (= b*), ``directions`` (K, dim), ``labels`` (category, -1 for inactive),
        ``magnitudes`` (0 for inactive).
    """
    K = n_categories
    if K < 3:
        raise ValueError(f"n_categories must be >= 3 (two exclusive categories are one antipodal line), got {K}")
    if dim < K - 1:
        raise ValueError(f"dim must be >= n_categories - 1 = {K - 1}, got {dim}")
    if not 0 < magnitude[0] <= magnitude[1]:
        raise ValueError(f"magnitude must be (low, high) with 0 < low <= high, got {magnitude}")
    rng = np.random.default_rng(seed)
    U = simplex_directions(K, dim, rng)
    c = np.zeros(dim) if centre is None else np.asarray(centre, dtype=np.float64)
    s = rng.uniform(magnitude[0], magnitude[1], points_per_category)
    X = (c + s[None, :, None] * U[:, None, :]).reshape(-1, dim)
    labels = np.repeat(np.arange(K), points_per_category)
    mags = np.tile(s, K)
    if n_inactive:
        X = np.vstack([X, np.tile(c, (n_inactive, 1))])
        labels = np.concatenate([labels, -np.ones(n_inactive, dtype=int)])
        mags = np.concatenate([mags, np.zeros(n_inactive)])
    return X, {"centre": c, "directions": U, "labels": labels, "magnitudes": mags}


def digits(*, seed: int = 0):
    """scikit-learn's bundled handwritten digits (1797 x 64, pixel values 0..16), shipped with the package."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return np.asarray(d.data, dtype=np.float64), {"labels": d.target}


def iris(*, seed: int = 0):
    """scikit-learn's bundled iris measurements (150 x 4)."""
    from sklearn.datasets import load_iris

    d = load_iris()
    return np.asarray(d.data, dtype=np.float64), {"labels": d.target}


#: Datasets the CLI accepts by name, with the ``lam`` used when none is given.
BUILTIN: dict[str, tuple[Callable, float]] = {
    "rays2d": (rays2d, 1.0),
    "rays": (symmetric_rays, 0.5),
    "gaussian": (gaussian, 0.5),
    "collinear": (collinear, 1.0),
    "hierarchical": (hierarchical, 0.5),
    "sparse1d": (sparse_variable, 0.1),
    "dense1d": (dense_symmetric, 0.1),
    "exclusive": (exclusive_categories, 0.5),
    "digits": (digits, 5.0),
    "iris": (iris, 0.5),
}


def load_builtin(name: str, seed: int = 0):
    """``(X, truth)`` of a built-in dataset by name (see :data:`BUILTIN`)."""
    if name not in BUILTIN:
        raise ValueError(f"unknown built-in dataset {name!r}; choose one of {', '.join(sorted(BUILTIN))}")
    fn, _ = BUILTIN[name]
    return fn(seed=seed)
