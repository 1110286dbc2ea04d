"""Signed codes (z in R, penalty |z|): width counts lines, same optimal value as nonnegative codes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import widelimit as wl
from widelimit.data import datasets
from widelimit.exact.objective import sae_objective


def _lines_data(n_lines, dim, per_side, seed, centre_noise=0.0):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n_lines, dim))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    c = rng.standard_normal(dim)
    t = rng.uniform(1.0, 3.0, (n_lines, per_side))
    X = np.vstack([c + t[j][:, None] * U[j] for j in range(n_lines)] + [c - t[j][:, None] * U[j] for j in range(n_lines)])
    return X, c, U


def _count_lines(X, b, lam, tol=1e-8):
    """Brute force: distinct lines u ~ -u among points beyond lam."""
    D = X - b
    r = np.linalg.norm(D, axis=1)
    U = D[r > lam * (1 + 1e-12)] / r[r > lam * (1 + 1e-12)][:, None]
    lines = []
    for u in U:
        if not any(min(np.linalg.norm(u - v), np.linalg.norm(u + v)) <= tol for v in lines):
            lines.append(u)
    return len(lines)


@pytest.mark.parametrize("n_lines", [1, 2, 3, 5])
def test_signed_width_is_number_of_lines(n_lines):
    X, c, U = _lines_data(n_lines, 6, 7, seed=n_lines)
    lam = 0.3
    uns = wl.solve(X, lam=lam)
    sgn = wl.solve(X, lam=lam, signed=True)
    # symmetric data: b* = c, each line is two rays
    assert np.allclose(sgn.bias, c, atol=1e-9)
    assert uns.width == 2 * n_lines
    assert sgn.width == n_lines == _count_lines(X, sgn.bias, lam)
    assert sgn.certified and uns.certified
    assert sgn.value == pytest.approx(uns.value, rel=1e-12)
    # the signed triple's objective, evaluated independently with signed codes
    ov = sae_objective(X, sgn.dictionary, sgn.codes, sgn.bias, lam=lam, signed=True)
    assert ov.value == pytest.approx(sgn.value, rel=1e-12)
    assert ov.value == pytest.approx(wl.huber_value(X, sgn.bias, lam=lam), rel=1e-12)
    # atoms are the lines (up to sign)
    assert np.allclose(np.abs(sgn.dictionary @ U.T).max(axis=0), 1.0, atol=1e-10)


def test_signed_dense_antipodal_pair_collapses():
    X, t = datasets.dense_symmetric(100, 5, seed=3)
    uns = wl.solve(X, lam=0.1)
    sgn = wl.solve(X, lam=0.1, signed=True)
    assert uns.width == 2 and sgn.width == 1
    assert uns.dictionary[0] @ uns.dictionary[1] == pytest.approx(-1.0, abs=1e-12)
    assert abs(sgn.dictionary[0] @ t["direction"]) == pytest.approx(1.0, abs=1e-12)
    assert sgn.codes.min() < 0 < sgn.codes.max()


def test_signed_line_with_rounding_noise_in_a_zero_coordinate():
    # an axis-aligned line whose first coordinate is rounding noise: one line, not two
    rng = np.random.default_rng(0)
    s = np.concatenate([rng.uniform(1, 3, 50), -rng.uniform(1, 3, 50)])
    X = np.zeros((100, 4))
    X[:, 1] = s
    X[:, 0] = 1e-10 * rng.standard_normal(100)
    assert wl.solve(X, lam=0.1, signed=True).width == 1
    assert wl.solve(X, lam=0.1).width == 2


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4), N=st.integers(3, 25), lam=st.floats(0.05, 1.0))
def test_signed_matches_unsigned_value_and_counts_lines(seed, n, N, lam):
    rng = np.random.default_rng(seed)
    # points on a few random lines through a random point, at random signed positions
    U = rng.standard_normal((3, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    o = rng.standard_normal(n)
    X = o + rng.uniform(-3, 3, (N, 1)) * U[rng.integers(0, 3, N)]
    uns = wl.solve(X, lam=lam)
    sgn = wl.solve(X, lam=lam, signed=True)
    assert sgn.value == pytest.approx(uns.value, rel=1e-9, abs=1e-12)
    # same bound, same bias: certified exactly when the nonnegative solution is (the Huber median's
    # convergence is checked in tests/exact/test_median.py::test_no_stall_when_points_sit_near_the_lam_sphere)
    assert sgn.certificate.gap == pytest.approx(uns.certificate.gap, rel=1e-6, abs=1e-12)
    assert sgn.width <= uns.width
    assert sgn.width == _count_lines(X, sgn.bias, lam)
