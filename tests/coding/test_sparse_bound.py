"""The Babel function of widelimit/coding/sparse_bound.py: a row sample skips the k^2 n product where the
restricted-eigenvalue bound is void, and nothing changes where it is not. Checked against the full Gram."""

from __future__ import annotations

import numpy as np
import torch

from widelimit.coding.sparse_bound import babel, sparse_lower_bound


def _unit(rng, k, n):
    U = rng.standard_normal((k, n))
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def _babel_dense(U, s_max):
    """``mu_1(s - 1)`` from the whole Gram matrix (numpy), no rounding term."""
    A = np.abs(U @ U.T)
    np.fill_diagonal(A, 0.0)
    top = np.cumsum(-np.sort(-A, axis=1), axis=1).max(0)
    return np.concatenate([[0.0, 0.0], top[: s_max - 1]])


def _case(seed, k, n, budgets, m=12):
    rng = np.random.default_rng(seed)
    U = _unit(rng, k, n)
    X = rng.standard_normal((m, n))
    R = X - 0.5 * (X @ U[:3].T) @ U[:3]  # any residuals: the bound holds for every r
    bud = torch.as_tensor(np.resize(budgets, m))
    return torch.as_tensor(U), torch.as_tensor(X), bud, torch.as_tensor(R)


def test_babel_skips_the_full_product_where_the_bound_is_void_with_the_same_bounds():
    # 300 atoms in 20 dimensions: mu_1(s - 1) >= 1 from s = 3 on, the restricted-eigenvalue bound cannot certify
    U, X, bud, R = _case(0, 300, 20, [4, 5, 7])
    dense = _babel_dense(U.numpy(), 7)
    assert dense[3] >= 1.0 > dense[2]
    mu = babel(U, 7, s_min=4, cap=1.0)
    assert np.all(np.isnan(mu[2:3]))  # below s_min, not computed: the k^2 n product was skipped
    assert np.all((mu[4:] >= 1.0) & (mu[4:] <= dense[4:]))  # a lower estimate, proven >= cap
    full = babel(U, 7)
    assert np.all((full >= dense) & (full <= dense + 8 * 20 * 2.0 ** -52 * np.arange(8)))  # exact plus rounding
    for a, b in zip(sparse_lower_bound(U, X, bud, R, max_subsets=10), sparse_lower_bound(U, X, bud, R, mu=full,
                                                                                            max_subsets=10)):
        np.testing.assert_array_equal(a, b)
    assert np.all(sparse_lower_bound(U, X, bud, R, max_subsets=10)[1] == 0)  # void: only MSE >= 0


def test_babel_is_exact_in_blocks_where_the_bound_is_not_void():
    # near-orthogonal atoms: mu_1(s - 1) < 1 for small s, >= 1 for large s; tokens at both
    U, X, bud, R = _case(1, 200, 300, [2, 3, 40])
    dense = _babel_dense(U.numpy(), 40)
    assert dense[3] < 1.0 <= dense[40]
    for chunk in (None, 7):
        mu = babel(U, 40, chunk, s_min=2, cap=1.0)
        exact = dense < 1.0
        np.testing.assert_allclose(mu[exact], babel(U, 40)[exact], rtol=0, atol=1e-14)  # exact where used
        assert np.all((mu[exact] >= dense[exact]) & (mu[exact] <= dense[exact] + 8 * 300 * 2.0 ** -52 * 40))
        assert np.all(mu[~exact] >= 1.0)
    lb_new, m_new = sparse_lower_bound(U, X, bud, R, max_subsets=10)
    lb_old, m_old = sparse_lower_bound(U, X, bud, R, mu=babel(U, 40), max_subsets=10)
    np.testing.assert_array_equal(m_new, m_old)
    np.testing.assert_array_equal(lb_new, lb_old)
    assert set(m_new.tolist()) == {0, 3}  # bounded at s = 2, 3; void at s = 40
