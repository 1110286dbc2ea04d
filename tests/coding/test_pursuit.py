"""Codes at a sparsity budget (widelimit.coding.pursuit, widelimit.coding.sparse_bound; theory.md §10): the witness
against brute-force enumeration with scipy's NNLS, the lower bounds against the exact optimum, and the pursuit
against dictionary_learning's grad_pursuit on the decoders of the real libraries' SAEs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.optimize import nnls

from fixtures import libraries
from widelimit.coding._nnls import gram_batch, nnls_batch, nnls_refit
from widelimit.coding.pursuit import PursuitOptions, sparse_codes
from widelimit.coding.sparse_bound import babel


def _unit(rng, k, n):
    U = rng.standard_normal((k, n))
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def _exact(U, X, s):
    """min over supports of size s of scipy's NNLS residual (the definition of m_s, by enumeration)."""
    return np.array([min(nnls(U[list(S)].T, x)[1] ** 2 for S in itertools.combinations(range(len(U)), s)) for x in X])


@pytest.mark.parametrize("solver", ["batched", "refit"])  # the batched active set; the refit's numba CD + Newton
def test_nnls_batch_matches_scipy_on_random_supports(solver):
    from widelimit.coding._nnls import nnls_refit as _nnls

    rng = np.random.default_rng(0)
    U, X = _unit(rng, 7, 5), rng.standard_normal((30, 5))
    S = torch.as_tensor(np.stack([rng.choice(7, 5, replace=False) for _ in range(30)]))
    valid = torch.as_tensor(rng.random((30, 5)) < 0.8)  # (masked slots anywhere in a support, not only last)
    G, q = gram_batch(torch.as_tensor(U)[S], torch.as_tensor(X), valid)
    y = (nnls_batch(G, q, valid) if solver == "batched" else _nnls(G, q, valid, torch.as_tensor(X))).numpy()
    for i in range(30):
        cols = S[i][valid[i]].numpy()
        want = nnls(U[cols].T, X[i])[0] if cols.size else np.zeros(0)
        np.testing.assert_allclose(y[i][valid[i].numpy()], want, atol=1e-10)
        assert np.all(y[i][~valid[i].numpy()] == 0)


@pytest.mark.parametrize("s", [1, 2, 3])
def test_bracket_contains_the_enumerated_optimum(s):
    rng = np.random.default_rng(s)
    U, X = _unit(rng, 9, 5), rng.standard_normal((25, 5)) + 0.5
    b = rng.standard_normal(5) * 0.1
    res = sparse_codes(X, 2.0 * U, b, budget=s, device="cpu")  # decoder rows of norm 2: codes in its units
    exact = _exact(U, X - b, s)
    assert np.all(res.point_values >= exact - 1e-9)  # a witness is never below the optimum
    assert np.all(res.point_bounds <= exact + 1e-12)
    np.testing.assert_allclose(res.point_bounds, exact, rtol=1e-9, atol=1e-12)  # s <= 1 exact, else enumeration
    # the codes are the witness: their MSE recomputed from scratch, and they respect the budget
    R = X - b - res.codes @ (2.0 * U)
    np.testing.assert_allclose((R * R).sum(1), res.point_values, rtol=1e-12)
    assert np.diff(res.codes.indptr).max() <= s and res.codes.data.min() > 0
    assert np.mean(res.point_values <= exact + 1e-9) >= 0.9  # the pursuit finds the optimum on most tokens


def _random_start(seed, N, k=40, n=12, s=4):
    """Unit atoms, random tokens and random start codes of ``s`` atoms per token."""
    rng = np.random.default_rng(seed)
    U, X = _unit(rng, k, n), rng.standard_normal((N, n))
    Z0 = np.zeros((N, k))
    for i in range(N):
        Z0[i, rng.choice(k, s, replace=False)] = rng.exponential(size=s)
    return U, X, Z0, n, s


def test_warm_start_is_never_worse_than_its_start():
    U, X, Z0, n, s = _random_start(3, 60)
    res = sparse_codes(X, U, np.zeros(n), budget=s, Z0=Z0, opts=PursuitOptions(max_iter=0, cold_start=False),
                       device="cpu")
    R0 = X - Z0 @ U
    own = (R0 * R0).sum(1)
    assert res.start_value == pytest.approx(own.mean(), rel=1e-12)
    assert np.all(res.point_values <= own * (1 + 1e-12))
    assert np.mean(res.point_values < own * (1 - 1e-6)) > 0.9  # the NNLS refit improves random codes


def test_a_spent_time_budget_keeps_the_start_codes_without_refitting(monkeypatch):
    """The time budget covers the refit of the start's support too (a ReLU SAE's ~150-atom supports made that
    refit alone 10x the rest of a certification): with the budget spent before the pursuit, no NNLS runs and the
    witness is exactly the start's codes or the empty code, whichever is better (their MSE computed here); with
    time, the refit improves them."""
    import widelimit.coding.pursuit as pursuit

    U, X, Z0, n, s = _random_start(7, 30)
    own = ((X - Z0 @ U) ** 2).sum(1)
    calls = []
    monkeypatch.setattr(pursuit, "nnls_refit", lambda *a, **kw: calls.append(1) or nnls_refit(*a, **kw))
    opts = PursuitOptions(max_iter=0, cold_start=False, grad_start=False)
    spent = sparse_codes(X, U, np.zeros(n), budget=s, Z0=Z0, opts=opts, device="cpu", time_limit=0.0)
    assert calls == []
    # the start's codes, or the empty code (also within budget) where random start codes are worse than it
    np.testing.assert_allclose(spent.point_values, np.minimum(own, (X * X).sum(1)), rtol=1e-12)
    timed = sparse_codes(X, U, np.zeros(n), budget=s, Z0=Z0, opts=opts, device="cpu")
    assert calls and np.mean(timed.point_values < own * (1 - 1e-6)) > 0.9


def test_restricted_eigenvalue_bound_below_the_optimum_and_nontrivial():
    rng = np.random.default_rng(4)
    k, n, s = 24, 400, 2  # nearly orthogonal atoms: mu_1(1) << 1
    U = _unit(rng, k, n)
    Z = np.zeros((4, k))
    for i in range(4):
        Z[i, rng.choice(k, s, replace=False)] = 1.0 + rng.random(s)
    X = Z @ U + 0.1 * rng.standard_normal((4, n))  # s-sparse tokens plus noise spread over 400 dimensions
    mu = babel(torch.as_tensor(U), s)
    G = np.abs(U @ U.T) - np.eye(k)
    assert mu[2] == pytest.approx(G.max(), abs=1e-12)
    res = sparse_codes(X, U, np.zeros(n), budget=s, max_subsets=10, device="cpu")
    assert "restricted eigenvalue" in res.status
    exact = _exact(U, X, s)
    assert np.all(res.point_bounds <= exact)
    assert np.all(res.point_bounds >= 0.3 * exact)  # and not far below it on this near-orthogonal dictionary


def test_no_bound_is_claimed_for_a_coherent_dictionary():
    rng = np.random.default_rng(5)
    U = _unit(rng, 200, 8)  # 200 atoms in 8 dimensions: mu_1(s-1) > 1, C(200, 6) supports
    res = sparse_codes(rng.standard_normal((10, 8)), U, np.zeros(8), budget=6, device="cpu")
    assert res.lower_bound == 0.0 and res.status.startswith("none") and not res.certified
    assert res.value > 0


def _sparse_data(W, b, k, N, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(W.shape[0], generator=g)[:k] for _ in range(N)])
    Z = torch.zeros(N, W.shape[0], dtype=torch.float64).scatter(1, idx, torch.rand(N, k, generator=g, dtype=torch.float64) + 0.5)
    return (Z @ W + b + 0.05 * torch.randn(N, W.shape[1], generator=g, dtype=torch.float64)).numpy()


def _library_saes():
    """Decoders of TopK SAEs built by the libraries themselves (SAELens, sparsify, dictionary_learning)."""
    out = []
    torch.manual_seed(0)
    try:
        sl = libraries.sae_lens()
        m = sl.TopKSAE(sl.TopKSAEConfig(d_in=16, d_sae=48, k=4, dtype="float64"))
        out.append(("sae_lens", m, 4))
    except pytest.skip.Exception:
        pass
    try:
        spz = libraries.sparsify()
        out.append(("sparsify", spz.SparseCoder(16, spz.SparseCoderConfig(num_latents=48, k=4), dtype=torch.float64), 4))
    except pytest.skip.Exception:
        pass
    try:
        _, topk, _, _ = libraries.dictionary_learning()
        out.append(("dictionary_learning", topk.AutoEncoderTopK(16, 48, 4).double(), 4))
    except pytest.skip.Exception:
        pass
    return out


def test_grad_pursuit_never_finds_better_codes_on_library_saes():
    gp = libraries.grad_pursuit()
    from widelimit.sae.formats import as_sae

    saes = _library_saes()
    if not saes:
        pytest.skip("no SAE library installed")
    for name, m, k in saes:
        sae = as_sae(m)
        W, b = torch.as_tensor(sae.W_dec, dtype=torch.float64), torch.as_tensor(sae.b_dec, dtype=torch.float64)
        X = _sparse_data(W, b, k, 150, seed=1)
        Z0 = sp.csr_array(sae.encode(X))
        res = sparse_codes(X, sae.W_dec, sae.b_dec, budget=k, Z0=Z0, device="cpu")
        # the library's own call (float32, as it allocates its codes): signal b x d, dictionary d x n
        w = gp.grad_pursuit((torch.as_tensor(X) - b).float(), W.T.float(), target_l0=k).double()
        assert int((w > 0).sum(1).max()) <= k
        r = torch.as_tensor(X) - b - w @ W
        theirs = (r * r).sum(1).numpy()
        own = ((X - sae.decode(Z0.toarray())) ** 2).sum(1)
        assert res.value <= theirs.mean(), name
        assert res.value <= own.mean(), name
        assert np.all(res.point_values <= theirs * (1 + 1e-10)), name  # on every token, not on average
        assert math.isfinite(res.lower_bound)


def _grad_pursuit_per_budget(gp, X, W, b, budget):
    """dictionary_learning's grad_pursuit, called as the library allocates it (float32), on the tokens of each
    budget with that target_l0; the per-token MSE of its codes, evaluated in float64."""
    mse = np.empty(len(X))
    for s in np.unique(budget):
        i = np.flatnonzero(budget == s)
        w = gp.grad_pursuit(torch.as_tensor(X[i] - b).float(), torch.as_tensor(W.T).float(), target_l0=int(s)).double()
        assert int((w > 0).sum(1).max()) <= s
        r = X[i] - b - w.numpy() @ W
        mse[i] = (r * r).sum(1)
    return mse


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_token_where_grad_pursuit_is_better_per_token_budgets_uneven_norms(seed):
    """A BatchTopK-like SAE: per-token budgets (1..6) and decoder rows of norms 0.3..3, which grad_pursuit's
    choices weigh (it correlates with the raw rows). Without the gradient-pursuit start widelimit's witness
    loses a few tokens to it (the check that this test can fail); with it, none."""
    gp = libraries.grad_pursuit()
    rng = np.random.default_rng(seed)
    d, n, N = 48, 16, 300
    W = _unit(rng, d, n) * rng.uniform(0.3, 3.0, d)[:, None]
    b = 0.1 * rng.standard_normal(n)
    budget = rng.integers(1, 7, N)
    Z = np.zeros((N, d))
    for i in range(N):
        Z[i, rng.choice(d, budget[i], replace=False)] = rng.uniform(0.5, 1.5, budget[i])
    X = Z @ W + b + 0.05 * rng.standard_normal((N, n))
    theirs = _grad_pursuit_per_budget(gp, X, W, b, budget)
    res = sparse_codes(X, W, b, budget=budget, opts=PursuitOptions(max_iter=2), device="cpu")
    R = X - b - res.codes @ W
    np.testing.assert_allclose((R * R).sum(1), res.point_values, rtol=1e-12)  # the witness, recomputed
    assert np.all(np.diff(res.codes.indptr) <= budget)
    assert np.all(res.point_values <= theirs * (1 + 1e-10))
    assert res.value < theirs.mean()
    without = sparse_codes(X, W, b, budget=budget, opts=PursuitOptions(max_iter=2, grad_start=False), device="cpu")
    assert np.any(without.point_values > theirs * (1 + 1e-6))


def test_a_token_bound_above_its_witness_is_an_error_not_clipped(monkeypatch):
    """Was: ``np.minimum(bound, mse)`` per token whatever the distance, so a wrong bound became a zero gap. Now:
    above by rounding (a small multiple of eps ||x - b||^2) the bound is the witness MSE (gap exactly 0); beyond,
    :class:`InconsistentBound` naming the token."""
    import widelimit.coding.pursuit as pu
    from widelimit.results import InconsistentBound

    rng = np.random.default_rng(4)
    U, X = _unit(rng, 6, 4), rng.standard_normal((10, 4))
    honest = sparse_codes(X, U, np.zeros(4), budget=2, device="cpu")
    real = pu.sparse_lower_bound

    def lifted(by):
        def bound(U_, xt, bt, R, **kw):
            lb, m = real(U_, xt, bt, R, **kw)
            mse = (R * R).sum(1).cpu().numpy()
            lb = lb.copy()
            lb[3] = mse[3] + by * float((xt[3] * xt[3]).sum())  # token 3 (one batch): its bound lifted above
            return lb, m
        return bound

    monkeypatch.setattr(pu, "sparse_lower_bound", lifted(1e-14))  # rounding
    r = sparse_codes(X, U, np.zeros(4), budget=2, device="cpu")
    assert r.point_bounds[3] == r.point_values[3] and np.all(r.point_bounds <= r.point_values) and r.gap >= 0
    np.testing.assert_array_equal(np.delete(r.point_bounds, 3), np.delete(honest.point_bounds, 3))
    monkeypatch.setattr(pu, "sparse_lower_bound", lifted(1e-6))  # beyond: a bound of something else
    with pytest.raises(InconsistentBound, match=r"^inconsistent result at entry 3: the sparse lower bound .* is "
                                                r"above the witness MSE of that token"):
        sparse_codes(X, U, np.zeros(4), budget=2, device="cpu")


def test_spectral_norm_sq_is_an_upper_estimate_on_a_gapless_spectrum():
    """Random unit atoms: the top of ``U^T U``'s spectrum is a Marchenko-Pastur edge with no gap, where power
    iteration stops low by more than its 1 % padding; the estimate must be the SVD's value to ~1e-5, padded."""
    from widelimit.coding._atoms import spectral_norm_sq

    rng = np.random.default_rng(0)
    for k, n in ((20000, 256), (300, 40), (5, 8)):
        U = rng.standard_normal((k, n))
        U /= np.linalg.norm(U, axis=1, keepdims=True)
        true = np.linalg.norm(U, 2) ** 2
        est = spectral_norm_sq(torch.as_tensor(U))
        assert abs(est / 1.01 / true - 1.0) < 1e-5, (k, n, est / 1.01 / true)
    assert spectral_norm_sq(torch.zeros(4, 3, dtype=torch.float64)) == 1.0



@pytest.mark.parametrize("max_iter", [0, 1, 3])
def test_witness_residuals_are_those_of_its_codes(max_iter, monkeypatch):
    # the witness's residuals are the start's or its refit's where no round reached a token (not recomputed), and
    # recomputed where one did (rounds in chunks of ROUND_ROWS tokens, here 7): either way those of the codes
    # returned, and its MSE their squared norm
    import widelimit.coding.pursuit as pursuit

    monkeypatch.setattr(pursuit, "ROUND_ROWS", 7)
    U, X, Z0, n, s = _random_start(9, 30)
    out = pursuit.pursue_batch(torch.as_tensor(U), torch.as_tensor(X), torch.full((30,), s), sp.csr_array(Z0),
                               opts=PursuitOptions(max_iter=max_iter, cold_start=False, grad_start=False))
    R = X - out["codes"].toarray() @ U
    np.testing.assert_allclose(out["residuals"].numpy(), R, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["mse"], (R * R).sum(1), rtol=1e-12)
    assert (out["rounds"] == 0) if max_iter == 0 else (1 <= out["rounds"] <= max_iter)
