"""Optimal nonnegative coding for a fixed dictionary: checked against cvxpy, sklearn and closed forms."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from widelimit import sae_objective
from widelimit.coding import CodingResult
from widelimit.coding.fista import fista_codes as optimal_codes


def _problem(rng, N=30, k=12, n=6, scale=True):
    X = rng.standard_normal((N, n)) * 2.0
    W = rng.standard_normal((k, n))
    if scale:
        W *= rng.uniform(0.3, 3.0, (k, 1))  # non-unit atoms: norms fold into the penalty
    b = 0.3 * rng.standard_normal(n)
    return X, W, b


def _cvxpy_codes(X, W, b, lam):
    import cvxpy as cp

    N, k = X.shape[0], W.shape[0]
    Z = cp.Variable((N, k), nonneg=True)
    norms = np.linalg.norm(W, axis=1)
    obj = cp.sum_squares(Z @ W + np.ones((N, 1)) @ b[None, :] - X) + 2 * lam * cp.sum(Z @ norms)
    prob = cp.Problem(cp.Minimize(obj / N))
    prob.solve(solver=cp.CLARABEL)
    return prob.value, Z.value


def test_matches_cvxpy_with_nonunit_atoms(rng):
    X, W, b = _problem(rng)
    lam = 0.7
    ref, Zref = _cvxpy_codes(X, W, b, lam)
    res = optimal_codes(X, W, b, lam=lam, tol=1e-9, device="cpu")
    assert isinstance(res, CodingResult) and res.certified
    assert res.value == pytest.approx(ref, rel=1e-7)
    # the certified lower bound really is below the optimum, and tight
    assert res.lower_bound <= ref + 1e-9 * ref
    assert res.gap <= 1e-8 * res.value
    # value is the objective of the returned codes, evaluated independently
    assert res.value == pytest.approx(sae_objective(X, W, res.codes, b, lam=lam).value, rel=1e-12)
    np.testing.assert_allclose(res.codes.toarray(), Zref, atol=1e-5)


def test_matches_sklearn_sparse_encode(rng):
    from sklearn.decomposition import sparse_encode

    X, W, b = _problem(rng, N=80, k=40, n=16, scale=False)
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    lam = 0.4
    # sklearn: 0.5||x - zW||^2 + alpha||z||_1 per point -> same minimiser for alpha = lam
    Zsk = sparse_encode(X - b, W, positive=True, algorithm="lasso_cd", alpha=lam, max_iter=10000)
    ref = sae_objective(X, W, Zsk, b, lam=lam).value
    res = optimal_codes(X, W, b, lam=lam, tol=1e-8, device="cpu")
    assert res.certified
    assert res.value <= ref * (1 + 1e-7)
    assert res.lower_bound <= ref
    assert res.value == pytest.approx(ref, rel=1e-6)
    np.testing.assert_allclose(res.codes.toarray(), Zsk, atol=1e-4)


def test_orthonormal_dictionary_closed_form(rng):
    n = 5
    Qm = np.linalg.qr(rng.standard_normal((n, n)))[0]
    s = np.array([1.0, 2.0, 0.5, 3.0, 1.5])
    W = Qm * s[:, None]  # orthogonal atoms of different norms
    X = 3 * rng.standard_normal((40, n))
    b = rng.standard_normal(n)
    lam = 0.8
    Zexact = np.maximum((X - b) @ Qm.T - lam, 0.0) / s  # soft threshold per orthonormal coordinate
    res = optimal_codes(X, W, b, lam=lam, tol=1e-10, device="cpu")
    # float32 codes: the gap is quadratic in the code error, so codes are good to ~1e-7 relative
    np.testing.assert_allclose(res.codes.toarray(), Zexact, rtol=1e-5, atol=1e-6)
    assert res.certified and res.max_gap <= 1e-10 * max(res.point_values.max(), lam**2)
    res64 = optimal_codes(X, W, b, lam=lam, tol=1e-12, device="cpu", dtype="float64")
    np.testing.assert_allclose(res64.codes.toarray(), Zexact, rtol=1e-12, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), iters=st.integers(1, 30), lam=st.floats(0.05, 3.0))
def test_lower_bound_is_valid_even_when_not_converged(seed, iters, lam):
    r = np.random.default_rng(seed)
    X, W, b = _problem(r, N=12, k=9, n=4)
    exact = optimal_codes(X, W, b, lam=lam, tol=1e-11, device="cpu", dtype="float64")
    rough = optimal_codes(X, W, b, lam=lam, tol=1e-12, max_iter=iters, device="cpu")
    opt = exact.value  # within 1e-11 relative of the optimum
    assert rough.value - rough.gap <= opt * (1 + 1e-9) + 1e-12
    assert rough.value >= exact.lower_bound - 1e-12
    assert np.all(rough.point_gaps >= 0)
    assert rough.codes.min() >= 0


def test_batches_warm_start_and_options(rng):
    X, W, b = _problem(rng, N=53, k=10, n=5)
    lam = 0.5
    full = optimal_codes(X, W, b, lam=lam, tol=1e-9, device="cpu")
    small = optimal_codes(X.astype(np.float32), W, b, lam=lam, tol=1e-9, device="cpu", batch_size=7)
    assert full.certified and small.certified
    assert small.value == pytest.approx(full.value, rel=1e-6)
    # warm start at the solution: certified at the first check, no iterations
    warm = optimal_codes(X, W, b, lam=lam, tol=1e-6, device="cpu", Z0=full.codes)
    assert warm.n_iter == 0 and warm.certified
    dense = optimal_codes(X, W, b, lam=lam, tol=1e-6, device="cpu", Z0=full.codes.toarray())
    assert dense.n_iter == 0
    none = optimal_codes(X, W, b, lam=lam, device="cpu", return_codes=False)
    assert none.codes is None and none.value == pytest.approx(full.value, rel=1e-6)
    seen = []
    optimal_codes(X, W, b, lam=lam, device="cpu", batch_size=20, progress=lambda e: seen.append((e.stage, e.rows_done, e.rows_total, e.done)))
    assert seen == [("optimal codes", 20, 53, False), ("optimal codes", 40, 53, False), ("optimal codes", 53, 53, True)]
    assert full.as_dict()["nnz"] == full.codes.nnz
    assert isinstance(full.codes, sp.csr_array) and full.codes.shape == (53, 10)


def test_zero_atoms_and_empty_dictionary(rng):
    X, W, b = _problem(rng, N=20, k=6, n=4)
    W[2] = 0.0
    res = optimal_codes(X, W, b, lam=0.3, tol=1e-9, device="cpu")
    assert res.codes[:, [2]].nnz == 0
    empty = optimal_codes(X, np.zeros((0, 4)), b, lam=0.3, device="cpu")
    assert empty.codes.shape == (20, 0)
    assert empty.value == pytest.approx(np.mean(np.sum((X - b) ** 2, axis=1)))
    assert empty.gap == pytest.approx(0.0, abs=1e-12)


def test_bad_input(rng):
    X, W, b = _problem(rng, N=10, k=4, n=3)
    with pytest.raises(ValueError, match="lam"):
        optimal_codes(X, W, b, lam=0.0)
    Xn = X.copy()
    Xn[4, 1] = np.nan
    with pytest.raises(ValueError, match="row 4"):
        optimal_codes(Xn, W, b, lam=0.5)
    with pytest.raises(ValueError, match="columns"):
        optimal_codes(X, W[:, :2], b, lam=0.5)
    with pytest.raises(ValueError, match="b has length"):
        optimal_codes(X, W, b[:2], lam=0.5)
    with pytest.raises(ValueError, match="tol"):
        optimal_codes(X, W, b, lam=0.5, tol=0)
    with pytest.raises(ValueError, match="Z0"):
        optimal_codes(X, W, b, lam=0.5, Z0=-np.ones((10, 4)))
    with pytest.raises(ValueError, match="dtype"):
        optimal_codes(X, W, b, lam=0.5, dtype="float16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            optimal_codes(X, W, b, lam=0.5, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu(rng):
    X, W, b = _problem(rng, N=500, k=64, n=16)
    cpu = optimal_codes(X, W, b, lam=0.5, tol=1e-8, device="cpu")
    gpu = optimal_codes(X, W, b, lam=0.5, tol=1e-8, device="cuda")
    assert gpu.device.startswith("cuda") and gpu.certified
    assert gpu.value == pytest.approx(cpu.value, rel=1e-7)
    assert gpu.lower_bound <= cpu.value * (1 + 1e-9)
