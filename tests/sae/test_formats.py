"""SAE files: loaders, savers, round trips, encoders against each library's own formulas, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import widelimit as wl
from widelimit.data.source import ActivationSource, DataError, open_activations
from fixtures.saes import orthogonal_rays_sae, save_dictionary_learning, save_plain, save_sparsify
from widelimit.sae.formats import load_sae, save_saelens
from widelimit.sae.model import SAE, SAEFormatError

ARCHS = ["standard", "jumprelu", "topk", "gated"]


def random_sae(arch="standard", d_in=6, d_sae=9, seed=0, apply=True, dtype="float32"):
    rng = np.random.default_rng(seed)
    dt = np.float64 if dtype == "float64" else np.float32
    kw = dict(W_dec=rng.standard_normal((d_sae, d_in)).astype(dt), b_dec=rng.standard_normal(d_in).astype(dt),
              W_enc=rng.standard_normal((d_in, d_sae)).astype(dt), architecture=arch, apply_b_dec_to_input=apply,
              dtype=dtype)
    if arch == "gated":
        kw.update(b_gate=rng.standard_normal(d_sae).astype(dt), b_mag=rng.standard_normal(d_sae).astype(dt),
                  r_mag=(0.3 * rng.standard_normal(d_sae)).astype(dt))
    else:
        kw["b_enc"] = rng.standard_normal(d_sae).astype(dt)
    if arch == "jumprelu":
        kw["threshold"] = np.abs(rng.standard_normal(d_sae)).astype(dt)
    if arch == "topk":
        kw["k"] = 3
    return SAE(**kw)


def assert_same_sae(a: SAE, b: SAE, exact=True):
    assert a.architecture == b.architecture and a.k == b.k
    assert a.apply_b_dec_to_input == b.apply_b_dec_to_input
    assert a.normalize_activations == b.normalize_activations
    for name, x in a.state_dict().items():
        y = getattr(b, name)
        assert y.shape == x.shape, name
        if exact:
            assert np.array_equal(np.asarray(x), np.asarray(y)), name
        else:
            np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-6, err_msg=name)


# --------------------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("legacy", [False, True])
def test_saelens_round_trip(tmp_path, arch, legacy):
    sae = random_sae(arch, apply=arch != "jumprelu")
    save_saelens(sae, tmp_path / "s", legacy=legacy)
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert ("metadata" in cfg) != legacy
    back = load_sae(tmp_path / "s")
    assert back.source_format == ("saelens-legacy" if legacy else "saelens")
    assert_same_sae(sae, back)
    X = np.random.default_rng(1).standard_normal((20, sae.d_in))
    np.testing.assert_array_equal(back.encode(X), sae.encode(X))


@pytest.mark.parametrize("arch", ARCHS)
def test_dictionary_learning_round_trip(tmp_path, arch):
    # dictionary_learning fixes apply_b_dec_to_input per class; a matching SAE is stored identically
    sae = random_sae(arch, apply=arch != "jumprelu")
    save_dictionary_learning(sae, tmp_path / "d")
    back = load_sae(tmp_path / "d")
    assert back.source_format == "dictionary_learning"
    assert_same_sae(sae, back)
    # ... and a non-matching one through the equivalent encoder bias: same codes
    other = random_sae(arch, apply=arch == "jumprelu", seed=3)
    save_dictionary_learning(other, tmp_path / "d2")
    back2 = load_sae(tmp_path / "d2" / "ae.pt")
    X = np.random.default_rng(2).standard_normal((30, other.d_in))
    np.testing.assert_allclose(back2.encode(X), other.encode(X), rtol=1e-5, atol=1e-5)


def test_sparsify_round_trip(tmp_path):
    sae = random_sae("topk")
    save_sparsify(sae, tmp_path / "sp")
    back = load_sae(tmp_path / "sp")
    assert back.source_format == "sparsify"
    assert_same_sae(sae, back)
    with pytest.raises(ValueError, match="TopK SAEs only"):
        save_sparsify(random_sae("standard"), tmp_path / "bad")


@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk", "decoder_only"])
def test_plain_round_trip(tmp_path, ext, arch):
    if arch == "decoder_only":
        s = random_sae("standard")
        sae = SAE(W_dec=s.W_dec, b_dec=s.b_dec, architecture="decoder_only")
    else:
        sae = random_sae(arch)
    p = save_plain(sae, tmp_path / f"sae{ext}")
    back = load_sae(p)
    assert_same_sae(sae, back)


def test_bfloat16_weights_round_trip(tmp_path):
    sae = random_sae("jumprelu", apply=False)
    sae.dtype = "bfloat16"
    save_saelens(sae, tmp_path / "b")
    sd = load_file(str(tmp_path / "b" / "sae_weights.safetensors"))
    assert sd["W_dec"].dtype == torch.bfloat16
    back = load_sae(tmp_path / "b")
    assert back.dtype == "bfloat16" and back.W_dec.dtype == np.float32
    np.testing.assert_array_equal(back.W_dec, sd["W_dec"].float().numpy())


# --------------------------------------------------------------------------------------
# encoders: each library's own formula, written independently from the raw files
# --------------------------------------------------------------------------------------


def test_encoders_match_library_formulas(tmp_path):
    rng = np.random.default_rng(5)
    X = torch.as_tensor(rng.standard_normal((40, 6)), dtype=torch.float64)
    # SAELens v6 (sae_lens/saes/*.py): process_sae_in subtracts b_dec * apply_b_dec_to_input
    for arch in ARCHS:
        sae = random_sae(arch, dtype="float64")
        save_saelens(sae, tmp_path / arch)
        sd = {k: v.double() for k, v in load_file(str(tmp_path / arch / "sae_weights.safetensors")).items()}
        x = X - sd["b_dec"]
        if arch == "gated":
            gate = (x @ sd["W_enc"] + sd["b_gate"] > 0).double()
            ref = gate * torch.relu(x @ (sd["W_enc"] * sd["r_mag"].exp()) + sd["b_mag"])
        else:
            pre = x @ sd["W_enc"] + sd["b_enc"]
            if arch == "standard":
                ref = torch.relu(pre)
            elif arch == "jumprelu":
                ref = torch.relu(pre) * (pre > sd["threshold"])
            else:
                top = torch.topk(pre, k=3, dim=-1)
                ref = torch.zeros_like(pre).scatter_(-1, top.indices, torch.relu(top.values))
        got = load_sae(tmp_path / arch).encode(X.numpy())
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-12, atol=1e-12, err_msg=arch)
    # dictionary_learning AutoEncoder: relu(encoder(x - bias)); decoder(f) + bias
    sae = random_sae("standard", dtype="float64")
    save_dictionary_learning(sae, tmp_path / "dl")
    sd = torch.load(tmp_path / "dl" / "ae.pt", weights_only=True)
    enc = torch.nn.Linear(6, 9).double()
    enc.weight.data, enc.bias.data = sd["encoder.weight"], sd["encoder.bias"]
    f = torch.relu(enc(X - sd["bias"]))
    xhat = f @ sd["decoder.weight"].T + sd["bias"]
    back = load_sae(tmp_path / "dl")
    np.testing.assert_allclose(back.encode(X.numpy()), f.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(back.decode(back.encode(X.numpy())), xhat.detach().numpy(), rtol=1e-12, atol=1e-12)
    # sparsify: relu(linear(x - b_dec, encoder.weight, encoder.bias)) then top-k; decode with W_dec rows
    sae = random_sae("topk", dtype="float64")
    save_sparsify(sae, tmp_path / "sp")
    sd = load_file(str(tmp_path / "sp" / "sae.safetensors"))
    pre = torch.relu(torch.nn.functional.linear(X - sd["b_dec"], sd["encoder.weight"], sd["encoder.bias"]))
    top = pre.topk(3, dim=-1)
    f = torch.zeros_like(pre).scatter_(-1, top.indices, top.values)
    np.testing.assert_allclose(load_sae(tmp_path / "sp").encode(X.numpy()), f.numpy(), rtol=1e-12, atol=1e-12)


def test_topk_rescale_by_decoder_norm():
    sae = random_sae("topk", dtype="float64")
    sae.rescale_acts_by_decoder_norm = True
    X = np.random.default_rng(0).standard_normal((15, 6))
    n = np.linalg.norm(sae.W_dec, axis=1)
    pre = ((X - sae.b_dec) @ sae.W_enc + sae.b_enc) * n  # SAELens: rank pre * ||W_dec||, decode (f / ||W_dec||) W_dec
    f = np.zeros_like(pre)
    idx = np.argsort(-pre, axis=1)[:, :3]
    np.put_along_axis(f, idx, np.maximum(np.take_along_axis(pre, idx, 1), 0), 1)
    np.testing.assert_allclose(sae.decode(sae.encode(X)), (f / n) @ sae.W_dec + sae.b_dec, rtol=1e-12, atol=1e-12)


def test_normalisation_settings(tmp_path):
    sae = random_sae("standard", dtype="float64")
    X = np.random.default_rng(0).standard_normal((5, 6)) * 3 + 1
    sae.normalize_activations = "constant_norm_rescale"
    np.testing.assert_allclose(np.linalg.norm(sae.preprocess(X), axis=1), np.sqrt(6))
    sae.normalize_activations = "layer_norm"
    Y = sae.preprocess(X)
    ref = (X - X.mean(1, keepdims=True)) / (X.std(1, ddof=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(Y, ref)
    # expected_average_only_in: refused without the factor, folded with it
    sae.normalize_activations = "none"
    save_saelens(sae, tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "cfg.json").read_text())
    cfg["normalize_activations"] = "expected_average_only_in"
    (tmp_path / "e" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="norm_scaling_factor"):
        load_sae(tmp_path / "e")
    s = 2.5
    folded = load_sae(tmp_path / "e", norm_scaling_factor=s)
    # the folded SAE on raw x equals the original on s * x, mapped back by 1/s
    np.testing.assert_allclose(folded.encode(X), sae.encode(s * X), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(folded.decode(folded.encode(X)), sae.decode(sae.encode(s * X)) / s, rtol=1e-10, atol=1e-10)


def test_folded_norm_scaling_certifies_the_sae_s_own_objective(tmp_path):
    """An SAE exactly optimal for its training objective on s x (lam 0.7, built from the closed form) must be
    certified optimal on raw x once the factor is folded: the raw objective has l1 / s (lam 0.7 / s). Keeping
    l1 made it 28% "above the optimum" of an objective it never had."""
    X = np.random.default_rng(0).standard_normal((200, 1)) * 3  # the training activations s x
    lam, s = 0.7, 4.0
    b = wl.solve(X, lam=lam).bias
    opt = SAE(W_dec=np.array([[1.0], [-1.0]]), b_dec=b, W_enc=np.array([[1.0, -1.0]]), b_enc=np.array([-lam, -lam]),
              architecture="standard", l1_coefficient=2 * lam, dtype="float64")
    assert wl.certify_sae(X, opt).certified
    save_saelens(opt, tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "cfg.json").read_text())
    cfg["normalize_activations"] = "expected_average_only_in"
    (tmp_path / "e" / "cfg.json").write_text(json.dumps(cfg))
    folded = load_sae(tmp_path / "e", norm_scaling_factor=s)
    assert folded.l1_coefficient == 2 * lam / s
    c = wl.certify_sae(X / s, folded)
    assert c.lam == lam / s and c.certified
    # the raw objective is the training objective over s^2, point for point
    assert c.sae_objective == pytest.approx(wl.certify_sae(X, opt).sae_objective / s**2, rel=1e-12)


def test_orthogonal_rays_sae_every_architecture_same_codes():
    codes = []
    for arch in ARCHS:
        X, sae = orthogonal_rays_sae(0.5, architecture=arch, n_core=2)
        codes.append(sae.encode(X))
    for c in codes[1:]:
        np.testing.assert_allclose(c, codes[0], atol=1e-12)


# --------------------------------------------------------------------------------------
# bad input: one clear error naming the file and the tensor
# --------------------------------------------------------------------------------------


def test_missing_tensor_names_file_and_tensor(tmp_path):
    save_saelens(random_sae("standard"), tmp_path / "m")
    p = tmp_path / "m" / "sae_weights.safetensors"
    sd = load_file(str(p))
    del sd["W_enc"]
    save_file(sd, str(p))
    with pytest.raises(SAEFormatError, match=r"sae_weights\.safetensors.*'W_enc'"):
        load_sae(tmp_path / "m")


def test_shape_mismatch_against_config(tmp_path):
    save_saelens(random_sae("standard"), tmp_path / "c")
    cfg = json.loads((tmp_path / "c" / "cfg.json").read_text())
    cfg["d_sae"] = 10
    (tmp_path / "c" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match=r"cfg\.json.*d_sae=10"):
        load_sae(tmp_path / "c")
    p = tmp_path / "c" / "sae_weights.safetensors"
    sd = load_file(str(p))
    sd["b_enc"] = torch.zeros(4)
    save_file(sd, str(p))
    with pytest.raises(SAEFormatError, match=r"'b_enc' has shape \(4,\)"):
        load_sae(tmp_path / "c")


def test_unknown_architecture_and_options(tmp_path):
    save_saelens(random_sae("standard"), tmp_path / "u")
    cfg = json.loads((tmp_path / "u" / "cfg.json").read_text())
    cfg["architecture"] = "temporal"
    (tmp_path / "u" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="unsupported SAELens architecture .temporal."):
        load_sae(tmp_path / "u")
    save_sparsify(random_sae("topk"), tmp_path / "sp")
    cfg = json.loads((tmp_path / "sp" / "cfg.json").read_text())
    cfg["skip_connection"] = True
    (tmp_path / "sp" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="skip_connection"):
        load_sae(tmp_path / "sp")
    save_dictionary_learning(random_sae("standard"), tmp_path / "dl")
    cfg = json.loads((tmp_path / "dl" / "config.json").read_text())
    cfg["trainer"]["dict_class"] = "CrossCoder"
    (tmp_path / "dl" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="unsupported dictionary_learning dict_class 'CrossCoder'"):
        load_sae(tmp_path / "dl")


class _Payload:
    pass


def test_pickled_objects_are_refused(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    torch.save({"encoder.weight": torch.zeros(3, 2), "payload": _Payload()}, d / "ae.pt")
    with pytest.raises(SAEFormatError, match="refused to unpickle"):
        load_sae(d)
    torch.save({"acts": _Payload()}, tmp_path / "acts.pt")
    with pytest.raises(DataError, match="refused to unpickle"):
        open_activations(tmp_path / "acts.pt")


def test_unreadable_and_missing_files(tmp_path):
    with pytest.raises(SAEFormatError, match="no such file"):
        load_sae(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SAEFormatError, match="no SAE found"):
        load_sae(tmp_path / "empty")
    save_saelens(random_sae("topk"), tmp_path / "j")
    (tmp_path / "j" / "cfg.json").write_text("{not json")
    with pytest.raises(SAEFormatError, match="not valid JSON"):
        load_sae(tmp_path / "j")
    (tmp_path / "w.safetensors").write_bytes(b"garbage!garbage")
    with pytest.raises(SAEFormatError, match="w.safetensors"):
        load_sae(tmp_path / "w.safetensors")
    np.savez(tmp_path / "nodec.npz", b_dec=np.zeros(3))
    with pytest.raises(SAEFormatError, match="missing tensor 'W_dec'"):
        load_sae(tmp_path / "nodec.npz")
    np.savez(tmp_path / "nan.npz", W_dec=np.full((2, 3), np.nan), b_dec=np.zeros(3))
    with pytest.raises(SAEFormatError, match="non-finite"):
        load_sae(tmp_path / "nan.npz")


# --------------------------------------------------------------------------------------
# activation files
# --------------------------------------------------------------------------------------


def test_open_activations_formats(tmp_path):
    x = torch.randn(50, 7)
    np.save(tmp_path / "a16.npy", x.half().numpy())
    save_file({"a": x.bfloat16(), "b": x}, str(tmp_path / "a.safetensors"))
    torch.save({"acts": x.bfloat16()}, tmp_path / "a.pt")
    torch.save(x, tmp_path / "t.pt")
    a = open_activations(tmp_path / "a16.npy")
    assert isinstance(a, ActivationSource) and a.storage_dtypes == ["f16"] and a[3:9].dtype == np.float32
    np.testing.assert_array_equal(a[3:9], x[3:9].half().float().numpy())
    bf = open_activations(tmp_path / "a.safetensors", key="a")
    assert bf.shape == (50, 7) and bf[10:12].dtype == np.float32 and bf.storage_dtypes == ["bf16"]
    np.testing.assert_array_equal(bf[10:12], x[10:12].bfloat16().float().numpy())
    np.testing.assert_array_equal(np.asarray(bf), x.bfloat16().float().numpy())
    f32 = open_activations(tmp_path / "a.safetensors", key="b")
    np.testing.assert_array_equal(f32[:], x.numpy())
    np.testing.assert_array_equal(open_activations(tmp_path / "a.pt")[0:5], x[0:5].bfloat16().float().numpy())
    np.testing.assert_array_equal(open_activations(tmp_path / "t.pt")[:], x.numpy())
    with pytest.raises(DataError, match="holds several"):
        open_activations(tmp_path / "a.safetensors")


def test_open_activations_bad(tmp_path):
    np.save(tmp_path / "three.npy", np.zeros((2, 3, 4), np.float32))
    with pytest.raises(DataError, match="must be 2-D"):
        open_activations(tmp_path / "three.npy")
    np.save(tmp_path / "int.npy", np.arange(6).reshape(2, 3))  # integers are read as float64
    S = open_activations(tmp_path / "int.npy")
    assert S.dtype == np.float64 and np.array_equal(S[:], np.arange(6.0).reshape(2, 3))
    np.save(tmp_path / "str.npy", np.array([["a", "b"]]))
    with pytest.raises(DataError, match="floating point"):
        open_activations(tmp_path / "str.npy")
    with pytest.raises(DataError, match="no such file"):
        open_activations(tmp_path / "missing.npy")


def test_dtype_checked_against_config(tmp_path):
    sae = random_sae("standard")
    save_saelens(sae, tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "cfg.json").read_text())
    cfg["dtype"] = "bfloat16"
    (tmp_path / "d" / "cfg.json").write_text(json.dumps(cfg))
    back = load_sae(tmp_path / "d")
    assert any("config dtype bfloat16 but tensors are stored as float32" in w for w in back.warnings)
    p = tmp_path / "d" / "sae_weights.safetensors"
    sd = load_file(str(p))
    sd["b_dec"] = torch.zeros(6, dtype=torch.int32)
    save_file(sd, str(p))
    with pytest.raises(SAEFormatError, match=r"tensor 'b_dec' has non-float dtype"):
        load_sae(tmp_path / "d")
