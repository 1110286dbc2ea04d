"""dictionary_learning files: ``ae.pt`` (a state dict, read with ``weights_only=True``) + ``config.json``.

Classes (``trainer.dict_class``): AutoEncoder (standard), JumpReluAutoEncoder,
AutoEncoderTopK (topk), BatchTopKSAE (batchtopk), MatryoshkaBatchTopKSAE
(matryoshka), GatedAutoEncoder (gated). Without a config the class is read from
the state dict's tensor names where they tell it apart (and the SAE's warnings
say so); AutoEncoderTopK and BatchTopKSAE store the same tensors, so without a
config that pair is refused unless the caller names the architecture.
"""

from __future__ import annotations

from pathlib import Path

from ..model import SAE, SAEFormatError
from ._io import cfg_get, check_dims, check_unused, dtype_name, get_tensor, read_json, read_pt, tensor_int

#: Tensors a dictionary_learning class stores that its encoder and decoder do not read: noted, not refused.
_IGNORED = {
    "AutoEncoderTopK": {"threshold": "AutoEncoderTopK keeps a threshold for its optional thresholded inference "
                                     "(encode(use_threshold=True)); its top-k encoder, certified here, does not read it"},
    "MatryoshkaBatchTopKSAE": {"group_sizes": "the nested groups shape the Matryoshka training loss, not the encoder"},
}

#: The tensors each class's encoder and decoder read (as loaded below).
_READ = {
    "AutoEncoder": {"encoder.weight", "encoder.bias", "decoder.weight", "bias"},
    "JumpReluAutoEncoder": {"W_enc", "b_enc", "W_dec", "b_dec", "threshold"},
    "GatedAutoEncoder": {"encoder.weight", "decoder.weight", "decoder_bias", "gate_bias", "mag_bias", "r_mag"},
    "AutoEncoderTopK": {"encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "k"},
    "BatchTopKSAE": {"encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "k", "threshold"},
    "MatryoshkaBatchTopKSAE": {"W_enc", "b_enc", "W_dec", "b_dec", "k", "threshold"},
}

CLASSES = {"AutoEncoder": "standard", "JumpReluAutoEncoder": "jumprelu", "AutoEncoderTopK": "topk",
           "BatchTopKSAE": "batchtopk", "MatryoshkaBatchTopKSAE": "matryoshka", "GatedAutoEncoder": "gated"}


def _infer_class(sd, ae_path, architecture):
    if architecture is not None:
        by_arch = {v: k for k, v in CLASSES.items()}
        if architecture not in by_arch:
            raise SAEFormatError(f"{ae_path}: architecture {architecture!r} has no dictionary_learning class; "
                                 f"supported: {', '.join(by_arch)}")
        return by_arch[architecture], None
    if "W_enc" in sd and "group_sizes" in sd:
        return "MatryoshkaBatchTopKSAE", "group_sizes"
    if "W_enc" in sd and "threshold" in sd:
        return "JumpReluAutoEncoder", "W_enc and threshold"
    if "r_mag" in sd:
        return "GatedAutoEncoder", "r_mag"
    if "encoder.weight" in sd and "bias" in sd:
        return "AutoEncoder", "encoder.weight and bias"
    if "k" in sd and "encoder.weight" in sd:
        raise SAEFormatError(f"{ae_path}: AutoEncoderTopK and BatchTopKSAE store the same tensors and there is no "
                             "config.json with trainer.dict_class; name the architecture (topk or batchtopk)")
    raise SAEFormatError(f"{ae_path}: cannot tell the dictionary_learning class from its tensors "
                         f"({', '.join(sorted(sd))}) and there is no config.json with trainer.dict_class")


def load_dictionary_learning(ae_path: Path, cfg_path: Path | None, *, architecture: str | None = None) -> SAE:
    """Read a dictionary_learning ``ae.pt`` (+ ``config.json``); errors name the file and field."""
    sd = read_pt(ae_path)
    cfg = read_json(cfg_path) if cfg_path is not None and cfg_path.exists() else {}
    return dl_from_dicts(sd, cfg, ae_path=ae_path, cfg_path=cfg_path, architecture=architecture)


def dl_from_dicts(sd: dict, cfg: dict, *, ae_path, cfg_path, architecture=None, source_format="dictionary_learning",
                  apply_b_dec_to_input=None) -> SAE:
    """An :class:`SAE` from a dictionary_learning state dict and config (the paths name them in errors)."""
    where = cfg_path if cfg else ae_path
    if "trainer" in cfg:
        trainer, pre = cfg_get(cfg, "trainer", cfg_path, "dict"), "trainer."
    else:
        trainer, pre = cfg, ""
    cls = cfg_get(trainer, "dict_class", where, "str", None, prefix=pre)
    warnings: list[str] = []
    if cls is None:
        cls, why = _infer_class(sd, ae_path, architecture)
        if why is not None:
            warnings.append(f"no trainer.dict_class in a config: class {cls} read from the tensors ({why})")
    if cls not in CLASSES:
        raise SAEFormatError(f"{where}: unsupported dictionary_learning dict_class {cls!r}; "
                             f"supported: {', '.join(CLASSES)}")
    arch = CLASSES[cls]
    if architecture is not None and architecture != arch:
        raise SAEFormatError(f"{where}: field '{pre}dict_class' is {cls} ({arch}) but {architecture!r} was asked for")
    d_in = cfg_get(trainer, "activation_dim", where, "pos_int", None, prefix=pre)
    d_sae = cfg_get(trainer, "dict_size", where, "pos_int", None, prefix=pre)
    k = None
    T = lambda n, why: get_tensor(sd, n, ae_path, f"{cls} {why}")  # noqa: E731
    apply = True
    if arch == "standard":
        kw = {"W_enc": T("encoder.weight", "encoder").T, "b_enc": T("encoder.bias", "encoder"),
              "W_dec": T("decoder.weight", "decoder").T, "b_dec": T("bias", "bias")}
    elif arch == "jumprelu":
        kw = {n: T(n, "weights") for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
        apply = cfg_get(trainer, "apply_b_dec_to_input", where, "bool", False, prefix=pre)
        if apply_b_dec_to_input is not None:
            apply = bool(apply_b_dec_to_input)
    elif arch == "gated":
        kw = {"W_enc": T("encoder.weight", "encoder").T, "W_dec": T("decoder.weight", "decoder").T,
              "b_dec": T("decoder_bias", "decoder bias"), "b_gate": T("gate_bias", "gate"),
              "b_mag": T("mag_bias", "magnitude"), "r_mag": T("r_mag", "magnitude")}
    else:  # topk, batchtopk, matryoshka
        if arch == "matryoshka":
            kw = {n: T(n, "weights") for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
        else:
            kw = {"W_enc": T("encoder.weight", "encoder").T, "b_enc": T("encoder.bias", "encoder"),
                  "W_dec": T("decoder.weight", "decoder").T, "b_dec": T("b_dec", "decoder bias")}
        k = cfg_get(trainer, "k", where, "pos_int", None, prefix=pre)
        if "k" in sd:
            k_sd = tensor_int(sd, "k", ae_path)
            if k is not None and k != k_sd:
                raise SAEFormatError(f"{ae_path}: tensor 'k' = {k_sd} but {cfg_path} says {pre}k = {k}")
            k = k_sd
        if k is None:
            raise SAEFormatError(f"{ae_path}: {cls} without k (no 'k' tensor and no {pre}k in a config)")
        if arch != "topk" and "threshold" in sd:
            kw["threshold"] = sd["threshold"]
    check_unused(sd, _READ[cls], ae_path, f"dictionary_learning {cls}", warnings, _IGNORED.get(cls))
    l1 = cfg_get(trainer, "l1_penalty", where, "l1", None, prefix=pre)
    sae = SAE(**kw, architecture=arch, k=k, apply_b_dec_to_input=apply, source_format=source_format,
              path=str(ae_path), dtype=dtype_name(sd), l1_coefficient=l1, config=cfg, warnings=warnings)
    check_dims(sae, where, d_in, d_sae)
    return sae
