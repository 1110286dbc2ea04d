"""The one lasso dual gap of optimal coding (widelimit.coding.lasso): its numpy (numba) and torch back-ends
agree with each other and with cvxpy: zero at the lasso's optimum, and elsewhere exactly the primal value
minus the best dual value along the residual, a true bound on the suboptimality."""

import numpy as np
import pytest

cp = pytest.importorskip("cvxpy")
torch = pytest.importorskip("torch")

from widelimit.coding.lasso import lasso_gap, point_gaps, token_gap  # noqa: E402


def _instance(seed, m=6, n=5, k=8):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((k, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    return 2.0 * rng.standard_normal((m, n)), U


def _lasso_optimum(xt, U, lam):
    """cvxpy (Clarabel) per token: ``min_{y >= 0} ||xt - y U||^2 + 2 lam sum y`` -> (y*, P*)."""
    ys, vals = [], []
    for x in xt:
        y = cp.Variable(U.shape[0], nonneg=True)
        prob = cp.Problem(cp.Minimize(cp.sum_squares(x - U.T @ y) + 2 * lam * cp.sum(y)))
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
        ys.append(np.maximum(y.value, 0.0))
        vals.append(prob.value)
    return np.array(ys), np.array(vals)


def _best_dual_on_residual(x, U, y, lam):
    """cvxpy: ``max_s 2 s <r, x> - s^2 ||r||^2`` over ``s >= 0`` with ``s <u_d, r> <= lam`` (the dual point ``s r``)."""
    r = x - y @ U
    s = cp.Variable(nonneg=True)
    prob = cp.Problem(cp.Maximize(2 * s * (r @ x) - cp.square(s) * (r @ r)), [s * (U @ r) <= lam])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-13, tol_gap_rel=1e-13, tol_feas=1e-13)
    return prob.value


def _both(xt, U, y, lam):
    Pn, gn, rrn = point_gaps(xt, U, y, lam)
    Pt, gt, rrt = point_gaps(torch.as_tensor(xt), torch.as_tensor(U), torch.as_tensor(y), lam)
    return (Pn, gn, rrn), (Pt.numpy(), gt.numpy(), rrt.numpy())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gap_is_zero_at_the_lasso_optimum_on_both_back_ends(seed):
    xt, U = _instance(seed)
    lam = 0.7
    y, P_opt = _lasso_optimum(xt, U, lam)
    (Pn, gn, _), (Pt, gt, _) = _both(xt, U, y, lam)
    np.testing.assert_allclose(Pn, P_opt, rtol=1e-8)
    assert np.all(gn <= 1e-7 * P_opt)  # cvxpy's own accuracy: the gap of the exact optimum is 0
    np.testing.assert_allclose(Pt, Pn, rtol=1e-15, atol=0)
    np.testing.assert_allclose(gt, gn, rtol=1e-12, atol=1e-15 * Pn.max())


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_gap_away_from_the_optimum_is_primal_minus_dual_and_bounds_the_suboptimality(seed):
    xt, U = _instance(seed)
    lam = 0.5
    y = np.maximum(np.random.default_rng(seed + 10).standard_normal((xt.shape[0], U.shape[0])), 0.0)
    _, P_opt = _lasso_optimum(xt, U, lam)
    (Pn, gn, rrn), (Pt, gt, rrt) = _both(xt, U, y, lam)
    P_ref = ((xt - y @ U) ** 2).sum(1) + 2 * lam * y.sum(1)
    D_ref = np.array([_best_dual_on_residual(x, U, yi, lam) for x, yi in zip(xt, y)])
    np.testing.assert_allclose(Pn, P_ref, rtol=1e-13)
    np.testing.assert_allclose(rrn, ((xt - y @ U) ** 2).sum(1), rtol=1e-13)
    assert np.all(gn > 0)
    np.testing.assert_allclose(gn, P_ref - D_ref, rtol=1e-7, atol=1e-9)
    assert np.all(D_ref <= P_opt + 1e-8)  # the dual point is feasible: weak duality
    assert np.all(gn >= Pn - P_opt - 1e-8)  # so the gap bounds the suboptimality
    np.testing.assert_allclose(Pt, Pn, rtol=1e-15, atol=0)
    np.testing.assert_allclose(gt, gn, rtol=1e-12, atol=0)
    np.testing.assert_allclose(rrt, rrn, rtol=1e-15, atol=0)


def test_the_edge_cases_agree_across_back_ends():
    # r = 0 (s = 0), a residual anticorrelated with every atom (no cap on s), a negative <r, xt> (s clipped to 0)
    rr = np.array([0.0, 4.0, 4.0, 1.0])
    rx = np.array([0.0, 3.0, -1.0, 2.0])
    mx = np.array([0.0, -0.5, 1.0, 4.0])
    l1 = np.array([1.0, 0.0, 0.5, 0.2])
    lam = 0.5
    P, g = lasso_gap(rr, rx, mx, l1, lam)
    Pt, gt = lasso_gap(*(torch.as_tensor(a) for a in (rr, rx, mx, l1)), lam)
    # closed forms: s = clip(rx / rr, 0, lam / mx)
    s = np.array([0.0, 0.75, 0.0, 0.125])
    np.testing.assert_allclose(P, rr + 2 * lam * l1, rtol=0)
    np.testing.assert_allclose(g, np.maximum(P - (2 * s * rx - s * s * rr), 0.0), rtol=1e-15)
    np.testing.assert_array_equal(Pt.numpy(), P)
    np.testing.assert_allclose(gt.numpy(), g, rtol=1e-15)
    assert token_gap(rr[3], rx[3], mx[3], l1[3], lam) == (P[3], g[3])
