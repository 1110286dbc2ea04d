"""The front door: a Problem computes exactly what the module-level functions compute, on one engine."""

import numpy as np
import pytest

import widelimit as wl
import widelimit.engine as wl_engine
from widelimit.engine.local import LocalEngine


@pytest.fixture
def X():
    r = np.random.default_rng(3)
    return np.vstack([r.standard_normal((300, 6)), 8 * r.standard_normal((40, 6))]).astype(np.float32)


def test_problem_solve_and_verify_equal_the_functions(X):
    prob = wl.Problem(X, lam=1.5)
    sol = prob.solve()
    ref = wl.solve(X, lam=1.5)
    assert sol.value == ref.value and sol.width == ref.width
    np.testing.assert_array_equal(sol.bias, ref.bias)
    np.testing.assert_array_equal(sol.dictionary, ref.dictionary)
    # the bound is the certified median and is cached: the same object, no new passes
    assert prob.bound() is prob.bound() is sol.median
    c = prob.verify(sol.dictionary, sol.sparse_codes, sol.bias + 0.05)
    c_ref = wl.verify(X, sol.dictionary, sol.sparse_codes, sol.bias + 0.05, lam=1.5)
    assert c.value == c_ref.value and c.lower_bound == c_ref.lower_bound and not c.certified


def test_problem_makes_its_engine_once(X, monkeypatch):
    made = []
    orig = LocalEngine.__init__

    def counting(self, *a, **k):
        made.append(1)
        orig(self, *a, **k)

    monkeypatch.setattr(LocalEngine, "__init__", counting)
    prob = wl.Problem(X, lam=1.5)
    sol = prob.solve()
    prob.verify(sol.dictionary, sol.sparse_codes, sol.bias)
    assert len(made) == 1  # one engine for the median, the rays, the dictionary and both certificates
    assert wl_engine.engine_for(prob.data).X is prob.data


def test_problem_from_a_file_and_a_shard_folder(X, tmp_path):
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "shards").mkdir()
    np.save(tmp_path / "shards" / "0.npy", X[:170])
    np.save(tmp_path / "shards" / "1.npy", X[170:])
    ref = wl.solve(X, lam=1.5)
    for path in (tmp_path / "x.npy", tmp_path / "shards", str(tmp_path / "shards")):
        prob = wl.Problem(path, lam=1.5)
        assert isinstance(prob.data, wl.ActivationSource)
        assert (prob.n_points, prob.dim) == X.shape
        sol = prob.solve()
        assert sol.value == pytest.approx(ref.value, rel=1e-12) and sol.width == ref.width
        assert sol.certified


def test_open_activations_matches_the_array(X, tmp_path):
    np.save(tmp_path / "x.npy", X)
    src = wl.open_activations(tmp_path / "x.npy")
    np.testing.assert_array_equal(np.asarray(src[0:X.shape[0]]), X)


def test_problem_rejects_bad_arguments(X):
    with pytest.raises(ValueError, match="lam"):
        wl.Problem(X, lam=0)
    with pytest.raises(ValueError, match="signed"):
        wl.Problem(X, lam=1.0, signed="yes")
    with pytest.raises(ValueError, match="key"):
        wl.Problem(X, lam=1.0, key="x")
    with pytest.raises(TypeError):
        wl.Problem(X, 1.0)  # lam is keyword-only


def test_a_median_of_other_data_or_lam_is_refused(X):
    med = wl.huber_median(X, lam=2.0)
    with pytest.raises(ValueError, match="lam"):
        wl.solve(X, lam=1.5, median=med)


def test_residual_passes_run_on_the_engine_for_sources(X, tmp_path):
    """sae_objective and first_order_conditions stream a shard folder and name the shard of a bad row."""
    sol = wl.solve(X, lam=1.5)
    W, Z, b = sol.dictionary, sol.sparse_codes, sol.bias
    (tmp_path / "s").mkdir()
    np.save(tmp_path / "s" / "0.npy", X[:100])
    np.save(tmp_path / "s" / "1.npy", X[100:])
    src = wl.open_activations(tmp_path / "s")
    a, s_ = wl.sae_objective(X, W, Z, b, lam=1.5), wl.sae_objective(src, W, Z, b, lam=1.5)
    assert s_.value == pytest.approx(a.value, rel=1e-13)
    # an independent evaluation in plain NumPy
    Zd = Z.toarray() if hasattr(Z, "toarray") else Z
    R = Zd @ W.astype(np.float64) + b - X.astype(np.float64)
    norms = np.linalg.norm(W.astype(np.float64), axis=1)  # float32 atoms: not exactly unit
    ref = (np.einsum("ij,ij->", R, R) + 2 * 1.5 * (Zd @ norms).sum()) / X.shape[0]
    assert a.value == pytest.approx(ref, rel=1e-12)
    fa = wl.first_order_conditions(X, W, Z, b, lam=1.5)
    fs = wl.first_order_conditions(src, W, Z, b, lam=1.5)
    assert fs.bias_residual == pytest.approx(fa.bias_residual, abs=1e-12)
    assert fs.code_margin == pytest.approx(fa.code_margin, abs=1e-12)
    bad = X[100:].copy()
    bad[7, 2] = np.nan
    np.save(tmp_path / "s" / "1.npy", bad)
    with pytest.raises(ValueError, match=r"1\.npy.*row 7|row 107"):
        wl.sae_objective(wl.open_activations(tmp_path / "s"), W, Z, b, lam=1.5)


def test_problem_fingerprint_is_the_content_hash_and_binds_its_certificates(X):
    from widelimit.engine import fingerprint_of

    prob = wl.Problem(X, lam=1.5)
    assert prob.fingerprint == fingerprint_of(X)
    Y = X.copy()
    Y[17, 3] = np.nextafter(Y[17, 3], np.inf)  # one ulp in one entry
    assert wl.Problem(Y, lam=1.5).fingerprint != prob.fingerprint
    sol = prob.solve()
    with pytest.raises(ValueError, match="other data"):
        wl.verify(Y, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.5, median=prob.bound())


def test_certify_sae_batches_run_on_the_engine(tmp_path):
    """certify_sae reads a shard folder through the engine: same numbers as in memory, a bad row named with its shard."""
    from fixtures.saes import orthogonal_rays_sae

    Xs, sae = orthogonal_rays_sae(0.5, seed=2)
    (tmp_path / "s").mkdir()
    np.save(tmp_path / "s" / "0.npy", Xs[:50])
    np.save(tmp_path / "s" / "1.npy", Xs[50:])
    a = wl.certify_sae(Xs, sae, lam=0.5, device="cpu", batch_size=16, threads=1)
    b = wl.certify_sae(wl.open_activations(tmp_path / "s"), sae, lam=0.5, device="cpu", batch_size=16, threads=1)
    assert b.sae_objective == pytest.approx(a.sae_objective, rel=1e-12)
    assert b.lower_bound == pytest.approx(a.lower_bound, rel=1e-12)
    bad = Xs[50:].copy()
    bad[3, 1] = np.inf
    np.save(tmp_path / "s" / "1.npy", bad)
    with pytest.raises(ValueError, match=r"1\.npy: non-finite value \(Inf\) in row 3 \(0-based; row 53 of "):
        wl.certify_sae(wl.open_activations(tmp_path / "s"), sae, lam=0.5, device="cpu", batch_size=16, threads=1)


def test_one_progress_protocol_for_the_iterative_solvers(X):
    """fit_dictionary, frontier, solve_dnn and optimal_codes all report widelimit.Progress events."""
    Y = X[:40].astype(np.float64)
    got = {}
    for name, run in {
        "fit": lambda cb: wl.fit_dictionary(Y, lam=1.5, width=3, device="cpu", max_iter=5, progress=cb),
        "frontier": lambda cb: wl.frontier(Y, lam=1.5, widths=[1, 2], n_restarts=1, max_iter=5, device="cpu", progress=cb),
        "dnn": lambda cb: wl.solve_dnn(Y[:12], lam=1.5, max_iter=30, check_every=5, device="cpu", progress=cb),
        "codes": lambda cb: wl.optimal_codes(Y, np.eye(6)[:3], np.zeros(6), lam=1.5, device="cpu", batch_size=16, progress=cb),
    }.items():
        seen = []
        run(seen.append)
        assert seen and all(isinstance(e, wl.Progress) for e in seen), name
        got[name] = seen
    assert [e.stage for e in got["frontier"]] == ["width 1", "width 2"] and got["frontier"][-1].done
    assert [e.rows_done for e in got["codes"]] == [16, 32, 40]
    assert all(e.lower_bound <= e.value + 1e-9 for e in got["dnn"])


def test_signed_problem_verifies_its_own_solution():
    """Problem(signed=True).solve() returns signed codes; .verify() of them certified them (it raised
    'Z must be >= 0': signed was not passed on), with the numbers of an independent computation."""
    rng = np.random.default_rng(3)
    c = rng.normal(size=3)
    q = np.linalg.qr(rng.normal(size=(3, 3)))[0][:2]
    t = rng.uniform(1.0, 3.0, size=(2, 5))
    X = np.vstack([c + s * t[j, :, None] * q[j] for j in range(2) for s in (1.0, -1.0)])  # antipodal rays: lines
    prob = wl.Problem(X, lam=0.5, signed=True)
    sol = prob.solve()
    Z = sol.codes
    assert (Z < 0).any() and sol.width == 2  # antipodal rays share one atom, with signed codes
    cert = prob.verify(sol.dictionary, Z, sol.bias)
    assert cert.certified and cert.value == pytest.approx(sol.value, rel=1e-12)
    # the objective by hand: mean ||x - b - z W||^2 + 2 lam |z|_1
    E = X - sol.bias - Z @ sol.dictionary
    by_hand = np.mean(np.sum(E * E, axis=1) + 2 * 0.5 * np.abs(Z).sum(axis=1))
    assert cert.value == pytest.approx(by_hand, rel=1e-12)
    # the lower bound is the wide-limit bound min_b mean h_lam(||x - b||), the same as the nonnegative problem's
    assert cert.lower_bound == wl.huber_median(X, lam=0.5).lower_bound
    with pytest.raises(ValueError, match="Z must be >= 0"):
        wl.Problem(X, lam=0.5).verify(sol.dictionary, Z, sol.bias)  # a nonnegative problem refuses signed codes
