r"""Downstream cost of an SAE: the model's loss with the SAE spliced into its forward pass.

For a causal language model (Hugging Face ``transformers`` via forward hooks, or
TransformerLens via ``run_with_hooks``), on next-token prediction over the
given token ids (SAELens' ``evals`` names):

* ``ce_loss_without_sae``: mean cross-entropy of the clean model;
* ``ce_loss_with_sae``: with the hooked activation replaced by the SAE's reconstruction
  ``x_hat = f(x) W_dec + b_dec``;
* ``ce_loss_with_ablation``: with the activation replaced by zeros;
* ``ce_loss_score`` (CE loss recovered): ``(CE_ablation - CE_sae) / (CE_ablation - CE_clean)``;
* ``kl_div_with_sae``, ``kl_div_with_ablation``: mean over tokens of
  ``KL(p_clean || p_spliced)`` of the next-token distributions;
  ``kl_div_score = (KL_ablation - KL_sae) / KL_ablation``.

For an embedding model (a BERT-style encoder such as all-MiniLM-L6-v2 from
:mod:`widelimit.lab.lm`): :func:`embedding_distortion` splices the SAE after a
block and reports the cosine similarity of the mean-pooled sentence embeddings
with and without it (``1 - cos`` is the distortion).

The SAE runs in float64 on the activations (:meth:`widelimit.SAE.encode`), its
output cast back to the model's dtype. SAEs with input normalisation are spliced
with SAELens' convention: normalise, reconstruct, undo the normalisation.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .formats import as_sae

__all__ = ["splice", "downstream_loss", "downstream_loss_transformer_lens", "embedding_distortion",
           "hooked_transformer_from_folder"]


def _reconstruct(sae, x):
    """SAE reconstruction of torch activations ``x (..., d_in)`` in float64, returned in ``x``'s dtype."""
    import torch

    shape, dt = x.shape, x.dtype
    h = x.reshape(-1, shape[-1]).to(torch.float64)
    norm = sae.normalize_activations
    if norm == "constant_norm_rescale":
        s = torch.linalg.norm(h, dim=1, keepdim=True).clamp_min(1e-300) / math.sqrt(sae.d_in)
        hn = h / s
    elif norm == "layer_norm":
        mu = h.mean(1, keepdim=True)
        sd = (h - mu).std(1, keepdim=True) + 1e-5
        hn = (h - mu) / sd
    else:
        hn = h
    f = sae.encode(hn, device=h.device)
    W = torch.as_tensor(np.asarray(sae.W_dec, dtype=np.float64), device=h.device)
    b = torch.as_tensor(np.asarray(sae.b_dec, dtype=np.float64), device=h.device)
    out = f @ W + b
    if norm == "constant_norm_rescale":
        out = out * s
    elif norm == "layer_norm":
        out = out * sd + mu
    return out.reshape(shape).to(dt)


class splice:
    """Context manager: replace the output of ``module`` by the SAE's reconstruction (or zeros).

    ``module`` is a ``torch.nn.Module`` whose output (or first output, for blocks
    returning tuples) is the activation the SAE was trained on, e.g.
    ``model.transformer.h[L]`` of a GPT-2 for the residual stream after block L.
    ``mode``: ``"sae"`` or ``"zero"``. ``mask`` (bool, batch x positions), set via
    the attribute of the same name before each forward pass, limits the
    replacement to those positions.
    """

    def __init__(self, module, sae=None, mode: str = "sae"):
        if mode not in ("sae", "zero"):
            raise ValueError(f"mode must be 'sae' or 'zero', got {mode!r}")
        self.module, self.sae, self.mode, self.mask, self._h = module, sae, mode, None, None

    def _hook(self, module, inputs, output):
        import torch

        x = output[0] if isinstance(output, tuple) else output
        new = torch.zeros_like(x) if self.mode == "zero" else _reconstruct(self.sae, x)
        if self.mask is not None:
            new = torch.where(self.mask.to(x.device).reshape(*x.shape[:-1], 1), new, x)
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    def __enter__(self):
        self._h = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self._h.remove()
        return False


def _ce_kl(logits, ref_logits, ids, attn):
    import torch

    lp = torch.log_softmax(logits[:, :-1].double(), -1)
    tgt = ids[:, 1:]
    m = attn[:, 1:].bool() & attn[:, :-1].bool()
    ce = -lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    out = {"ce": float(ce[m].sum()), "n": int(m.sum())}
    if ref_logits is not None:
        lq = torch.log_softmax(ref_logits[:, :-1].double(), -1)
        kl = (lq.exp() * (lq - lp)).sum(-1)
        out["kl"] = float(kl[m].sum())
    return out


def _scores(tot):
    n = tot["clean"]["n"]
    ce0, ces, cea = tot["clean"]["ce"] / n, tot["sae"]["ce"] / n, tot["zero"]["ce"] / n
    kls, kla = tot["sae"]["kl"] / n, tot["zero"]["kl"] / n
    return {"ce_loss_without_sae": ce0, "ce_loss_with_sae": ces, "ce_loss_with_ablation": cea,
            "ce_loss_score": (cea - ces) / (cea - ce0) if cea != ce0 else None,
            "kl_div_with_sae": kls, "kl_div_with_ablation": kla,
            "kl_div_score": (kla - kls) / kla if kla > 0 else None, "n_points": n}


def downstream_loss(model, sae, input_ids, *, module, attention_mask=None, batch_size: int = 8) -> dict:
    """CE loss recovered and KL of a Hugging Face causal LM with the SAE spliced at ``module`` (module docstring).

    Parameters
    ----------
    model : transformers causal LM (``model(input_ids, attention_mask=...).logits``)
    sae : SAE, library object or path (:func:`widelimit.sae.formats.as_sae`)
    input_ids : LongTensor (B, T)
    module : torch.nn.Module
        The submodule whose output the SAE reconstructs (e.g. ``model.transformer.h[L]``).
    attention_mask : LongTensor (B, T), optional
    batch_size : int
        Sequences per forward pass.
    """
    import torch

    sae = as_sae(sae)
    ids = torch.as_tensor(input_ids)
    attn = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask)
    tot = {k: {"ce": 0.0, "n": 0, "kl": 0.0} for k in ("clean", "sae", "zero")}
    model.eval()
    with torch.no_grad():
        for s in range(0, ids.shape[0], batch_size):
            i, a = ids[s : s + batch_size], attn[s : s + batch_size]
            ref = model(input_ids=i, attention_mask=a).logits
            r = _ce_kl(ref, None, i, a)
            tot["clean"]["ce"] += r["ce"]
            tot["clean"]["n"] += r["n"]
            for mode in ("sae", "zero"):
                with splice(module, sae, mode) as sp:
                    sp.mask = a.bool()
                    r = _ce_kl(model(input_ids=i, attention_mask=a).logits, ref, i, a)
                tot[mode]["ce"] += r["ce"]
                tot[mode]["kl"] += r["kl"]
    return _scores(tot)


def downstream_loss_transformer_lens(model, sae, tokens, *, hook_name: str, batch_size: int = 8) -> dict:
    """:func:`downstream_loss` for a TransformerLens ``HookedTransformer`` (``run_with_hooks`` at ``hook_name``)."""
    import torch

    sae = as_sae(sae)
    ids = torch.as_tensor(tokens)
    attn = torch.ones_like(ids)
    tot = {k: {"ce": 0.0, "n": 0, "kl": 0.0} for k in ("clean", "sae", "zero")}
    with torch.no_grad():
        for s in range(0, ids.shape[0], batch_size):
            i, a = ids[s : s + batch_size], attn[s : s + batch_size]
            ref = model(i)
            r = _ce_kl(ref, None, i, a)
            tot["clean"]["ce"] += r["ce"]
            tot["clean"]["n"] += r["n"]
            for mode, fn in (("sae", lambda x, hook: _reconstruct(sae, x)), ("zero", lambda x, hook: torch.zeros_like(x))):
                r = _ce_kl(model.run_with_hooks(i, fwd_hooks=[(hook_name, fn)]), ref, i, a)
                tot[mode]["ce"] += r["ce"]
                tot[mode]["kl"] += r["kl"]
    return _scores(tot)


def hooked_transformer_from_folder(folder, hf_model=None):
    """A TransformerLens ``HookedTransformer`` (CPU, float32) of the Hugging Face causal LM saved in ``folder``, offline.

    TransformerLens's ``from_pretrained`` accepts only its list of hub names; its own config conversion and
    weight conversion also read a local folder (``config.json`` of an architecture TransformerLens supports,
    e.g. GPT-2 with ``n_ctx`` recorded), and the weights are loaded unprocessed (no layer-norm folding or
    centring): the same function as the Hugging Face model, so SAELens's hook names
    (``blocks.0.hook_resid_post``) address its activations.
    """
    import transformer_lens as tl
    import transformers
    from transformer_lens import loading_from_pretrained as loading

    if hf_model is None:
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    cfg = loading.get_pretrained_model_config(str(folder), device="cpu")
    state = loading.get_pretrained_state_dict(str(folder), cfg, hf_model=hf_model.float())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (TransformerLens 3: "use TransformerBridge")
        model = tl.HookedTransformer(cfg, move_to_device=False)
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model.eval()


def embedding_distortion(model, tokenizer, texts, sae, *, layer: int, max_length: int = 128, batch_size: int = 16,
                         include_special: bool = False) -> dict:
    """Cosine similarity of mean-pooled sentence embeddings with and without the SAE spliced after block ``layer``.

    ``model`` is a BERT-style ``transformers`` encoder (``model.encoder.layer``),
    ``layer`` in ``1..n_layers`` as in :func:`widelimit.lab.lm.token_activations`
    (the output of block ``layer``). The SAE replaces the non-special tokens
    (as the activations it is trained on) unless ``include_special``. The
    embedding is the attention-masked mean of the last hidden state (the
    sentence-transformers pooling of all-MiniLM-L6-v2), L2-normalised.

    Returns ``{"cossim_mean", "cossim_min", "distortion_mean" (= 1 - cossim_mean), "n_texts"}``.
    """
    import torch

    sae = as_sae(sae)
    n_layers = len(model.encoder.layer)
    if not (isinstance(layer, int) and 1 <= layer <= n_layers):
        raise ValueError(f"layer must be an integer in [1, {n_layers}], got {layer!r}")
    special = torch.as_tensor(sorted(tokenizer.all_special_ids))
    cos = []
    model.eval()

    def embed(batch):
        h = model(**batch).last_hidden_state.double()
        m = batch["attention_mask"].unsqueeze(-1).double()
        e = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
        return torch.nn.functional.normalize(e, dim=-1)

    with torch.no_grad():
        for s in range(0, len(texts), batch_size):
            batch = tokenizer(list(texts[s : s + batch_size]), truncation=True, max_length=max_length, padding=True,
                              return_tensors="pt")
            clean = embed(batch)
            with splice(model.encoder.layer[layer - 1], sae) as sp:
                mask = batch["attention_mask"].bool()
                if not include_special:
                    mask &= ~torch.isin(batch["input_ids"], special)
                sp.mask = mask
                spliced = embed(batch)
            cos.append((clean * spliced).sum(-1).cpu().numpy())
    c = np.concatenate(cos)
    return {"cossim_mean": float(c.mean()), "cossim_min": float(c.min()), "distortion_mean": float(1.0 - c.mean()),
            "n_texts": int(c.size)}
