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
    "gaussian",
    "collinear",
    "hierarchical",
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
                 child_scale=(0.5, 2.0), seed: int = 0):
    r"""Hierarchical data: a parent direction always active whenever any child is.

    Point ``x = a u_parent + c u_child`` with a fixed parent magnitude
    ``a = parent_scale`` and a child magnitude ``c`` uniform in ``child_scale``;
    the parent and child directions are orthonormal.

    Returns
    -------
    X : ndarray (n_children * points_per_child, dim)
    truth : dict
        ``parent`` (dim,), ``children`` (n_children, dim), ``labels``, ``parent_mag``, ``child_mag``.
    """
    if dim < n_children + 1:
        raise ValueError(f"dim must be >= n_children + 1 = {n_children + 1}, got {dim}")
    rng = np.random.default_rng(seed)
    Qm = np.linalg.qr(rng.standard_normal((dim, n_children + 1)))[0].T
    parent, children = Qm[0], Qm[1:]
    labels = np.repeat(np.arange(n_children), points_per_child)
    c = rng.uniform(child_scale[0], child_scale[1], labels.size)
    X = parent_scale * parent + c[:, None] * children[labels]
    return X, {"parent": parent, "children": children, "labels": labels,
               "parent_mag": np.full(labels.size, parent_scale), "child_mag": c}


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
    "digits": (digits, 5.0),
    "iris": (iris, 0.5),
}


def load_builtin(name: str, seed: int = 0):
    """``(X, truth)`` of a built-in dataset by name (see :data:`BUILTIN`)."""
    if name not in BUILTIN:
        raise ValueError(f"unknown built-in dataset {name!r}; choose one of {', '.join(sorted(BUILTIN))}")
    fn, _ = BUILTIN[name]
    return fn(seed=seed)
