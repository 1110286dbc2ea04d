"""SAELens folders: ``cfg.json`` + ``sae_weights.safetensors`` (v6 and the older flat configs).

Read: v6 configs (``architecture``, ``metadata``) and the older ones
(``activation_fn_str`` / ``activation_fn_kwargs``, boolean
``normalize_activations``, a ``scaling_factor`` tensor when
``finetuning_scaling_factor``). Architectures standard, jumprelu, topk, gated.
The training L1 coefficient comes from ``l1_coefficient`` or, in v6, from
``metadata.training_architecture_details.l1_coefficient``; a BatchTopK SAE
saved by SAELens as ``jumprelu`` keeps ``metadata.training_architecture``.

A config without ``architecture`` (nor the legacy ``activation_fn_str``) is
refused unless the caller names the architecture: the encoder is never guessed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..model import SAE, SAEFormatError, _arr
from ._io import (cfg_get, check_config_dtype, check_dims, check_unused, dtype_name, get_tensor, read_json,
                  read_safetensors, same_values)

_ARCHS = ("standard", "jumprelu", "topk", "gated")
_TRAINING_ONLY = {"batchtopk": "batchtopk", "matryoshka_batchtopk": "matryoshka"}


def _fold_norm_scaling(kw: dict, s: float) -> None:
    """SAELens ``fold_activation_norm_scaling_factor``: W_enc *= s, W_dec /= s, b_dec /= s (the caller divides
    ``l1_coefficient`` by ``s``, which SAELens leaves to the training objective)."""
    kw["W_enc"] = np.asarray(_arr(kw["W_enc"], "W_enc", ""), dtype=np.float64) * s
    kw["W_dec"] = np.asarray(_arr(kw["W_dec"], "W_dec", ""), dtype=np.float64) / s
    kw["b_dec"] = np.asarray(_arr(kw["b_dec"], "b_dec", ""), dtype=np.float64) / s


#: The tensors each architecture's encoder and decoder read (SAELens v6 ``sae_weights.safetensors``; the
#: legacy ``scaling_factor`` is read by every architecture).
_USED = {"standard": {"W_enc", "b_enc", "W_dec", "b_dec"}, "topk": {"W_enc", "b_enc", "W_dec", "b_dec"},
         "jumprelu": {"W_enc", "b_enc", "W_dec", "b_dec", "threshold", "log_threshold"},
         "gated": {"W_enc", "b_gate", "b_mag", "r_mag", "W_dec", "b_dec"}}


def _jumprelu_threshold(cfg, sd, kw, cfg_path, w_path, warnings):
    """The JumpReLU threshold from ``threshold``, ``exp(log_threshold)`` or the config's ``jump_relu_threshold``.

    Two of them stored: they must agree (``log_threshold`` up to the rounding of its storage dtype
    and of ``exp``), else the file is refused naming both values; when they agree the SAE's notes say
    which was used.
    """
    forms = []
    if "threshold" in sd:
        forms.append(("tensor 'threshold'", sd["threshold"].double(), 0.0))
    if "log_threshold" in sd:
        lt = sd["log_threshold"]
        eps = float(np.finfo(np.float32).eps) if lt.dtype.itemsize >= 4 else 2.0 ** -7
        rt = 4 * (eps if lt.dtype.itemsize < 8 else float(np.finfo(np.float64).eps))
        rt *= 1.0 + float(lt.double().abs().max()) if lt.numel() else 1.0
        forms.append(("exp(tensor 'log_threshold')", lt.double().exp(), rt))
    if "jump_relu_threshold" in cfg:
        t = cfg_get(cfg, "jump_relu_threshold", cfg_path, "float")
        forms.append((f"{cfg_path} field 'jump_relu_threshold'", np.full(int(kw["W_dec"].shape[0]), t), 0.0))
    if not forms:
        return get_tensor(sd, "threshold", w_path, "jumprelu thresholds")
    for name, v, rt in forms[1:]:
        same_values(forms[0][0], forms[0][1], name, v, w_path, rtol=max(rt, forms[0][2]))
    if len(forms) > 1:
        warnings.append(f"{w_path}: {' and '.join(f[0] for f in forms)} agree; {forms[0][0]} used")
    return forms[0][1]


def _l1_coefficient(cfg, meta, cfg_path, warnings):
    """``l1_coefficient`` from the top level of the config or SAELens v6's
    ``metadata.training_architecture_details``; both given: equal (then noted), else refused naming both."""
    top = cfg_get(cfg, "l1_coefficient", cfg_path, "l1", None)
    details = cfg_get(meta, "training_architecture_details", cfg_path, "dict", {}, prefix="metadata.")
    inner = cfg_get(details, "l1_coefficient", cfg_path, "l1", None, prefix="metadata.training_architecture_details.")
    if top is not None and inner is not None:
        same_values("field 'l1_coefficient'", top, "field 'metadata.training_architecture_details.l1_coefficient'",
                    inner, cfg_path)
        warnings.append(f"{cfg_path}: l1_coefficient {top:g} is given both at the top level and in "
                        "metadata.training_architecture_details (equal); used")
    return top if top is not None else inner


def _version_major(cfg, meta, cfg_path) -> int:
    v = cfg.get("sae_lens_version")
    if v is None:
        v = meta.get("sae_lens_version")
    if v is None:
        return 0
    if not isinstance(v, str):
        raise SAEFormatError(f"{cfg_path}: field 'sae_lens_version' must be a string, got {json.dumps(v)[:80]}")
    try:
        return int(v.split(".")[0])
    except ValueError:
        return 0


def load_saelens(folder: Path, *, architecture: str | None = None, norm_scaling_factor=None) -> SAE:
    """Read a SAELens folder (see the module docstring); every problem is one line naming file and field."""
    cfg_path = folder / "cfg.json"
    w_path = folder / "sae_weights.safetensors"
    cfg = read_json(cfg_path)
    sd = read_safetensors(w_path)
    return saelens_from_dicts(cfg, sd, cfg_path=cfg_path, w_path=w_path, path=str(folder), architecture=architecture,
                              norm_scaling_factor=norm_scaling_factor)


def saelens_from_dicts(cfg: dict, sd: dict, *, cfg_path, w_path, path, architecture=None, norm_scaling_factor=None,
                       source_format=None) -> SAE:
    """An :class:`SAE` from a SAELens config dict and state dict (``cfg_path`` / ``w_path`` name them in errors)."""
    meta = cfg_get(cfg, "metadata", cfg_path, "dict", None) or cfg_get(cfg, "meta", cfg_path, "dict", None) or {}
    major = _version_major(cfg, meta, cfg_path)
    legacy = major < 6 and not (major == 0 and ("metadata" in cfg or "meta" in cfg))
    arch = _architecture(cfg, cfg_path, architecture)
    reshape = cfg_get(cfg, "reshape_activations", cfg_path, "str", "none")
    if reshape not in ("none", "hook_z"):
        raise SAEFormatError(f"{cfg_path}: unsupported reshape_activations {reshape!r}")
    norm = _normalisation(cfg, cfg_path)
    apply = cfg_get(cfg, "apply_b_dec_to_input", cfg_path, "bool", True)
    rescale = cfg_get(cfg, "rescale_acts_by_decoder_norm", cfg_path, "bool", False)
    d_in = cfg_get(cfg, "d_in", cfg_path, "pos_int", None)
    d_sae = cfg_get(cfg, "d_sae", cfg_path, "pos_int", None)
    cfg_dtype = cfg_get(cfg, "dtype", cfg_path, "str", None)
    warnings: list[str] = []
    check_config_dtype(cfg_dtype, sd, warnings)
    kw, k = _weights(cfg, sd, arch, cfg_path, w_path, warnings)
    _fold_scaling_factor(sd, kw, w_path, warnings)
    norm, folded = _fold_norm(norm, norm_scaling_factor, kw, cfg_path, warnings)
    l1 = _l1_coefficient(cfg, meta, cfg_path, warnings)
    if folded is not None and l1 is not None:
        # SAELens trains on s x: ||s x - xhat_s||^2 + l1 sum f ||W_dec_s||. With W_dec = W_dec_s / s and the same
        # codes f, that is s^2 (||x - xhat||^2 + (l1 / s) sum f ||W_dec||): on raw x the coefficient is l1 / s
        l1 = float(l1) / folded
        warnings.append(f"l1_coefficient divided by the norm scaling factor (the SAE's objective on raw "
                        f"activations): {l1:g}")
    check_unused(sd, _USED[arch] | {"scaling_factor", "finetuning_scaling_factor"}, w_path, arch, warnings)
    saved = meta.get("widelimit_warnings", cfg.get("widelimit_warnings", []))
    warnings.extend(str(w) for w in saved if isinstance(saved, list))
    train_arch = cfg_get(meta, "training_architecture", cfg_path, "str", None, prefix="metadata.")
    train_arch = _TRAINING_ONLY.get(train_arch, train_arch)
    sae = SAE(**kw, architecture=arch, k=k, apply_b_dec_to_input=apply, normalize_activations=norm,
              rescale_acts_by_decoder_norm=rescale,
              source_format=source_format or ("saelens-legacy" if legacy else "saelens"), path=path, dtype=dtype_name(sd), l1_coefficient=l1,
              training_architecture=None if train_arch == arch else train_arch, config=cfg, warnings=warnings)
    check_dims(sae, cfg_path, d_in, d_sae)
    return sae


def _architecture(cfg, cfg_path, architecture) -> str:
    """The SAE's architecture from ``architecture`` or ``activation_fn_str`` (pre-6 configs), checked against the
    one asked for and the ones supported (transcoders and training checkpoints refused)."""
    arch = cfg_get(cfg, "architecture", cfg_path, "str", None)
    act = cfg_get(cfg, "activation_fn_str", cfg_path, "str", None)
    if act is None:
        act = cfg_get(cfg, "activation_fn", cfg_path, "str", None)
    if arch is None:
        if act is not None:
            arch = {"relu": "standard", "topk": "topk"}.get(act)
            if arch is None:
                raise SAEFormatError(f"{cfg_path}: unsupported activation_fn_str {act!r}; supported: relu, topk")
        elif architecture is not None:
            arch = architecture
        else:
            raise SAEFormatError(
                f"{cfg_path}: no 'architecture' field (nor 'activation_fn_str'): the encoder cannot be told from the "
                "config; name it (load_sae(..., architecture=...) or widelimit certify --architecture)")
    elif arch == "standard" and act == "topk":  # pre-6 configs: architecture standard + activation topk
        arch = "topk"
    if architecture is not None and architecture != arch:
        raise SAEFormatError(f"{cfg_path}: field 'architecture' is {arch!r} but {architecture!r} was asked for")
    if "d_out" in cfg or str(arch).endswith("transcoder"):
        raise SAEFormatError(f"{cfg_path}: transcoders (architecture {arch!r}) are not supported; only SAEs x -> x")
    if arch in _TRAINING_ONLY:
        raise SAEFormatError(f"{cfg_path}: a SAELens {arch} training checkpoint; save it with save_inference_model "
                             "(which writes it as jumprelu with its threshold) and certify that folder")
    if arch not in _ARCHS:
        raise SAEFormatError(f"{cfg_path}: unsupported SAELens architecture {arch!r}; supported: {', '.join(_ARCHS)}")
    return arch


def _normalisation(cfg, cfg_path) -> str:
    """The activation normalisation (``normalize_activations``; pre-6 configs have a boolean)."""
    norm = cfg.get("normalize_activations", "none")
    if isinstance(norm, bool):  # pre-6 boolean form
        norm = "expected_average_only_in" if norm else "none"
    norm = "none" if norm is None else cfg_get({"normalize_activations": norm}, "normalize_activations", cfg_path, "str")
    if norm == "covariance_whitening":
        raise SAEFormatError(f"{cfg_path}: normalize_activations='covariance_whitening' is not supported")
    return norm


def _weights(cfg, sd, arch, cfg_path, w_path, warnings):
    """The tensors of the SAE (as :class:`SAE` keywords) and ``k`` (topk): the encoder's by architecture and the
    JumpReLU thresholds (what was reconciled is noted in ``warnings``)."""
    kw = {"W_dec": get_tensor(sd, "W_dec", w_path, "the decoder"),
          "b_dec": get_tensor(sd, "b_dec", w_path, "the decoder bias"),
          "W_enc": get_tensor(sd, "W_enc", w_path, f"{arch} encoder")}
    if arch == "gated":
        for n in ("b_gate", "b_mag", "r_mag"):
            kw[n] = get_tensor(sd, n, w_path, "gated encoder")
    else:
        kw["b_enc"] = get_tensor(sd, "b_enc", w_path, f"{arch} encoder")
    if arch != "jumprelu":
        for t in ("threshold", "log_threshold"):
            if t in sd:
                raise SAEFormatError(f"{w_path}: tensor {t!r} present but {cfg_path} says architecture {arch!r}; "
                                     "a JumpReLU SAE needs architecture 'jumprelu'")
    k = None
    if arch == "jumprelu":
        kw["threshold"] = _jumprelu_threshold(cfg, sd, kw, cfg_path, w_path, warnings)
    if arch == "topk":
        k = cfg_get(cfg, "k", cfg_path, "pos_int", None)
        kwargs = cfg_get(cfg, "activation_fn_kwargs", cfg_path, "dict", {})
        k_old = cfg_get(kwargs, "k", cfg_path, "pos_int", None, prefix="activation_fn_kwargs.")
        if k is not None and k_old is not None:
            same_values("field 'k'", k, "field 'activation_fn_kwargs.k'", k_old, cfg_path)
            warnings.append(f"{cfg_path}: k = {k} is given both as 'k' and as 'activation_fn_kwargs.k' (equal); used")
        k = k if k is not None else k_old
        if k is None:
            raise SAEFormatError(f"{cfg_path}: topk SAE without k (neither 'k' nor activation_fn_kwargs.k)")
    return kw, k


def _fold_scaling_factor(sd, kw, w_path, warnings) -> None:
    """A finetuning scaling factor (per feature) folded into ``kw["W_dec"]``, in place."""
    if "scaling_factor" not in sd and "finetuning_scaling_factor" not in sd:
        return
    if "scaling_factor" in sd and "finetuning_scaling_factor" in sd:
        same_values("tensor 'scaling_factor'", sd["scaling_factor"], "tensor 'finetuning_scaling_factor'",
                    sd["finetuning_scaling_factor"], w_path)
        warnings.append(f"{w_path}: tensors 'scaling_factor' and 'finetuning_scaling_factor' are equal; "
                        "'finetuning_scaling_factor' used")
    sf = sd.get("finetuning_scaling_factor", sd.get("scaling_factor"))
    if hasattr(sf, "ndim") and sf.ndim == 1 and sf.shape[0] == kw["W_dec"].shape[0]:
        W = _arr(kw["W_dec"], "W_dec", w_path).astype(np.float64)
        kw["W_dec"] = W * _arr(sf, "scaling_factor", w_path).astype(np.float64)[:, None]
        if not np.allclose(_arr(sf, "scaling_factor", w_path), 1.0):
            warnings.append("finetuning scaling_factor folded into W_dec")
    else:
        raise SAEFormatError(f"{w_path}: tensor 'scaling_factor' has shape {tuple(sf.shape)}, "
                             f"expected ({kw['W_dec'].shape[0]},)")


def _fold_norm(norm, norm_scaling_factor, kw, cfg_path, warnings):
    """Fold the dataset norm scaling factor into the weights for ``expected_average_only_in`` (it is not stored in
    the files): returns the normalisation left (``"none"``) and the factor folded (``None`` when none)."""
    folded = None  # the norm scaling factor folded into the weights
    if norm == "expected_average_only_in":
        if norm_scaling_factor is None:
            raise SAEFormatError(
                f"{cfg_path}: normalize_activations='expected_average_only_in' scales inputs by a dataset norm factor "
                "that is not stored in the SAE files; pass norm_scaling_factor= (SAELens: sqrt(d_in) / E||x||) to fold it in"
            )
        folded = float(norm_scaling_factor)
        _fold_norm_scaling(kw, folded)
        norm = "none"
        warnings.append(f"norm scaling factor {float(norm_scaling_factor):g} folded into the weights")
    elif norm_scaling_factor is not None:
        raise SAEFormatError(f"{cfg_path}: norm_scaling_factor given but the SAE uses normalize_activations={norm!r}")
    return norm, folded


def _tensors(d: dict, dtype=None) -> dict:
    import torch

    out = {}
    for k, v in d.items():
        t = torch.as_tensor(np.ascontiguousarray(v))
        out[k] = t.to(dtype) if dtype is not None else t
    return out


def storage_dtype(sae: SAE):
    """The torch dtype the SAE's weights are stored in."""
    import torch

    return {"float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(sae.dtype, torch.float32)


def save_saelens(sae: SAE, path, *, legacy: bool = False) -> Path:
    """Write ``cfg.json`` + ``sae_weights.safetensors`` in SAELens' layout.

    ``legacy=False`` writes a v6 config (``architecture``, ``k`` for topk,
    ``metadata.sae_lens_version = "6.0.0"``, the L1 coefficient in
    ``metadata.training_architecture_details`` as SAELens does), which
    ``sae_lens.SAE.load_from_disk`` reads; ``legacy=True`` the older flat config
    (``activation_fn_str``, ``activation_fn_kwargs``, ``sae_lens_version`` 5.x).
    Architectures standard, jumprelu, topk, gated (a batchtopk / matryoshka SAE
    with a calibrated threshold is written as jumprelu, as SAELens does).
    """
    from safetensors.torch import save_file

    if not sae.has_encoder:
        raise ValueError("a decoder-only SAE cannot be saved in SAELens layout (it needs an encoder)")
    if sae.normalize_activations not in ("none", "constant_norm_rescale", "layer_norm"):
        raise ValueError(f"cannot save normalize_activations={sae.normalize_activations!r}")
    arch, train_arch, state = sae.architecture, sae.training_architecture, sae.state_dict()
    if arch in ("batchtopk", "matryoshka"):
        if sae.threshold is None or float(np.min(sae.threshold)) < 0:
            raise ValueError(f"a {arch} SAE without a calibrated threshold has no SAELens inference form")
        # relu(p) * (relu(p) > t) == relu(p) * (p > t) for t >= 0: the jumprelu encoder
        arch, train_arch = "jumprelu", arch
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    cfg = {"architecture": arch, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": sae.dtype,
           "device": "cpu", "apply_b_dec_to_input": bool(sae.apply_b_dec_to_input),
           "normalize_activations": sae.normalize_activations, "reshape_activations": "none"}
    if arch == "topk":
        cfg["k"] = int(sae.k)
        if sae.rescale_acts_by_decoder_norm:
            cfg["rescale_acts_by_decoder_norm"] = True
    if legacy:
        if sae.rescale_acts_by_decoder_norm:
            raise ValueError("rescale_acts_by_decoder_norm has no pre-6 SAELens form")
        cfg.pop("k", None)
        cfg.pop("reshape_activations")
        cfg["architecture"] = "standard" if arch == "topk" else arch
        cfg["activation_fn_str"] = "topk" if arch == "topk" else "relu"
        cfg["activation_fn_kwargs"] = {"k": int(sae.k)} if arch == "topk" else {}
        cfg["sae_lens_version"] = "5.9.0"
        cfg["finetuning_scaling_factor"] = False
        cfg["hook_point"] = "unknown"
        if sae.l1_coefficient is not None:
            cfg["l1_coefficient"] = float(sae.l1_coefficient)
        if sae.warnings:
            cfg["widelimit_warnings"] = list(sae.warnings)
    else:
        meta = {"sae_lens_version": "6.0.0", "model_name": None, "hook_name": None}
        if sae.l1_coefficient is not None or train_arch is not None:
            meta["training_architecture"] = train_arch or arch
            meta["training_architecture_details"] = (
                {} if sae.l1_coefficient is None else {"l1_coefficient": float(sae.l1_coefficient)})
        if sae.warnings:  # e.g. an encoder that was not trained: a reader of the folder must see it too
            meta["widelimit_warnings"] = list(sae.warnings)
        cfg["metadata"] = meta
    save_file(_tensors(state, storage_dtype(sae)), str(p / "sae_weights.safetensors"))
    (p / "cfg.json").write_text(json.dumps(cfg, indent=2))
    return p
