"""The joint second-order test (theory.md §5.4) against its closed form and a brute-force objective."""

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import brentq

import widelimit as wl
from widelimit.exact.second_order import joint_curvature, move

from fixtures.stability import check_witnesses, exact_codes_value, plain_objective, two_shared_rays


def threshold(rho, lam):
    """theory.md §5.4: the two-ray saddle starts where rho^2 sin^2 phi = lam (rho cos phi - lam)."""
    return brentq(lambda p: (rho * math.sin(p)) ** 2 - lam * (rho * math.cos(p) - lam), 1e-6, math.pi / 2 - 1e-6)


def test_joint_threshold_is_the_closed_form_not_the_single_atom_one():
    rho, lam = 1.0, 0.3
    phi_joint = threshold(rho, lam)
    phi_single = brentq(lambda p: rho * math.cos(2 * p) - lam * math.cos(p), 0.1, 1.0)
    assert round(phi_joint, 3) == 0.440 and round(phi_single, 3) == 0.666
    for phi, negative in [(phi_joint - 1e-3, False), (phi_joint + 1e-3, True), (0.5, True), (0.6, True),
                          (0.3, False)]:
        X, W, Z, b = two_shared_rays(phi, rho=rho, lam=lam, dead=False)
        jc = joint_curvature(X, W, sp.csr_array(Z), b, lam)
        assert (jc.value < -1e-9) == negative, phi
        # closed form (theory.md §5.4): Hessian in (t_0, t_1, beta) = [[a,0,4z],[0,a,4z],[4z,4z,8]] / N
        c, s = rho * math.cos(phi), rho * math.sin(phi)
        z = c - lam
        a = 4 * (z * c - s * s)
        closed = np.linalg.eigvalsh(np.array([[a, 0, 4 * z], [0, a, 4 * z], [4 * z, 4 * z, 8]]) / 4)[0]
        assert jc.value == pytest.approx(min(closed, 0.0), abs=1e-12)


@pytest.mark.parametrize("phi", [0.5, 0.6])
def test_joint_direction_lowers_the_brute_force_objective(phi):
    rho, lam = 1.0, 0.3
    X, W, Z, b = two_shared_rays(phi, rho=rho, lam=lam, dead=False)
    jc = joint_curvature(X, W, sp.csr_array(Z), b, lam)
    F0 = exact_codes_value(X, W, b, lam)
    assert F0 == pytest.approx(plain_objective(X, W, Z, b, lam), rel=1e-14)
    # second difference of the brute-force reduced objective along the eigenvector = the eigenvalue
    h = 1e-3
    Fp, Fm = (exact_codes_value(X, *move(W, b, jc, t), lam) for t in (h, -h))
    assert (Fp - 2 * F0 + Fm) / h**2 == pytest.approx(jc.value, rel=1e-4)
    if phi == 0.5:  # a 0.01 rad tilt of the atoms (bias moved with them) lowers L by 5.6e-6
        m = 2
        tilt = np.linalg.norm(jc.direction[:m])
        drop = F0 - exact_codes_value(X, *move(W, b, jc, 0.01 / tilt), lam)
        assert drop == pytest.approx(5.6e-6, rel=0.02)
    # feature_stability no longer calls these points stable: a witness (atoms and bias moved) is verified
    res = wl.feature_stability(X, W, Z, b, lam=lam)
    assert res.joint_curvature == pytest.approx(jc.value, rel=1e-12)
    assert np.all(res.curvature > 0)                     # each atom turned alone: positive curvature
    assert set(res.unstable.tolist()) == {0, 1} and set(res.witness_moves.values()) == {"joint"}
    check_witnesses(res, X, W, Z, b, lam)
    assert not np.allclose(res.witnesses[0][2], b)       # the witness moves the bias too


def test_stable_below_the_threshold():
    X, W, Z, b = two_shared_rays(0.4, rho=1.0, lam=0.3, dead=False)
    res = wl.feature_stability(X, W, Z, b, lam=0.3)
    assert res.verdict == ("stable", "stable") and res.joint_curvature > -1e-12 and res.joint_curvature_complete


def test_hessian_quadratic_form_against_brute_force_on_a_fitted_point():
    lam = 0.3
    X = wl.datasets.gaussian(8, 3, seed=2)[0]
    fit = wl.fit_dictionary(X, lam=lam, width=3, init="random", seed=0, device="cpu", coding_tol=1e-12)
    W, b = np.asarray(fit.dictionary, dtype=np.float64), np.asarray(fit.bias, dtype=np.float64)
    W = W / np.linalg.norm(W, axis=1, keepdims=True)
    Z = wl.optimal_codes(X, W, b, lam=lam, tol=1e-14, dtype="float64", device="cpu").codes
    jc = joint_curvature(X, W, sp.csr_array(Z), b, lam)
    assert jc.complete and jc.hessian.shape == (jc.features.size * 2 + 3,) * 2
    F0 = exact_codes_value(X, W, b, lam)
    rng = np.random.default_rng(1)
    h = 1e-3
    for _ in range(3):
        v = rng.standard_normal(jc.hessian.shape[0])
        v /= np.linalg.norm(v)
        jv = type(jc)(jc.value, v, jc.features, jc.bases, jc.complete, jc.hessian)
        Fp, Fm = (exact_codes_value(X, *move(W, b, jv, t), lam) for t in (h, -h))
        assert (Fp - 2 * F0 + Fm) / h**2 == pytest.approx(v @ jc.hessian @ v, rel=1e-3, abs=1e-6)


def test_duplicated_atom_is_merged_and_nearly_dependent_atoms_give_no_value():
    X, W, Z, b = two_shared_rays(0.5, rho=1.0, lam=0.3, dead=False)
    ref = joint_curvature(X, W, sp.csr_array(Z), b, 0.3).value
    W3 = np.vstack([W, W[0]])                               # atom 0 twice, its codes split 30/70
    Z3 = np.hstack([Z, 0.7 * Z[:, :1]])
    Z3[:, 0] *= 0.3
    assert plain_objective(X, W3, Z3, b, 0.3) == pytest.approx(plain_objective(X, W, Z, b, 0.3), rel=1e-14)
    assert joint_curvature(X, W3, sp.csr_array(Z3), b, 0.3).value == pytest.approx(ref, rel=1e-12)
    W3[2] = [math.cos(1e-4), math.sin(1e-4), 0.0]             # a copy 1e-4 rad away: no smooth reduced objective
    assert math.isnan(joint_curvature(X, W3, sp.csr_array(Z3), b, 0.3).value)
