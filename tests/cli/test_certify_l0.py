"""``widelimit certify`` on L0-trained SAEs (issue 28): the bracket at the SAE's own sparsity leads, no L1 gain or
flag for an SAE that does not minimise the L1 objective, --json stdout is the JSON object alone (a dead JumpReLU
included), several SAEs make a sweep, and --model adds SAELens's CE loss score and the KL on a tiny GPT-2
built from a config (offline)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fixtures import libraries
from widelimit.cli import main


def _saelens(tmp_path, name, arch, d_in=16, d_sae=40, **kw):
    sl = libraries.sae_lens()
    torch.manual_seed(len(name))
    cls = {"topk": (sl.TopKSAE, sl.TopKSAEConfig), "jumprelu": (sl.JumpReLUSAE, sl.JumpReLUSAEConfig)}[arch]
    m = cls[0](cls[1](d_in=d_in, d_sae=d_sae, dtype="float32", **kw))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    m.save_model(tmp_path / name)
    return m


def _acts(tmp_path, n=200, d=16):
    X = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    np.save(tmp_path / "acts.npy", X)
    return X


def test_topk_sae_table_leads_with_its_l0_bracket(tmp_path, capsys):
    _saelens(tmp_path, "tk", "topk", k=4)
    _acts(tmp_path)
    assert main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "tk"), "--device", "cpu",
                 "--pursuit-time", "60"]) == 0
    out = capsys.readouterr().out
    body = out.split("quantity", 1)[1]
    assert body.index("gain at its L0") < body.index("best MSE at its") < body.index("explained_variance")
    assert "should have fired" not in out and "encoder gap" not in out and "wide-limit bound" not in out


def test_json_stdout_is_the_json_alone_on_a_dead_jumprelu(tmp_path, capfd):
    m = _saelens(tmp_path, "dead", "jumprelu")
    with torch.no_grad():
        m.threshold.fill_(1e6)  # fires nothing: L0 = 0
    m.save_model(tmp_path / "dead")
    X = _acts(tmp_path)
    assert main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "dead"), "--json", "--device", "cpu"]) == 0
    out, err = capfd.readouterr()
    d = json.loads(out)  # the whole of stdout is one JSON object
    assert "DLASWP" not in out and "MKL" not in out  # (once written to stdout by oneMKL on this SAE)
    assert any(n.startswith("the SAE is dead: no feature fires on any of the 200 tokens") for n in d["notes"])
    s = d["sparsity"]
    X = X.astype(np.float64)
    xx = ((X - m.b_dec.detach().double().numpy()) ** 2).sum(1).mean()
    # budget 0 on every token: the only code is the empty one, and the bracket is exact
    assert s["value"] == pytest.approx(xx, rel=1e-12) and s["lower_bound"] == pytest.approx(xx, rel=1e-9)
    assert s["gain"] == 0.0 and d["lam"] is None and d["metrics"]["l0"] == 0.0
    assert d["metrics"]["explained_variance_legacy"] == pytest.approx(1 - np.mean(
        ((X - m.b_dec.detach().double().numpy()) ** 2).sum(1) / ((X - X.mean(0)) ** 2).sum(1)), rel=1e-9)
    # the L1 stand-in cannot be calibrated at L0 = 0: one line, status 2
    assert main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "dead"), "--objective", "l1"]) == 2
    err = capfd.readouterr().err
    assert "L0 = 0" in err and err.count("\n") == 1


def test_progress_lines_on_a_non_terminal_stderr(tmp_path, capsys):
    _saelens(tmp_path, "tk", "topk", k=4)
    _acts(tmp_path)
    assert main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "tk"), "--json", "--batch-size", "64"]) == 0
    err = capsys.readouterr().err
    first = [ln for ln in err.splitlines() if ln.startswith("certify: ")]
    assert first and first[0].startswith("certify: 64/200 tokens (32%), ") and "tokens/s" in first[0]
    assert "s left" in first[0]


def test_sweep_of_a_folder_of_saes(tmp_path, capsys):
    root = tmp_path / "ckpts"
    root.mkdir()
    for k in (2, 6):
        _saelens(root, f"k{k}", "topk", k=k)
    _acts(tmp_path)
    assert main(["certify", str(tmp_path / "acts.npy"), str(root), "--out", str(tmp_path / "out"),
                 "--device", "cpu", "--pursuit-time", "60", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["sae"] for r in d["rows"]] == ["k2", "k6"]
    assert [round(r["l0"]) for r in d["rows"]] == [2, 6]
    for r, curve in zip(d["rows"], d["curves"]):
        assert r["mse_at_l0_found"] <= r["mse"]
        at_k = [c for c in curve if c["budget"] == round(r["l0"])][0]
        assert at_k["value"] <= r["mse"] + 1e-9
        values = [c["value"] for c in sorted(curve, key=lambda c: c["budget"])]
        assert values == sorted(values, reverse=True)  # more atoms, no worse codes
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 0
    assert len((tmp_path / "out" / "sweep.csv").read_text().splitlines()) == 3


def test_model_adds_ce_loss_score_and_kl(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from widelimit.sae.downstream import downstream_loss
    from widelimit.sae.formats import load_sae

    cfg = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=50, n_positions=32, n_ctx=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(tmp_path / "gpt2")
    ids = np.random.default_rng(1).integers(0, 50, size=(6, 12))
    np.save(tmp_path / "tokens.npy", ids)
    with torch.no_grad():
        hs = model(torch.as_tensor(ids), output_hidden_states=True).hidden_states[1]  # output of transformer.h.0
    np.save(tmp_path / "acts.npy", hs.reshape(-1, 16).numpy())
    _saelens(tmp_path, "tk", "topk", k=4)
    argv = ["certify", str(tmp_path / "acts.npy"), str(tmp_path / "tk"), "--model", str(tmp_path / "gpt2"),
            "--hook", "transformer.h.0", "--tokens", str(tmp_path / "tokens.npy"), "--json", "--device", "cpu"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)["downstream"]
    want = downstream_loss(model, load_sae(tmp_path / "tk"), torch.as_tensor(ids), module=model.transformer.h[0])
    for key in ("ce_loss_score", "ce_loss_without_sae", "ce_loss_with_sae", "ce_loss_with_ablation",
                "kl_div_with_sae", "kl_div_with_ablation"):
        assert d[key] == pytest.approx(want[key], rel=1e-9), key
    bad = argv[:5] + ["--hook", "transformer.h.9"] + argv[7:]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "--hook 'transformer.h.9'" in err and err.count("\n") == 1
    # a hub name is refused before anything is downloaded: one line, status 2
    assert main(argv[:3] + ["--model", "gpt2"] + argv[5:]) == 2
    err = capsys.readouterr().err
    assert "--model gpt2: not a local folder" in err and err.count("\n") == 1
    # a TransformerLens hook name: the same model as a HookedTransformer, SAELens's hook at block 0's output
    pytest.importorskip("transformer_lens")
    assert main(argv[:6] + ["blocks.0.hook_resid_post"] + argv[7:]) == 0
    tl = json.loads(capsys.readouterr().out)["downstream"]
    for key in ("ce_loss_score", "ce_loss_without_sae", "ce_loss_with_sae", "ce_loss_with_ablation",
                "kl_div_with_sae", "kl_div_with_ablation"):
        assert tl[key] == pytest.approx(d[key], rel=1e-4, abs=1e-6), key  # HF hooks vs TransformerLens, float32
