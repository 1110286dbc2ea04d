"""widelimit.results: a certified result never reports a bound above its value (issue 29, "never report a bound
above a value"). Before: ``FiniteSolution`` clipped any bound to its value, the other results took any pair, and an
exactly optimal SAE reported ``decoder_gap_at_bias = -4.4e-16``."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import widelimit as wl
from widelimit.exact.gap import InconsistentBound as FromGap
from widelimit.exact.median_result import MedianResult
from widelimit.finite.bnb import _result
from widelimit.results import ORDER_RTOL, InconsistentBound, ordered_bound

from fixtures.saes import orthogonal_rays_sae


def _median(value, lb, gap=None, rounding=0.0):
    return MedianResult(point=np.zeros(2), value=value, lower_bound=lb, gap=value - lb if gap is None else gap,
                        segment=np.zeros((2, 2)), n_passes=1, n_iter=1, certified=False, method="newton",
                        kind="huber", lam=1.0, rounding=rounding)


def test_one_error_for_a_bound_above_its_value():
    assert FromGap is InconsistentBound and issubclass(InconsistentBound, ValueError)


@pytest.mark.parametrize("value", [3.689, -2.5, 1e-300, 7e300])
def test_ordered_bound_rounding_and_beyond(value):
    slack = ORDER_RTOL * abs(value)
    below = np.nextafter(value, -np.inf)
    assert ordered_bound(value, below) == below  # a bound below is returned as it is
    assert ordered_bound(value, value + 0.5 * slack) == value  # above by rounding: lowered to the value
    with pytest.raises(InconsistentBound, match=r"^inconsistent result: the lower bound .* is above the value"):
        ordered_bound(value, value + 4 * slack + 1e-300)
    # a rigorous rounding bound of the caller widens the slack by exactly that much
    assert ordered_bound(value, value + 3 * slack, rounding=3 * slack) == value
    assert math.isnan(ordered_bound(value, math.nan)) and ordered_bound(math.inf, 1.0) == 1.0


def test_an_edited_bound_is_refused_when_the_result_is_made():
    """The issue's edited checkpoint: ``lower_bound 4.189 > value 3.689``, ``gap -0.5``."""
    with pytest.raises(InconsistentBound, match=r"MedianResult lower_bound 4.18.* is above the MedianResult value "
                                                r"3.68"):
        _median(3.689, 4.189)
    with pytest.raises(InconsistentBound, match="MedianResult value - gap"):  # a negative gap alone, too
        _median(3.689, 3.0, gap=-0.5)
    # the result's own rigorous rounding bound counts: 1e-9 above with rounding 2e-9 is rounding
    r = _median(3.689, 3.689 + 1e-9, rounding=2e-9)
    assert r.lower_bound == 3.689 and r.gap == 0.0 and r.rel_gap == 0.0


def test_within_rounding_the_gap_is_zero():
    v = 2.0
    r = _median(v, v + 4 * np.spacing(v))
    assert r.lower_bound == v and r.gap == 0.0 and r.rel_gap == 0.0 and r.as_dict()["gap"] == 0.0
    r = _median(v, v - 0.25)  # an ordered pair is untouched
    assert r.lower_bound == 1.75 and r.gap == 0.25


def test_the_finite_search_never_clips_a_bound_beyond_rounding():
    """Was: ``lb = min(lb, value)`` whatever the distance, so a wrong bound became a zero gap."""
    W, Z, b = np.eye(2), np.zeros((3, 2)), np.zeros(2)
    t0 = time.perf_counter()
    args = (W, Z, b, 1.0, 1e-6, "optimal", 5, 4, 0.5, t0)
    with pytest.raises(InconsistentBound, match=r"search's lower bound 1\.5 is above the value of the search's best"):
        _result(1.0, 1.5, *args)
    sol = _result(1.0, 1.0 + 1e-14, *args)  # rounding: gap exactly 0, certified
    assert sol.lower_bound == 1.0 and sol.gap == 0.0 and sol.certified and sol.status == "optimal"
    sol = _result(1.0, 0.9, *args)
    assert sol.lower_bound == 0.9 and sol.gap == 1.0 - 0.9 and not sol.certified


def test_an_exactly_optimal_sae_reports_zero_not_negative_gaps():
    """Was: ``decoder_gap_at_bias = -4.440892098500626e-16`` at seed 0 (the SAE attains the wide-limit optimum)."""
    X, sae = orthogonal_rays_sae(0.5, seed=0)
    c = wl.certify_sae(X, sae, lam=0.5, tol=1e-6)
    assert c.decoder_gap_at_bias == 0.0
    assert c.bias_gap >= 0.0 and c.global_gap >= 0.0 and c.lower_bound <= c.sae_objective and c.certified
    # the truth, independently: the SAE's objective is sum_i h_lam(t_i) / N, which the bound reaches to rounding
    d = np.linalg.norm(X - sae.b_dec, axis=1)
    h = np.where(d <= 0.5, d * d, 2 * 0.5 * d - 0.25).mean()
    assert c.sae_objective == pytest.approx(h, rel=1e-12) and c.lower_bound == pytest.approx(h, rel=1e-10)


def test_every_certified_result_is_checked_when_made():
    """No result class skips the check by a ``__post_init__`` of its own (dataclasses call the base's)."""
    import importlib

    from widelimit.results import CertifiedResult

    for mod in ("exact.certificate", "exact.median_result", "exact.solve", "finite.bnb", "coding.result",
                "relax.cones", "relax.dnn", "sae.certify"):
        importlib.import_module(f"widelimit.{mod}")
    subs = CertifiedResult.__subclasses__()
    assert len(subs) >= 8
    for cls in subs:
        assert cls.__post_init__ is CertifiedResult.__post_init__, cls
