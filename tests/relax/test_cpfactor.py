"""CP factorisation (Groetzner-Dür alternating projections) and refinement of a relaxation's Q."""

import dataclasses

import numpy as np
import pytest

import widelimit as wl
from widelimit.relax.cpfactor import factorize_cp, random_cp_matrix, refine
from widelimit.relax.families import make_bench_instance
from widelimit.relax.cones import horn_matrix, relax


def _rel_res(Z, A):
    return np.linalg.norm(Z @ Z.T - A) / np.linalg.norm(A)


@pytest.mark.parametrize("n,r", [(10, 15), (20, 30), (20, 60)])
def test_literature_protocol_small(n, r):
    for seed in range(2):
        A, _ = random_cp_matrix(n, seed=seed)
        f = factorize_cp(A, width=r, seed=seed)
        assert f.success, f.message
        assert f.Z.shape == (n, r) and f.Z.min() >= 0
        assert _rel_res(f.Z, A) <= 1e-8  # independent check of the reported residual
        assert f.residual == pytest.approx(_rel_res(f.Z, A), rel=1e-6, abs=1e-15)


def test_width_search_finds_the_narrowest():
    rng = np.random.default_rng(0)
    # 3 nonnegative columns with disjoint supports: cp-rank = rank = 3
    C = np.zeros((9, 3))
    for j in range(3):
        C[3 * j:3 * j + 3, j] = rng.uniform(0.5, 2.0, 3)
    A = C @ C.T
    f = factorize_cp(A)
    assert f.success and f.width == 3 and f.rank == 3 and f.provably_narrowest
    assert _rel_res(f.Z, A) <= 1e-8
    # a generic CP matrix of rank n: the search starts at the rank and reports what it tried
    B, _ = random_cp_matrix(6, 12, seed=4)
    g = factorize_cp(B)
    assert g.success and g.width >= g.rank == 6 and min(g.widths_tried) == 6


def test_reports_failure_on_horn_separated_dnn_matrix():
    Cyc = np.roll(np.eye(5), 1, axis=1)
    A = np.eye(5) + 0.6 * (Cyc + Cyc.T)
    assert np.linalg.eigvalsh(A).min() > 0 and A.min() >= 0  # doubly nonnegative
    assert np.sum(horn_matrix() * A) < 0  # ... but not completely positive
    f = factorize_cp(A, max_iter=500, restarts=2, max_width=8)
    assert not f.success
    assert f.residual > 1e-2  # the best residual reached is reported and stays far from 0
    assert "not be completely positive" in f.message and str(round(f.residual, 3))[:4] in f.message
    assert f.Z.min() >= 0 and f.residual == pytest.approx(_rel_res(f.Z, A), rel=1e-9)


def test_not_psd_is_not_cp():
    A = np.array([[1.0, 2.0], [2.0, 1.0]])
    f = factorize_cp(A)
    assert not f.success and "not positive semidefinite" in f.message


def test_bad_input():
    with pytest.raises(ValueError, match="square"):
        factorize_cp(np.ones((3, 4)))
    with pytest.raises(ValueError, match="symmetric"):
        factorize_cp(np.array([[1.0, 0.5], [0.2, 1.0]]))
    with pytest.raises(ValueError, match=r"negative entry Q\[0, 1\]"):
        factorize_cp(np.array([[1.0, -0.5], [-0.5, 1.0]]))
    with pytest.raises(ValueError, match="non-finite"):
        factorize_cp(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="width"):
        factorize_cp(np.eye(3), width=0)


def test_zero_and_torch_input():
    import torch

    f = factorize_cp(np.zeros((3, 3)))
    assert f.success and f.width == 0
    A, _ = random_cp_matrix(5, 8, seed=1)
    g = factorize_cp(torch.tensor(A), width=8)
    assert g.success


def test_refine_rays_gives_one_atom_per_ray():
    inst = make_bench_instance("rays", 16, dim=3, seed=0)
    sol = wl.solve(inst.X, lam=inst.lam)
    r = relax(inst.X, lam=inst.lam, cone="dnn", solver="SCS", tol=1e-8)
    ref = refine(inst.X, r.Q, r.b, lam=inst.lam)
    assert ref.width == sol.width == inst.truth["n_rays"]
    assert ref.value >= sol.certificate.lower_bound - 1e-12  # an upper bound ...
    assert ref.value == pytest.approx(sol.value, rel=1e-5)  # ... that matches the optimum
    # the triple is evaluated independently
    obj = wl.sae_objective(inst.X, ref.W, ref.Z, ref.b, lam=inst.lam).value
    assert obj == pytest.approx(ref.value, rel=1e-12)
    assert np.allclose(np.linalg.norm(ref.W, axis=1), 1.0)
    assert ref.certificate.rel_gap < 1e-5


def test_refine_rays_n40_one_atom_per_ray():
    inst = make_bench_instance("rays", 40, dim=3, seed=0)
    sol = wl.solve(inst.X, lam=inst.lam)
    r = relax(inst.X, lam=inst.lam, cone="dnn", solver="SCS", tol=1e-8)
    ref = refine(inst.X, r.Q, r.b, lam=inst.lam)
    assert ref.width == sol.width == inst.truth["n_rays"] == 4
    assert (ref.Z.max(axis=0) > 0).all()
    # one atom per ray: each refined atom is parallel to one exact atom
    cos = ref.W @ sol.dictionary.T
    assert np.allclose(np.sort(cos.max(axis=1)), 1.0, atol=1e-6)
    assert ref.value >= sol.certificate.lower_bound - 1e-12
    assert ref.value == pytest.approx(sol.value, rel=1e-6)
    assert wl.sae_objective(inst.X, ref.W, ref.Z, ref.b, lam=inst.lam).value == pytest.approx(ref.value, rel=1e-12)


def test_refine_drops_an_atom_no_point_uses(monkeypatch):
    """An inexact factor (SCS's Q is CP only to its accuracy) can carry an extra column whose atom lies
    between two rays, farther from both than the coarsest merge tolerance: the lasso re-fit gives it no
    code at all, and it must not count towards the width (it did once: width 5 on 4 rays)."""
    import widelimit.relax.cpfactor as cpf

    inst = make_bench_instance("rays", 16, dim=3, seed=0)
    sol = wl.solve(inst.X, lam=inst.lam)
    r = relax(inst.X, lam=inst.lam, cone="dnn", solver="SCS", tol=1e-8)
    real = cpf.factorize_cp
    widths = []

    def inexact(A, **kw):
        f = real(A, **kw)
        widths.append(f.width)
        on_ray = [np.flatnonzero(sol.rays == j)[0] for j in range(2)]  # a point of each of two rays
        extra = np.zeros((f.Z.shape[0], 1))
        extra[on_ray, 0] = 1e-3 * f.Z.max()
        return dataclasses.replace(f, Z=np.hstack([f.Z, extra]), width=f.width + 1)

    monkeypatch.setattr(cpf, "factorize_cp", inexact)
    ref = refine(inst.X, r.Q, r.b, lam=inst.lam)
    assert ref.factor_width == widths[0] + 1  # the extra column reached the dictionary ...
    assert ref.width == sol.width == 4  # ... and its atom, unused, was dropped
    assert (ref.Z.max(axis=0) > 0).all()
    assert ref.value == pytest.approx(sol.value, rel=1e-6)


def test_refine_random_instance_and_errors():
    inst = make_bench_instance("random", 10, dim=3, seed=5)
    sol = wl.solve(inst.X, lam=inst.lam)
    r = relax(inst.X, lam=inst.lam, cone="sdd", solver="SCS", tol=1e-8)
    ref = refine(inst.X, r.Q, r.b, lam=inst.lam)
    assert ref.value == pytest.approx(sol.value, rel=1e-5)
    with pytest.raises(ValueError, match="N = 10"):
        refine(inst.X, np.eye(4), r.b, lam=inst.lam)


def test_refine_of_a_q_that_is_not_cp_is_still_an_honest_upper_bound():
    # the Horn-separated DNN matrix has no nonnegative factor: refine uses the best one it found,
    # says so, and the value is the true objective of the triple it returns (>= the optimum)
    Cyc = np.roll(np.eye(5), 1, axis=1)
    A = np.eye(5) + 0.6 * (Cyc + Cyc.T)
    X = np.random.default_rng(0).standard_normal((5, 2)) * 3
    sol = wl.solve(X, lam=0.5)
    ref = refine(X, A, sol.bias, lam=0.5, max_iter=300, restarts=1)
    assert not ref.factorization.success and ref.factorization.residual > 1e-2
    assert ref.value == pytest.approx(wl.sae_objective(X, ref.W, ref.Z, ref.b, lam=0.5).value, rel=1e-12)
    assert ref.value >= sol.value * (1 - 1e-12)
    assert ref.certificate.rel_gap >= -1e-12
    with pytest.raises(ValueError, match="best relative residual"):
        refine(X, A, sol.bias, lam=0.5, accept=1e-3, max_iter=300, restarts=1)
