import warnings

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import widelimit as wl
from widelimit.exact.collinear import solve_1d as _solve_1d


def test_huber_median_closed_form_four_points():
    r = wl.huber_median(np.array([[0.0], [0.0], [0.0], [10.0]]), lam=1.0)
    assert r.point[0] == pytest.approx(1 / 3, abs=1e-14)
    assert r.value == pytest.approx(14 / 3, rel=1e-14)
    assert r.gap - r.rounding <= 1e-12 and r.lower_bound <= r.value  # the rest is the rounding bound
    assert r.unique


def test_geometric_median_differs_from_huber_median_when_points_within_lam():
    X = np.array([[0.0], [0.0], [0.0], [10.0]])
    assert wl.geometric_median(X).point[0] == pytest.approx(0.0, abs=1e-14)
    assert wl.huber_median(X, lam=1.0).point[0] == pytest.approx(1 / 3)
    # with no point within lam of the geometric median, they agree
    Y = 10 * np.c_[np.cos([0.1, 1.3, 2.0, 3.1, 4.0, 5.2]), np.sin([0.1, 1.3, 2.0, 3.1, 4.0, 5.2])]
    g, h = wl.geometric_median(Y), wl.huber_median(Y, lam=0.1)
    assert np.min(np.linalg.norm(Y - g.point, axis=1)) > 0.1
    np.testing.assert_allclose(h.point, g.point, atol=1e-9)


def test_segment_two_points():
    r = wl.huber_median(np.array([[-5.0], [5.0]]), lam=1.0)
    np.testing.assert_allclose(r.segment.ravel(), [-4.0, 4.0])
    assert -4 <= r.point[0] <= 4 and not r.unique
    assert r.value == 9.0 and r.gap - r.rounding <= 1e-12  # the rest is the rounding bound
    g = wl.geometric_median(np.array([[-5.0], [5.0]]))
    np.testing.assert_allclose(g.segment.ravel(), [-5.0, 5.0])


def test_segment_in_higher_dimensions(rng):
    o, u = rng.standard_normal(6), rng.standard_normal(6)
    u /= np.linalg.norm(u)
    X = o + np.array([-5.0, -5.0, 5.0, 5.0])[:, None] * u
    r = wl.huber_median(X, lam=1.0)
    assert r.method == "collinear-exact"
    ends = sorted(((r.segment - o) @ u).tolist())
    np.testing.assert_allclose(ends, [-4.0, 4.0], atol=1e-12)


def test_identical_points_and_single_point():
    X = np.tile([1.0, 2.0, 3.0], (7, 1))
    for r in (wl.huber_median(X, lam=0.5), wl.geometric_median(X)):
        np.testing.assert_allclose(r.point, [1, 2, 3])
        assert r.value == 0.0 and r.gap == 0.0 and r.certified
    r = wl.huber_median(np.array([[4.0, -1.0]]), lam=2.0)
    np.testing.assert_allclose(r.point, [4.0, -1.0])


def test_weights_equal_duplication(rng):
    X = rng.standard_normal((30, 4))
    w = rng.integers(1, 4, size=30)
    Xd = np.repeat(X, w, axis=0)
    for f in (lambda A, ww: wl.huber_median(A, lam=0.8, weights=ww), lambda A, ww: wl.geometric_median(A, weights=ww)):
        a, b = f(X, w.astype(float)), f(Xd, None)
        np.testing.assert_allclose(a.point, b.point, atol=1e-9)
        assert a.value == pytest.approx(b.value, rel=1e-12)
    # zero weights remove points
    w0 = np.ones(30)
    w0[:10] = 0
    np.testing.assert_allclose(wl.huber_median(X, lam=0.8, weights=w0).point, wl.huber_median(X[10:], lam=0.8).point, atol=1e-9)


def test_geometric_median_at_a_data_point_with_duplicates(rng):
    X = np.vstack([np.zeros((6, 3)), rng.standard_normal((5, 3))])
    r = wl.geometric_median(X)
    np.testing.assert_allclose(r.point, 0.0, atol=1e-12)
    assert r.certified and r.rel_gap <= 1e-10


def test_float32_input_accumulates_in_float64(rng):
    X = rng.standard_normal((2000, 8)).astype(np.float32)
    a = wl.huber_median(X, lam=0.5)
    b = wl.huber_median(X.astype(np.float64), lam=0.5)
    np.testing.assert_allclose(a.point, b.point, atol=1e-12)
    assert a.rel_gap <= 1e-10


@pytest.mark.parametrize("lam", [0.05, 0.5, 2.0, 50.0])
def test_huber_median_matches_cvxpy_clarabel(rng, lam):
    X = rng.standard_normal((60, 5))
    X[:20] += 2.0
    b = cp.Variable(5)
    prob = cp.Problem(cp.Minimize(cp.sum(cp.huber(cp.norm(X - np.ones((60, 1)) @ cp.reshape(b, (1, 5), order="C"), axis=1), lam)) / 60))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    r = wl.huber_median(X, lam=lam)
    assert r.value == pytest.approx(prob.value, rel=1e-7)
    assert r.value <= prob.value + 1e-9  # ours is at least as good
    # the value agrees to 1e-7; the interior-point b is less accurate than ours (flat directions)
    np.testing.assert_allclose(r.point, b.value, atol=1e-5)
    assert r.rel_gap <= 1e-10 and r.certified


def test_geometric_median_matches_cvxpy(rng):
    X = rng.standard_normal((50, 4)) * [1, 3, 0.5, 2]
    b = cp.Variable(4)
    prob = cp.Problem(cp.Minimize(cp.sum(cp.norm(X - np.ones((50, 1)) @ cp.reshape(b, (1, 4), order="C"), axis=1)) / 50))
    prob.solve(solver=cp.CLARABEL)
    r = wl.geometric_median(X)
    assert r.value == pytest.approx(prob.value, rel=1e-7)
    assert r.rel_gap <= 1e-10


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), lam=st.floats(0.01, 10.0), N=st.integers(1, 40), n=st.integers(1, 6))
def test_certificate_is_a_valid_lower_bound(seed, lam, N, n):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n)) * rng.uniform(0.1, 5)
    r = wl.huber_median(X, lam=lam)
    assert r.lower_bound <= r.value + 1e-12 * max(1, r.value)
    assert r.gap <= 1e-9 * max(r.value, 1e-12) + 1e-14
    # no bias does better than the lower bound
    for _ in range(5):
        b = r.point + rng.standard_normal(n) * rng.uniform(1e-3, 3)
        assert wl.huber_value(X, b, lam=lam) >= r.lower_bound - 1e-12 * max(1, r.value)


def test_solve_1d_flat_region():
    lo, hi = _solve_1d(np.array([-5.0, 5.0, -5.0, 5.0]), None, 1.0, "huber")
    assert (lo, hi) == (-4.0, 4.0)
    lo, hi = _solve_1d(np.array([0.0, 0.0, 0.0, 10.0]), None, 1.0, "huber")
    assert lo == pytest.approx(1 / 3) and hi == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "X, lam, w, msg",
    [
        (np.array([[1.0, 2], [np.nan, 0]]), 1.0, None, "row 1"),
        (np.array([[1.0, 2], [0, 0], [np.inf, 1]]), 1.0, None, r"Inf\) in row 2"),
        (np.ones(4), 1.0, None, "2-D"),
        (np.ones((0, 3)), 1.0, None, "empty"),
        (np.ones((3, 2)), -1.0, None, "lam"),
        (np.ones((3, 2)), float("inf"), None, "lam"),
        (np.ones((3, 2)), 1.0, np.ones(2), "weights"),
        (np.ones((3, 2)), 1.0, -np.ones(3), ">= 0"),
        (np.ones((3, 2)), 1.0, np.zeros(3), "all zero"),
    ],
)
def test_bad_input(X, lam, w, msg):
    with pytest.raises(ValueError, match=msg):
        wl.huber_median(X, lam=lam, weights=w)


def test_no_stall_when_points_sit_near_the_lam_sphere():
    # found by a property test: the Newton matrix is nearly singular (all points beyond lam on
    # three lines) and jumps where a point crosses the lam sphere; a reference from scipy
    from scipy import optimize

    from widelimit.exact.objective import huber_h

    rng = np.random.default_rng(3803)
    U = rng.standard_normal((3, 2))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    o = rng.standard_normal(2)
    X = o + rng.uniform(-3, 3, (6, 1)) * U[rng.integers(0, 3, 6)]
    lam = 0.25
    H = lambda b: float(huber_h(np.linalg.norm(X - b, axis=1), lam=lam).mean())  # noqa: E731
    ref = min((optimize.minimize(H, x0, method="Nelder-Mead", options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 20000})
               for x0 in X), key=lambda r: r.fun)
    med = wl.huber_median(X, lam=lam)
    assert med.value <= ref.fun + 1e-12
    assert med.certified and med.rel_gap <= 1e-10 and med.n_iter < 30


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), lam=st.floats(0.05, 2.0), n_lines=st.integers(1, 4), N=st.integers(2, 12))
@example(seed=797, lam=0.5, n_lines=2, N=10)  # nearly collinear, optimum where a point crosses lam: Newton overshoots
def test_huber_median_converges_on_points_on_few_lines(seed, lam, n_lines, N):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n_lines, 2))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = rng.standard_normal(2) + rng.uniform(-3, 3, (N, 1)) * U[rng.integers(0, n_lines, N)]
    med = wl.huber_median(X, lam=lam)
    assert med.certified and med.rel_gap <= 1e-9


@pytest.mark.parametrize("seed,n_lines,N", [(70731, 2, 10), (40783, 3, 12)])
def test_geometric_median_converges_next_to_a_data_point(seed, n_lines, N):
    """Points on a few lines whose geometric median lies just off a data point (||g|| = 1.02 w0):
    found by a stress run; a line search meant for the Huber median's lam-sphere crossings stalled here."""
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n_lines, 2))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = rng.standard_normal(2) + rng.uniform(-3, 3, (N, 1)) * U[rng.integers(0, n_lines, N)]
    g = wl.geometric_median(X)
    assert g.certified and g.rel_gap <= 1e-9


def test_geometric_median_at_a_data_point_with_near_neighbours():
    """The median is a data point and other points sit 1e-9 from it: 1/r^3 weights near 1e27 must
    not overflow the subsample Newton matrix."""
    star = np.array([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [1e-9, 0.0], [0.0, 1e-9]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow / invalid value on the way
        g = wl.geometric_median(star)
    assert g.certified and np.linalg.norm(g.point) <= 1e-8
