"""The screened coder (widelimit/coding/screened.py) on the blocks that stalled it: cycling Newton steps, singular
active blocks. Checked against coordinate descent on the full Gram (an independent solver) and plain PDAS."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize
import torch

from widelimit.coding import optimal_codes
from widelimit.coding.screened import ScreenedCoder
from widelimit.coding.working_set import _pdas


def _pdas_supports(G, c, steps=30):
    """Supports visited by undamped primal-dual active-set steps from 0 (numpy, the textbook iteration)."""
    y, seen = np.zeros(len(c)), []
    for _ in range(steps):
        A = (y - (G @ y - c)) > 0
        seen.append(tuple(np.nonzero(A)[0]))
        y = np.zeros(len(c))
        y[A] = np.linalg.solve(G[np.ix_(A, A)], c[A])
        y = np.maximum(y, 0.0)
    return seen


def _tokens(U, m, L, rng):
    idx = rng.integers(0, U.shape[0], (m, L))
    return np.einsum("ml,mln->mn", rng.uniform(1, 3, (m, L)), U[idx]) + 0.05 * rng.standard_normal((m, U.shape[1]))


def _check(U, X, lam, res):
    ref = optimal_codes(X, U, np.zeros(U.shape[1]), lam=lam, tol=1e-13, device="cpu", algorithm="cd")
    assert res.certified
    assert np.all(res.point_gaps <= 1e-9 * res.point_values)
    np.testing.assert_allclose(res.point_values, ref.point_values, rtol=2e-9)
    Y = res.codes.toarray()
    np.testing.assert_allclose(res.point_values, ((X - Y @ U) ** 2).sum(1) + 2 * lam * Y.sum(1), rtol=1e-11)


@pytest.mark.parametrize("restricted", ["coordinate_descent", "lawson_hanson"])
def test_screened_coder_certifies_tokens_whose_newton_steps_cycle(restricted):
    # pairs of atoms at cosine ~0.999 (cond(G) ~ 8e4): the active-set Newton iteration alternates between two
    # supports for ever on most tokens. The former coder kept the Newton points regardless and repeated the same
    # round until max_rounds: 30 rounds, not certified. Newton points are now kept only where they lower the
    # restricted objective, the others take a projected gradient step, and FISTA finishes the restricted lasso.
    rng = np.random.default_rng(4)
    n, k, m, lam = 16, 12, 40, 0.05
    B = rng.standard_normal((k // 2, n))
    U = np.concatenate([B, B + 0.05 * rng.standard_normal((k // 2, n))])
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = _tokens(U, m, 4, rng)
    G = U @ U.T
    cycling = sum(len(set(_pdas_supports(G, U @ x - lam)[10:])) > 1 for x in X)
    assert cycling >= m // 2
    res = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=k, restricted=restricted).solve(torch.as_tensor(X))
    _check(U, X, lam, res)
    assert res.n_iter <= 4


@pytest.mark.parametrize("restricted", ["coordinate_descent", "lawson_hanson"])
def test_screened_coder_survives_singular_active_blocks(restricted):
    # every atom twice (u_{d + 20} = u_d) and more atoms than dimensions: the working sets hold both copies, the
    # active blocks are singular. The batched LU met zero pivots and the former coder gave up on the whole chunk's
    # Newton steps (the warm start stayed: 30 rounds, not certified); now only the failed tokens take a gradient step
    rng = np.random.default_rng(0)
    n, m, lam = 16, 30, 0.1
    V = rng.standard_normal((20, n))
    U = np.concatenate([V, V])
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = _tokens(U, m, 5, rng)
    res = ScreenedCoder(U, lam=lam, tol=1e-9, restricted=restricted).solve(torch.as_tensor(X))
    _check(U, X, lam, res)
    # the Newton steps themselves, per token: a batch of one singular block (atom 0 twice) and one regular block;
    # the regular token gets its exact solution (scipy's NNLS on the Cholesky factor), the singular one descends
    x = X[0]
    blocks = [U[[0, 20, 1, 2, 3]], U[[0, 4, 1, 2, 3]]]
    G = torch.as_tensor(np.stack([W @ W.T for W in blocks]))
    q = torch.as_tensor(np.stack([W @ x for W in blocks]))
    y = _pdas(q, G, torch.zeros(2, 5, dtype=torch.float64), lam, 8).numpy()
    L = np.linalg.cholesky(G[1].numpy())
    want = scipy.optimize.nnls(L.T, np.linalg.solve(L, q[1].numpy() - lam))[0]
    np.testing.assert_allclose(y[1], want, rtol=1e-10, atol=1e-12)
    f = (y[0] @ G[0].numpy() @ y[0]) - 2 * (q[0].numpy() - lam) @ y[0]
    assert np.all(np.isfinite(y[0])) and f < 0.0


def test_screened_coder_certifies_when_the_batched_lu_is_refused(monkeypatch):
    # MKL refused a batched LU of the restricted solve ("Parameter 6 was incorrect on entry to DLASWP", then
    # torch's "Pivots given to lu_solve must all be greater or equal to 1") on a 768 x 16,384 cell at optimal L0
    # 190 and the whole certification failed; now the block's tokens take the gradient step, and the same
    # certified optimum (checked against scipy's NNLS) is reached without any Newton step
    def refused(*a, **kw):
        raise RuntimeError("Pivots given to lu_solve must all be greater or equal to 1.")

    # (now a Cholesky factorisation, which the Newton steps call; the Lawson-Hanson finisher is left out)
    monkeypatch.setattr(torch.linalg, "cholesky_ex", refused)
    rng = np.random.default_rng(1)
    n, m, lam = 16, 20, 0.1
    U = rng.standard_normal((60, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = _tokens(U, m, 4, rng)
    res = ScreenedCoder(U, lam=lam, tol=1e-9, restricted="newton").solve(torch.as_tensor(X))
    _check(U, X, lam, res)


def test_screened_coder_grows_small_working_sets_to_a_large_support():
    # optimal supports of ~47 atoms (n = 48) reached 8 atoms a round from a cold start: a round whose codes lower
    # the objective but not (yet) the gap was dropped, and the next round rebuilt the same working set (30 rounds,
    # not certified). The working sets now grow from the codes of lower objective.
    k, n, m, lam = 400, 48, 8, 0.05
    U, X = _random_problem(0, k, n, m, 30)
    res = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=8).solve(torch.as_tensor(X))
    _check(U, X, lam, res)
    assert res.codes.nnz / m > 40


def _unit_rows(U):
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def _random_problem(seed, k, n, m, L):
    """``k`` random unit atoms in ``n`` dimensions and ``m`` tokens of ``L`` atoms each (plus noise)."""
    rng = np.random.default_rng(seed)
    U = _unit_rows(rng.standard_normal((k, n)))
    return U, _tokens(U, m, L, rng)


def test_lawson_hanson_solves_coherent_blocks_exactly_without_gradient_steps(monkeypatch):
    # a SAELens-trained ReLU SAE at d_sae 16,384 (decoder cosines up to 0.997, optimal L0 ~8): the Newton steps
    # from zero predicted nearly the whole working set (46 of 48 atoms) active and cycled, and projected
    # gradient on blocks of condition ~1e5 took ~1,700 steps per chunk (73% of the certification). Lawson and
    # Hanson's active set, from the current support, solves the block exactly: no gradient step is taken
    # (FISTA's first act, the eigenvalue bound, is never reached) and the optimum is coordinate descent's.
    rng = np.random.default_rng(7)
    n, k, m, lam = 24, 120, 30, 0.05
    B = rng.standard_normal((k // 3, n))
    U = _unit_rows(np.concatenate([B, B + 0.03 * rng.standard_normal(B.shape), B + 0.03 * rng.standard_normal(B.shape)]))
    X = _tokens(U, m, 5, rng)
    calls = []
    orig = torch.linalg.eigvalsh

    def counted(*a, **kw):
        calls.append(1)
        return orig(*a, **kw)

    monkeypatch.setattr(torch.linalg, "eigvalsh", counted)
    res = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=24, restricted="lawson_hanson").solve(torch.as_tensor(X))
    _check(U, X, lam, res)
    assert calls == []
    # coordinate descent with Newton steps per token (the CPU default) settles the same blocks by itself too
    cd = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=24, restricted="coordinate_descent").solve(torch.as_tensor(X))
    _check(U, X, lam, cd)
    assert calls == []
    newton = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=24, restricted="newton").solve(torch.as_tensor(X))
    _check(U, X, lam, newton)
    assert calls  # the Newton steps alone do not settle these blocks: the gradient iteration ran


def test_restricted_solver_is_checked():
    with pytest.raises(ValueError, match="restricted must be one of 'auto', 'coordinate_descent', 'lawson_hanson', 'newton', got str 'pdas'"):
        ScreenedCoder(np.eye(3), lam=0.1, restricted="pdas")


def test_blocks_coded_in_row_blocks_equal_one_block():
    # 2,000 tokens at once held 5-6.7 GB at d_sae 16,384 (optimal L0 190); the coder now takes block_rows at a
    # time: the same certified codes, objective and gaps as one block, rows in order
    n, k, m, lam = 16, 90, 70, 0.05
    U, X = _random_problem(2, k, n, m, 4)
    one = ScreenedCoder(U, lam=lam, tol=1e-9, block_rows=1000).solve(torch.as_tensor(X))
    blocks = ScreenedCoder(U, lam=lam, tol=1e-9, block_rows=16).solve(torch.as_tensor(X))
    _check(U, X, lam, blocks)
    np.testing.assert_allclose(blocks.point_values, one.point_values, rtol=1e-10)
    np.testing.assert_allclose(blocks.codes.toarray(), one.codes.toarray(), atol=1e-9)
    np.testing.assert_allclose(blocks.residuals, X - blocks.codes.toarray() @ U, atol=1e-12)


def test_solve_blocks_match_scipy_nnls_on_padded_blocks():
    # the per-token restricted solves of the CPU default (numba coordinate descent + Newton steps on the support)
    # on a batch of blocks of different widths, each the first slots of a padded (B, w, w) array whose padding is
    # garbage: every token's codes are scipy's NNLS solution of its own block (independent: an active-set method
    # on the Cholesky factor), to the restricted gap asked for, and the padding is never read
    from widelimit.coding._restricted import solve_blocks

    rng = np.random.default_rng(11)
    B, w_max, n, lam = 7, 20, 30, 0.2
    widths = np.array([20, 1, 7, 13, 0, 20, 4])
    G = rng.standard_normal((B, w_max, w_max)) * 50.0  # garbage outside each token's block
    q = rng.standard_normal((B, w_max)) * 50.0
    xx = np.empty(B)
    want = np.zeros((B, w_max))
    for t, w in enumerate(widths):
        Uw = _unit_rows(rng.standard_normal((w, n)))
        x = rng.standard_normal(n) * 2.0 + (Uw[: min(w, 3)].sum(0) if w else 0.0)
        G[t, :w, :w], q[t, :w], xx[t] = Uw @ Uw.T, Uw @ x, x @ x
        if w:
            L = np.linalg.cholesky(G[t, :w, :w])
            want[t, :w] = scipy.optimize.nnls(L.T, np.linalg.solve(L, q[t, :w] - lam))[0]
    y = np.zeros((B, w_max))
    y[:, w_max - 1] = 5.0  # a start entry outside every narrower block: must be left alone
    used = solve_blocks(G, q, xx, y, widths.astype(np.int64), lam, 1e-13, 1e-12, 400, 6)
    assert np.all(used < 400)
    for t, w in enumerate(widths):
        np.testing.assert_allclose(y[t, :w], want[t, :w], rtol=1e-6, atol=1e-9)
        if w < w_max:
            assert y[t, w_max - 1] == 5.0


@pytest.mark.parametrize("numba", [True, False])  # the CPU's loops per entry, and the torch code a GPU runs
def test_exact_max_picks_the_float64_maximum_among_near_ties(numba):
    # atoms 1e-9 apart: the float32 product orders them wrongly, the window recomputed in float64 does not (the CPU
    # path recomputes the window in numba: at the optimum every active atom ties at lam, the whole support is in it)
    from widelimit.coding.screened import exact_max

    rng = np.random.default_rng(7)
    U = _unit_rows(rng.standard_normal((500, 64)))
    U[1:6] = U[0] + 1e-9 * rng.standard_normal((5, 64))
    U = _unit_rows(U)
    R = rng.standard_normal((30, 64)) + 3.0 * U[0]
    Ut = torch.as_tensor(U)
    mx, C32 = exact_max(torch.as_tensor(R), Ut, Ut.to(torch.float32), numba=numba)
    exact = np.array([max(math.fsum(R[i] * U[d]) for d in range(500)) for i in range(30)])
    np.testing.assert_allclose(mx.numpy(), exact, rtol=1e-14)
    assert not np.allclose(C32.numpy().max(1).astype(np.float64), exact, rtol=1e-12)


def test_torch_code_path_on_the_cpu_gives_the_numba_path_certificate():
    # numba=False runs on the CPU the code a GPU runs (batched Newton + Lawson-Hanson restricted solves, torch
    # gathers, torch exact maxima): the same certified optimum as the CPU kernels, token by token
    U, X = _random_problem(3, 300, 24, 40, 6)
    lam = 0.1
    a = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=12).solve(torch.as_tensor(X))
    b = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=12, numba=False).solve(torch.as_tensor(X))
    assert a.certified and b.certified
    np.testing.assert_allclose(a.point_values, b.point_values, rtol=1e-9)
    _check(U, X, lam, b)
    with pytest.raises(ValueError, match="runs on the CPU only"):
        ScreenedCoder(U, lam=lam, restricted="coordinate_descent", numba=False, device="meta")
