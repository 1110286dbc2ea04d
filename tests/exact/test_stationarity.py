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
    assert first_order_conditions(X, W2, Z, b, lam=lam).atom_gradient > 1e-5       # atoms rotated
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


def test_atom_gradient_is_the_riemannian_gradient_norm_of_the_objective():
    """``atom_gradient`` against torch autograd of L(W, Z, b) projected on the sphere's tangent spaces."""
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
    assert foc.atom_gradient == pytest.approx(np.linalg.norm(tangent, axis=1).max(), rel=1e-12)
    assert foc.bias_residual == pytest.approx(np.linalg.norm((X - b - Z @ W).mean(0)), rel=1e-12)


@pytest.mark.parametrize("ratio", [0.75, 0.9, 0.99, 0.998])
def test_dead_atom_with_a_long_residual_can_still_be_a_local_minimum(ratio):
    """theory.md §5.4: a residual longer than lam with a dead atom proves the point is not global, not that
    it is not a local minimum; escaping needs a turn of the dead atom of at least the stated angle."""
    import math
    from fixtures.stability import exact_codes_value, plain_objective, two_shared_rays

    lam = 0.5
    X, W2, Z2, b = two_shared_rays(0.3, rho=3.0, lam=lam, dead=False)  # joint curvature positive here
    r = X[0] - b - Z2[0] @ W2                                           # (lam, rho sin phi, 0)
    rn = float(np.linalg.norm(r))
    assert rn > 1.9 * lam
    beta = ratio * lam / rn
    wf = beta * r / rn + math.sqrt(1 - beta**2) * np.array([0.0, 0.0, 1.0])
    W = np.vstack([W2, wf])
    Z = np.hstack([Z2, np.zeros((4, 1))])
    R = X - b - Z @ W
    assert np.max(R @ wf) / lam == pytest.approx(ratio, rel=1e-12)    # the dead atom's code margin
    assert first_order_conditions(X, W, Z, b, lam=lam).holds(1e-12)
    base = plain_objective(X, W, Z, b, lam)
    rng = np.random.default_rng(0)
    worst = math.inf
    for _ in range(2000):
        dW, dZ, db = rng.standard_normal(W.shape), rng.standard_normal(Z.shape), rng.standard_normal(3)
        scale = 1e-3 / math.sqrt(np.sum(dW**2) + np.sum(dZ**2) + np.sum(db**2))
        Wp = W + scale * dW
        Wp /= np.linalg.norm(Wp, axis=1, keepdims=True)
        Zp = np.maximum(Z + scale * dZ, 0.0)
        worst = min(worst, plain_objective(X, Wp, Zp, b + scale * db, lam) - base)
    assert worst > 0
    # the dead atom alone must turn by angle(w_f, r) - arccos(lam / ||r||) before anything changes
    theta0 = math.acos(beta) - math.acos(lam / rn)
    v = r / rn - beta * wf
    v /= np.linalg.norm(v)
    def turned(th):
        Wt = W.copy()
        Wt[2] = math.cos(th) * wf + math.sin(th) * v
        return exact_codes_value(X, Wt, b, lam)
    assert turned(theta0 * (1 - 1e-3)) == pytest.approx(base, rel=1e-13)
    assert turned(theta0 + 1e-2) < base - 1e-7
    # re-aimed at r with only that code set: N L falls by exactly (||r|| - lam)^2 (more once all codes move)
    Wr, Zr = W.copy(), Z.copy()
    Wr[2], Zr[0, 2] = r / rn, rn - lam
    assert plain_objective(X, Wr, Zr, b, lam) == pytest.approx(base - (rn - lam) ** 2 / 4, rel=1e-12)
    assert turned(math.acos(beta)) <= base - (rn - lam) ** 2 / 4 + 1e-12


def test_tangent_norms_blocked_equal_the_formula_without_dxk_temporaries():
    """Same values as ``g = E - <E, w> w`` formed whole (numpy and torch), with temporaries of a block only:
    the whole-matrix form allocated three ``d_sae x d_in`` arrays (2.4 GB at 131,072 x 768)."""
    import tracemalloc

    import torch

    from widelimit.exact.stationarity import tangent_norms

    rng = np.random.default_rng(0)
    k, n = 80000, 64
    E = rng.standard_normal((k, n))
    W = rng.standard_normal((k, n))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    g = E - np.einsum("ij,ij->i", E, W)[:, None] * W
    want = np.sqrt(np.einsum("ij,ij->i", g, g))
    tracemalloc.start()
    got = tangent_norms(E, W)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert peak < 8 * k * n / 2, peak  # a block's temporaries and the output, not one k x n array
    np.testing.assert_allclose(tangent_norms(torch.as_tensor(E), torch.as_tensor(W)).numpy(), want, rtol=1e-12)
    assert tangent_norms(E[:0], W[:0]).shape == (0,)
