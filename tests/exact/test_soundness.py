"""Numerical soundness: nothing can make widelimit certify a false statement.

Property tests: scale-equivariance from 1e-150 to 1e150, ties, and the rounding-aware lower bound
checked against an independent 60-digit (mpmath) evaluation; then certificates at the ends of the
float64 range. The reproducers of issue 13 are in tests/regressions/test_numerical_soundness.py.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import widelimit as wl
from fixtures.cli import one_line_error


# --------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------


def _exact_huber(X, b, lam, dps=60) -> mpmath.mpf:
    """H(b) = mean_i h_lam(||x_i - b||) for the stored float data and point, in ``dps``-digit arithmetic."""
    with mpmath.workdps(dps):
        lam = mpmath.mpf(float(lam))
        tot = mpmath.mpf(0)
        for x in np.asarray(X, dtype=np.float64):
            r = mpmath.sqrt(mpmath.fsum((mpmath.mpf(float(xi)) - mpmath.mpf(float(bi))) ** 2 for xi, bi in zip(x, b)))
            tot += r * r if r <= lam else 2 * lam * r - lam * lam
        return tot / len(X)


def _small_points(draw, n_max=3):
    N = draw(st.integers(1, 8))
    n = draw(st.integers(1, n_max))
    vals = draw(st.lists(st.integers(-4, 4), min_size=N * n, max_size=N * n))
    return np.array(vals, dtype=np.float64).reshape(N, n)


@st.composite
def _tie_instances(draw):
    """Small integer data (many ties: duplicated points, symmetric sets, points at distance lam) and lam."""
    X = _small_points(draw)
    lam = draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]))
    scale = draw(st.sampled_from([1.0, 2.0**-490, 2.0**490, 1e-150, 1e150]))
    return X * scale, lam * scale


@settings(max_examples=60, deadline=None)
@given(_tie_instances())
def test_rounding_aware_bound_is_below_the_exact_optimum(inst):
    """The certified bound (float64, rounding subtracted) <= the 60-digit optimum; and tight.

    ``H_exact(point)`` is the exact objective at the returned float64 point; H is C^1 with a
    Lipschitz gradient, so it exceeds the exact minimum by O(|point - b*|^2), far below the
    rounding level: a bound above the optimum by a rounding error would show here.
    """
    X, lam = inst
    med = wl.huber_median(X, lam=lam)
    exact = _exact_huber(X, med.point, lam)
    assert mpmath.mpf(med.lower_bound) <= exact
    assert float(exact) - med.lower_bound <= 1e-9 * float(exact) + 1e-300
    sol = wl.solve(X, lam=lam)
    assert mpmath.mpf(sol.lower_bound) <= exact
    assert sol.certified


@st.composite
def _scaled_instances(draw):
    X = _small_points(draw, n_max=4) + np.asarray(draw(st.floats(-0.5, 0.5)))
    e = draw(st.integers(-498, 498))
    mant = draw(st.sampled_from([1.0, 1.5, 3.0 / 7.0]))
    return X, draw(st.sampled_from([0.3, 1.0, 2.5])), mant * 2.0**e


@settings(max_examples=40, deadline=None)
@given(_scaled_instances())
def test_scale_equivariance_float64(inst):
    """solve(c X, c lam) = c^2 solve(X, lam) and certified, c from 1e-150 to 1e150 (powers of two: exactly)."""
    X, lam, c = inst
    ref = wl.solve(X, lam=lam)
    sol = wl.solve(c * X, lam=c * lam)
    assert sol.certified and ref.certified
    exact_scaling = c == 2.0 ** np.round(np.log2(c))
    assert sol.value / c / c == pytest.approx(ref.value, rel=1e-14 if exact_scaling else 1e-9, abs=1e-300)
    np.testing.assert_allclose(sol.bias / c, ref.bias, rtol=0, atol=1e-7 * (1 + np.abs(X).max()))
    assert sol.lower_bound / c / c <= ref.value * (1 + 1e-12)


@settings(max_examples=25, deadline=None)
@given(_scaled_instances())
def test_scale_equivariance_float32(inst):
    X, lam, c = inst
    c = float(2.0 ** np.clip(np.round(np.log2(c) / 5), -99, 99))  # keep c X normal in float32 (1e-30..1e30)
    X32 = X.astype(np.float32)
    ref = wl.solve(X32, lam=lam)
    sol = wl.solve((c * X32).astype(np.float32), lam=c * lam)  # exact: c is a power of two
    assert sol.certified and ref.certified
    assert sol.value / c / c == pytest.approx(ref.value, rel=1e-13, abs=1e-300)
    assert sol.width == ref.width


@st.composite
def _within_lam_instances(draw):
    """Every point within lam of the mean: the dual bound is tight (it equals the value up to rounding)."""
    N = draw(st.integers(2, 9))
    n = draw(st.integers(1, 4))
    vals = draw(st.lists(st.floats(-1, 1, allow_subnormal=False), min_size=N * n, max_size=N * n))
    scale = draw(st.sampled_from([1.0, 1e-150, 1e150, 3.0**-200]))
    return np.array(vals).reshape(N, n) * scale, 10.0 * scale


@settings(max_examples=80, deadline=None)
@given(_within_lam_instances())
def test_rounding_aware_bound_is_below_the_exact_variance(inst):
    """With every point within lam the optimum is the variance, exactly a rational number of the stored data.

    Here the float64 dual bound equals the computed value up to rounding, so without the
    rounding bound it lands above the exact optimum for about half of the draws; with it, never.
    """
    from fractions import Fraction

    X, lam = inst
    med = wl.huber_median(X, lam=lam)
    F = [[Fraction(float(v)) for v in row] for row in X]
    N = len(F)
    mean = [sum(col) / N for col in zip(*F)]
    opt = sum(sum((v - m) ** 2 for v, m in zip(row, mean)) for row in F) / N
    assert Fraction(med.lower_bound) <= opt
    # and tight: to 1e-10 relatively, or to the rounding level of the data themselves, or of float64
    # (a variance of data near 1e-237 is below the smallest subnormal, 2^-1074)
    slack = Fraction(1e-12) * Fraction(float(np.abs(X).max())) ** 2 + Fraction(2) ** -1070
    assert opt - Fraction(med.lower_bound) <= Fraction(1e-10) * opt + slack


def test_short_runs_are_grouped_as_one_by_one(monkeypatch):
    """The batched tightness test of short key runs gives the groups of the run-by-run test.

    Float32 data at the precision-scaled ray_tol: thousands of two- and three-point runs, some
    tight (repeated directions), some loose (distinct directions with close keys).
    """
    from widelimit.exact import rays

    r = np.random.default_rng(6)
    D = r.standard_normal((400, 5))
    sel = r.integers(0, 400, 3000)
    Rnd = r.standard_normal((3000, 5)) * 3
    X = np.vstack([D[sel] * r.uniform(2, 4, (3000, 1)), Rnd])
    X = X.astype(np.float32)
    b = np.zeros(5)
    tol = rays.default_ray_tol(np.float32) * 30
    batched = rays._group_rays(X, b, 0.5, tol, False, 0)
    monkeypatch.setattr(rays, "_SHORT_RUN", 0)
    one_by_one = rays._group_rays(X, b, 0.5, tol, False, 0)
    np.testing.assert_array_equal(batched.rays, one_by_one.rays)
    # repeated directions were merged, distinct ones kept
    assert batched.width == np.unique(sel).size + np.count_nonzero(np.linalg.norm(Rnd, axis=1) > 0.5)


def test_underflow_allowance_covers_subnormal_products():
    """The rounding model of the bounds, |fl(x y) - x y| <= U |x y| + ETA, on products that underflow into the
    subnormals, checked in exact rationals (an allowance of 0, as 2.0**-1075 evaluates to, fails it)."""
    from fractions import Fraction

    from widelimit.exact.median_bound import ETA, U

    rng = np.random.default_rng(0)
    worst = Fraction(0)
    for _ in range(2000):
        x = float(rng.uniform(0.5, 1.0)) * 2.0 ** int(rng.integers(-560, -500))
        y = float(rng.uniform(0.5, 1.0)) * 2.0 ** int(rng.integers(-560, -500))
        exact = Fraction(x) * Fraction(y)
        err = abs(Fraction(x * y) - exact) - Fraction(U) * exact
        worst = max(worst, err)
    assert 0 < worst <= Fraction(ETA)


# --------------------------------------------------------------------------------------------
# the review of this round: certificates at the ends of the float64 range


def _random_sae(n, k, seed, bias_scale=0.0):
    from widelimit.sae.model import SAE

    W = np.random.default_rng(seed).standard_normal((k, n))
    return SAE(W_dec=W, b_dec=np.full(n, bias_scale), W_enc=W.T.copy(), b_enc=np.zeros(k), architecture="standard")


def test_a_tiny_objective_is_judged_relatively_not_by_an_absolute_floor():
    """Data near 3e-155 (objective 6e-308, all normal numbers): a random SAE 60x above the optimum was
    certified optimal because "certified" tested gap <= tol * max(value, 1e-300). Its relative gap must be
    that of the same problem times 2^512 (an exact rescaling), and it is not certified."""
    from widelimit.sae.model import SAE

    s = 3e-155
    X = np.random.default_rng(0).standard_normal((200, 4)) * s
    sae = _random_sae(4, 3, 0, bias_scale=5.0 * s)
    c = wl.certify_sae(X, sae, lam=0.3 * s)
    f = 2.0 ** 512
    big = SAE(W_dec=sae.W_dec, b_dec=sae.b_dec * f, W_enc=sae.W_enc, b_enc=sae.b_enc, architecture="standard")
    c2 = wl.certify_sae(X * f, big, lam=0.3 * s * f)
    assert not c2.certified and c2.global_gap > 0.5 * c2.sae_objective
    assert c.certified is False
    assert c.as_dict()["rel_gap"] == pytest.approx(c2.global_gap / c2.sae_objective, rel=1e-6)
    v = wl.verify(X, sae.W_dec, sae.encode(X), sae.b_dec, lam=0.3 * s, tol=1e-6)
    assert v.certified is False and v.rel_gap == pytest.approx(c2.global_gap / c2.sae_objective, rel=1e-6)


def test_an_objective_that_overflows_certifies_nothing(tmp_path, capsys):
    """At lam = 1e305 the SAE's penalty overflows: value inf, gap inf, and "inf <= tol * inf" held."""
    X = np.random.default_rng(0).standard_normal((300, 4))
    sae = _random_sae(4, 6, 0)
    for lam, finite in ((1e300, True), (1e305, False)):
        c = wl.certify_sae(X, sae, lam=lam)
        assert np.isfinite(c.sae_objective) == finite and c.certified is False
        assert c.as_dict()["rel_gap"] == (c.global_gap / c.sae_objective if finite else np.inf)
    W, Z = np.eye(4)[:1], np.full((300, 1), 10.0)
    v = wl.verify(X, W, Z, np.zeros(4), lam=1e307)
    assert v.value == np.inf and v.certified is False and v.rel_gap == np.inf


def test_relative_gap_is_gap_over_value_at_every_scale():
    """Below 1e-300 the relative gap was gap / 1e-300: a true 12.5% was reported as 7.2e-9."""
    from widelimit.exact.certificate import is_certified, relative_gap

    s = 2.0 ** -63
    x = np.array([0.0, 0.0, 0.0, 1.0, 3.0, 10.0]) * s
    lam, b = 1e-289, 2.0 * s
    Z = np.c_[np.maximum(x - b - lam, 0), np.maximum(b - x - lam, 0)]
    c = wl.verify(x[:, None], np.array([[1.0], [-1.0]]), Z, np.array([b]), lam=lam)
    assert c.value < 1e-300 and c.rel_gap == c.gap / c.value and c.as_dict()["rel_gap"] == c.gap / c.value
    assert 0.1 < c.rel_gap < 0.2 and not c.certified
    assert relative_gap(0.0, 0.0) == 0.0 and relative_gap(1e-320, 0.0) == np.inf
    assert relative_gap(np.inf, np.inf) == np.inf and relative_gap(1.0, np.nan) == np.inf
    assert is_certified(0.0, 0.0, tol=1e-9) and not is_certified(1e-316, 0.0, tol=1e-9)
    assert is_certified(2e-317, 0.0, tol=1e-9)  # below the smallest normal a value counts as 2^-1022
    assert not is_certified(np.inf, np.inf, tol=1e-9) and not is_certified(np.nan, 1.0, tol=1e-9)
    assert is_certified(1e-316, 1e-308, tol=1e-9) is False and is_certified(1e-316, 1e-308, tol=1e-9, atol=1e-316)


@pytest.mark.parametrize("case", ["huge_with_small_entries", "below_float32_normals"])
def test_float32_data_are_rescaled_in_float64(case):
    """The power-of-two rescaling of float32 chunks ran in float32: at 2^-100 entries near 1e-20 flushed to zero
    (three distinct points became one, "certified" at value 0), and data near 1e-40 overflowed at 2^130
    ("non-finite value" for finite data). A float32 array must now be solved exactly like its float64 copy."""
    if case == "huge_with_small_entries":
        X, lam = np.array([[1e30, 1e-20], [1e30, -1e-20], [1e30, 0.0]], dtype=np.float32), 1e-25
    else:
        X, lam = (np.random.default_rng(0).standard_normal((50, 3)) * 1e-40).astype(np.float32), 1e-41
    a, b = wl.solve(X, lam=lam), wl.solve(X.astype(np.float64), lam=lam)
    assert (a.width, a.certified) == (b.width, b.certified) and a.value > 0 and a.width >= 1
    # the same numbers, up to the order of float64 sums (the float32 chunks take other code paths)
    assert a.value == pytest.approx(b.value, rel=1e-12) and a.lower_bound == pytest.approx(b.lower_bound, rel=1e-12)
    np.testing.assert_allclose(a.bias, b.bias, rtol=1e-12)


def test_data_float64_cannot_hold_exactly_are_refused_not_rounded(tmp_path, capsys):
    """int64 2^53 and 2^53 + 1 became one float64 point ("certified" value 0 for two points 1 apart, whose
    optimum is 2 lam - lam^2 over 2); long doubles 1 and 1 + 2^-60 likewise. Every entry point refuses them,
    naming the entry; integers and long doubles that float64 holds exactly are solved like their float64 copy."""
    from widelimit.data.source import ActivationSource

    X = np.array([[2**53], [2**53 + 1]], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^X: the int64 value 9007199254740993 at row 1, column 0 is not exactly"):
        wl.solve(X, lam=1e-3)
    with pytest.raises(ValueError, match=r"the uint64 value 18446744073709551615 at row 0"):
        ActivationSource.from_array(np.array([[2**64 - 1], [0]], dtype=np.uint64))
    np.save(tmp_path / "i.npy", X)
    err = one_line_error(capsys, ["solve", str(tmp_path / "i.npy"), "--lam", "1e-3"])
    assert "i.npy: the int64 value 9007199254740993 at row 1, column 0 is not exactly a float64 number" in err
    ok = np.array([[2**53], [2**53 + 2], [-(2**60)]], dtype=np.int64)  # all exact in float64
    a, b = wl.solve(ok, lam=1e-3), wl.solve(ok.astype(np.float64), lam=1e-3)
    assert (a.value, a.lower_bound, a.width) == (b.value, b.lower_bound, b.width)
    if np.finfo(np.longdouble).nmant > 52:  # x86 80-bit long double (not on platforms where it is float64)
        L = np.array([[1.0], [1.0]], dtype=np.longdouble)
        L[1, 0] += np.longdouble(2) ** -60
        with pytest.raises(ValueError, match=r"float128 value 1.0000000000000000009 at row 1, column 0|at row 1"):
            wl.solve(L, lam=1e-3)
        half = np.array([[0.5], [3.0]], dtype=np.longdouble)
        assert wl.solve(half, lam=0.1).value == wl.solve(half.astype(np.float64), lam=0.1).value


def test_a_weighted_median_is_refused_as_the_bound_of_the_unweighted_problem():
    """X = {0, 0, 0, 10}, lam = 1 (optimum 14/3, docs/theory.md §3.1): the median with weights (1, 0, 0, 1) has the
    same data fingerprint, kind and lam, and lower bound 9, so verify certified a candidate of value 9 and solve
    a value of 5.0. Both refuse it now; all-one weights are the same problem and are accepted."""
    X = np.array([[0.0], [0.0], [0.0], [10.0]])
    weighted = wl.huber_median(X, lam=1.0, weights=[1.0, 0.0, 0.0, 1.0])
    b = 5.0
    W, Z = np.array([[1.0], [-1.0]]), np.c_[np.maximum(X[:, 0] - b - 1, 0), np.maximum(b - X[:, 0] - 1, 0)]
    for call in (lambda m: wl.verify(X, W, Z, np.array([b]), lam=1.0, median=m),
                 lambda m: wl.solve(X, lam=1.0, median=m)):
        with pytest.raises(ValueError, match="^median: computed with point weights"):
            call(weighted)
    assert wl.verify(X, W, Z, np.array([b]), lam=1.0).certified is False
    ones = wl.huber_median(X, lam=1.0, weights=np.ones(4))
    assert wl.solve(X, lam=1.0, median=ones).value == pytest.approx(14 / 3, rel=1e-12)


def test_candidates_at_the_ends_of_the_range_are_evaluated_or_named():
    """(a) codes of 1e160 on unit data: the message blamed the data's rows; it names the candidate now.
    (b) codes of 1e308 on an atom of norm 1e-300 are a finite candidate (penalty 2 lam * 1e8 per point): the
    atom's norm underflowed to 0 and the column sums overflowed, giving nan. (c) weights whose sum overflows."""
    X = np.random.default_rng(0).standard_normal((50, 3))
    with pytest.raises(ValueError, match=r"^Z, W: the candidate's reconstruction of row 0 is about 1.0e\+160"):
        wl.verify(X, np.eye(3)[:1], np.full((50, 1), 1e160), np.zeros(3), lam=1.0)
    W, Z = np.array([[1e-300, 0.0, 0.0]]), np.full((50, 1), 1e308)
    obj, c = wl.sae_objective(X, W, Z, np.zeros(3), lam=1.0), wl.verify(X, W, Z, np.zeros(3), lam=1.0)
    assert obj.penalty == c.penalty == pytest.approx(2.0 * (1e308 * 1e-300), rel=1e-12)
    # the reconstruction: z w = (1e8, 0, 0) on every row, computed here in exact rationals
    from fractions import Fraction as F

    z1 = F(1e308) * F(1e-300)
    exact = sum((F(float(x[0])) - z1) ** 2 + F(float(x[1])) ** 2 + F(float(x[2])) ** 2 for x in X) / 50
    assert obj.reconstruction == pytest.approx(float(exact), rel=1e-12) and c.certified is False
    from widelimit._validation import row_norms

    A = np.array([[3e-300, 4e-300], [3e200, 4e200], [0.0, 0.0], [3.0, 4.0]])
    np.testing.assert_allclose(row_norms(A), [5e-300, 5e200, 0.0, 5.0], rtol=1e-15)
    with pytest.raises(ValueError, match="^weights: their sum overflows float64"):
        wl.huber_median(np.arange(4.0)[:, None], lam=1.0, weights=[1, 1, 1e308, 1e308])
