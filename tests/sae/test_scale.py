"""certify_sae at scale: the parts and their driver, the blocked decoder-pair search, Dask workers, storage rounding."""

from __future__ import annotations

from functools import partial

import numpy as np
import scipy.sparse as sp
import pytest
import torch

from fixtures.saes import orthogonal_rays_sae

from widelimit import certify_sae
from widelimit.data.source import open_activations
from widelimit.sae import _pairs
from widelimit.sae._pairs import decoder_pairs, pair_rows
from widelimit.sae._util import violation_tolerance
from widelimit.sae.certify import _setup, run_parts
from widelimit.sae.model import SAE
from widelimit.sae.options import CodingOptions, FlagOptions, RunOptions
from widelimit.sae.parts import default_parts


def _random_sae(seed=8, n=12, k=40, N=300):
    rng = np.random.default_rng(seed)
    W_dec = rng.standard_normal((k, n)) * rng.uniform(0.5, 2.0, (k, 1))
    sae = SAE(W_dec=W_dec, b_dec=0.1 * rng.standard_normal(n), W_enc=0.3 * rng.standard_normal((n, k)),
              b_enc=-0.2 + 0.1 * rng.standard_normal(k), architecture="standard")
    return 2.0 * rng.standard_normal((N, n)), sae


def _brute_pairs(U, lo, hi):
    G = U @ U.T
    np.fill_diagonal(G, 0.0)
    a, b = np.nonzero((G >= hi) | (G <= lo))
    return set(zip(a.tolist(), b.tolist())), G


def test_blocked_pair_search_matches_the_full_gram_and_keeps_the_most_extreme():
    rng = np.random.default_rng(0)
    k, n = 300, 16
    U = rng.standard_normal((k, n))
    U[10] = -U[3] + 0.01 * rng.standard_normal(n)  # planted antipodal pair
    U[20] = U[7] + 0.3 * rng.standard_normal(n)  # planted near-duplicate
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    lo, hi = -0.6, 0.6
    want, G = _brute_pairs(U, lo, hi)
    assert (3, 10) in want and (7, 20) in want and len(want) > 20
    for rows in (1, 7, 64, 1000):  # one row per block .. one block
        a, b, c = decoder_pairs(U, lo, hi, max_pairs=10**6, block_rows=rows)
        assert set(zip(a.tolist(), b.tolist())) == want
        np.testing.assert_allclose(c, G[a, b], rtol=0, atol=1e-15)
    # a budget keeps exactly the max_pairs most extreme cosines, whatever the blocks
    m = 12
    order = np.sort(np.abs(G[tuple(np.array(sorted(want)).T)]))[::-1]
    for rows in (5, 300):
        a, b, c = decoder_pairs(U, lo, hi, max_pairs=m, block_rows=rows)
        assert a.size == m
        np.testing.assert_allclose(np.sort(np.abs(c))[::-1], order[:m], rtol=0, atol=1e-15)
    # an odd budget splits the tie between (a, b) and (b, a) (equal cosines): the first in row-major order wins,
    # whatever the blocks (the search forms the upper triangle only and mirrors it)
    pa, pb = np.array(sorted(want)).T
    for m in (1, 13, len(want) - 1):
        first = np.lexsort((pa * k + pb, -np.abs(G[pa, pb])))[:m]
        first = first[np.argsort(pa[first] * k + pb[first])]
        for rows in (1, 7, 64, 1000):
            a, b, c = decoder_pairs(U, lo, hi, max_pairs=m, block_rows=rows)
            np.testing.assert_array_equal(a, pa[first])
            np.testing.assert_array_equal(b, pb[first])
    assert decoder_pairs(U, lo, hi, max_pairs=0)[0].size == 0


def test_pair_search_within_a_budget_finds_every_extreme_pair_of_the_sampled_atoms():
    rng = np.random.default_rng(1)
    k, n = 300, 16
    U = rng.standard_normal((k, n))
    U[10] = -U[3] + 0.01 * rng.standard_normal(n)
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    lo, hi = -0.6, 0.6
    want, G = _brute_pairs(U, lo, hi)
    assert pair_rows(k, n, None) is None and pair_rows(k, n, 1e3) is None  # small: the full search, any budget
    for R in (np.array([3]), np.array([0, 3, 10, 299]), np.arange(0, k, 7), np.arange(k)):
        sub = {(a, b) for a, b in want if a in set(R.tolist()) or b in set(R.tolist())}
        for rows in (1, 5, 1000):
            a, b, c = decoder_pairs(U, lo, hi, max_pairs=10**6, block_rows=rows, rows=R)
            got = list(zip(a.tolist(), b.tolist()))
            assert len(got) == len(set(got)) and set(got) == sub  # each pair once per order, no (a, a)
            np.testing.assert_allclose(c, G[a, b], rtol=0, atol=1e-15)
    assert (3, 10) in set(zip(*decoder_pairs(U, lo, hi, 10**6, rows=np.array([10]))[:2]))


def test_pair_rows_sample_fits_the_budget(monkeypatch):
    monkeypatch.setattr(_pairs, "PAIR_FULL_MADDS", 0)
    k, n = 1000, 8
    assert pair_rows(k, n, 0.5 * k * k * n) is None  # the full search fits
    R = pair_rows(k, n, 37.5 * k * n, seed=3)
    assert R.size == 37 and np.all(np.diff(R) > 0) and R.max() < k
    np.testing.assert_array_equal(R, pair_rows(k, n, 37.5 * k * n, seed=3))
    assert pair_rows(k, n, 0.0).size == 1


def test_certify_sae_notes_a_partial_pair_search(monkeypatch):
    monkeypatch.setattr(_pairs, "PAIR_FULL_MADDS", 0)
    X, sae = _random_sae(N=40)  # 40 tokens x 40 atoms: budget 40 k n of the 20 k n of the full search
    full = certify_sae(X, sae, lam=0.4, device="cpu", pair_budget=None)
    assert not any("pair search" in s for s in full.notes)
    assert not any("pair search" in s for s in certify_sae(X, sae, lam=0.4, device="cpu").notes)
    part = certify_sae(X, sae, lam=0.4, device="cpu", pair_budget=0.1)  # 4 of 40 atoms
    assert any("the pairs of 4 of 40 atoms" in s for s in part.notes)


def test_bad_options_fail_in_one_line_naming_the_option():
    X, sae = _random_sae()
    for kw, name in ((dict(containment=1.5), "containment"), (dict(antipodal_cosine=-2.0), "antipodal_cosine"),
                     (dict(batch_size=0), "batch_size"), (dict(max_pairs=-1), "max_pairs"),
                     (dict(pair_budget=-1.0), "pair_budget"),
                     (dict(backend="gpu"), "backend"), (dict(coding_algorithm="lars"), "coding_algorithm"),
                     (dict(kkt_tol=-1.0), "kkt_tol"), (dict(dense_threshold=float("nan")), "dense_threshold")):
        with pytest.raises(ValueError, match=name) as e:
            certify_sae(X, sae, lam=0.4, device="cpu", **kw)
        assert "\n" not in str(e.value)


class _TokenSum:
    """A part as another concern would add one: it sees every batch once, in row order."""

    def __init__(self, setup):
        self.s, self.starts, self.total, self.codes = setup, [], 0.0, 0

    def update(self, batch):
        self.starts.append(batch.start)
        self.total += float(batch.x.sum())
        self.codes += int(batch.Yo.nnz)  # the parts before it left the optimal codes on the batch

    def merge(self, other):
        self.starts += other.starts
        self.total += other.total
        self.codes += other.codes
        return self

    def result(self):
        return {"starts": self.starts, "total": self.total, "codes": self.codes}


def _with_token_sum(setup, coding, pairs):
    parts = default_parts(setup, coding, pairs)
    parts["token_sum"] = _TokenSum(setup)
    return parts


def test_a_further_part_plugs_into_the_driver():
    X, sae = _random_sae()
    setup, _, _ = _setup(sae, X, 0.4, None, 0, CodingOptions(coding_tol=1e-10), RunOptions(device="cpu"))
    make = partial(_with_token_sum, coding=CodingOptions(coding_tol=1e-10), pairs=(np.zeros(0), np.zeros(0)))
    parts = run_parts(X, make, setup, 70)
    out = parts["token_sum"].result()
    assert out["starts"] == [0, 70, 140, 210, 280]
    assert out["total"] == pytest.approx(float(X.sum()), rel=1e-13)
    ref = certify_sae(X, sae, lam=0.4, device="cpu", batch_size=70, coding_tol=1e-10)
    assert out["codes"] == pytest.approx(ref.metrics["optimal_l0"] * X.shape[0], abs=0.5)


def test_dask_cluster_runs_the_coding_on_the_workers_and_equals_the_local_result():
    da = pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    X, sae = _random_sae()
    kw = dict(lam=0.4, device="cpu", batch_size=70, coding_tol=1e-10)
    local = certify_sae(X, sae, **kw)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            distributed.Client(cl) as client:
        with distributed.get_task_stream(client) as ts:
            remote = certify_sae(da.from_array(X, chunks=(100, X.shape[1])), sae, **kw)
    keys = [str(t["key"]) for t in ts.data]
    assert sum("_block_parts" in key for key in keys) == 3  # one task per block, on the workers
    for key in ("sae_objective", "optimal_code_objective", "lower_bound", "bias_stationarity", "max_residual_norm",
                "encoder_gap"):
        assert getattr(remote, key) == pytest.approx(getattr(local, key), rel=1e-12), key
    assert remote.coding_gap == pytest.approx(local.coding_gap, rel=1e-4, abs=1e-12)
    for key in ("mse", "cossim", "l2_ratio", "l0", "l1", "frac_alive", "optimal_mse", "optimal_l0"):
        assert remote.metrics[key] == pytest.approx(local.metrics[key], rel=1e-12), key
    for col in ("frequency", "max_violation_firing", "max_violation_silent", "tangent_grad_norm",
                "tangent_grad_norm_optimal_codes"):
        np.testing.assert_allclose(remote.features[col], local.features[col], rtol=1e-10, atol=1e-13, err_msg=col)
    assert [(v["feature"], v["condition"]) for v in remote.violations] == \
        [(v["feature"], v["condition"]) for v in local.violations]


def test_violation_tolerance_uses_the_storage_dtype_not_the_widened_one(tmp_path):
    # an exactly optimal SAE (float64) on its data rounded to float16 / bfloat16: the rounding is the storage's;
    # read as float32 (shard folders, tensors widened on reading) it was judged with float32's epsilon
    X, sae = orthogonal_rays_sae(0.5, seed=1)
    X16 = X.astype(np.float16)
    np.save(tmp_path / "be.npy", X16.astype(">f2"))  # big-endian float16: was read as float64 storage
    np.save(tmp_path / "le.npy", X16)
    scale = float(np.linalg.norm(X16.astype(np.float64), axis=1).max() + np.linalg.norm(sae.b_dec))
    cases = {"float16": [X16, torch.tensor(X16), open_activations(tmp_path / "be.npy"),
                         open_activations(tmp_path / "le.npy")],
             "bfloat16": [torch.tensor(X).to(torch.bfloat16)]}
    for dt, inputs in cases.items():
        for acts in inputs:
            cert = certify_sae(acts, sae, lam=0.5, device="cpu")
            assert cert.violations == [], (dt, type(acts))
            if dt == "float16":  # (bfloat16's sample scale differs: its own rounding of the data)
                assert cert.violation_tolerance == pytest.approx(
                    violation_tolerance(0.5, 1e-6, scale, ("float16",)), rel=1e-12)
    assert open_activations(tmp_path / "be.npy").storage_dtypes == ["f16"]
    # the same float16-rounded numbers stored as float32 are judged at float32 precision: violations
    assert certify_sae(X16.astype(np.float32), sae, lam=0.5, device="cpu").violations


def test_a_lam_far_above_the_data_scale_does_not_pass_the_saes_codes_as_optimal():
    # lam >= max_d <u_d, x - b> on every token: the zero code is optimal (its KKT conditions hold), so the
    # encoder gap is exactly mean P(SAE codes) - mean ||x - b||^2 (80 here). With the former per-token test
    # gap <= coding_tol * max(P, lam^2) (lam^2 = 1e8) the coders stopped at the SAE's own codes: 0.0
    rng = np.random.default_rng(3)
    n, k, N, lam, z = 8, 20, 50, 1e4, 2e-4
    W = rng.standard_normal((k, n))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    sae = SAE(W_dec=W, b_dec=np.zeros(n), W_enc=np.zeros((n, k)), b_enc=np.full(k, z), architecture="standard")
    X = rng.standard_normal((N, n))
    assert (X @ W.T).max() < lam
    truth = float((((X - z * W.sum(0)) ** 2).sum(1) + 2 * lam * z * k).mean() - (X ** 2).sum(1).mean())
    for alg in ("cd", "working_set", "fista", "screened"):
        cert = certify_sae(X, sae, lam=lam, device="cpu", coding_algorithm=alg)
        assert cert.encoder_gap == pytest.approx(truth, rel=1e-9), alg
        assert cert.coding_certified and cert.coding_gap <= 1e-6 * cert.sae_objective, alg


def test_screened_coder_matches_the_gram_coder_and_its_gap_is_certified():
    from widelimit.coding import optimal_codes
    from widelimit.coding.screened import ScreenedCoder

    rng = np.random.default_rng(5)
    k, n, m, L, lam = 600, 48, 60, 4, 0.2
    U = rng.standard_normal((k, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    idx = rng.integers(0, k, (m, L))
    X = np.einsum("ml,mln->mn", rng.uniform(1, 3, (m, L)), U[idx]) + 0.05 * rng.standard_normal((m, n))
    ref = optimal_codes(X, U, np.zeros(n), lam=lam, tol=1e-12, device="cpu", algorithm="cd")
    for warm in (None, sp.csr_array(np.maximum(X @ U.T - 1.0, 0.0))):  # cold, and an encoder-like warm start
        res = ScreenedCoder(U, lam=lam, tol=1e-9, ws_extra=8).solve(torch.as_tensor(X), warm)
        assert res.certified and res.n_iter >= 1
        # certified: P - gap is a lower bound on the optimum, and P is the objective of the returned codes
        assert np.all(res.point_values - res.point_gaps <= ref.point_values * (1 + 1e-12) + 1e-12)
        Y = res.codes.toarray()
        P = ((X - Y @ U) ** 2).sum(1) + 2 * lam * Y.sum(1)
        np.testing.assert_allclose(res.point_values, P, rtol=1e-11)
        np.testing.assert_allclose(res.point_values, ref.point_values, rtol=2e-9)
        np.testing.assert_allclose(res.residuals, X - Y @ U, rtol=0, atol=1e-12)


def test_pair_co_firing_counts_from_bits_equal_the_boolean_counts():
    # the CPU counts pairs' co-firing tokens as popcounts of packed bits (the bool gathers took 6.3 s per
    # 2,000 tokens at d_sae 16,384); the counts must equal a direct count, across the byte padding (m = 1,003)
    from types import SimpleNamespace

    from widelimit.sae.parts import PairPart

    rng = np.random.default_rng(3)
    m, k = 1003, 300
    f = torch.as_tensor(rng.random((m, k)) < rng.uniform(0.01, 0.9, k))
    f = torch.where(f, torch.as_tensor(rng.uniform(0.1, 1.0, (m, k))), 0.0)
    qa, qb = rng.integers(0, k, 20_000), rng.integers(0, k, 20_000)
    setup = SimpleNamespace(dev=torch.device("cpu"))
    part = PairPart(setup, qa, qb)
    part.update(SimpleNamespace(f=f))
    part.update(SimpleNamespace(f=f[:517]))
    act = (f > 0).numpy()
    want = (act[:, qa] & act[:, qb]).sum(0) + (act[:517, qa] & act[:517, qb]).sum(0)
    np.testing.assert_array_equal(np.asarray(part.result()["co"]), want)


def test_unit_dictionary_holds_one_float64_copy_of_the_decoder():
    """Unit rows (zero rows stay zero) equal to the division by numpy's norms, with at most the result and a chunk
    allocated: the masked division held four ``d_sae x d_in`` float64 arrays (4.8 GB at 65,536 x 2,304)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    k, n = 40000, 64
    W = rng.standard_normal((k, n)).astype(np.float32) * rng.uniform(0.5, 2.0, (k, 1)).astype(np.float32)
    W[7] = 0.0
    sae = SAE(W_dec=W, b_dec=np.zeros(n, np.float32), architecture="decoder_only")
    W64 = W.astype(np.float64)
    nrm = np.linalg.norm(W64, axis=1)
    tracemalloc.start()
    U = sae.unit_dictionary()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_allclose(U[nrm > 0], W64[nrm > 0] / nrm[nrm > 0, None], rtol=1e-15, atol=0)
    assert not U[7].any() and U.dtype == np.float64
    np.testing.assert_allclose(sae.decoder_norms(), nrm, rtol=1e-15)
    assert peak < 1.5 * k * n * 8, peak / (k * n * 8)


@pytest.mark.parametrize("numba", [True, False])  # the CPU's loops per entry, and the torch code a GPU runs
def test_code_conditions_from_a_float32_product_are_the_float64_ones(numba):
    # the KKT statistics of a wide SAE came from a float64 (m, d_sae) product; now one float32 product, every
    # entry that could be a column's maximum recomputed in float64. Near-ties (pairs of atoms at cosine
    # 1 - 1e-7, whose float32 correlations coincide) and columns whose entries all fire are the hard cases
    from widelimit.exact.stationarity import code_conditions
    from widelimit.sae.parts import code_conditions_f32

    rng = np.random.default_rng(11)
    m, k, n, lam = 300, 64, 48, 0.3
    U = rng.standard_normal((k, n))
    U[1::2] = U[0::2] + 1e-7 * rng.standard_normal((k // 2, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    U[7] = 0.0  # a dead feature's zero decoder row: a column of exact ties, every token a candidate
    R = rng.standard_normal((m, n)) * rng.uniform(0.1, 5.0, (m, 1))
    F = rng.random((m, k)) < 0.1
    F[:, 7] = False
    F[:, 5] = True  # a feature firing on every token: no inactive entry
    rows, cols = (torch.as_tensor(a) for a in np.nonzero(F))
    Rt, Ut = torch.as_tensor(R), torch.as_tensor(U)
    act, inact = code_conditions_f32(Rt, rows, cols, Ut, Ut.to(torch.float32), lam, numba=numba)
    want_act, want_inact = code_conditions(R @ U.T, rows.numpy(), cols.numpy(), lam)
    np.testing.assert_allclose(act.numpy(), want_act, rtol=1e-13, atol=1e-13)
    assert inact[5].item() == -np.inf and want_inact[5] == -np.inf
    np.testing.assert_allclose(inact.numpy(), want_inact, rtol=1e-13, atol=1e-13)
    C32 = (Rt.to(torch.float32) @ Ut.to(torch.float32).T).double().numpy()
    C32[F] = -np.inf
    assert inact[7].item() == 0.0
    assert np.abs(C32.max(0)[np.arange(k) != 5] - want_inact[np.arange(k) != 5]).max() > 1e-8  # float32 alone is not enough
