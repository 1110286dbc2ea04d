"""First-order conditions (theory.md §5) against closed forms and perturbed solutions."""

import numpy as np
import pytest

import widelimit as wl
from widelimit.data import datasets
from widelimit.exact.stationarity import first_order_conditions


def test_exact_optimum_is_stationary_with_closed_form_margin():
    K, lam = 4, 0.5
    X, t = datasets.exclusive_categories(K, 6, 10, seed=0)
    sol = wl.solve(X, lam=lam)
    foc = first_order_conditions(X, sol.dictionary, sol.codes, sol.bias, lam=lam)
    assert foc.holds(1e-10)
    assert foc.code_margin == pytest.approx(lam * K / (K - 1), rel=1e-12)
    # sparse codes give the same answer
    foc2 = first_order_conditions(X, sol.dictionary, sol.sparse_codes, sol.bias, lam=lam)
    assert foc2.code_margin == pytest.approx(foc.code_margin, rel=1e-12)


def test_perturbations_are_detected():
    lam = 0.5
    X, t = datasets.exclusive_categories(3, 5, 8, seed=1)
    sol = wl.solve(X, lam=lam)
    W, Z, b = sol.dictionary, sol.codes, sol.bias
    assert not first_order_conditions(X, W, Z * 1.01, b, lam=lam).holds(1e-6)       # active codes off
    assert not first_order_conditions(X, W, Z, b + 0.01, lam=lam).holds(1e-6)       # bias off
    R = np.linalg.qr(np.random.default_rng(0).standard_normal((5, 5)))[0]
    W2 = W @ (np.eye(5) + 0.01 * (R - R.T))
    W2 /= np.linalg.norm(W2, axis=1, keepdims=True)
    assert first_order_conditions(X, W2, Z, b, lam=lam).atom_residual > 1e-5       # atoms rotated
    # a scaled atom with compensating codes is the same point: still stationary
    assert first_order_conditions(X, 3 * W, Z / 3, b, lam=lam).holds(1e-10)


def test_inactive_feature_margin_violation():
    # an extra atom along a ray that nobody uses: <w, r_i> = lam on that ray, margin 0;
    # an atom along a data direction beyond the residual: negative margin
    X = np.array([[3.0, 0.0], [0.0, 3.0], [-3.0, 0.0], [0.0, -3.0]])
    lam = 1.0
    sol = wl.solve(X, lam=lam)
    W = np.vstack([sol.dictionary, sol.dictionary[:1]])
    Z = np.hstack([sol.codes, np.zeros((4, 1))])
    assert first_order_conditions(X, W, Z, sol.bias, lam=lam).code_margin == pytest.approx(0.0, abs=1e-12)
    Z0 = np.zeros_like(sol.codes)
    assert first_order_conditions(X, sol.dictionary, Z0, sol.bias, lam=lam).code_margin == pytest.approx(-2.0)


def test_atom_residual_is_the_riemannian_gradient_norm_of_the_objective():
    """``atom_residual`` against torch autograd of L(W, Z, b) projected on the sphere's tangent spaces."""
    import torch

    rng = np.random.default_rng(3)
    X = rng.standard_normal((30, 4))
    W = rng.standard_normal((3, 4))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    Z = np.abs(rng.standard_normal((30, 3))) * (rng.random((30, 3)) < 0.6)
    b, lam = rng.standard_normal(4) * 0.1, 0.4
    Wt = torch.tensor(W, requires_grad=True)
    R = torch.tensor(X) - torch.tensor(b) - torch.tensor(Z) @ Wt
    L = (R * R).sum(1).mean() + 2 * lam * float(Z.sum()) / len(X)
    (G,) = torch.autograd.grad(L, Wt)
    G = G.numpy()
    tangent = G - np.sum(G * W, axis=1, keepdims=True) * W
    foc = first_order_conditions(X, W, Z, b, lam=lam)
    assert foc.atom_residual == pytest.approx(np.linalg.norm(tangent, axis=1).max(), rel=1e-12)
    assert foc.bias_residual == pytest.approx(np.linalg.norm((X - b - Z @ W).mean(0)), rel=1e-12)
