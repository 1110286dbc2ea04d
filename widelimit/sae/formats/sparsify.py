"""EleutherAI sparsify folders: ``cfg.json`` + ``sae.safetensors`` (TopK; the encoder always subtracts ``b_dec``)."""

from __future__ import annotations

from pathlib import Path

from ..model import SAE, SAEFormatError
from ._io import cfg_get, check_dims, check_unused, dtype_name, get_tensor, read_json, read_safetensors

_UNSUPPORTED = (("transcode", "transcoders"), ("skip_connection", "a skip connection (W_skip)"),
                ("signed", "signed top-k codes"), ("embed_skip", "an embedding skip connection"),
                ("gram_lookup", "n-gram lookup targets"))


def load_sparsify(folder: Path, *, architecture: str | None = None) -> SAE:
    """Read a sparsify folder; errors name the file and field."""
    cfg_path = folder / "cfg.json"
    w_path = folder / "sae.safetensors"
    cfg = read_json(cfg_path)
    return sparsify_from_dicts(cfg, None, cfg_path=cfg_path, w_path=w_path, path=str(folder), architecture=architecture)


def sparsify_from_dicts(cfg: dict, sd: dict | None, *, cfg_path, w_path, path, architecture=None,
                        source_format="sparsify") -> SAE:
    """An :class:`SAE` from a sparsify config dict and state dict (``sd=None``: read ``w_path``)."""
    for bad, why in _UNSUPPORTED:
        if cfg.get(bad):
            raise SAEFormatError(f"{cfg_path}: sparsify option {bad}=true ({why}) is not supported")
    act = cfg_get(cfg, "activation", cfg_path, "str", "topk")
    if act != "topk":
        raise SAEFormatError(f"{cfg_path}: sparsify activation {act!r} is not supported; only 'topk'")
    if architecture not in (None, "topk"):
        raise SAEFormatError(f"{cfg_path}: a sparsify SAE is topk, but {architecture!r} was asked for")
    d_in = cfg_get(cfg, "d_in", cfg_path, "pos_int")
    k = cfg_get(cfg, "k", cfg_path, "pos_int")
    n_lat = cfg_get(cfg, "num_latents", cfg_path, "int", 0)
    d_sae = n_lat or d_in * cfg_get(cfg, "expansion_factor", cfg_path, "pos_int", 32)
    if sd is None:
        sd = read_safetensors(w_path)
    kw = {"W_enc": get_tensor(sd, "encoder.weight", w_path, "sparsify encoder").T,
          "b_enc": get_tensor(sd, "encoder.bias", w_path, "sparsify encoder"),
          "W_dec": get_tensor(sd, "W_dec", w_path, "sparsify decoder"),
          "b_dec": get_tensor(sd, "b_dec", w_path, "sparsify decoder bias")}
    warnings: list[str] = []
    check_unused(sd, {"encoder.weight", "encoder.bias", "W_dec", "b_dec"}, w_path, "sparsify topk", warnings)
    sae = SAE(**kw, architecture="topk", k=k, apply_b_dec_to_input=True, source_format=source_format,
              path=path, dtype=dtype_name(sd), config=cfg)
    check_dims(sae, cfg_path, d_in, d_sae)
    return sae
