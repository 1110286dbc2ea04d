"""SAE configs are read strictly (issue 13.4, 13.7): the config beside a weights file is honoured, the
architecture is never guessed, and a mistyped field is one line naming the file and the field (CLI exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fixtures.saes import orthogonal_rays_sae, save_dictionary_learning, save_sparsify
from widelimit.cli import main
from widelimit.sae.formats import load_sae, save_saelens
from widelimit.sae.model import SAE, SAEFormatError


def _edit(folder, name="cfg.json", **changes):
    p = folder / name
    cfg = json.loads(p.read_text())
    for k, v in changes.items():
        if v is _DEL:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    p.write_text(json.dumps(cfg))


_DEL = object()


def test_weights_file_is_read_with_the_cfg_beside_it(tmp_path):
    X, sae = orthogonal_rays_sae(0.5, architecture="topk")
    save_saelens(sae, tmp_path / "s")
    got = load_sae(tmp_path / "s" / "sae_weights.safetensors")
    assert (got.architecture, got.k) == ("topk", 1)
    # a TopK (k=1) SAE scored as ReLU would fire every positive pre-activation: it does not
    assert ((got.encode(X) > 0).sum(1) <= 1).all()
    # and the CLI on the weights file certifies the TopK SAE (the constructed optimum)
    np.save(tmp_path / "x.npy", X)
    assert main(["certify", str(tmp_path / "x.npy"), str(tmp_path / "s" / "sae_weights.safetensors"),
                 "--lam", "0.5", "--json"]) == 0


def test_apply_b_dec_to_input_false_is_honoured(tmp_path):
    X, sae = orthogonal_rays_sae(0.5, seed=1)
    s = sae.with_b_dec_applied(False)
    save_saelens(s, tmp_path / "s")
    got = load_sae(tmp_path / "s")
    assert got.apply_b_dec_to_input is False
    np.testing.assert_allclose(got.encode(X), sae.encode(X), atol=1e-6)
    # reading it with the flag flipped would change the codes: the flag matters on this SAE
    assert np.abs(SAE(**{**got.state_dict(), "architecture": "standard"}).encode(X) - sae.encode(X)).max() > 0.1


def test_empty_config_is_refused_not_guessed(tmp_path):
    X, sae = orthogonal_rays_sae(0.5, architecture="jumprelu", seed=2)
    save_saelens(sae, tmp_path / "j")
    (tmp_path / "j" / "cfg.json").write_text("{}")
    with pytest.raises(SAEFormatError, match="cfg.json: no 'architecture' field"):
        load_sae(tmp_path / "j")
    got = load_sae(tmp_path / "j", architecture="jumprelu")
    np.testing.assert_array_equal(got.threshold, sae.threshold.astype(np.float32))
    with pytest.raises(SAEFormatError, match="tensor 'threshold' present but .* says architecture 'standard'"):
        load_sae(tmp_path / "j", architecture="standard")
    np.save(tmp_path / "x.npy", X)
    assert main(["certify", str(tmp_path / "x.npy"), str(tmp_path / "j"), "--lam", "0.5"]) == 2
    assert main(["certify", str(tmp_path / "x.npy"), str(tmp_path / "j"), "--lam", "0.5", "--architecture",
                 "jumprelu", "--json"]) == 0


@pytest.mark.parametrize("field,value,msg", [
    ("apply_b_dec_to_input", "false", "field 'apply_b_dec_to_input' must be a JSON boolean"),
    ("d_in", [1, 2], "field 'd_in' must be an integer, got [1, 2]"),
    ("d_sae", "8", "field 'd_sae' must be an integer"),
    ("k", {"a": 1}, "field 'k' must be an integer"),
    ("k", 0, "field 'k' must be a positive integer"),
    ("architecture", 3, "field 'architecture' must be a string"),
    ("normalize_activations", 1, "field 'normalize_activations' must be a string"),
    ("dtype", ["float32"], "field 'dtype' must be a string"),
    ("metadata", [], "field 'metadata' must be a JSON object"),
])
def test_saelens_mistyped_fields(tmp_path, capsys, field, value, msg):
    _, sae = orthogonal_rays_sae(0.5, architecture="topk")
    save_saelens(sae, tmp_path / "s")
    _edit(tmp_path / "s", **{field: value})
    with pytest.raises(SAEFormatError) as e:
        load_sae(tmp_path / "s")
    assert msg in str(e.value) and "cfg.json" in str(e.value) and "\n" not in str(e.value)
    np.save(tmp_path / "x.npy", np.zeros((3, sae.d_in)))
    assert main(["certify", str(tmp_path / "x.npy"), str(tmp_path / "s"), "--lam", "1"]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_l1_coefficient_mistyped_in_metadata(tmp_path):
    _, sae = orthogonal_rays_sae(0.5)
    sae.l1_coefficient = 1.0
    save_saelens(sae, tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert cfg["metadata"]["training_architecture_details"] == {"l1_coefficient": 1.0}
    assert load_sae(tmp_path / "s").l1_coefficient == 1.0
    cfg["metadata"]["training_architecture_details"]["l1_coefficient"] = [1]
    (tmp_path / "s" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="field 'metadata.training_architecture_details.l1_coefficient' must be "
                                             "a finite number, got \\[1\\]"):
        load_sae(tmp_path / "s")


def test_dictionary_learning_mistyped(tmp_path):
    _, sae = orthogonal_rays_sae(0.5, architecture="topk")
    save_dictionary_learning(sae, tmp_path / "d")
    p = tmp_path / "d" / "config.json"
    cfg = json.loads(p.read_text())
    cfg["trainer"]["activation_dim"] = [8]
    p.write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="config.json: field 'trainer.activation_dim' must be an integer, got \\[8\\]"):
        load_sae(tmp_path / "d")
    cfg["trainer"]["activation_dim"] = sae.d_in
    cfg["trainer"]["l1_penalty"] = "0.1"
    p.write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="field 'trainer.l1_penalty' must be a finite number"):
        load_sae(tmp_path / "d")
    del cfg["trainer"]["l1_penalty"]
    p.write_text(json.dumps(cfg))
    sd = torch.load(tmp_path / "d" / "ae.pt", weights_only=True)
    sd["k"] = torch.tensor([1, 2])
    torch.save(sd, tmp_path / "d" / "ae.pt")
    with pytest.raises(SAEFormatError, match="ae.pt: tensor 'k' must hold one integer, got shape \\(2,\\)"):
        load_sae(tmp_path / "d")


def test_sparsify_mistyped(tmp_path):
    _, sae = orthogonal_rays_sae(0.5, architecture="topk")
    save_sparsify(sae, tmp_path / "sp")
    _edit(tmp_path / "sp", k="1")
    with pytest.raises(SAEFormatError, match="cfg.json: field 'k' must be an integer"):
        load_sae(tmp_path / "sp")


def test_in_memory_k_checked():
    _, sae = orthogonal_rays_sae(0.5, architecture="topk")
    with pytest.raises(SAEFormatError, match="field 'k' must be an integer"):
        SAE(**sae.state_dict(), architecture="topk", k=[1, 2])
