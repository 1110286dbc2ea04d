"""The Q-problem over CP-cone approximations: bounds against the closed-form optimum."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import widelimit as wl
from widelimit.exact.median import huber_value
from widelimit.relax.families import make_bench_instance
from widelimit.relax.cones import CONES, INNER_CONES, OUTER_CONES, horn_matrix, horn_separation, relax
from widelimit.relax.sandwich import sandwich


def _cycle_matrix(t=0.6):
    """5x5 DNN matrix with <H, A> = 5 - 10 t < 0 (PSD for t <= 0.618): not CP."""
    C = np.roll(np.eye(5), 1, axis=1)
    return np.eye(5) + t * (C + C.T)


@pytest.mark.parametrize("family", ["random", "rays", "collinear"])
def test_sandwich_outer_le_exact_le_inner_scs(family):
    inst = make_bench_instance(family, 12, dim=3, seed=1)
    rep = sandwich(inst.X, lam=inst.lam, solver="SCS", tol=1e-7)
    assert rep.exact == pytest.approx(wl.solve(inst.X, lam=inst.lam).value, rel=1e-12)
    assert {e.cone for e in rep.entries} == set(CONES)
    assert rep.all_solved and rep.ok, rep.as_dict()
    for e in rep.entries:
        if e.kind == "outer":
            assert e.value <= rep.exact + rep.slack
        else:
            assert e.value >= rep.exact - rep.slack
    # the DNN relaxation is exact (theory.md §4): equal to solver tolerance
    assert rep.entry("dnn").rel_error < 1e-5
    assert rep.lower <= rep.upper + 2 * rep.slack


@pytest.mark.parametrize("family", ["random", "rays"])
def test_dnn_equals_exact_clarabel(family):
    inst = make_bench_instance(family, 10, dim=3, seed=2)
    exact = wl.solve(inst.X, lam=inst.lam).value
    for cone in ("dnn", "sdd"):
        r = relax(inst.X, lam=inst.lam, cone=cone, solver="CLARABEL", tol=1e-8)
        assert r.ok and r.status == "optimal"
        assert r.value == pytest.approx(exact, rel=1e-5)
        # the returned Q lies in the cone (to solver precision) and reproduces the value
        assert r.Q.min() >= -1e-6
        assert wl.q_objective(inst.X, np.maximum(r.Q, 0) + 1e-9 * np.eye(10), r.b, lam=inst.lam) == pytest.approx(
            exact, rel=1e-4)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), N=st.integers(3, 9), n=st.integers(1, 4),
       lam=st.floats(0.05, 2.0))
def test_dnn_value_agrees_with_closed_form(seed, N, n, lam):
    """Foundation cross-check: an independent conic solve of the DNN relaxation reproduces solve().value."""
    X = np.random.default_rng(seed).standard_normal((N, n)) * 2
    exact = wl.solve(X, lam=lam).value
    r = relax(X, lam=lam, cone="dnn", solver="SCS", tol=1e-9)
    assert r.ok
    assert r.value == pytest.approx(exact, rel=1e-5, abs=1e-7)


def test_fixed_bias_matches_huber_value():
    inst = make_bench_instance("random", 10, dim=3, seed=3)
    b = wl.solve(inst.X, lam=inst.lam).bias + 0.3
    rep = sandwich(inst.X, lam=inst.lam, cones=["nonneg", "dnn", "diagonal"], b=b, tol=1e-8)
    assert rep.exact == pytest.approx(huber_value(inst.X, b, lam=inst.lam))
    assert rep.exact > wl.solve(inst.X, lam=inst.lam).value
    assert rep.ok and rep.all_solved
    assert rep.entry("dnn").rel_error < 1e-5
    np.testing.assert_array_equal(rep.entry("dnn").result.b, b)


def test_failing_status_is_surfaced_never_a_bound():
    inst = make_bench_instance("random", 10, dim=3)
    r = relax(inst.X, lam=inst.lam, cone="dnn", solver="SCS", max_iter=5)
    assert r.status != "optimal" and not r.ok
    assert np.isnan(r.value) and np.isfinite(r.solver_value)
    with pytest.raises(RuntimeError, match="no bound"):
        r.bound
    r2 = relax(inst.X, lam=inst.lam, cone="dnn", solver="CLARABEL", max_iter=2)
    assert r2.status == "user_limit" and np.isnan(r2.value)
    rep = sandwich(inst.X, lam=inst.lam, cones=["dnn", "diagonal"], max_iter=5)
    assert rep.entry("dnn").consistent is None and not rep.all_solved
    assert np.isnan(rep.entry("dnn").error)


def test_bad_input_errors():
    X = np.random.default_rng(0).standard_normal((6, 2))
    with pytest.raises(ValueError, match=r"^cone must be one of .nonneg., .dnn.*got str .psd.$"):
        relax(X, lam=0.5, cone="psd")
    with pytest.raises(ValueError, match=r"^solver must be one of .SCS., .CLARABEL., got str .MOSEK.$"):
        relax(X, lam=0.5, cone="dnn", solver="MOSEK")
    with pytest.raises(ValueError, match="lam"):
        relax(X, lam=0.0, cone="dnn")
    Xn = X.copy()
    Xn[4, 1] = np.nan
    with pytest.raises(ValueError, match="row 4"):
        relax(Xn, lam=0.5, cone="dnn")
    with pytest.raises(ValueError, match="N >= 5"):
        relax(X[:4], lam=0.5, cone="dnn_horn")
    with pytest.raises(ValueError, match="b has length"):
        relax(X, lam=0.5, cone="dnn", b=np.zeros(3))
    with pytest.raises(ValueError, match="solver_opts"):
        relax(X, lam=0.5, cone="dnn", solver_opts={"solver": "SCS"})
    big = np.random.default_rng(0).standard_normal((300, 5))
    with pytest.raises(MemoryError, match="GiB"):
        relax(big, lam=0.5, cone="dnn", solver="CLARABEL")


def test_horn_separation():
    H = horn_matrix()
    assert np.allclose(H, H.T) and np.linalg.eigvalsh(H).min() < 0  # copositive but not PSD
    A = _cycle_matrix()
    assert np.linalg.eigvalsh(A).min() > 0 and A.min() >= 0  # DNN
    cuts = horn_separation(A)
    assert cuts and cuts[0][1] == pytest.approx(-1.0)
    # embedded in a larger matrix under a permutation, the cut is found on the right points
    p = np.random.default_rng(0).permutation(8)
    B = np.eye(8)
    B[:5, :5] = A
    B = B[np.ix_(p, p)]
    (cyc, val), *_ = horn_separation(B)
    assert sorted(cyc) == sorted(int(np.flatnonzero(p == i)[0]) for i in range(5))
    assert val == pytest.approx(-1.0)
    # sampled separation on a larger matrix still finds violated cuts when they are everywhere
    assert horn_separation(np.kron(np.eye(3), A), max_subsets=2000)
    # CP matrices are never cut
    C = np.abs(np.random.default_rng(1).standard_normal((9, 20)))
    assert horn_separation(C @ C.T) == []


def _padded(B, N=5):
    A = np.eye(N)
    A[: len(B), : len(B)] = B
    return A


# One witness per cone of the chain nonneg > dnn > dnn_horn > [CP] > sdd > nndd > diagonal: a 5x5 matrix
# inside that cone and outside the next smaller one (each checked by hand in its comment).
_WITNESSES = {
    "nonneg": _padded([[1.0, 2.0], [2.0, 1.0]]),  # eigenvalue -1: not PSD
    "dnn": _cycle_matrix(0.6),  # PSD (lowest eigenvalue 1 - 1.2 cos(pi/5) = 0.029), <H, A> = -1: not CP
    "dnn_horn": np.ones((5, 5)) + 0.1 * np.eye(5),  # CP (1 1^T + 0.1 I); d_i 1.1 >= sum_{j!=i} d_j fails: not sdd
    "sdd": _padded([[1.0, 1.8], [1.8, 4.0]]),  # a PSD 2x2 block (det 0.76), row 1 not dominant: not nndd
    "nndd": _padded([[2.0, 1.0], [1.0, 2.0]]),  # diagonally dominant, not diagonal
    "diagonal": np.diag([1.0, 2.0, 3.0, 4.0, 5.0]),
}


def _in_cone(A, cone):
    """Membership of A in the cone as :func:`relax` models it, decided by Clarabel on a feasibility problem."""
    import cvxpy as cp

    from widelimit.relax.cones import _cone_constraints

    if cone == "diagonal":  # relax models Q = diag(q), q >= 0
        return bool(np.all(A == np.diag(np.diag(A))) and np.all(np.diag(A) >= 0))
    Q = cp.Variable(A.shape, symmetric=True)
    prob = cp.Problem(cp.Minimize(0), _cone_constraints(cone, Q, A.shape[0]) + [Q == A])
    prob.solve(solver="CLARABEL")
    assert prob.status in ("optimal", "infeasible"), prob.status
    inside = prob.status == "optimal"
    if cone == "dnn_horn":  # the cuts relax adds by separation: every violated Horn inequality is one
        inside = inside and horn_separation(A) == []
    return inside


def test_cone_lists_follow_the_nesting_around_cp():
    """CONES runs from the largest cone to the smallest; OUTER_CONES contain CP, INNER_CONES lie inside it.

    Checked on membership of witness matrices, not on the lists themselves: a cone listed on the wrong
    side of CP, out of order, or with wrong constraints fails here.
    """
    assert CONES == OUTER_CONES + INNER_CONES and list(_WITNESSES) == list(CONES)
    member = {(w, c): _in_cone(A, c) for w, A in _WITNESSES.items() for c in CONES}
    for i, w in enumerate(CONES):
        assert [member[w, c] for c in CONES] == [j <= i for j in range(len(CONES))], w
    cp_not_sdd = _WITNESSES["dnn_horn"]  # completely positive
    assert all(member["dnn_horn", c] for c in OUTER_CONES)  # outer: contains every CP matrix
    assert not any(member["dnn_horn", c] for c in INNER_CONES)
    assert not any(member["dnn", c] for c in INNER_CONES)  # inner: no non-CP matrix
    assert np.linalg.eigvalsh(cp_not_sdd).min() > 0 and np.linalg.eigvalsh(_WITNESSES["dnn"]).min() > 0.02
    assert np.sum(horn_matrix() * _WITNESSES["dnn"]) == pytest.approx(-1.0)


def _write(tmp_path, X):
    path = tmp_path / "x.npy"
    np.save(path, X)
    return str(path)


def test_cli_relax_json(tmp_path, capsys):
    from widelimit.cli import main

    inst = make_bench_instance("random", 10, dim=3)
    path = _write(tmp_path, inst.X)
    rc = main(["relax", path, "--lam", str(inst.lam), "--cone", "dnn", "--solver", "scs", "--json", "--refine"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("value", "status", "cone", "solver", "time_s", "exact_value", "rel_error"):
        assert k in d
    assert d["status"] == "optimal" and d["cone"] == "dnn" and d["solver"] == "SCS"
    assert d["rel_error"] < 1e-4
    assert d["refined"]["width"] == d["refined"]["exact_width"]
    rc = main(["relax", path, "--lam", str(inst.lam), "--solver", "torch", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["solver"] == "TORCH" and d["rel_error"] < 1e-5


def test_cli_relax_errors(tmp_path, capsys):
    from widelimit.cli import main

    path = _write(tmp_path, np.random.default_rng(0).standard_normal((8, 2)))
    assert main(["relax", path, "--lam", "0.5", "--solver", "torch", "--cone", "sdd"]) == 2
    assert "dnn cone only" in capsys.readouterr().err
    assert main(["relax", path, "--lam", "-1"]) == 2
    assert "lam" in capsys.readouterr().err
    assert main(["relax", path]) == 2
    assert "--lam is required" in capsys.readouterr().err
