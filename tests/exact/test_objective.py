import numpy as np
import pytest
import scipy.sparse as sp

import widelimit as wl


def _problem(rng, N=12, n=4, k=5):
    X = rng.standard_normal((N, n))
    W = rng.standard_normal((k, n))
    Z = np.abs(rng.standard_normal((N, k))) * (rng.random((N, k)) < 0.5)
    b = rng.standard_normal(n)
    return X, W, Z, b


def test_sae_objective_parts_match_direct_formula(rng):
    X, W, Z, b = _problem(rng)
    Wu = W / np.linalg.norm(W, axis=1, keepdims=True)
    lam = 0.7
    ov = wl.sae_objective(X, Wu, Z, b, lam=lam)
    rec = np.mean(np.sum((Z @ Wu + b - X) ** 2, axis=1))
    pen = 2 * lam * np.mean(Z.sum(axis=1))
    assert ov.reconstruction == pytest.approx(rec, rel=1e-13)
    assert ov.penalty == pytest.approx(pen, rel=1e-13)
    assert ov.value == pytest.approx(rec + pen, rel=1e-13)


def test_sae_objective_folds_atom_norms_into_codes(rng):
    X, W, Z, b = _problem(rng)
    s = np.linalg.norm(W, axis=1)
    a = wl.sae_objective(X, W, Z, b, lam=0.3).value
    c = wl.sae_objective(X, W / s[:, None], Z * s[None, :], b, lam=0.3).value
    assert a == pytest.approx(c, rel=1e-13)


def test_sae_objective_accepts_float32_sparse_and_torch(rng):
    torch = pytest.importorskip("torch")
    X, W, Z, b = _problem(rng)
    ref = wl.sae_objective(X, W, Z, b, lam=0.5).value
    assert wl.sae_objective(X.astype(np.float32), W, sp.csr_array(Z), b, lam=0.5).value == pytest.approx(
        wl.sae_objective(X.astype(np.float32).astype(np.float64), W, Z, b, lam=0.5).value, rel=1e-12)
    assert wl.sae_objective(torch.tensor(X), torch.tensor(W), torch.tensor(Z), torch.tensor(b), lam=0.5).value == pytest.approx(ref)


def test_q_form_equals_ridge_eliminated_objective(rng):
    X, _, Z, b = _problem(rng)
    lam = 0.4
    W = wl.optimal_dictionary(X, Z, b, lam=lam)
    q = wl.q_objective(X, Z @ Z.T, b, lam=lam)
    assert q == pytest.approx(wl.exact.objective.unconstrained_objective(X, W, Z, b, lam=lam), rel=1e-10)
    # W* is the ridge minimiser: perturbing it increases the unconstrained objective
    for _ in range(5):
        Wp = W + 1e-3 * rng.standard_normal(W.shape)
        assert wl.exact.objective.unconstrained_objective(X, Wp, Z, b, lam=lam) > q
    # both systems (k <= N and k > N) give the same W*
    Zw = np.abs(rng.standard_normal((X.shape[0], 3 * X.shape[0])))
    W1 = wl.optimal_dictionary(X, Zw, b, lam=lam)
    W2 = np.linalg.solve(Zw.T @ Zw + lam * np.eye(Zw.shape[1]), Zw.T @ (X - b))
    np.testing.assert_allclose(W1, W2, rtol=1e-8, atol=1e-10)


def test_balanced_point_unconstrained_equals_sae_objective(rng):
    X, W, Z, b = _problem(rng)
    lam = 0.9
    Wb, Zb = wl.exact.objective.balance(W, Z)
    np.testing.assert_allclose(Zb @ Wb, Z @ W, rtol=1e-12, atol=1e-12)
    assert wl.exact.objective.unconstrained_objective(X, Wb, Zb, b, lam=lam) == pytest.approx(wl.sae_objective(X, W, Z, b, lam=lam).value, rel=1e-12)
    # AM-GM: any other scaling is worse
    assert wl.exact.objective.unconstrained_objective(X, W, Z, b, lam=lam) >= wl.sae_objective(X, W, Z, b, lam=lam).value


def test_q_objective_at_closed_form_optimum_equals_value(rng):
    X, truth = wl.datasets.symmetric_rays(4, 3, 3, seed=1)
    sol = wl.solve(X, lam=0.5)
    assert wl.q_objective(X, sol.Q, sol.bias, lam=0.5) == pytest.approx(sol.value, rel=1e-10)
    Wb, Zb = wl.exact.objective.balance(sol.dictionary, sol.codes)
    np.testing.assert_allclose(Zb @ Zb.T, sol.Q, atol=1e-12)
    assert wl.sae_objective(X, sol.dictionary, sol.codes, sol.bias, lam=0.5).value == pytest.approx(sol.value, rel=1e-13)


def test_huber_h_values():
    np.testing.assert_allclose(wl.exact.objective.huber_h([0.0, 0.5, 1.0, 3.0], lam=1.0), [0.0, 0.25, 1.0, 5.0])


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(W=np.ones((2, 3))), "columns"),
        (dict(Z=np.ones((4, 3))), "shape"),
        (dict(Z=-np.ones((5, 2))), ">= 0"),
        (dict(b=np.ones(3)), "length"),
        (dict(lam=0.0), "lam"),
        (dict(lam=np.nan), "lam"),
        (dict(X=np.ones(5)), "2-D"),
    ],
)
def test_objective_bad_input(kwargs, msg):
    args = dict(X=np.ones((5, 4)), W=np.ones((2, 4)), Z=np.ones((5, 2)), b=np.zeros(4), lam=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=msg):
        wl.sae_objective(args["X"], args["W"], args["Z"], args["b"], lam=args["lam"])


def test_q_objective_bad_input(rng):
    X = rng.standard_normal((4, 2))
    with pytest.raises(ValueError, match="square"):
        wl.q_objective(X, np.ones((4, 3)), np.zeros(2), lam=1.0)
    with pytest.raises(ValueError, match="symmetric"):
        wl.q_objective(X, np.triu(np.ones((4, 4))), np.zeros(2), lam=1.0)
    with pytest.raises(ValueError, match="positive definite"):
        wl.q_objective(X, -5 * np.eye(4), np.zeros(2), lam=1.0)
    with pytest.raises(ValueError, match="N = 4"):
        wl.q_objective(X, np.eye(3), np.zeros(2), lam=1.0)
