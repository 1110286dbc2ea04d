"""The wide-limit solve (widelimit.exact.solve): closed forms, the certificate, verify, agreement with cvxpy."""

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import widelimit as wl
import widelimit.engine.local as wl_local
from widelimit.data.datasets import digits, symmetric_rays


def test_solve_four_points():
    sol = wl.solve(np.array([[0.0], [0.0], [0.0], [10.0]]), lam=1.0)
    assert sol.value == pytest.approx(14 / 3, rel=1e-14)
    assert sol.width == 1 and sol.bias[0] == pytest.approx(1 / 3)
    assert sol.rays.tolist() == [-1, -1, -1, 0]
    np.testing.assert_allclose(sol.dictionary, [[1.0]])
    np.testing.assert_allclose(sol.codes[:, 0], [0, 0, 0, 10 - 1 / 3 - 1])
    assert sol.certified


def test_solve_segment_picks_narrowest_bias():
    sol = wl.solve(np.array([[-5.0], [5.0]]), lam=1.0)
    np.testing.assert_allclose(sol.bias_segment.ravel(), [-4.0, 4.0])
    assert sol.width == 1 and sol.value == pytest.approx(9.0)
    assert abs(abs(sol.bias[0]) - 4.0) < 1e-12  # an endpoint: the far point sits at distance lam
    assert sol.certified


def test_solve_identical_points_and_one_point():
    sol = wl.solve(np.tile([1.0, -2.0], (5, 1)), lam=0.3)
    assert sol.width == 0 and sol.value == 0.0 and sol.certified
    assert sol.codes.shape == (5, 0) and sol.dictionary.shape == (0, 2)
    sol = wl.solve(np.array([[3.0, 4.0]]), lam=1.0)
    assert sol.width == 0 and sol.value == 0.0 and sol.certified


def test_huge_lam_gives_width_zero_and_variance(rng):
    X = rng.standard_normal((50, 3))
    sol = wl.solve(X, lam=1e6)
    assert sol.width == 0 and sol.certified
    np.testing.assert_allclose(sol.bias, X.mean(0), atol=1e-12)
    assert sol.value == pytest.approx(np.mean(np.sum((X - X.mean(0)) ** 2, axis=1)), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_symmetric_rays_known_bias_and_width(dtype):
    X, truth = symmetric_rays(8, 12, 25, n_core=10, seed=3)
    sol = wl.solve(X.astype(dtype), lam=0.5)
    assert sol.width == 8
    np.testing.assert_allclose(sol.bias, truth["centre"], atol=1e-10 if dtype == np.float64 else 1e-5)
    assert sol.certified and sol.certificate.rel_gap < 1e-9
    # atoms are the true directions (up to order)
    cos = sol.dictionary @ truth["directions"].T
    assert np.all(np.max(cos, axis=1) > 1 - 1e-6)


def test_solution_consistency_and_certificate_quantities(rng):
    X = rng.standard_normal((40, 5))
    sol = wl.solve(X, lam=0.3)
    ov = wl.sae_objective(X, sol.dictionary, sol.codes, sol.bias, lam=0.3)
    assert ov.value == pytest.approx(sol.value, rel=1e-13)
    assert sol.value == pytest.approx(sol.lower_bound, rel=1e-9)
    np.testing.assert_allclose(np.linalg.norm(sol.dictionary, axis=1), 1.0, atol=1e-14)
    assert sol.codes.min() >= 0
    c = sol.certificate
    assert c.dual_min >= -1e-15 and abs(c.complementarity) <= 1e-12 and c.bias_stationarity <= 1e-10
    # Q* is diagonal with (r_i - lam)_+ (every point is its own ray here)
    r = np.linalg.norm(X - sol.bias, axis=1)
    np.testing.assert_allclose(sol.Q, np.diag(np.maximum(r - 0.3, 0)), atol=1e-12)
    # the dense dual matrix, formed here only to check the O(N n) formulas
    E = X - sol.bias - sol.codes @ sol.dictionary
    G = 0.3 / 40 * (1 - E @ E.T / 0.3**2)
    assert G.min() == pytest.approx(c.dual_min, abs=1e-15)
    assert np.sum(G * sol.Q) == pytest.approx(c.complementarity, abs=1e-12)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), lam=st.floats(0.05, 3.0), N=st.integers(1, 30), n=st.integers(1, 5), k=st.integers(1, 8))
def test_lower_bound_below_any_feasible_point(seed, lam, N, n, k):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n)) * 2
    W = rng.standard_normal((k, n))
    Z = np.abs(rng.standard_normal((N, k))) * (rng.random((N, k)) < 0.6)
    b = rng.standard_normal(n)
    cert = wl.verify(X, W, Z, b, lam=lam)
    assert cert.lower_bound <= cert.value + 1e-12
    assert cert.lower_bound_at_bias <= cert.value + 1e-12
    assert cert.lower_bound <= cert.lower_bound_at_bias + 1e-12


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), lam=st.floats(0.05, 3.0), N=st.integers(2, 30), n=st.integers(1, 5))
@example(seed=1, lam=2.8125, N=16, n=1)  # one ray with codes <= 0.05: this atom perturbation costs < tol
def test_solve_is_certified_and_perturbation_is_not(seed, lam, N, n):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n)) * 2
    sol = wl.solve(X, lam=lam)
    assert sol.certified
    own = wl.sae_objective(X, sol.dictionary, sol.codes, sol.bias, lam=lam).value
    assert own == pytest.approx(sol.value, rel=1e-12, abs=1e-15)
    assert abs(sol.value - sol.lower_bound) <= 1e-9 * max(sol.value, 1e-300) + 1e-15
    if sol.width:
        W = sol.dictionary + 0.05 * rng.standard_normal(sol.dictionary.shape)
        cert = wl.verify(X, W, sol.codes, sol.bias, lam=lam)
        worse = cert.value - sol.value  # what the perturbation costs (tiny when the codes are tiny)
        assert worse >= -1e-12 * sol.value and cert.gap >= worse - 1e-12 * sol.value
        if worse > 1e-8 * sol.value:
            assert not cert.certified
    b = sol.bias + 0.05
    assert not wl.verify(X, sol.dictionary, sol.codes, b, lam=lam).certified


def test_verify_reports_suboptimal_candidate(rng):
    X, truth = symmetric_rays(4, 6, 10, seed=0)
    sol = wl.solve(X, lam=0.5)
    Z = sol.codes.copy()
    Z[:, 0] *= 0.9  # wrong code lengths on one ray
    cert = wl.verify(X, sol.dictionary, Z, sol.bias, lam=0.5)
    assert not cert.certified
    assert cert.gap == pytest.approx(cert.value - sol.value, rel=1e-9)


def test_ray_tol_merging_reports_true_objective(rng):
    th = np.array([0.0, 0.01, 1.5, 3.0, 4.5])
    X = 3 * np.c_[np.cos(th), np.sin(th)]
    exact = wl.solve(X, lam=0.2)
    merged = wl.solve(X, lam=0.2, ray_tol=0.05)
    assert exact.width == 5 and merged.width == 4
    assert merged.value == pytest.approx(wl.sae_objective(X, merged.dictionary, merged.codes, merged.bias, lam=0.2).value)
    assert merged.excess > 0 and merged.value > exact.value
    assert not merged.certified


def test_signed_codes_count_lines(rng):
    X, truth = symmetric_rays(6, 5, 10, seed=2)
    assert wl.solve(X, lam=0.5).width == 6
    s = wl.solve(X, lam=0.5, signed=True)
    assert s.width == 3 and s.certified
    assert s.value == pytest.approx(wl.solve(X, lam=0.5).value, rel=1e-12)


def _dnn_value(X, lam, solver, fixed_b=None):
    N, n = X.shape
    Q = cp.Variable((N, N), PSD=True)
    b = cp.Variable(n) if fixed_b is None else fixed_b
    Xt = X - np.ones((N, 1)) @ cp.reshape(b, (1, n), order="C") if fixed_b is None else X - fixed_b
    obj = lam / N * (cp.matrix_frac(Xt, Q + lam * np.eye(N)) + cp.sum(Q))
    prob = cp.Problem(cp.Minimize(obj), [Q >= 0])
    kw = dict(eps=1e-9, max_iters=200_000) if solver == cp.SCS else {}
    prob.solve(solver=solver, **kw)
    return prob.value, prob.status


@pytest.mark.parametrize("solver", [cp.CLARABEL, cp.SCS])
@pytest.mark.parametrize("kind", ["random", "rays"])
def test_dnn_relaxation_of_q_form_matches_closed_form(solver, kind, rng):
    if kind == "random":
        X = rng.standard_normal((10, 3))
    else:
        X, _ = symmetric_rays(4, 3, 3, n_core=2, seed=1)
    lam = 0.6
    sol = wl.solve(X, lam=lam)
    val, status = _dnn_value(X, lam, solver)
    assert status in ("optimal", "optimal_inaccurate")
    assert val == pytest.approx(sol.value, rel=1e-5 if solver == cp.SCS else 1e-7)


def test_real_data_digits_solves_and_certifies():
    X, _ = digits()
    sol = wl.solve(X, lam=5.0)
    assert sol.certified and sol.width == X.shape[0]
    sol = wl.solve(X, lam=35.0)
    assert sol.certified and 0 < sol.width < X.shape[0]


def test_dense_codes_guard(rng):
    sol = wl.solve(rng.standard_normal((20, 3)), lam=0.1)
    assert sol.sparse_codes.shape == (20, sol.width)
    assert sol.sparse_codes.nnz == np.count_nonzero(sol.code_values)


@pytest.mark.parametrize(
    "fn, msg",
    [
        (lambda: wl.solve(np.array([[1.0, np.nan]]), lam=1.0), "row 0"),
        (lambda: wl.solve(np.ones((3, 2)), lam=0), "lam"),
        (lambda: wl.solve(np.ones((2, 2, 2)), lam=1.0), "2-D"),
        (lambda: wl.solve(np.ones((3, 2)), lam=1.0, ray_tol=-1), "ray_tol"),
        (lambda: wl.verify(np.ones((3, 2)), np.ones((1, 3)), np.ones((3, 1)), np.zeros(2), lam=1.0), "columns"),
        (lambda: wl.verify(np.ones((3, 2)), np.ones((1, 2)), np.ones((3, 1)), np.zeros(3), lam=1.0), "length"),
        (lambda: wl.verify(np.ones((3, 2)), np.ones((1, 2)), np.ones((2, 1)), np.zeros(2), lam=1.0), "shape"),
    ],
)
def test_bad_input(fn, msg):
    with pytest.raises(ValueError, match=msg):
        fn()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["singles", "shared", "mixed"])
def test_one_pass_solution_matches_the_generic_pieces(dtype, layout, rng):
    """solve builds atoms, codes and certificate in one fused pass: it must agree with
    RayGroups.atoms / code_values and with verify's generic certificate of the same triple,
    on rays of one point, rays shared by many points (spanning several batches), and both."""
    from widelimit import _validation
    from widelimit.exact.solve import _build_and_certify
    from widelimit.exact.rays import _group_rays
    from widelimit.engine.local import LocalEngine

    n = 6
    if layout == "singles":
        X = rng.standard_normal((3000, n))
    else:
        dirs = rng.standard_normal((7, n))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        X = dirs[rng.integers(0, 7, 3000)] * rng.uniform(0.1, 4.0, (3000, 1))
        if layout == "mixed":
            X[::3] = rng.standard_normal((1000, n)) * 2
    X = X.astype(dtype)
    lam = 0.8
    sol = wl.solve(X, lam=lam)
    ref = wl.huber_median(X, lam=lam)
    groups = _group_rays(X, sol.bias, lam, sol.ray_tol, False, 0)
    W_ref = groups.atoms(X, dtype=dtype)
    np.testing.assert_array_equal(sol.rays, groups.rays)
    np.testing.assert_allclose(sol.dictionary, W_ref, rtol=0, atol=4 * np.finfo(dtype).eps)
    np.testing.assert_allclose(sol.code_values, groups.code_values(X, sol.dictionary), rtol=1e-12, atol=1e-12)
    generic = wl.verify(X, sol.dictionary, sol.sparse_codes, sol.bias, lam=lam, median=sol.median)
    for key in ("value", "reconstruction", "penalty", "lower_bound_at_bias", "dual_min", "max_residual_norm"):
        assert getattr(sol.certificate, key) == pytest.approx(getattr(generic, key), rel=1e-11, abs=1e-13), key
    assert sol.certificate.complementarity == pytest.approx(generic.complementarity, rel=1e-8, abs=1e-12)
    assert sol.certificate.bias_stationarity == pytest.approx(generic.bias_stationarity, rel=1e-6, abs=1e-12)
    assert sol.certificate.width == generic.width == sol.width
    assert sol.certified and generic.certified
    assert abs(sol.median.lower_bound - ref.lower_bound) <= 1e-10 * ref.value
    # the rays' keys came from the median's last pass: one pass after the median builds and certifies
    assert sol.n_passes == sol.median.n_passes + 1
    # small batches: a shared ray is carried over batch boundaries
    old = wl_local.CHUNK_BYTES
    try:
        wl_local.CHUNK_BYTES = 8 * n * 37
        W2, z2, cert2 = _build_and_certify(LocalEngine(X, threads=2), groups, lam, sol.median, 1e-9, dtype)
    finally:
        wl_local.CHUNK_BYTES = old
    # each atom is its leader row's direction, computed row by row in both runs; the kernels sum with
    # fastmath reassociation, so the compiled variant (which the chunk's layout picks) may round the
    # norm differently in the last bit: unit atoms agree to a few ulps, never more
    np.testing.assert_allclose(W2, sol.dictionary, rtol=0, atol=4 * np.finfo(dtype).eps)
    np.testing.assert_allclose(z2, sol.code_values, rtol=1e-13, atol=1e-13)
    assert cert2.value == pytest.approx(generic.value, rel=1e-11)
    assert cert2.complementarity == pytest.approx(generic.complementarity, rel=1e-8, abs=1e-12)
    assert cert2.width == generic.width
