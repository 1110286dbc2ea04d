"""The coding entry point optimal_codes(algorithm=...): every algorithm against cvxpy (Clarabel) and against each
other, the certified gap is a true bound, the float32 products give the exact float64 maximum, the default
algorithm choice, the thread limiter, certify_sae's progress events and fit's time budget."""

from __future__ import annotations

import numpy as np
import pytest

import widelimit as wl
from widelimit.coding import GRAM_LIMIT, choose_algorithm, optimal_codes
from widelimit.engine.local import Progress


def _problem(seed, N=12, n=6, k=15):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((k, n)) * rng.uniform(0.3, 2.0, (k, 1))  # non-unit atoms
    X = rng.standard_normal((N, n)) * 2.0
    b = 0.3 * rng.standard_normal(n)
    return X, W, b


def _cvxpy_values(X, W, b, lam):
    """Per-point optimum of ||z W + b - x||^2 + 2 lam sum_d z_d ||w_d||, z >= 0, by Clarabel."""
    import cvxpy as cp

    norms = np.linalg.norm(W, axis=1)
    out = []
    for x in X:
        z = cp.Variable(W.shape[0], nonneg=True)
        prob = cp.Problem(cp.Minimize(cp.sum_squares(W.T @ z + b - x) + 2 * lam * norms @ z))
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
        out.append(prob.value)
    return np.array(out)


@pytest.mark.parametrize("algorithm", ["cd", "working_set", "fista"])
@pytest.mark.parametrize("lam", [0.2, 1.0])
def test_each_algorithm_matches_cvxpy_and_its_gap_is_a_true_bound(algorithm, lam):
    X, W, b = _problem(1)
    ref = _cvxpy_values(X, W, b, lam)
    res = optimal_codes(X, W, b, lam=lam, algorithm=algorithm, tol=1e-10, device="cpu")
    assert res.certified
    np.testing.assert_allclose(res.point_values, ref, rtol=1e-7)
    # certified: P_i - gap_i <= optimum_i <= P_i (cvxpy's optimum is accurate to ~1e-9)
    assert np.all(res.point_values - res.point_gaps <= ref + 1e-8 * np.maximum(ref, 1))
    # the codes reproduce the reported values (objective recomputed independently)
    Z = res.codes.toarray()
    P = ((Z @ W + b - X) ** 2).sum(1) + 2 * lam * Z @ np.linalg.norm(W, axis=1)
    np.testing.assert_allclose(P, res.point_values, rtol=1e-10)


def test_cd_matches_fista_on_a_wide_dictionary_with_a_warm_start():
    rng = np.random.default_rng(3)
    k, n, N, lam = 300, 40, 150, 0.4
    W = rng.standard_normal((k, n)) * rng.uniform(0.5, 2.0, (k, 1))
    X = 2.0 * rng.standard_normal((N, n))
    b = 0.1 * rng.standard_normal(n)
    Z0 = np.maximum(rng.standard_normal((N, k)) - 2.0, 0.0)  # a poor, sparse warm start
    a = optimal_codes(X, W, b, lam=lam, algorithm="cd", tol=1e-11, Z0=Z0, batch_size=64)
    f = optimal_codes(X, W, b, lam=lam, algorithm="fista", tol=1e-11, device="cpu", dtype="float64", max_iter=50000)
    assert a.certified and f.certified
    np.testing.assert_allclose(a.point_values, f.point_values, rtol=1e-9)
    # strictly convex in the codes here (n >= support size): the codes agree too
    np.testing.assert_allclose(a.codes.toarray(), f.codes.toarray(), atol=1e-4)


def test_unconverged_cd_still_certifies_a_true_bound():
    X, W, b = _problem(5, N=20, n=8, k=40)
    lam = 0.3
    ref = _cvxpy_values(X, W, b, lam)
    from widelimit.coding.cd import GramCoder

    norms = np.linalg.norm(W, axis=1)
    coder = GramCoder(W / norms[:, None], lam=lam, tol=1e-12, max_rounds=1, max_sweeps=1, newton_every=0)
    out = coder.solve(X - b)
    assert not out.certified and out.unconverged_rows().size > 0  # stopped early on purpose
    assert np.all(out.point_values - out.point_gaps <= ref + 1e-8)
    assert np.all(out.point_values >= ref - 1e-8)


@pytest.mark.parametrize("gram_updates", [True, False])
def test_both_certificate_paths_match_cvxpy_over_several_rounds(gram_updates):
    # a poor warm start and a tight tolerance: several working-set rounds, each certified either from the
    # Gram updates of the correlations or from a new product R U^T (float32 with the exact maximum)
    from widelimit.coding.cd import GramCoder

    X, W, b = _problem(11, N=25, n=20, k=60)
    lam = 0.3
    ref = _cvxpy_values(X, W, b, lam)
    U = W / np.linalg.norm(W, axis=1, keepdims=True)
    Y0 = np.maximum(np.random.default_rng(2).standard_normal((25, 60)) - 1.5, 0.0)
    coder = GramCoder(U, lam=lam, tol=1e-11, ws_extra=3, gram_updates=gram_updates, fast_products=True)
    out = coder.solve(X - b, Y0)
    assert out.n_iter >= 3 and out.certified and out.unconverged_rows().size == 0
    assert (out.correlations is not None) == gram_updates
    np.testing.assert_allclose(out.point_values, ref, rtol=1e-8)
    assert np.all(out.point_values - out.point_gaps <= ref + 1e-9 * np.maximum(ref, 1))
    Y = out.codes.toarray()
    np.testing.assert_allclose(((X - b - Y @ U) ** 2).sum(1) + 2 * lam * Y.sum(1), out.point_values, rtol=1e-12)
    np.testing.assert_allclose(out.residuals, X - b - Y @ U, atol=1e-12)
    assert out.value == pytest.approx(out.point_values.mean(), rel=1e-15)


def test_gram_updated_correlations_stay_within_their_rounding_bound():
    # every entry of the correlations the rounds maintain by c <- c - delta G is compared with the exact
    # rational value <u_d, xt - y U> of the returned codes; the bound cerr must cover the difference
    from fractions import Fraction

    from widelimit.coding.cd import GramCoder

    rng = np.random.default_rng(5)
    m, n, k, lam = 12, 10, 30, 0.2
    U = rng.standard_normal((k, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    xt = 3.0 * rng.standard_normal((m, n))
    Y0 = np.maximum(rng.standard_normal((m, k)) - 1.0, 0.0)
    out = GramCoder(U, lam=lam, tol=1e-12, ws_extra=4, gram_updates=True).solve(xt, Y0)
    assert out.n_iter >= 2
    Y = out.codes.toarray()
    Uf = [[Fraction(v) for v in row] for row in U]
    err = np.zeros((m, k))
    for i in range(m):
        r = [Fraction(xt[i, j]) - sum(Fraction(Y[i, d]) * Uf[d][j] for d in range(k) if Y[i, d]) for j in range(n)]
        for d in range(k):
            err[i, d] = abs(float(Fraction(out.correlations[i, d]) - sum(Uf[d][j] * r[j] for j in range(n))))
    assert np.all(err <= out.correlation_error[:, None])
    assert err.max() > 0  # rounding happened: a zero bound would fail
    assert out.correlation_error.max() < 1e-11  # and the bound is not vacuous


def test_float32_products_give_the_exact_float64_maximum():
    from widelimit.coding.cd import _exact_max

    rng = np.random.default_rng(7)
    U = rng.standard_normal((500, 64))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    # residuals with many near-ties: the maximum is shared by several atoms up to 1e-9
    R = rng.standard_normal((30, 64))
    R[:, :] += 3.0 * U[0]
    U[1:6] = U[0] + 1e-9 * rng.standard_normal((5, 64))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    C32 = R.astype(np.float32) @ U.astype(np.float32).T
    out = np.empty(30)
    _exact_max(C32, R, U, np.arange(30), 1.01 * (64 + 3) * 2.0 ** -24, out)
    np.testing.assert_allclose(out, (R @ U.T).max(1), rtol=1e-14)
    assert not np.allclose(C32.max(1).astype(np.float64), (R @ U.T).max(1), rtol=1e-12)


def test_default_algorithm_choice_and_bad_names():
    import torch

    assert choose_algorithm(4096, "cpu") == "cd"
    assert choose_algorithm(GRAM_LIMIT + 1, torch.device("cpu")) == "fista"
    assert choose_algorithm(256, torch.device("cuda", 0)) == "fista"
    X, W, b = _problem(2)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        optimal_codes(X, W, b, lam=0.5, algorithm="lbfgs")
    with pytest.raises(TypeError):
        optimal_codes(X, W, b, 0.5)  # lam is keyword-only
    # the public name is the entry point, and "auto" on the CPU gives the cd result
    assert wl.optimal_codes is optimal_codes
    a = optimal_codes(X, W, b, lam=0.5, device="cpu", tol=1e-10)
    c = optimal_codes(X, W, b, lam=0.5, algorithm="cd", tol=1e-10)
    np.testing.assert_array_equal(a.point_values, c.point_values)


def test_thread_limiter_sets_and_restores_all_pools(monkeypatch):
    import numba
    import torch
    from threadpoolctl import threadpool_info

    from widelimit._runtime import default_threads, limit_threads

    before = (torch.get_num_threads(), numba.get_num_threads())
    with limit_threads(1):
        assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1
        assert all(i["num_threads"] == 1 for i in threadpool_info())
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        limit_threads(0)
    monkeypatch.setenv("WIDELIMIT_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("WIDELIMIT_THREADS", "x")
    with pytest.raises(ValueError, match="WIDELIMIT_THREADS"):
        default_threads()
    monkeypatch.delenv("WIDELIMIT_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert default_threads() == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (16.0, 16.0, 16.0))  # overloaded by other processes
    assert default_threads() == 1
    # three runnable processes on two cores: two threads made the screened coder 5x slower (a load of 3.4-5)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    assert default_threads() == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (2.9, 2.9, 2.9))  # one of our own runs on both cores
    assert default_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's count for the OpenMP pools is kept
    assert default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    assert default_threads() == 2


def test_blas_threads_override_only_numpys_blas(monkeypatch):
    import numba
    import torch
    from threadpoolctl import threadpool_info

    from widelimit._runtime import limit_threads

    def blas():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = (torch.get_num_threads(), numba.get_num_threads(), blas())
    with limit_threads(2, blas_threads=1):
        assert (torch.get_num_threads(), numba.get_num_threads()) == (2, min(2, numba.config.NUMBA_NUM_THREADS))
        assert blas() and set(blas()) == {1}
    assert (torch.get_num_threads(), numba.get_num_threads(), blas()) == before
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="blas_threads must be a positive integer"):
            limit_threads(2, blas_threads=bad)


def test_certify_progress_events_and_algorithms_agree():
    from fixtures.saes import orthogonal_rays_sae

    X, sae = orthogonal_rays_sae(0.5, seed=4)
    events = []
    cert = wl.certify_sae(X, sae, lam=0.5, device="cpu", batch_size=7, progress=events.append, threads=1)
    mine = [e for e in events if e.stage == "certify"]
    assert all(isinstance(e, Progress) for e in events)
    assert [e.rows_done for e in mine] == list(range(7, X.shape[0], 7)) + [X.shape[0]]
    assert all(e.rows_total == X.shape[0] for e in mine) and mine[-1].done and not mine[0].done
    assert len(events) > len(mine)  # the wide-limit bound reports its passes too
    other = wl.certify_sae(X, sae, lam=0.5, device="cpu", coding_algorithm="fista")
    assert abs(cert.optimal_code_objective - other.optimal_code_objective) <= cert.coding_gap + other.coding_gap + 1e-12
    with pytest.raises(ValueError, match="coding_algorithm"):
        wl.certify_sae(X, sae, lam=0.5, device="cpu", coding_algorithm="newton")


def test_fit_stops_for_the_time_budget_before_the_final_coding():
    from widelimit.learn import gradient

    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 5))
    seen = []
    real = gradient._Reporter

    class Spy(real):
        def __init__(self, rtol, window, time_limit, *a, **kw):
            seen.append(time_limit)
            super().__init__(rtol, window, time_limit, *a, **kw)

    gradient._Reporter = Spy
    try:
        fit = wl.fit_dictionary(X, lam=0.5, width=4, time_limit=1e-6, device="cpu")
    finally:
        gradient._Reporter = real
    assert fit.stop_reason == "time_limit"
    assert seen == [pytest.approx((1 - gradient._FINAL_SHARE) * 1e-6)]


def test_cd_time_budget_returns_certified_codes():
    X, W, b = _problem(6, N=30, n=8, k=40)
    lam = 0.3
    ref = optimal_codes(X, W, b, lam=lam, algorithm="fista", tol=1e-12, device="cpu", dtype="float64",
                        max_iter=50000)
    spent = optimal_codes(X, W, b, lam=lam, algorithm="cd", tol=1e-12, time_limit=0.0)  # no round may start
    assert spent.n_iter == 0 and not spent.certified and spent.codes.nnz == 0
    # the zero codes' gap is still a true bound on their suboptimality
    assert np.all(spent.point_values - spent.point_gaps <= ref.point_values + 1e-9)
    np.testing.assert_allclose(spent.point_values, ((X - b) ** 2).sum(1), rtol=1e-12)


def test_nested_thread_limits_keep_the_callers_choice():
    import torch

    from widelimit._runtime import limit_threads, with_thread_limit

    seen = []

    @with_thread_limit
    def solver():
        seen.append(torch.get_num_threads())

    with limit_threads(1):
        solver()  # the solver's default does not undo the caller's one thread
        with limit_threads(2):
            solver()
        assert torch.get_num_threads() == 1
    assert seen == [1, 2]


def test_torch_products_accept_read_only_arrays_without_a_warning():
    # widelimit._runtime.matmul hands numpy arrays to torch; a read-only one (a memory map) must be copied,
    # not shared with a "not writable" warning. torch warns once per process: checked in a fresh one
    import subprocess
    import sys

    code = ("import numpy as np; from widelimit._runtime import matmul; A = np.arange(12.).reshape(3, 4);"
            "A.flags.writeable = False; print(np.array_equal(matmul(A, A.T), A @ A.T))")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-500:]
