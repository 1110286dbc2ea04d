"""The own first-order DNN solver: certified gap, agreement with the closed form and with SCS."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import widelimit as wl
from widelimit.relax.dnn import dnn_dual_bound, solve_dnn
from widelimit.exact.median import huber_value
from widelimit.relax.families import make_bench_instance
from widelimit.relax.cones import relax


@pytest.mark.parametrize("family", ["random", "rays", "collinear"])
def test_converges_to_the_closed_form(family):
    inst = make_bench_instance(family, 16, dim=3, seed=0)
    exact = wl.solve(inst.X, lam=inst.lam).value
    r = solve_dnn(inst.X, lam=inst.lam, tol=1e-7, device="cpu")
    assert r.certified and r.rel_gap <= 1e-7
    # bracket: certified lower bound <= exact <= feasible value
    assert r.lower_bound <= exact * (1 + 1e-12) and r.value >= exact * (1 - 1e-12)
    assert abs(r.value - exact) / exact <= 1e-7
    # the returned Q is feasible (PSD and nonnegative) and reproduces the value
    assert r.Q.min() >= 0 and np.linalg.eigvalsh(r.Q).min() >= -1e-10
    assert wl.q_objective(inst.X, r.Q, r.b, lam=inst.lam) == pytest.approx(r.value, rel=1e-10)


def test_momentum_certifies_anisotropic_data_the_plain_splitting_does_not_reach():
    # one coordinate 10x the others: the objective is ill-conditioned and first-order steps crawl. With
    # momentum the solver certifies 1e-6 against the closed form; the plain splitting, given four times
    # as many iterations, is still short of it (it needs about 9,000 here, the momentum about 600)
    X = wl.datasets.gaussian(40, 5, seed=1)[0] * np.array([1.0, 1.0, 1.0, 1.0, 10.0])
    exact = wl.solve(X, lam=0.5).value
    fast = solve_dnn(X, lam=0.5, tol=1e-6, device="cpu")
    assert fast.certified and fast.rel_gap <= 1e-6
    assert fast.lower_bound <= exact * (1 + 1e-12) and fast.value >= exact * (1 - 1e-12)
    assert wl.q_objective(X, fast.Q, fast.b, lam=0.5) == pytest.approx(fast.value, rel=1e-10)
    plain = solve_dnn(X, lam=0.5, tol=1e-6, device="cpu", accelerate=False, max_iter=4 * fast.n_iter)
    assert not plain.certified and plain.rel_gap > 1e-6 and plain.status == "iteration_limit"
    assert plain.lower_bound <= exact * (1 + 1e-12)  # still a valid bound
    with pytest.raises(ValueError, match=r"^accelerate must be True or False, got str 'yes'$"):
        solve_dnn(X, lam=0.5, accelerate="yes")


def test_agrees_with_scs():
    inst = make_bench_instance("random", 14, dim=3, seed=3)
    ours = solve_dnn(inst.X, lam=inst.lam, tol=1e-8)
    scs = relax(inst.X, lam=inst.lam, cone="dnn", solver="SCS", tol=1e-9)
    assert scs.ok and ours.value == pytest.approx(scs.value, rel=1e-6)


def test_fixed_bias_and_warm_start():
    inst = make_bench_instance("random", 12, dim=3, seed=1)
    b = wl.solve(inst.X, lam=inst.lam).bias - 0.2
    r = solve_dnn(inst.X, lam=inst.lam, b=b, tol=1e-8)
    assert r.certified and r.value == pytest.approx(huber_value(inst.X, b, lam=inst.lam), rel=1e-7)
    np.testing.assert_array_equal(r.b, b)
    again = solve_dnn(inst.X, lam=inst.lam, b=b, tol=1e-8, Q0=r.Q, u0=r.u, step0=r.step, check_every=1)
    assert again.certified and again.n_iter <= 3


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), N=st.integers(2, 12), n=st.integers(1, 4), lam=st.floats(0.05, 3.0))
def test_dual_bound_is_a_lower_bound_and_tight_at_the_optimum(seed, N, n, lam):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n)) * 2
    sol = wl.solve(X, lam=lam)
    # at the closed-form optimum the dual bound of the Q-problem equals the optimum (an independent formula)
    assert dnn_dual_bound(X, lam, sol.Q) == pytest.approx(sol.value, rel=1e-9, abs=1e-12)
    # anywhere else it stays below, with or without the alternating-projection rounds on the residuals
    C = np.abs(rng.standard_normal((N, N + 2)))
    Q = C @ C.T * rng.uniform(0, 1)
    for sweeps in (0, 1, 3, 20):
        assert dnn_dual_bound(X, lam, Q, sweeps=sweeps) <= sol.value * (1 + 1e-12) + 1e-12
    fixed = sol.bias + rng.standard_normal(n)
    assert dnn_dual_bound(X, lam, Q, b=fixed) <= huber_value(X, fixed, lam=lam) * (1 + 1e-12) + 1e-12


def test_psd_projection_skips_eigh_only_for_positive_definite_input():
    import torch

    from widelimit.relax.dnn import _Problem

    rng = np.random.default_rng(0)
    prob = _Problem(rng.standard_normal((30, 3)), 0.5, None, torch.device("cpu"))
    A = rng.standard_normal((30, 30))
    U = np.linalg.qr(A)[0]
    one_negative = (U * np.r_[-1e-3, rng.uniform(0.1, 2.0, 29)]) @ U.T  # a single small negative eigenvalue
    zero_rows = A @ A.T + 0.1 * np.eye(30)
    zero_rows[[3, 17], :] = 0.0  # PSD but singular (points within lam): still its own projection
    zero_rows[:, [3, 17]] = 0.0
    keep = np.setdiff1d(np.arange(30), [3, 17])
    U28 = np.linalg.qr(rng.standard_normal((28, 28)))[0]
    bad_rows = np.zeros((30, 30))
    bad_rows[np.ix_(keep, keep)] = (U28 * np.r_[-1e-3, rng.uniform(0.1, 2.0, 27)]) @ U28.T
    cases = ((A @ A.T + 0.1 * np.eye(30), True), (A + A.T, False), (one_negative, False), (zero_rows, True),
             (bad_rows, False), (np.zeros((30, 30)), True))
    for Z, pd in cases:
        out, identity = prob.psd_project(torch.as_tensor(Z))
        w, V = np.linalg.eigh(0.5 * (Z + Z.T))
        ref = (V * np.maximum(w, 0)) @ V.T
        assert identity == pd
        np.testing.assert_allclose(out.numpy(), ref, atol=1e-10 * np.abs(Z).max())


def test_threads_option():
    import torch

    X = np.random.default_rng(0).standard_normal((12, 3))
    before = torch.get_num_threads()
    seen = []
    solve_dnn(X, lam=0.5, device="cpu", threads=1, progress=lambda e: seen.append(torch.get_num_threads()),
              check_every=1, tol=1e-12, max_iter=3)
    assert seen and set(seen) == {1} and torch.get_num_threads() == before
    with pytest.raises(TypeError, match="num_threads"):  # the deprecated name is gone
        solve_dnn(X, lam=0.5, device="cpu", num_threads=1)
    with pytest.raises(ValueError, match=r"^threads must be an integer >= 1 and at most 4 per usable core or None, got 0$"):
        solve_dnn(X, lam=0.5, threads=0)


def test_bad_input():
    X = np.random.default_rng(0).standard_normal((5, 2))
    with pytest.raises(ValueError, match="lam"):
        solve_dnn(X, lam=-1.0)
    with pytest.raises(ValueError, match="Q0"):
        solve_dnn(X, lam=0.5, Q0=np.eye(4))
    with pytest.raises(ValueError, match="positive definite"):
        dnn_dual_bound(X, 0.5, -np.eye(5))


def test_cuda_request_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        solve_dnn(np.ones((3, 2)), lam=0.5, device="cuda")


@pytest.mark.gpu
def test_gpu_matches_cpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    inst = make_bench_instance("random", 30, dim=4, seed=2)
    a = solve_dnn(inst.X, lam=inst.lam, tol=1e-7, device="cpu")
    g = solve_dnn(inst.X, lam=inst.lam, tol=1e-7, device="cuda")
    assert g.certified and g.device.startswith("cuda")
    assert g.value == pytest.approx(a.value, rel=1e-7)
