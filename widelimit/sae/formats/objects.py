"""SAE objects in memory: ``sae_lens.SAE`` (v6), dictionary_learning dictionaries, a sparsify ``Sae``, any module.

:func:`from_object` reads the object's own weights and config with the same
code that reads its files (so the same checks and the same settings:
``apply_b_dec_to_input``, activation normalisation, the L1 coefficient SAELens
records in ``metadata.training_architecture_details``). None of the libraries
is imported here: objects are recognised by their class and module names.
"""

from __future__ import annotations

import dataclasses

from ..model import SAE, SAEFormatError
from .dictionary_learning import CLASSES, dl_from_dicts
from .saelens import saelens_from_dicts
from .sparsify import sparsify_from_dicts


def _state(obj) -> dict:
    return {k: v.detach().cpu() for k, v in obj.state_dict().items()}


def _mro_names(obj):
    return [(c.__module__ or "", c.__name__) for c in type(obj).__mro__]


def _from_sae_lens(obj, architecture, norm_scaling_factor):
    name = f"sae_lens.{type(obj).__name__}"
    cfg_obj = obj.cfg
    sd = {k: v for k, v in obj.state_dict().items()}
    if hasattr(obj, "process_state_dict_for_saving_inference") and hasattr(cfg_obj, "get_inference_sae_cfg_dict"):
        obj.process_state_dict_for_saving_inference(sd)  # a TrainingSAE: its inference form (BatchTopK -> jumprelu)
        cfg = cfg_obj.get_inference_sae_cfg_dict()
        meta = cfg.get("metadata")
        if hasattr(cfg_obj, "_metadata_with_training_info"):
            cfg["metadata"] = cfg_obj._metadata_with_training_info()
        elif meta is not None and hasattr(meta, "to_dict"):
            cfg["metadata"] = meta.to_dict()
    else:
        obj.process_state_dict_for_saving(sd)
        cfg = cfg_obj.to_dict()
    sd = {k: v.detach().cpu() for k, v in sd.items()}
    if hasattr(cfg.get("metadata"), "to_dict"):
        cfg["metadata"] = cfg["metadata"].to_dict()
    return saelens_from_dicts(cfg, sd, cfg_path=f"{name}.cfg", w_path=f"{name}.state_dict()", path=None,
                              architecture=architecture, norm_scaling_factor=norm_scaling_factor,
                              source_format="sae_lens object")


def _from_dictionary_learning(obj, cls_name, architecture):
    name = f"dictionary_learning.{cls_name}"
    trainer = {"dict_class": cls_name}
    for attr, key in (("activation_dim", "activation_dim"), ("dict_size", "dict_size")):
        if isinstance(getattr(obj, attr, None), int):
            trainer[key] = getattr(obj, attr)
    apply = getattr(obj, "apply_b_dec_to_input", None) if cls_name == "JumpReluAutoEncoder" else None
    return dl_from_dicts(_state(obj), {"trainer": trainer}, ae_path=f"{name}.state_dict()", cfg_path=name,
                         architecture=architecture, source_format="dictionary_learning object",
                         apply_b_dec_to_input=apply)


def _from_sparsify(obj, architecture):
    cfg = obj.cfg.to_dict() if hasattr(obj.cfg, "to_dict") else dataclasses.asdict(obj.cfg)
    cfg["d_in"] = int(obj.d_in)
    name = f"sparsify.{type(obj).__name__}"
    return sparsify_from_dicts(cfg, _state(obj), cfg_path=f"{name}.cfg", w_path=f"{name}.state_dict()", path=None,
                               architecture=architecture, source_format="sparsify object")


def from_object(obj, *, architecture: str | None = None, k: int | None = None, norm_scaling_factor=None) -> SAE:
    """An :class:`SAE` from an SAE object of a library, or any object with ``W_dec`` and ``b_dec``.

    Parameters
    ----------
    obj
        A widelimit :class:`SAE` (returned as is); a ``sae_lens.SAE`` or
        ``TrainingSAE`` (v6; a training SAE is read in its inference form, as
        ``save_inference_model`` writes it); a dictionary_learning
        ``AutoEncoder``, ``JumpReluAutoEncoder``, ``AutoEncoderTopK``,
        ``BatchTopKSAE``, ``MatryoshkaBatchTopKSAE`` or ``GatedAutoEncoder``; a
        sparsify ``SparseCoder`` / ``Sae``; or any object with tensor attributes
        ``W_dec`` (d_sae, d_in) and ``b_dec`` (+ ``W_enc``, ``b_enc``,
        ``threshold``: then ``architecture`` names the encoder).
    architecture : str, optional
        Required for a generic object with an encoder; checked against the
        library's own class otherwise.
    k : int, optional
        Generic topk objects: active features per token.
    norm_scaling_factor : float, optional
        As for :func:`load_sae` (SAELens ``expected_average_only_in``).
    """
    if isinstance(obj, SAE):
        return obj
    names = _mro_names(obj)
    for mod, cls in names:
        if mod.startswith("sae_lens") and cls in ("SAE", "TrainingSAE"):
            return _from_sae_lens(obj, architecture, norm_scaling_factor)
    for mod, cls in names:
        if mod.startswith("dictionary_learning") and cls in CLASSES:
            return _from_dictionary_learning(obj, cls, architecture)
    for mod, cls in names:
        if mod.startswith("sparsify") and cls in ("SparseCoder", "Sae"):
            return _from_sparsify(obj, architecture)
    if hasattr(obj, "W_dec") and hasattr(obj, "b_dec"):
        where = f"{type(obj).__name__} object"
        kw = {n: getattr(obj, n) for n in ("W_dec", "b_dec", "W_enc", "b_enc", "threshold")
              if getattr(obj, n, None) is not None}
        if "W_enc" in kw and architecture is None:
            raise SAEFormatError(f"{where}: it has an encoder (W_enc) but not of a known library; name its "
                                 "architecture (standard, jumprelu, topk, ...)")
        arch = architecture or "decoder_only"
        if arch == "decoder_only":
            kw = {n: kw[n] for n in ("W_dec", "b_dec")}
        apply = getattr(obj, "apply_b_dec_to_input", True)
        return SAE(**kw, architecture=arch, k=k, apply_b_dec_to_input=bool(apply), source_format="object", path=where)
    raise SAEFormatError(f"{type(obj).__name__} object: not an SAE (no W_dec and b_dec); give a widelimit SAE, a "
                         "sae_lens.SAE, a dictionary_learning dictionary, a sparsify Sae or a path")
