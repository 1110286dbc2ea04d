"""certify_sae: a constructed global optimum certifies in every format, perturbed copies do not, numbers are checked
against independent computations (the libraries' loss formulas, cvxpy, numpy), and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from widelimit import certify_sae, load_sae, sae_objective
from widelimit.cli import main
from fixtures.saes import orthogonal_rays_sae, save_dictionary_learning, save_plain, save_sparsify
from widelimit.sae.formats import save_saelens
from widelimit.sae.model import SAE
from widelimit.sae.certify import resolve_lam, write_sae_certificate

LAM = 0.5

SAVERS = {
    "saelens": lambda s, p: save_saelens(s, p),
    "saelens-legacy": lambda s, p: save_saelens(s, p, legacy=True),
    "dictionary_learning": save_dictionary_learning,
    "sparsify": save_sparsify,
    "plain": lambda s, p: save_plain(s, p / "sae.safetensors"),
}
CASES = [(fmt, arch) for fmt in SAVERS for arch in ("standard", "jumprelu", "topk", "gated")
         if not (fmt == "sparsify" and arch != "topk") and not (fmt == "plain" and arch == "gated")]


@pytest.mark.parametrize("fmt,arch", CASES)
def test_constructed_optimum_certifies_in_every_format(tmp_path, fmt, arch):
    X, sae = orthogonal_rays_sae(LAM, architecture=arch, n_core=4, seed=1)
    SAVERS[fmt](sae, tmp_path)
    loaded = load_sae(tmp_path if fmt != "plain" else tmp_path / "sae.safetensors")
    cert = certify_sae(X, loaded, lam=LAM, device="cpu")
    assert cert.global_gap <= 1e-6
    assert abs(cert.encoder_gap) <= 1e-6 and cert.coding_gap <= 1e-6
    assert cert.certified
    assert cert.violations == []
    assert cert.max_residual_norm <= LAM * (1 + 1e-9)
    assert cert.bias_stationarity <= 1e-9
    # value of the known optimum: mean h_lam(t) over ray points, 0 for core points
    r = np.linalg.norm(X - sae.b_dec, axis=1)
    opt = np.mean(np.where(r > LAM, 2 * LAM * r - LAM**2, r**2))
    assert cert.sae_objective == pytest.approx(opt, rel=1e-9)
    assert cert.lower_bound == pytest.approx(opt, rel=1e-9)


def test_perturbed_decoder_is_not_certified_and_the_feature_is_named():
    X, sae = orthogonal_rays_sae(LAM, seed=2)
    W = sae.W_dec.copy()
    W[2] = W[2] + 0.1 * W[0]
    bad = SAE(W_dec=W, b_dec=sae.b_dec, W_enc=sae.W_enc, b_enc=sae.b_enc)
    cert = certify_sae(X, bad, lam=LAM, device="cpu")
    assert not cert.certified and cert.global_gap > 1e-4
    assert cert.violating_features("atom stationarity: tangent gradient = 0") == [2]
    assert 2 in cert.violating_features("feature-residual on firing tokens: <u_d, r_i> = lam")
    # the optimum is still certified from below
    assert cert.lower_bound <= cert.optimal_code_objective + 1e-12 <= cert.sae_objective + 1e-9


def test_perturbed_encoder_shows_encoder_gap_and_silent_violation():
    X, sae = orthogonal_rays_sae(LAM, seed=3)
    b_enc = sae.b_enc.copy()
    b_enc[5] = -4.0  # feature 5 now stays silent on points it should code
    bad = SAE(W_dec=sae.W_dec, b_dec=sae.b_dec, W_enc=sae.W_enc, b_enc=b_enc)
    cert = certify_sae(X, bad, lam=LAM, device="cpu")
    assert cert.encoder_gap > 1e-3 and not cert.certified
    # the decoder and bias are still optimal: optimal codes reach the global bound
    assert cert.optimal_code_objective - cert.lower_bound <= 1e-6
    assert 5 in cert.violating_features("should have fired: <u_d, r_i> <= lam on silent tokens")
    assert cert.features["tangent_grad_norm_optimal_codes"].max() <= 1e-8


def test_objective_matches_library_loss_formulas():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((60, 5)) * 2
    W_dec = rng.standard_normal((8, 5)) * rng.uniform(0.3, 2, (8, 1))
    sae = SAE(W_dec=W_dec, b_dec=rng.standard_normal(5), W_enc=rng.standard_normal((5, 8)),
              b_enc=rng.standard_normal(8) * 0.3, dtype="float64")
    c = 0.8  # l1_coefficient
    cert = certify_sae(X, sae, l1_coefficient=c, device="cpu", batch_size=13)
    f = torch.as_tensor(sae.encode(X))
    x = torch.as_tensor(X)
    x_hat = f @ torch.as_tensor(W_dec) + torch.as_tensor(sae.b_dec)
    mse = (x_hat - x) ** 2
    # SAELens v6 StandardTrainingSAE: mse.sum(-1).mean() + l1_coefficient * (f * ||W_dec rows||).sum(-1).mean()
    saelens = mse.sum(-1).mean() + c * (f * torch.as_tensor(W_dec).norm(dim=1)).sum(-1).mean()
    assert cert.sae_objective == pytest.approx(float(saelens), rel=1e-12)
    assert cert.sae_objective == pytest.approx(sae_objective(X, W_dec, f.numpy(), sae.b_dec, lam=c / 2).value, rel=1e-12)
    assert cert.lam == c / 2
    # metrics against their stated definitions
    m = cert.metrics
    assert m["mse"] == pytest.approx(float(mse.sum(-1).mean()), rel=1e-12)
    ev = 1 - float(mse.sum(-1).mean()) / (np.mean(np.sum(X**2, 1)) - np.sum(X.mean(0) ** 2))
    assert m["explained_variance"] == pytest.approx(ev, rel=1e-10)
    assert m["l0"] == pytest.approx(float((f > 0).sum(-1).double().mean()))
    assert m["l1"] == pytest.approx(float(f.sum(-1).mean()))
    # dictionary_learning StandardTrainer on a unit-norm decoder: recon.sum(-1).mean() + l1_penalty * ||f||_1.mean()
    U = W_dec / np.linalg.norm(W_dec, axis=1, keepdims=True)
    unit = SAE(W_dec=U, b_dec=sae.b_dec, W_enc=sae.W_enc, b_enc=sae.b_enc, dtype="float64")
    cu = certify_sae(X, unit, l1_coefficient=c, device="cpu")
    fu = torch.as_tensor(unit.encode(X))
    dl = ((fu @ torch.as_tensor(U) + torch.as_tensor(sae.b_dec) - x) ** 2).sum(-1).mean() + c * fu.norm(p=1, dim=-1).mean()
    assert cu.sae_objective == pytest.approx(float(dl), rel=1e-12)


def test_optimal_code_objective_against_cvxpy():
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(11)
    X = rng.standard_normal((12, 4)) * 2
    sae = SAE(W_dec=rng.standard_normal((6, 4)), b_dec=rng.standard_normal(4) * 0.1,
              W_enc=rng.standard_normal((4, 6)), b_enc=np.zeros(6), dtype="float64")
    cert = certify_sae(X, sae, lam=LAM, device="cpu", coding_tol=1e-9)
    nrm = np.linalg.norm(sae.W_dec, axis=1)
    total = 0.0
    for x in X:
        z = cp.Variable(6, nonneg=True)
        obj = cp.sum_squares(z @ sae.W_dec + sae.b_dec - x) + 2 * LAM * (nrm @ z)
        total += cp.Problem(cp.Minimize(obj)).solve(solver=cp.CLARABEL)
    assert cert.optimal_code_objective == pytest.approx(total / len(X), rel=1e-6, abs=1e-8)
    assert cert.encoder_gap >= -1e-8


def test_batching_and_16bit_inputs_agree():
    X, sae = orthogonal_rays_sae(LAM, seed=4, n_core=2)
    X = X + 0.05 * np.random.default_rng(0).standard_normal(X.shape)
    a = certify_sae(X, sae, lam=LAM, device="cpu", batch_size=4096)
    b = certify_sae(X, sae, lam=LAM, device="cpu", batch_size=7)
    for key in ("sae_objective", "optimal_code_objective", "lower_bound", "global_gap"):
        assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-9, abs=1e-12), key
    np.testing.assert_allclose(b.features["tangent_grad_norm"], a.features["tangent_grad_norm"], rtol=1e-8, atol=1e-12)
    # 16-bit inputs are certified exactly as their float64 values (the widening is exact): same numbers
    X16 = X.astype(np.float16)
    Xbf = torch.as_tensor(X).bfloat16()
    for low, wide in ((X16, X16.astype(np.float64)), (Xbf, Xbf.double().numpy())):
        h = certify_sae(low, sae, lam=LAM, device="cpu")
        w = certify_sae(wide, sae, lam=LAM, device="cpu")
        for key in ("sae_objective", "optimal_code_objective", "lower_bound", "global_gap"):
            assert getattr(h, key) == pytest.approx(getattr(w, key), rel=1e-12, abs=1e-15), key
        assert h.sae_objective != a.sae_objective  # the rounding is seen, not undone


def test_feature_flags_dead_dense_antipodal_absorbed():
    X, sae = orthogonal_rays_sae(LAM, seed=5, n_pairs=3, dim=8)
    U, Wenc, benc = sae.W_dec, sae.W_enc, sae.b_enc
    # feature 6: dead (never passes its bias); feature 7: fires on half of feature 0's tokens, atom close to atom 0
    u7 = U[0] + 0.3 * U[1]
    u7 /= np.linalg.norm(u7)
    W = np.vstack([U, U[3], u7])
    We = np.hstack([Wenc, U[3][:, None], U[0][:, None]])
    be = np.concatenate([benc, [-1e6], [-3.0]])
    s = SAE(W_dec=W, b_dec=sae.b_dec, W_enc=We, b_enc=be)
    cert = certify_sae(X, s, lam=LAM, device="cpu", dense_threshold=0.16)
    F = cert.features
    assert F["dead"][6] and F["dead"].sum() == 1
    assert F["frequency"][:6] == pytest.approx(np.full(6, 1 / 6)) and F["frequency"][7] < 1 / 6
    assert np.flatnonzero(F["dense"]).tolist() == [0, 1, 2, 3, 4, 5]
    pairs = {tuple(p["features"]) for p in cert.antipodal_pairs}
    assert {(0, 3), (1, 4), (2, 5)} <= pairs and (0, 6) in pairs  # feature 6 duplicates atom 3 = -atom 0
    assert [a["feature"] for a in cert.absorbed] == [7] and cert.absorbed[0]["contained_in"] == 0
    assert cert.metrics["dead_features"] == 1 and cert.metrics["absorbed_looking"] == 1


def test_normalised_sae_is_certified_in_normalised_space():
    X, sae = orthogonal_rays_sae(LAM, seed=6)
    scales = np.random.default_rng(1).uniform(0.5, 3, (X.shape[0], 1))
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True) * np.sqrt(X.shape[1])
    base = certify_sae(Xn, sae, lam=LAM, device="cpu")
    sae_n = SAE(**{k: getattr(sae, k) for k in ("W_dec", "b_dec", "W_enc", "b_enc")},
                normalize_activations="constant_norm_rescale")
    cert = certify_sae(X * scales, sae_n, lam=LAM, device="cpu")
    for key in ("sae_objective", "optimal_code_objective", "lower_bound"):
        assert getattr(cert, key) == pytest.approx(getattr(base, key), rel=1e-10), key
    assert cert.notes and "normalised" in cert.notes[0]


def test_decoder_only_file(tmp_path):
    X, sae = orthogonal_rays_sae(LAM, seed=8)
    np.savez(tmp_path / "dec.npz", W_dec=sae.W_dec * 3.0, b_dec=sae.b_dec)
    cert = certify_sae(X, load_sae(tmp_path / "dec.npz"), lam=LAM, device="cpu")
    assert cert.encoder_gap is None and cert.global_gap <= 1e-6 and cert.certified


def test_bad_inputs():
    X, sae = orthogonal_rays_sae(LAM)
    with pytest.raises(ValueError, match="d_in=5 but the SAE expects d_in=12"):
        certify_sae(X[:, :5], sae, lam=LAM)
    Xn = X.copy()
    Xn[17, 3] = np.nan
    with pytest.raises(ValueError, match=r"non-finite value \(NaN\) in row 17"):
        certify_sae(Xn, sae, lam=LAM, batch_size=8)
    with pytest.raises(ValueError, match="exactly one of lam or l1_coefficient"):
        certify_sae(X, sae, lam=LAM, l1_coefficient=1.0)
    with pytest.raises(ValueError, match="lam must be a finite number > 0"):
        certify_sae(X, sae, lam=-1.0)
    assert resolve_lam(l1_coefficient=3.0) == 1.5


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def test_cli_certify_json_and_outputs(tmp_path, capsys):
    X, sae = orthogonal_rays_sae(LAM, seed=9)
    save_saelens(sae, tmp_path / "sae")
    np.save(tmp_path / "acts.npy", X.astype(np.float32))
    rc = main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "sae"), "--l1-coefficient", str(2 * LAM),
               "--json", "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("sae_objective", "optimal_code_objective", "lower_bound", "encoder_gap", "global_gap",
                "certified", "n_points", "d_in", "d_sae", "metrics"):
        assert key in d
    assert d["n_points"] == X.shape[0] and d["d_in"] == 12 and d["d_sae"] == 8 and d["lam"] == LAM
    # float32 activations: the optimum is certified to float32 accuracy
    assert d["global_gap"] <= 1e-5
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"certificate.json", "features.csv", "feature_frequency.png", "feature_violations.png"} <= names
    rows = (tmp_path / "out" / "features.csv").read_text().splitlines()
    assert len(rows) == 9 and rows[0].startswith("feature,frequency")
    # the table output
    assert main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "sae"), "--lam", str(LAM), "--device", "cpu"]) == 0
    assert "certified optimal" in capsys.readouterr().out


class _Obj:
    pass


def test_cli_bad_inputs_exit_nonzero(tmp_path, capsys):
    X, sae = orthogonal_rays_sae(LAM, seed=10)
    save_saelens(sae, tmp_path / "sae")
    np.save(tmp_path / "short.npy", X[:, :5])
    Xn = X.copy()
    Xn[3, 0] = np.inf
    np.save(tmp_path / "inf.npy", Xn)
    torch.save({"x": _Obj()}, tmp_path / "evil.pt")
    (tmp_path / "badarch").mkdir()
    save_saelens(sae, tmp_path / "badarch")
    cfg = json.loads((tmp_path / "badarch" / "cfg.json").read_text())
    cfg["architecture"] = "weird"
    (tmp_path / "badarch" / "cfg.json").write_text(json.dumps(cfg))
    sae_dir, good = str(tmp_path / "sae"), str(tmp_path / "short.npy")
    cases = [
        ([good, sae_dir, "--lam", "0.5"], "d_in=5 but the SAE expects d_in=12"),
        ([str(tmp_path / "inf.npy"), sae_dir, "--lam", "0.5"], "row 3"),
        ([str(tmp_path / "evil.pt"), sae_dir, "--lam", "0.5"], "refused to unpickle"),
        ([good, str(tmp_path / "badarch"), "--lam", "0.5"], "unsupported SAELens architecture 'weird'"),
        ([good, str(tmp_path / "nothing"), "--lam", "0.5"], "no such file"),
        ([good, sae_dir, "--lam", "0"], "argument --lam: must be a finite number > 0"),
        # the old order (SAE first) is named, not read as activations
        ([sae_dir, good, "--lam", "0.5"], "the activations come first: widelimit certify ACTS SAE"),
    ]
    for argv, msg in cases:
        assert main(["certify", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
    # --lam and --l1-coefficient are exclusive: argparse's refusal is one line too
    assert main(["certify", good, sae_dir, "--lam", "1", "--l1-coefficient", "2"]) == 2
    err = capsys.readouterr().err
    assert "not allowed with argument" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("kind", ["saelens", "npz"])
def test_cli_old_argument_order_is_one_line_naming_the_order(tmp_path, capsys, kind):
    """`certify SAE ACTS` (the order before 0.3) exits 2 with one line that gives the order, before loading
    anything; data first is the order of certify_sae(acts, sae) and of every other command."""
    X, sae = orthogonal_rays_sae(LAM, seed=11)
    if kind == "saelens":
        save_saelens(sae, tmp_path / "sae")
        sae_path = str(tmp_path / "sae")
    else:
        sae_path = str(tmp_path / "sae.npz")
        np.savez(sae_path, W_dec=sae.W_dec, b_dec=sae.b_dec)
    np.save(tmp_path / "acts.npy", X)
    assert main(["certify", sae_path, str(tmp_path / "acts.npy"), "--lam", str(LAM)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the activations come first: widelimit certify ACTS SAE" in err, err
    assert main(["certify", str(tmp_path / "acts.npy"), sae_path, "--lam", str(LAM), "--json"]) == 0  # the right order
    assert json.loads(capsys.readouterr().out)["certified"]


def test_cli_subprocess_exit_code(tmp_path):
    X, sae = orthogonal_rays_sae(LAM, seed=12)
    save_saelens(sae, tmp_path / "sae")
    save_file({"acts": torch.as_tensor(X[:, :4]).float()}, str(tmp_path / "a.safetensors"))
    p = subprocess.run([sys.executable, "-m", "widelimit", "certify", str(tmp_path / "a.safetensors"),
                        str(tmp_path / "sae"), "--lam", "0.5"], capture_output=True, text=True)
    assert p.returncode == 2 and "d_in=4" in p.stderr and "Traceback" not in p.stderr


def test_write_certificate_files(tmp_path):
    X, sae = orthogonal_rays_sae(LAM, seed=13)
    cert = certify_sae(X, sae, lam=LAM, device="cpu")
    files = write_sae_certificate(cert, tmp_path)
    d = json.loads((tmp_path / "certificate.json").read_text())
    assert d["certified"] is True and len(d["optimal_bias"]) == 12
    assert all(f.exists() and f.stat().st_size > 0 for f in files)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    X, sae = orthogonal_rays_sae(LAM, seed=14, n_core=2)
    X = X + 0.05 * np.random.default_rng(3).standard_normal(X.shape)
    cpu = certify_sae(X, sae, lam=LAM, device="cpu")
    gpu = certify_sae(X, sae, lam=LAM, device="cuda")
    assert gpu.device.startswith("cuda")
    for key in ("sae_objective", "optimal_code_objective", "lower_bound", "global_gap"):
        assert getattr(gpu, key) == pytest.approx(getattr(cpu, key), rel=1e-9, abs=1e-12), key


def test_diagnostics_agree_with_first_order_conditions():
    from widelimit import first_order_conditions

    rng = np.random.default_rng(21)
    X = rng.standard_normal((80, 6)) * 2
    sae = SAE(W_dec=rng.standard_normal((9, 6)), b_dec=rng.standard_normal(6) * 0.2,
              W_enc=rng.standard_normal((6, 9)), b_enc=rng.standard_normal(9) * 0.3, dtype="float64")
    cert = certify_sae(X, sae, lam=LAM, device="cpu", batch_size=17)
    f = sae.encode(X)
    foc = first_order_conditions(X, sae.W_dec, f, sae.b_dec, lam=LAM)
    F = cert.features
    assert np.nanmax(F["max_violation_firing"]) == pytest.approx(foc.code_active_error, rel=1e-9)
    assert np.max(F["max_violation_silent"]) == pytest.approx(max(0.0, -foc.code_margin), rel=1e-9, abs=1e-12)
    assert np.max(F["tangent_grad_norm"]) == pytest.approx(foc.atom_gradient, rel=1e-9)
    assert cert.bias_stationarity == pytest.approx(foc.bias_residual, rel=1e-9)


@pytest.mark.parametrize("parts_bytes", [None, 1])
def test_sparse_code_kernels_match_dense_products(monkeypatch, parts_bytes):
    # the CPU kernels of certify_sae against plain dense float64 numpy: residuals with the per-token sums,
    # and Z^T R with per-thread accumulators (parts_bytes=1 forces a single accumulator)
    import numba
    import scipy.sparse as sp

    from widelimit.sae import _kernels

    if parts_bytes is not None:
        monkeypatch.setattr(_kernels, "ACCUMULATOR_BYTES", parts_bytes)
    rng = np.random.default_rng(3)
    m, n, k = 57, 13, 40
    U = rng.standard_normal((k, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    x, b = rng.standard_normal((m, n)), rng.standard_normal(n)
    Zd = sp.random(m, k, density=0.15, format="csr", random_state=1).toarray()
    Zd[4] = 0.0  # a token with no code
    Z = sp.csr_array(np.abs(Zd))
    R, sums = _kernels.residuals(x, b, U, Z)
    Rd = x - b - Z.toarray() @ U
    xh = x - Rd
    np.testing.assert_allclose(R, Rd, rtol=0, atol=1e-13)
    expect = np.stack([(x * x).sum(1), (xh * xh).sum(1), (x * xh).sum(1), (Rd * Rd).sum(1), (Rd * (x - b)).sum(1)], 1)
    np.testing.assert_allclose(sums, expect, rtol=1e-13)
    torch_sums = _kernels.token_sums(torch.from_numpy(x), torch.from_numpy(x - b), torch.from_numpy(Rd)).numpy()
    np.testing.assert_allclose(torch_sums, expect, rtol=1e-13)
    prev = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        out = np.full((k, n), 0.5)
        _kernels.add_codes_t_residuals(Z, R, out)
    finally:
        numba.set_num_threads(prev)
    np.testing.assert_allclose(out, 0.5 + Z.toarray().T @ Rd, rtol=0, atol=1e-12)


def _random_standard_sae(seed, n, k, N):
    """A random ReLU SAE whose codes are neither optimal nor trivial, and ``N`` random tokens."""
    rng = np.random.default_rng(seed)
    W_dec = rng.standard_normal((k, n)) * rng.uniform(0.5, 2.0, (k, 1))
    sae = SAE(W_dec=W_dec, b_dec=0.1 * rng.standard_normal(n), W_enc=0.3 * rng.standard_normal((n, k)),
              b_enc=-0.2 + 0.1 * rng.standard_normal(k), architecture="standard")
    return sae, 2.0 * rng.standard_normal((N, n))


def test_numba_kernels_and_torch_products_give_the_same_certificate():
    # the CPU path (sparse-code products in numba) against the torch products a GPU runs (backend="torch":
    # the GPU's code path on the CPU), on a random SAE whose codes are neither optimal nor trivial, over batches
    k = 40
    sae, X = _random_standard_sae(8, 12, k, 300)
    runs = []
    for backend in ("numba", "torch"):
        runs.append(certify_sae(X, sae, lam=0.4, device="cpu", batch_size=70, coding_tol=1e-10, backend=backend))
    a, b = runs
    assert 0 < a.metrics["l0"] < k  # codes are sparse, not trivial
    for key in ("sae_objective", "optimal_code_objective", "coding_gap", "lower_bound", "bias_stationarity",
                "max_residual_norm"):
        assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-9, abs=1e-12), key
    for key in ("mse", "explained_variance", "cossim", "l2_ratio", "relative_reconstruction_bias", "l0", "l1",
                "frac_alive", "optimal_mse", "optimal_l0"):
        assert b.metrics[key] == pytest.approx(a.metrics[key], rel=1e-10), key
    for col in ("max_violation_firing", "max_violation_silent", "tangent_grad_norm", "tangent_grad_norm_optimal_codes"):
        np.testing.assert_allclose(b.features[col], a.features[col], rtol=1e-8, atol=1e-10, err_msg=col)


def test_screened_coder_and_float32_kkt_same_certificate_in_numba_and_torch():
    # the wide-SAE path (screened coder, float32 KKT product made exact) forced on a small SAE: the CPU kernels
    # (numba restricted solves, loops per entry) against the torch code a GPU runs (backend="torch" on the CPU)
    k = 60
    sae, X = _random_standard_sae(9, 16, k, 200)
    a, b = (certify_sae(X, sae, lam=0.4, device="cpu", batch_size=70, coding_tol=1e-10, coding_algorithm="screened",
                        backend=bk) for bk in ("numba", "torch"))
    ref = certify_sae(X, sae, lam=0.4, device="cpu", batch_size=70, coding_tol=1e-10)  # the Gram coder, float64 KKT
    assert 0 < a.metrics["l0"] < k
    for c in (a, b):
        assert c.optimal_code_objective == pytest.approx(ref.optimal_code_objective, rel=1e-9)
        for col in ("max_violation_firing", "max_violation_silent"):
            np.testing.assert_allclose(c.features[col], ref.features[col], rtol=1e-9, atol=1e-11, err_msg=col)


def test_progress_events_carry_the_rate_and_the_time_left(monkeypatch):
    """Issue 31 item 5: the certify pass stamps each batch's event with its time since the pass began, on the
    engine's clock (here a fake one that ticks 0.5 s per reading), so the rate and time left are exact."""
    import widelimit.engine.local as local

    X, sae = orthogonal_rays_sae(LAM, seed=4, n_core=2)  # 122 tokens
    ticks = iter(range(10**6))
    monkeypatch.setattr(local, "clock", lambda: 0.5 * next(ticks))
    events = []
    certify_sae(X, sae, lam=LAM, device="cpu", batch_size=50, progress=events.append)
    ev = [e for e in events if e.stage == "certify"]
    N = X.shape[0]
    assert [e.rows_done for e in ev] == [50, 100, N]
    assert [e.time_s for e in ev] == [0.5, 1.0, 1.5]  # one reading at the start, one per batch
    assert [e.rows_per_s for e in ev] == [100.0, 100.0, N / 1.5]
    assert [e.time_left_s for e in ev] == [(N - 50) / 100.0, (N - 100) / 100.0, 0.0]
    assert ev[-1].done and not ev[0].done
    # the engine's passes (the wide-limit bound's) are timed the same way
    assert all(e.time_s is not None for e in events if e.stage != "certify" and e.value is None and e.rows_total)
