"""The SAE report: metrics against independent computations, the rounding tolerance, equal-L0 objectives,
the flat dict, the figures, the training callback, and the fit -> SAELens folder -> certify round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

import widelimit as wl
from fixtures.saes import orthogonal_rays_sae
from widelimit.cli import main
from widelimit.sae.formats import load_sae, save_saelens
from widelimit.sae.model import SAE
from widelimit.sae.callback import CertifyCallback
from widelimit.sae.report import SHOULD_HAVE_FIRED, certificate_rows, figures, flat_dict

LAM = 0.5


def _random_sae(seed=0, n=8, width=12, arch="standard", **kw):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((width, n))
    return SAE(W_dec=W, b_dec=0.1 * rng.standard_normal(n), W_enc=0.5 * W.T, b_enc=-0.3 * np.ones(width),
               architecture=arch, dtype="float64", **kw), rng.standard_normal((300, n))


def test_metrics_match_an_independent_computation():
    sae, X = _random_sae()
    cert = wl.certify_sae(X, sae, lam=LAM, device="cpu")
    f = sae.encode(X)
    xh = f @ sae.W_dec + sae.b_dec
    m = cert.metrics
    nx, nh = np.linalg.norm(X, axis=1), np.linalg.norm(xh, axis=1)
    assert m["mse"] == pytest.approx(((X - xh) ** 2).sum(1).mean(), rel=1e-12)
    assert m["explained_variance"] == pytest.approx(1 - ((X - xh) ** 2).sum() / ((X - X.mean(0)) ** 2).sum(), rel=1e-10)
    assert m["cossim"] == pytest.approx(np.mean((X * xh).sum(1) / (nx * nh)), rel=1e-12)
    assert m["l2_ratio"] == pytest.approx(np.mean(nh / nx), rel=1e-12)
    assert m["relative_reconstruction_bias"] == pytest.approx(np.mean(nh ** 2) / np.mean((X * xh).sum(1)), rel=1e-12)
    assert m["l0"] == pytest.approx((f > 0).sum(1).mean(), rel=1e-15)
    assert m["l1"] == pytest.approx(f.sum(1).mean(), rel=1e-12)
    assert m["frac_alive"] == pytest.approx((f > 0).any(0).mean(), rel=1e-15)
    opt = wl.optimal_codes(X, sae.unit_dictionary(), sae.b_dec, lam=LAM, tol=1e-10)
    assert m["optimal_mse"] == pytest.approx(opt.reconstruction, rel=1e-4)
    # the gaps add up to the global gap, and the wide optimum width counts tokens outside the lam ball
    d = flat_dict(cert)
    assert d["gap/encoder"] + d["gap/dictionary_at_bias"] + d["gap/bias"] == pytest.approx(d["gap/global"], abs=1e-12)
    bstar = wl.huber_median(X, lam=LAM).point
    assert cert.wide_optimum_width == int((np.linalg.norm(X - bstar, axis=1) > LAM).sum())
    assert all("/" in k or k in ("lam", "certified", "n_points", "time_s") for k in d)
    json.dumps(d, allow_nan=False)


def test_rounding_is_not_a_violation_but_a_silent_feature_is():
    X, sae = orthogonal_rays_sae(LAM, seed=3, radius=(100.0, 400.0))  # activation norms as in real models
    X32 = X.astype(np.float32)
    s32 = SAE(**{k: v.astype(np.float32) for k, v in sae.state_dict().items()}, dtype="float32")
    cert = wl.certify_sae(X32, s32, lam=LAM, device="cpu")
    # float32 rounding of the optimum exceeds the old 1e-6 lam threshold, and is not reported
    assert np.nanmax(cert.features["max_violation_firing"]) > 1e-6 * LAM
    assert cert.violations == []
    b_enc = s32.b_enc.copy()
    b_enc[5] = -1000.0  # feature 5 stays silent on tokens it should code
    bad = SAE(**{**s32.state_dict(), "b_enc": b_enc}, dtype="float32")
    cert = wl.certify_sae(X32, bad, lam=LAM, device="cpu")
    assert cert.violating_features(SHOULD_HAVE_FIRED) == [5]


def test_topk_sae_is_certified_at_its_own_l0_and_at_equal_l0_only_when_asked():
    sae, X = _random_sae(seed=4, arch="topk", k=3)
    own = wl.certify_sae(X, sae, device="cpu")  # issue 28: no L1 stand-in unless asked
    assert own.lam is None and own.encoder_gap is None and own.lower_bound is None and own.violations == []
    f = sae.encode(X)
    mse = ((X - sae.decode(f)) ** 2).sum(1).mean()
    assert own.sparsity["sae_value"] == pytest.approx(mse, rel=1e-12)
    assert own.sparsity["lower_bound"] <= own.sparsity["value"] <= mse and own.sparsity["gain"] >= 0
    names = [r[0] for r in certificate_rows(own)]
    assert names[0] == "gain at its L0 (MSE)" and "encoder gap (L1)" not in names
    assert "features that should have fired" not in names and "wide-limit bound" not in names
    cert = wl.certify_sae(X, sae, device="cpu", objective="l1")
    obj = cert.objective
    assert obj["stand_in"] and obj["lam_source"].startswith("calibrated")
    names = [r[0] for r in certificate_rows(cert)]
    assert "L1 stand-in: objective difference" in names and "encoder gap (L1)" not in names
    assert "features that should have fired" not in names  # the L1 flags are not the TopK SAE's
    target = (sae.encode(X) > 0).sum(1).mean()
    # an independent solver at the calibrated lam fires as often as the SAE (1 % bisection tolerance)
    opt = wl.optimal_codes(X, sae.unit_dictionary(), sae.b_dec, lam=cert.lam, tol=1e-10)
    assert opt.codes.nnz / X.shape[0] == pytest.approx(target, rel=0.02)
    assert cert.metrics["optimal_l0"] == pytest.approx(target, rel=0.02)
    # a given lam wins, and the report still says it is a stand-in
    c2 = wl.certify_sae(X, sae, lam=LAM, device="cpu")
    assert c2.lam == LAM and c2.objective["stand_in"] and c2.objective["lam_source"] == "given"
    with pytest.raises(ValueError, match="records no l1_coefficient"):
        wl.certify_sae(X, _random_sae()[0])


def test_violation_figure_is_indexed_by_feature_id():
    import matplotlib

    backend = matplotlib.get_backend()
    X, sae = orthogonal_rays_sae(LAM, seed=3)
    b_enc = sae.b_enc.copy()
    b_enc[5] = -4.0
    cert = wl.certify_sae(X, SAE(**{**sae.state_dict(), "b_enc": b_enc}, dtype="float64"), lam=LAM, device="cpu")
    figs = figures(cert)
    from matplotlib.figure import Figure

    assert all(isinstance(f, Figure) for f in figs.values())
    ax = figs["feature_violations"].axes[0]
    silent = [c for c in ax.collections if "should have fired" in c.get_label()][0].get_offsets()
    np.testing.assert_array_equal(silent[:, 0], np.arange(sae.d_sae))
    assert silent[5, 1] == pytest.approx(cert.features["max_violation_silent"][5])
    assert matplotlib.get_backend() == backend


def test_callback_samples_and_logs():
    X, sae = orthogonal_rays_sae(LAM, seed=6)
    logged = []
    cb = CertifyCallback(X, every=2, max_tokens=50, lam=LAM, log=lambda d, s: logged.append((s, d)))
    for step in range(5):
        cb(step, sae)
    assert [s for s, _ in logged] == [0, 2, 4] and cb.acts.shape == (50, X.shape[1])
    assert logged[0][1]["certify/n_points"] == 50 and "certify/gap/encoder" in logged[0][1]


def test_fit_out_is_a_saelens_folder_that_certify_and_sae_lens_read(tmp_path, capsys):
    X, sae = orthogonal_rays_sae(LAM, n_pairs=2, dim=4, seed=7)
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    out = tmp_path / "fit"
    assert main(["fit", str(tmp_path / "x.npy"), "--lam", str(LAM), "--width", "4", "--encoder", "standard",
                 "--max-iter", "300", "--lr", "3e-3", "--device", "cpu", "--json", "--out", str(out)]) == 0
    capsys.readouterr()
    got = load_sae(out)
    assert got.architecture == "standard" and got.l1_coefficient == 2 * LAM
    fit = wl.fit_dictionary(X, lam=LAM, width=4, encoder="standard", max_iter=50, device="cpu")
    s = fit.to_sae()
    enc = wl.learn.gradient.encoder_codes(X, "standard", fit.encoder_params, fit.bias).toarray()
    np.testing.assert_allclose(s.encode(X), enc, atol=1e-12)
    # certify reads the folder with lam from its config
    assert main(["certify", str(tmp_path / "x.npy"), str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["lam"] == LAM and d["objective"]["lam_source"].startswith("the SAE's config")
    sl = pytest.importorskip("sae_lens")
    ref = sl.SAE.load_from_disk(out)
    import torch

    np.testing.assert_allclose(ref.encode(torch.as_tensor(X, dtype=torch.float32)).detach().numpy(),
                               got.encode(X), atol=1e-4)


def test_cli_shard_folder_and_max_tokens(tmp_path, capsys):
    X, sae = orthogonal_rays_sae(LAM, seed=8)
    save_saelens(sae, tmp_path / "sae")
    (tmp_path / "shards").mkdir()
    np.save(tmp_path / "shards" / "a.npy", X[:60].astype(np.float32))
    np.save(tmp_path / "shards" / "b.npy", X[60:].astype(np.float32))
    assert main(["certify", str(tmp_path / "shards"), str(tmp_path / "sae"), "--lam", str(LAM), "--max-tokens",
                 "50", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n_points"] == 50 and d["n_points_total"] == X.shape[0]
    assert d["flat"]["n_points"] == 50


def test_fit_out_of_free_codes_says_its_encoder_was_not_trained(tmp_path, capsys):
    """`fit --out` of a free-code fit exports the tied ReLU encoder W_dec^T, b_enc = -lam, never trained. The folder
    looked like a trained standard SAE: certify then reported a sae_objective far above the fit's with no note. The
    note now goes to stderr, into cfg.json, back into the loaded SAE and into certify's notes; sae_lens still reads
    the folder."""
    from widelimit.data import datasets

    X = datasets.symmetric_rays(seed=0)
    X = X[0] if isinstance(X, tuple) else X
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "fit"
    assert main(["fit", str(tmp_path / "x.npy"), "--lam", "0.3", "--width", "6", "--json", "--out", str(out)]) == 0
    io = capsys.readouterr()
    fit = json.loads(io.out)
    note = "free-code fit: the encoder is the tied ReLU encoder W_dec^T, b_enc = -lam, not a trained one"
    assert f"widelimit fit: note: {out}: {note}" in io.err
    assert any(w.startswith(note) for w in json.loads((out / "cfg.json").read_text())["metadata"]["widelimit_warnings"])
    assert any(w.startswith(note) for w in load_sae(out).warnings)
    assert main(["certify", str(tmp_path / "x.npy"), str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert any(n.startswith(note) for n in d["notes"]) and d["sae_objective"] > 1.5 * fit["value"]
    sl = pytest.importorskip("sae_lens")
    assert sl.SAE.load_from_disk(out).cfg.d_sae == 6


@pytest.mark.parametrize("encoder", ["topk", "jumprelu"])
def test_an_l1_trained_topk_or_jumprelu_fit_is_certified_on_its_own_objective(encoder, tmp_path):
    """widelimit trains topk and jumprelu encoders on the L1 objective and records l1_coefficient = 2 lam; certify
    calibrated another lam at equal L0 and called the objective a stand-in. It uses the recorded lam now, and the
    SAE's objective is the fit's encoder value."""
    X, _ = orthogonal_rays_sae(LAM, n_pairs=2, dim=4, seed=7)
    fit = wl.fit_dictionary(X, lam=LAM, width=4, encoder=encoder, topk=2 if encoder == "topk" else None,
                            max_iter=100, device="cpu")
    save_saelens(fit.to_sae(dtype="float64"), tmp_path / "sae")
    c = wl.certify_sae(X, load_sae(tmp_path / "sae"))
    assert c.lam == LAM and c.objective["stand_in"] is False
    assert c.objective["lam_source"] == "the SAE's config (metadata.training_architecture_details.l1_coefficient / 2)"
    assert c.sae_objective == pytest.approx(fit.encoder_value, rel=1e-9)
