"""Dataset generators: seeded, documented ground truth, and the optimal structure they promise."""

import numpy as np
import pytest

import widelimit as wl
from widelimit.data import datasets


def test_generators_are_seeded():
    for fn in (datasets.sparse_variable, datasets.dense_symmetric, datasets.exclusive_categories,
               datasets.balanced_rays2d, datasets.hierarchical):
        X1, _ = fn(seed=3)
        X2, _ = fn(seed=3)
        X3, _ = fn(seed=4)
        assert np.array_equal(X1, X2) and X1.dtype == np.float64
        assert not np.array_equal(X1, X3)


def test_sparse_variable_truth_and_exact_count():
    X, t = datasets.sparse_variable(50, 6, n_active=20, low=1.0, high=2.0, seed=1)
    assert X.shape == (50, 6) and t["active"].sum() == 20 and t["p"] == 0.4
    assert np.allclose(X, t["values"][:, None] * t["direction"])
    assert t["values"][:20].min() >= 1.0 and t["values"][:20].max() <= 2.0
    # adding zeros keeps the active values: only the activity changes
    X2, t2 = datasets.sparse_variable(80, 6, n_active=20, low=1.0, high=2.0, seed=1)
    assert np.array_equal(X2[:20], X[:20]) and not X2[20:].any()
    _, te = datasets.sparse_variable(2000, 3, p=0.3, distribution="exponential", seed=0)
    assert abs(te["active"].mean() - 0.3) < 0.05 and te["values"][te["active"]].min() >= 1.0


def test_dense_symmetric_and_exclusive_known_optimum():
    X, t = datasets.dense_symmetric(60, 4, seed=0)
    assert np.allclose(X.sum(axis=0), 0) and np.allclose(wl.solve(X, lam=0.1).bias, 0, atol=1e-9)
    X, t = datasets.exclusive_categories(5, 7, 10, n_inactive=4, seed=2)
    U = t["directions"]
    assert np.allclose(U @ U.T, np.where(np.eye(5) > 0, 1.0, -0.25))
    sol = wl.solve(X, lam=0.5)
    assert sol.width == 5 and np.allclose(sol.bias, t["centre"], atol=1e-9)
    assert np.allclose((sol.dictionary @ U.T).max(axis=1), 1.0, atol=1e-12)


def test_balanced_rays2d_has_known_bias_and_width():
    for lam in (0.5, 1.0, 2.0):
        X, t = datasets.balanced_rays2d(lam, seed=1)
        sol = wl.solve(X, lam=lam)
        assert np.allclose(sol.bias, t["centre"], atol=1e-9) and sol.width == 6
        assert np.linalg.norm(wl.geometric_median(X).point - t["centre"]) > 0.1


def test_hierarchical_parent_only_and_inactive():
    X, t = datasets.hierarchical(3, 6, 4, child_scale=(1.5, 1.5), n_parent_only=5, n_inactive=2, seed=0)
    assert X.shape == (19, 6)
    assert np.allclose(X[t["labels"] == -1], 2.0 * t["parent"]) and not X[t["labels"] == -2].any()
    assert np.allclose(X[t["labels"] >= 0] @ t["parent"], 2.0)
    # default arguments keep the original data
    X0, _ = datasets.hierarchical(seed=5)
    X1, _ = datasets.hierarchical(seed=5, n_parent_only=0, n_inactive=0)
    assert np.array_equal(X0, X1)


@pytest.mark.parametrize("call, match", [
    (lambda: datasets.sparse_variable(10, 2, p=1.5), "p must be"),
    (lambda: datasets.sparse_variable(10, 2, n_active=11), "n_active"),
    (lambda: datasets.sparse_variable(10, 2, low=0.0), "low"),
    (lambda: datasets.sparse_variable(10, 2, distribution="cauchy"), "distribution"),
    (lambda: datasets.dense_symmetric(7), "even"),
    (lambda: datasets.exclusive_categories(2), "n_categories"),
    (lambda: datasets.exclusive_categories(6, dim=3), "dim"),
    (lambda: datasets.balanced_rays2d(1.0, n_core=3), "n_core"),
    (lambda: datasets.hierarchical(n_parent_only=-1), "n_parent_only"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_builtin_names_load():
    for name in ("sparse1d", "dense1d", "exclusive"):
        X, _ = datasets.load_builtin(name)
        assert X.ndim == 2 and np.isfinite(X).all()
