"""The peers of benchmarks/certify_scale.py --peers solve widelimit's lasso, not another one.

widelimit's per-token lasso is ``min_{y>=0} ||xt - y U||^2 + 2 lam ||y||_1`` (docs/theory.md §1); SPAMS,
scikit-learn and celer each scale it their own way (``certify_scale.peer_lam``). A wrong scaling (the
former ``lambda1 = 2 lam``, ``alpha = 2 lam / d_in`` passed to ``sparse_encode``) solves a lasso with another
penalty, whose objective here differs by more than 5 %. The peers are optional (the ``bench`` extra): each
test is skipped where its library is not installed.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from widelimit.coding import optimal_codes

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _certify_scale():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("certify_scale", BENCH / "certify_scale.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(7)
    n, k, N, lam = 32, 64, 20, 0.3
    U = rng.standard_normal((k, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    xt = rng.standard_normal((N, n))
    ours = optimal_codes(xt, U, np.zeros(n), lam=lam, tol=1e-10, return_codes=True)
    return U, xt, lam, ours


def _objective(U, xt, Y, lam):
    """Mean ``||xt - Y U||^2 + 2 lam sum(Y)`` computed directly (not by widelimit)."""
    R = xt - Y @ U
    return float(np.mean(np.sum(R * R, axis=1) + 2.0 * lam * Y.sum(axis=1)))


@pytest.mark.parametrize("peer", ["spams", "sklearn_lars", "sklearn_cd", "sparse_encode_cd", "celer"])
def test_peer_solves_the_same_lasso(problem, peer):
    pytest.importorskip({"spams": "spams", "celer": "celer"}.get(peer, "sklearn"))
    cs = _certify_scale()
    U, xt, lam, ours = problem
    run = {"spams": lambda: cs.run_spams(U, xt, lam),
           "sklearn_lars": lambda: cs.run_sklearn(U, xt, lam, "lasso_lars"),
           "sklearn_cd": lambda: cs.run_sklearn_cd(U, xt, lam, 1e-12),
           "sparse_encode_cd": lambda: cs.run_sklearn(U, xt, lam, "lasso_cd", 10000),
           "celer": lambda: cs.run_celer(U, xt, lam, 1e-12)}[peer]
    Y = run()
    assert Y.shape == (xt.shape[0], U.shape[0]) and Y.min() >= 0
    best = float(np.mean(ours.point_values))
    # the codes are (near) optimal for widelimit's objective: same value as widelimit's certified coder
    assert _objective(U, xt, Y, lam) == pytest.approx(best, rel=1e-9)
    # and the benchmark's certified gap of them (widelimit's point_gaps) is small and bounds their suboptimality
    c = cs.certified(U, xt, Y, lam)
    assert c["objective"] == pytest.approx(_objective(U, xt, Y, lam), rel=1e-12)
    assert 0 <= c["gap"] <= 1e-6 * best
    assert c["objective"] - c["gap"] <= best * (1 + 1e-12)


def test_wrong_scaling_is_another_lasso(problem):
    """The test above can fail: SPAMS at the former ``lambda1 = 2 lam`` misses the optimum by > 5 %."""
    pytest.importorskip("spams")
    cs = _certify_scale()
    U, xt, lam, ours = problem
    Y = cs.run_spams(U, xt, 2 * lam)
    assert _objective(U, xt, Y, lam) > 1.05 * float(np.mean(ours.point_values))
