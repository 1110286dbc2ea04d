"""The batched Lawson--Hanson NNLS (widelimit.coding._nnls) factorises only the tokens still at work.

Found certifying SAELens-trained SAEs (benchmarks/certify_saelens16k.py): the warm-start refit of the sparsity
bracket on supports of ~200 atoms re-factorised every token's Gram block at each active-set step of the batch's
slowest token. The codes are checked against scipy's NNLS; the work by counting the rows each factorisation gets.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import nnls

import widelimit.coding._nnls as N


def _counting(monkeypatch):
    rows = []
    orig = N._solve

    def solve(G, q, P):
        rows.append(G.shape[0])
        return orig(G, q, P)

    monkeypatch.setattr(N, "_solve", solve)
    return rows


def test_easy_tokens_are_factorised_once_beside_a_hard_one(monkeypatch):
    rng = np.random.default_rng(3)
    n = s = 10
    U = rng.standard_normal((s, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    hard = -U[:6].sum(0) + 0.3 * U[6:].sum(0) + 0.1 * rng.standard_normal(n)  # negative least-squares codes
    easy = rng.uniform(0.5, 2.0, (19, s)) @ U  # nonnegative combinations: least squares is the NNLS answer
    X = np.vstack([hard, easy])
    Ut = torch.as_tensor(U)
    valid = torch.ones(20, s, dtype=torch.bool)
    G, q = N.gram_batch(Ut.expand(20, s, n), torch.as_tensor(X), valid)

    rows = _counting(monkeypatch)
    N.nnls_batch(G[:1], q[:1], valid[:1])
    alone = sum(rows)
    assert alone >= 3  # the hard token takes several active-set steps
    rows.clear()
    y = N.nnls_batch(G, q, valid).numpy()
    assert sum(rows) == alone + 19  # before the fix: alone * 20 rows
    for i in range(20):
        np.testing.assert_allclose(y[i], nnls(U.T, X[i])[0], atol=1e-10)


def test_factorisations_are_the_size_of_the_passive_sets(monkeypatch):
    # the screened coder's working sets hold up to a few hundred slots where the solution uses tens: each
    # Cholesky factorisation was of the whole padded block (s^3), now of the largest passive set of the batch
    rng = np.random.default_rng(5)
    n, s, B = 150, 120, 6
    U = rng.standard_normal((s, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = np.stack([rng.uniform(1, 2, 4) @ U[rng.choice(s, 4, replace=False)] for _ in range(B)])
    Ut = torch.as_tensor(U)
    valid = torch.ones(B, s, dtype=torch.bool)
    G, q = N.gram_batch(Ut.expand(B, s, n), torch.as_tensor(X), valid)
    sizes = []
    orig = N._solve_block
    monkeypatch.setattr(N, "_solve_block", lambda G_, q_, P_: sizes.append(G_.shape[1]) or orig(G_, q_, P_))
    y = N.nnls_batch(G, q, valid, start=torch.zeros(B, s, dtype=torch.bool)).numpy()
    for i in range(B):
        np.testing.assert_allclose(y[i], nnls(U.T, X[i])[0], atol=1e-9)
    support = int((y > 0).sum(1).max())
    assert max(sizes) <= support + 1 < s  # (a step may hold one variable it then drops)
