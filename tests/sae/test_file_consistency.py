"""Issue 29: an SAE file is certified as what it holds, or refused.

Tensors the architecture does not read are refused, naming them (the file may hold another model), except
the extras a library legitimately stores, which the report names as ignored with the reason. Two stored forms
of one quantity (``threshold`` / ``log_threshold``, a top-level ``l1_coefficient`` and the metadata's,
``k`` / ``activation_fn_kwargs.k``) must agree, else the file is refused naming both values; when they agree
the report says which was used. Files written by the real libraries are never refused.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import widelimit as wl
from widelimit.sae.formats import load_sae
from widelimit.sae.model import SAEFormatError

from fixtures import libraries

D_IN, D_SAE = 4, 6


def _weights(folder, name="sae_weights.safetensors"):
    return folder / name, load_file(str(folder / name))


def _saelens(tmp_path, arch, training=False, **kw):
    sl = libraries.sae_lens()
    if training:
        m = sl.StandardTrainingSAE(sl.StandardTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, dtype="float64", **kw))
        m.save_model(tmp_path / arch)  # the training form: l1_coefficient at the top level and in the metadata
    else:
        cls, cfg = {"standard": (sl.StandardSAE, sl.StandardSAEConfig), "jumprelu": (sl.JumpReLUSAE, sl.JumpReLUSAEConfig),
                    "topk": (sl.TopKSAE, sl.TopKSAEConfig), "gated": (sl.GatedSAE, sl.GatedSAEConfig)}[arch]
        m = cls(cfg(d_in=D_IN, d_sae=D_SAE, dtype="float64", **kw))
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.linspace(0.05, 0.5, p.numel(), dtype=p.dtype).reshape(p.shape))
        m.save_model(tmp_path / arch)
    return tmp_path / arch


def test_real_saelens_files_load_and_extra_tensors_are_refused(tmp_path):
    for arch, kw in (("standard", {}), ("jumprelu", {}), ("topk", {"k": 2}), ("gated", {})):
        folder = _saelens(tmp_path, arch, **kw)
        sae = load_sae(folder)  # what SAELens writes is read without a refusal or a note
        assert sae.architecture == arch and sae.warnings == []
        f, sd = _weights(folder)
        sd["b_gate" if arch != "gated" else "b_enc"] = torch.zeros(D_SAE, dtype=torch.float64)
        save_file(sd, str(f))
        extra = "b_gate" if arch != "gated" else "b_enc"
        with pytest.raises(SAEFormatError, match=rf"sae_weights.safetensors: tensor '{extra}' not used by a {arch} SAE"):
            load_sae(folder)


def test_real_sparsify_files_load_and_a_skip_connection_is_refused(tmp_path):
    sp = libraries.sparsify()
    m = sp.SparseCoder(D_IN, sp.SparseCoderConfig(num_latents=D_SAE, k=3), dtype=torch.float64)
    m.save_to_disk(tmp_path / "sp")
    assert load_sae(tmp_path / "sp").warnings == []
    f, sd = _weights(tmp_path / "sp", "sae.safetensors")
    sd["W_skip"] = torch.zeros(D_IN, D_IN, dtype=torch.float64)  # a skip connection the config does not declare
    save_file(sd, str(f))
    with pytest.raises(SAEFormatError, match=r"sae.safetensors: tensor 'W_skip' not used by a sparsify topk SAE"):
        load_sae(tmp_path / "sp")


def test_real_dictionary_learning_extras_are_named_as_ignored(tmp_path):
    dic, topk, btk, mat = libraries.dictionary_learning()
    cases = {"AutoEncoderTopK": (topk.AutoEncoderTopK(D_IN, D_SAE, 3), ["'threshold'", "does not read it"]),
             "MatryoshkaBatchTopKSAE": (mat.MatryoshkaBatchTopKSAE(D_IN, D_SAE, 3, [2, 4]),
                                        ["'group_sizes'", "training loss"]),
             "AutoEncoder": (dic.AutoEncoder(D_IN, D_SAE), None)}
    for cls, (m, note) in cases.items():
        d = tmp_path / cls
        d.mkdir()
        torch.save(m.state_dict(), d / "ae.pt")
        (d / "config.json").write_text(json.dumps({"trainer": {"dict_class": cls, "activation_dim": D_IN,
                                                               "dict_size": D_SAE}}))
        sae = load_sae(d)
        if note is None:
            assert sae.warnings == []
        else:
            assert len(sae.warnings) == 1 and all(s in sae.warnings[0] for s in note + ["ignored"]), sae.warnings
        sd = m.state_dict()
        sd["log_threshold"] = torch.zeros(D_SAE)
        torch.save(sd, d / "ae.pt")
        with pytest.raises(SAEFormatError, match=rf"ae.pt: tensor 'log_threshold' not used by a dictionary_learning {cls}"):
            load_sae(d)


def test_plain_file_extra_tensor_refused(tmp_path):
    rng = np.random.default_rng(0)
    arrs = {"W_dec": rng.standard_normal((D_SAE, D_IN)), "b_dec": np.zeros(D_IN), "W_enc": rng.standard_normal((D_IN, D_SAE)),
            "b_enc": np.zeros(D_SAE), "threshold": np.full(D_SAE, 0.1)}
    np.savez(tmp_path / "ok.npz", **arrs)
    assert load_sae(tmp_path / "ok.npz").architecture == "jumprelu"
    np.savez(tmp_path / "bad.npz", **arrs, b_gate=np.zeros(D_SAE), r_mag=np.zeros(D_SAE))
    with pytest.raises(SAEFormatError, match=r"bad.npz: tensors 'b_gate', 'r_mag' not used by a jumprelu SAE"):
        load_sae(tmp_path / "bad.npz")


def test_threshold_and_log_threshold_must_agree(tmp_path):
    folder = _saelens(tmp_path, "jumprelu")
    f, sd = _weights(folder)
    t = sd["threshold"]
    sd["log_threshold"] = t.log().float()  # stored in float32: agrees up to its rounding
    save_file(sd, str(f))
    sae = load_sae(folder)
    np.testing.assert_array_equal(sae.threshold, t.numpy())  # the threshold tensor is what is used
    assert any("tensor 'threshold' and exp(tensor 'log_threshold') agree; tensor 'threshold' used" in w
               for w in sae.warnings), sae.warnings
    X = np.random.default_rng(1).standard_normal((20, D_IN))
    cert = wl.certify_sae(X, folder, lam=0.1, device="cpu")
    assert any("'threshold' used" in n for n in cert.notes)  # the report says which was used
    sd["log_threshold"] = (1.5 * t).log()
    save_file(sd, str(f))
    with pytest.raises(SAEFormatError) as e:
        load_sae(folder)
    msg = str(e.value)
    want = f"tensor 'threshold' = {float(t[0])!r} but exp(tensor 'log_threshold') = "
    assert msg.startswith(f"{f}: {want}") and "at entry 0" in msg and "refused" in msg, msg


def test_l1_coefficient_top_level_and_metadata_must_agree(tmp_path):
    folder = _saelens(tmp_path, "standard", training=True, l1_coefficient=0.7)
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["l1_coefficient"] == cfg["metadata"]["training_architecture_details"]["l1_coefficient"] == 0.7
    sae = load_sae(folder)  # SAELens' own training save: both places, equal
    assert sae.l1_coefficient == 0.7
    assert any("l1_coefficient 0.7 is given both at the top level and in metadata.training_architecture_details "
               "(equal); used" in w for w in sae.warnings), sae.warnings
    cfg["l1_coefficient"] = 0.5
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match=r"cfg.json: field 'l1_coefficient' = 0.5 but field "
                                             r"'metadata.training_architecture_details.l1_coefficient' = 0.7; "
                                             r"they disagree"):
        load_sae(folder)


def test_k_and_activation_fn_kwargs_k_must_agree(tmp_path):
    folder = _saelens(tmp_path, "topk", k=2)
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["activation_fn_kwargs"] = {"k": 2}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    assert load_sae(folder).k == 2
    cfg["activation_fn_kwargs"] = {"k": 3}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match=r"field 'k' = 2 but field 'activation_fn_kwargs.k' = 3"):
        load_sae(folder)
