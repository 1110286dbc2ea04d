"""Working-set optimal coding: same certified optimum as the full solver, on every path (growth, fallback, warm start)."""

from __future__ import annotations

import numpy as np
import pytest

from widelimit.coding.fista import fista_codes as optimal_codes
from widelimit.exact.objective import sae_objective
from widelimit.coding.working_set import optimal_codes_working_set


def _problem(N=30, k=80, n=24, active=4, seed=0, noise=0.05):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((k, n)) * rng.uniform(0.5, 2.0, (k, 1))
    U = W / np.linalg.norm(W, axis=1, keepdims=True)
    Z = np.zeros((N, k))
    for i in range(N):
        Z[i, rng.choice(k, active, replace=False)] = rng.exponential(1.0, active)
    b = rng.standard_normal(n) * 0.1
    return Z @ U + b + noise * rng.standard_normal((N, n)), W, b


@pytest.mark.parametrize("lam,ws", [(0.2, 32), (0.02, 8), (1.0, 16)])
def test_matches_full_solver_and_is_certified(lam, ws):
    X, W, b = _problem()
    ref = optimal_codes(X, W, b, lam=lam, tol=1e-8, device="cpu")
    got = optimal_codes_working_set(X, W, b, lam=lam, tol=1e-8, device="cpu", ws_size=ws)
    assert got.certified and got.gap <= 1e-7 * max(got.value, lam * lam)
    np.testing.assert_allclose(got.point_values, ref.point_values, rtol=1e-7, atol=1e-10)
    # the reported value is the objective of the returned codes (independent evaluation)
    assert got.value == pytest.approx(sae_objective(X, W, got.codes, b, lam=lam).value, rel=1e-10)
    assert got.reconstruction == pytest.approx(sae_objective(X, W, got.codes, b, lam=lam).reconstruction, rel=1e-8)


def test_fallback_and_warm_start_paths():
    X, W, b = _problem(seed=1)
    lam = 0.05
    ref = optimal_codes(X, W, b, lam=lam, tol=1e-8, device="cpu")
    # one round and tiny working sets: most tokens finish in the full solver
    fb = optimal_codes_working_set(X, W, b, lam=lam, tol=1e-8, device="cpu", ws_size=2, max_iter=1, inner_iter=5)
    assert fb.certified
    np.testing.assert_allclose(fb.point_values, ref.point_values, rtol=1e-6, atol=1e-10)
    warm = optimal_codes_working_set(X, W, b, lam=lam, tol=1e-8, device="cpu", Z0=ref.codes, batch_size=7)
    assert warm.certified and warm.n_iter == 1
    np.testing.assert_allclose(warm.point_values, ref.point_values, rtol=1e-7, atol=1e-10)


def test_against_cvxpy():
    cp = pytest.importorskip("cvxpy")
    X, W, b = _problem(N=6, k=40, n=8, seed=2)
    lam = 0.1
    got = optimal_codes_working_set(X, W, b, lam=lam, tol=1e-10, device="cpu", ws_size=8)
    nrm = np.linalg.norm(W, axis=1)
    for i, x in enumerate(X):
        z = cp.Variable(W.shape[0], nonneg=True)
        val = cp.Problem(cp.Minimize(cp.sum_squares(z @ W + b - x) + 2 * lam * nrm @ z)).solve(solver=cp.CLARABEL)
        assert got.point_values[i] == pytest.approx(val, rel=1e-6, abs=1e-9)


def test_narrow_dictionary_goes_to_full_solver():
    X, W, b = _problem(k=10)
    got = optimal_codes_working_set(X, W, b, lam=0.2, device="cpu", ws_size=32)
    ref = optimal_codes(X, W, b, lam=0.2, device="cpu")
    assert got.value == pytest.approx(ref.value, rel=1e-9)
