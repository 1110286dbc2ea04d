"""Numerical soundness, the reproducers of issue 13 (items 1, 2, 3, 6 and 11): nothing can make widelimit
certify a false statement. Each must give the right answer or a one-line error; each failed before its fix.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import widelimit as wl
from widelimit.cli import main
from widelimit.exact.median_bound import InconsistentBound
from fixtures.cli import one_line_error


def _stale_pair():
    """The issue's data: B is A with rows 100..299 scaled by 20 (same shape, same first/last rows)."""
    r = np.random.default_rng(5)
    A = r.standard_normal((400, 4))
    B = A.copy()
    B[100:300] *= 20
    return A, B


def _fans(dtype=np.float64, m=3000, spread=9e-6, seed=0):
    """Two antipodal fans of m points each in 2-D around +u and -u, angular spread ``spread``."""
    r = np.random.default_rng(seed)
    th = r.uniform(-spread / 2, spread / 2, 2 * m)
    th[m:] += np.pi
    rad = r.uniform(1.0, 3.0, 2 * m)
    return (rad[:, None] * np.c_[np.cos(th), np.sin(th)]).astype(dtype)


# --------------------------------------------------------------------------------------
# the reproducers, by the behaviour each checks
# --------------------------------------------------------------------------------------


def test_stale_checkpoint_on_the_cli_is_an_error_naming_both(tmp_path, capsys):
    A, B = _stale_pair()
    d, ck = tmp_path / "d.npz", tmp_path / "ck.npz"
    np.savez(d, x=B)
    assert main(["bound", str(d), "--lam", "1", "--checkpoint", str(ck), "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lower_bound"] == pytest.approx(wl.huber_median(B, lam=1.0).lower_bound, rel=1e-12)
    np.savez(d, x=A)  # same file name, same shape, same first and last 64 rows
    err = one_line_error(capsys, ["bound", str(d), "--lam", "1", "--checkpoint", str(ck), "--json", "--no-progress"])
    fa = wl.huber_median(A, lam=1.0).fingerprint
    fb = wl.huber_median(B, lam=1.0).fingerprint
    assert "computed on other data" in err and fa != fb and fa in err and fb in err  # names both


def test_stale_checkpoint_through_the_api_is_refused(tmp_path):
    A, B = _stale_pair()
    ck = tmp_path / "ck.npz"
    wl.huber_median(B, lam=1.0, checkpoint=ck)
    sol = wl.solve(A, lam=1.0)
    with pytest.raises(ValueError, match="computed on other data"):
        wl.verify(A, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.0, checkpoint=ck)
    # the same data resume to the answer of an uninterrupted run (after one certifying pass)
    again = wl.huber_median(B, lam=1.0, checkpoint=ck)
    ref = wl.huber_median(B, lam=1.0)
    assert again.value == ref.value and again.lower_bound == ref.lower_bound and again.fingerprint == ref.fingerprint


def test_median_of_other_data_is_refused_and_inconsistency_is_an_error():
    A, B = _stale_pair()
    sol = wl.solve(A, lam=1.0)
    mB = wl.huber_median(B, lam=1.0)
    with pytest.raises(ValueError, match="median was computed on other data"):
        wl.verify(A, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.0, median=mB)
    # even with A's fingerprint, a bound above the objective is reported, never clipped
    with pytest.raises(InconsistentBound, match="MedianResult lower_bound .* is above the MedianResult value"):
        dataclasses.replace(sol.median, lower_bound=mB.lower_bound)  # refused when made (widelimit.results)
    forged = dataclasses.replace(sol.median)
    object.__setattr__(forged, "lower_bound", mB.lower_bound)  # made past that check: verify still refuses it
    with pytest.raises(InconsistentBound, match="below the certified lower bound"):
        wl.verify(A, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.0, median=forged)
    with pytest.raises(ValueError, match="no data fingerprint"):
        wl.verify(A, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.0,
                  median=dataclasses.replace(sol.median, fingerprint=None))
    ok = wl.verify(A, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.0, median=sol.median)
    assert ok.certified and ok.gap == ok.value - ok.lower_bound  # not clipped


@pytest.mark.parametrize("name", ["tol", "atol"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_tolerances_are_validated(name, bad):
    A, _ = _stale_pair()
    sol = wl.solve(A, lam=1.0)
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number >= 0"):
        wl.verify(A, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.0, median=sol.median, **{name: bad})
    if name == "tol":
        with pytest.raises(ValueError, match="^tol must be"):
            wl.solve(A, lam=1.0, tol=bad)
        with pytest.raises(ValueError, match="^tol must be"):
            wl.huber_median(A, lam=1.0, tol=bad)
        with pytest.raises(ValueError, match="^ray_tol must be"):
            wl.solve(A, lam=1.0, ray_tol=bad)


def test_cli_tolerances_exit_2(tmp_path, capsys):
    from fixtures.saes import orthogonal_rays_sae
    from widelimit.sae.formats import save_saelens

    X, sae = orthogonal_rays_sae(0.5, seed=9)
    save_saelens(sae, tmp_path / "sae")
    np.save(tmp_path / "acts.npy", X.astype(np.float32))
    base = ["certify", str(tmp_path / "acts.npy"), str(tmp_path / "sae"), "--lam", "0.5", "--device", "cpu"]
    # refused by argparse, naming the flag (issue 13: messages name the CLI flag)
    cases = [(base + ["--tol", v], "argument --tol: must be a finite number >= 0") for v in ("inf", "-1", "nan")]
    cases += [(base + ["--coding-tol", "inf"], "argument --coding-tol: must be a finite number > 0"),
              (base + ["--norm-scaling-factor", "-1"], "argument --norm-scaling-factor: must be a finite number > 0")]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("widelimit certify: error: ") and err.count("\n") == 1 and needle in err, err
    # the same command with valid tolerances certifies (so the refusals above are about the values)
    assert main(base + ["--tol", "1e-6", "--json"]) == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("c", [1e19, 1e154, 1e-150])
def test_extreme_scales_are_solved_and_certified(dtype, c):
    X = np.random.default_rng(0).standard_normal((300, 3))
    X[:100] *= 0.3
    if dtype == np.float32 and not (1e-30 < c < 1e30):
        pytest.skip("outside the float32 range")
    ref = wl.solve(X.astype(dtype).astype(np.float64) if dtype == np.float32 else X, lam=1.0)
    Xc = (c * X).astype(dtype)
    sol = wl.solve(Xc, lam=c * 1.0)
    assert sol.certified and sol.certificate.rel_gap <= 1e-9
    # float32 * c rounds the data again: then only to float32 accuracy
    assert sol.value / c / c == pytest.approx(ref.value, rel=1e-13 if dtype == np.float64 else 1e-6)
    assert sol.width == ref.width
    cert = wl.verify(Xc, sol.dictionary, sol.sparse_codes, sol.bias, lam=c * 1.0, median=sol.median)
    assert cert.certified and cert.value == pytest.approx(sol.value, rel=1e-12)


def test_finite_data_whose_squares_overflow_are_rescaled():
    """A row 2^1000 times the others, which the sampled rows miss: the median rescales from a full pass."""
    X = np.random.default_rng(0).standard_normal((1000, 3))
    sampled = set(np.unique(np.linspace(0, 999, 257).astype(np.int64)).tolist())
    big = next(i for i in range(1000) if i not in sampled)
    X[big] *= 2.0**1000
    med = wl.huber_median(X, lam=1.0)
    ref = wl.huber_median(X * 2.0**-1000, lam=2.0**-1000)  # the same problem in units 2^1000 times larger
    assert med.certified and med.value / 2.0**1000 / 2.0**1000 == pytest.approx(ref.value, rel=1e-13)
    np.testing.assert_allclose(med.point, ref.point * 2.0**1000, rtol=1e-12)

def test_a_value_beyond_float64_is_refused_not_certified():
    """Rows near 3e156 are solved as 2^-520 X exactly; where the optimum times 2^1040 leaves the float64 range
    the answer is an error, not ``value = inf`` with ``certified = True`` (``gap <= tol * inf`` holds for any gap)."""
    X0 = np.random.default_rng(3).standard_normal((30, 3))
    X0 /= 1.25 * np.abs(X0).max()  # entries below 1 in magnitude: X0 needs no scaling, 2^520 X0 is scaled by 2^-520
    s = 2.0**520
    X = X0 * s
    ref = wl.solve(X0, lam=1e-10)
    sol = wl.solve(X, lam=1e-10 * s)  # the same computation in other units: exact powers of two
    assert sol.certified and sol.value == (ref.value * s) * s and sol.width == ref.width
    big = wl.solve(X0, lam=0.5)
    W, Z, b = big.dictionary, big.codes * s, big.bias * s
    for call in (lambda: wl.solve(X, lam=0.5 * s), lambda: wl.huber_median(X, lam=0.5 * s),
                 lambda: wl.verify(X, W, Z, b, lam=0.5 * s)):
        with pytest.raises(ValueError, match="beyond the float64 range"):
            call()


@pytest.mark.parametrize("lam", [1e-200, 1e-100, 1e200])
def test_tiny_and_huge_lam_give_an_honest_certificate(lam):
    X = np.random.default_rng(0).standard_normal((300, 3))
    X[:100] *= 0.3
    med = wl.huber_median(X, lam=lam)
    assert med.certified and med.lower_bound <= med.value
    if lam < 1:  # h(r) = 2 lam r - lam^2 for every point: 2 lam times the geometric median's value
        geo = wl.geometric_median(X)
        assert med.value == pytest.approx(2 * lam * geo.value, rel=1e-12)
        assert med.lower_bound <= 2 * lam * geo.value and med.rel_gap <= 1e-10
    else:  # every point within lam: the mean and the variance
        np.testing.assert_allclose(med.point, X.mean(axis=0), rtol=0, atol=1e-14)
        assert med.value == pytest.approx(np.mean(np.sum((X - X.mean(0)) ** 2, axis=1)), rel=1e-13)
    sol = wl.solve(X, lam=lam)  # no ZeroDivisionError; an honest certificate
    assert sol.lower_bound <= sol.value + sol.certificate.rounding_error
    if lam > 1:
        assert sol.certified and sol.width == 0
    else:  # no float64 triple is within 1e-9 of the optimum: the residual rounding eps * r exceeds lam
        assert not sol.certified


def test_two_fans_are_certified(subtests=None):
    for dtype in (np.float64, np.float32):
        X = _fans(dtype)
        for lam in (0.5, 2.0):
            med = wl.huber_median(X, lam=lam)
            assert med.certified and med.rel_gap <= 1e-9 and med.n_iter < 40, (dtype, lam, med.n_iter)
            sol = wl.solve(X, lam=lam)
            assert sol.certified and sol.certificate.rel_gap <= 1e-9, (dtype, lam)


def test_float32_near_collinear_rays_are_not_merged():
    """56 rays 1e-5 apart around one line: float32 storage must not merge them (width 56, as float64)."""
    r = np.random.default_rng(4)
    th = np.repeat(np.arange(28) * 1e-5, 10)
    th = np.concatenate([th, th + np.pi])
    rad = r.uniform(1.0, 3.0, th.size)
    X = rad[:, None] * np.c_[np.cos(th), np.sin(th)]
    w64 = wl.solve(X, lam=0.5)
    w32 = wl.solve(X.astype(np.float32), lam=0.5)
    assert w64.width == 56 and w32.width == 56
    assert w32.certified and w32.certificate.rel_gap <= 1e-9


def test_float32_small_lam_is_certified():
    X = np.random.default_rng(0).standard_normal((300, 3)).astype(np.float32)
    for lam in (1e-10, 1e-12):
        sol = wl.solve(X, lam=lam)
        assert sol.certified and sol.dictionary.dtype == np.float64  # float32 atoms could not be certified
