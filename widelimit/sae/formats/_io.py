"""Readers shared by the SAE format loaders: JSON, safetensors, torch files, typed config fields.

Every failure is one :class:`~widelimit.sae.model.SAEFormatError` line naming the
file and the tensor or config field (``cfg.json: field 'd_in' must be an integer,
got [1, 2]``); nothing is unpickled.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np

from ..._validation import LAM_MIN as _LAM_MIN
from ...data.readers import plain_tensor, unpickle_reason
from ...data.shards import DataError, special_file, special_message
from ..model import SAEFormatError

_MISSING = object()


def check_regular(p: Path) -> None:
    """Refuse a named pipe, device or socket where an SAE file is expected (reading it could block forever)."""
    kind = special_file(p)
    if kind is not None:
        raise SAEFormatError(special_message(p, kind))


def read_json(p: Path) -> dict:
    """A JSON object from ``p`` (anything else is an :class:`SAEFormatError` naming the file)."""
    check_regular(p)
    try:
        with open(p) as fh:
            d = json.load(fh)
    except json.JSONDecodeError as e:
        raise SAEFormatError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise SAEFormatError(f"{p}: cannot read ({e.strerror})") from None
    if not isinstance(d, dict):
        raise SAEFormatError(f"{p}: expected a JSON object, found {type(d).__name__}")
    return d


def read_safetensors(p: Path) -> dict:
    """All tensors of a safetensors file (torch)."""
    from safetensors.torch import load_file

    if not p.exists():
        raise SAEFormatError(f"{p}: no such file")
    check_regular(p)
    try:
        return dict(load_file(str(p)))
    except Exception as e:  # noqa: BLE001 - any reader failure is one line naming the file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SAEFormatError(f"{p}: not a readable safetensors file ({msg})") from None


def read_pt(p: Path) -> dict:
    """A state dict of tensors from a torch file (``weights_only=True``: nothing else is unpickled)."""
    import torch

    if not p.exists():
        raise SAEFormatError(f"{p}: no such file")
    check_regular(p)
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise SAEFormatError(
            f"{p}: refused to unpickle: the file holds Python objects other than tensors "
            f"({unpickle_reason(e)}); save a plain state dict of tensors instead"
        ) from None
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SAEFormatError(f"{p}: not a readable torch file ({msg[:200]})") from None
    if not isinstance(obj, dict):
        raise SAEFormatError(f"{p}: expected a state dict (name -> tensor), found {type(obj).__name__}")
    out = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            raise SAEFormatError(f"{p}: entry {k!r} is a {type(v).__name__}, expected a tensor")
        if v.dtype != torch.bool:  # sparse, meta, quantized, nested, float8 ...: one line naming file and key
            try:
                plain_tensor(v, p, f"tensor {str(k)!r}")
            except DataError as e:
                raise SAEFormatError(str(e)) from None
        out[str(k)] = v
    return out


def get_tensor(sd: dict, name: str, where, why: str):
    """``sd[name]`` or an error naming the file, the tensor, what it is for and what the file holds."""
    if name not in sd:
        have = ", ".join(sorted(sd)) or "nothing"
        raise SAEFormatError(f"{where}: missing tensor {name!r} ({why}); the file holds: {have}")
    return sd[name]


def check_unused(sd: dict, used, where, arch: str, warnings: list, ignored: dict | None = None) -> None:
    """Refuse tensors of ``sd`` that the architecture does not read: the file may hold another model, and
    certifying what is left would certify something else without a word.

    ``used``: the names the loader read; ``ignored``: ``{name: why}`` for extras that a library
    legitimately stores next to the weights (dictionary_learning's ``AutoEncoderTopK`` keeps a
    ``threshold`` its top-k encoder does not read): those present are noted in ``warnings`` (the report).
    """
    ignored = ignored or {}
    extra = sorted(set(sd) - set(used) - set(ignored))
    if extra:
        names = ", ".join(repr(e) for e in extra)
        raise SAEFormatError(f"{where}: tensor{'s' if len(extra) > 1 else ''} {names} not used by a {arch} SAE "
                             f"(it reads {', '.join(repr(u) for u in sorted(used))}); the file may hold another "
                             "model: refused rather than certified as this one")
    for name in sorted(set(ignored) & set(sd)):
        warnings.append(f"tensor {name!r} of {where} ignored: {ignored[name]}")


def _flat(v) -> np.ndarray:
    return np.asarray(v.detach().cpu().double() if hasattr(v, "detach") else v, dtype=np.float64).reshape(-1)


def _num(v) -> str:
    """A stored number as written: ``2`` for integral values, else the float's repr (``0.07500000000000002``)."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def same_values(name_a: str, a, name_b: str, b, where, *, rtol: float = 0.0, what: str = "") -> None:
    """Refuse two stored forms of one quantity that disagree (``threshold`` vs ``exp(log_threshold)``, a
    top-level ``l1_coefficient`` vs the metadata's), naming both values and ``where``. ``rtol``: the
    rounding the two forms may differ by."""
    va, vb = _flat(a), _flat(b)
    if va.shape != vb.shape:
        raise SAEFormatError(f"{where}: {name_a} has {va.size} values but {name_b} has {vb.size}{what}; refused "
                             "(which one the SAE uses cannot be told)")
    bad = np.flatnonzero(~(np.abs(va - vb) <= rtol * np.maximum(np.abs(va), np.abs(vb))))
    if bad.size:
        i = int(bad[0])
        at = f" at entry {i}" if va.size > 1 else ""
        raise SAEFormatError(f"{where}: {name_a} = {_num(va[i])} but {name_b} = {_num(vb[i])}{at}{what}; they disagree, "
                             "refused (which one the SAE uses cannot be told): remove one")


def tensor_int(sd: dict, name: str, where) -> int:
    """A 0-d (or one-element) integer tensor as an int; anything else names the file and tensor."""
    v = sd[name]
    a = np.asarray(v.detach().cpu() if hasattr(v, "detach") else v)
    if a.size != 1:
        raise SAEFormatError(f"{where}: tensor {name!r} must hold one integer, got shape {tuple(a.shape)}")
    x = a.reshape(()).item()
    if isinstance(x, bool) or not float(x).is_integer():
        raise SAEFormatError(f"{where}: tensor {name!r} must hold an integer, got {x!r}")
    return int(x)


def dtype_name(sd: dict) -> str:
    """Storage dtype of the first tensor (``float32`` for an empty dict)."""
    for v in sd.values():
        return str(v.dtype).replace("torch.", "")
    return "float32"


def check_dims(sae, where, d_in, d_sae):
    """The config's ``d_in`` / ``d_sae`` agree with ``W_dec``."""
    if d_in is not None and int(d_in) != sae.d_in:
        raise SAEFormatError(f"{where}: config says d_in={d_in} but tensor 'W_dec' has d_in={sae.d_in}")
    if d_sae is not None and int(d_sae) != sae.d_sae:
        raise SAEFormatError(f"{where}: config says d_sae={d_sae} but tensor 'W_dec' has d_sae={sae.d_sae}")


def check_config_dtype(cfg_dtype, sd, warnings):
    """Warn when the config's dtype differs from the stored tensors."""
    if cfg_dtype is None:
        return
    got = dtype_name(sd)
    want = str(cfg_dtype).replace("torch.", "")
    if want != got:
        warnings.append(f"config dtype {want} but tensors are stored as {got} (read as stored, computed in float64)")


# ---- typed config fields ---------------------------------------------------------------


def _bad(where, field, want, v):
    r = json.dumps(v) if isinstance(v, (list, dict, str, bool, int, float)) or v is None else repr(v)
    raise SAEFormatError(f"{where}: field {field!r} must be {want}, got {r[:80]}")


def cfg_get(cfg: dict, field: str, where, kind: str, default=_MISSING, *, prefix: str = ""):
    """Field ``field`` of ``cfg`` checked against ``kind``; a wrong type is one line naming file and field.

    ``kind``: ``"int"`` (an integer; an integral float such as ``8.0`` is accepted),
    ``"pos_int"``, ``"float"`` (finite number), ``"l1"`` (an L1 coefficient: a positive finite number whose
    half, ``lam``, is a normal float64), ``"bool"`` (a JSON boolean only:
    ``"false"`` is an error), ``"str"``, ``"dict"``, ``"int_list"``. ``None`` values
    count as absent. ``prefix`` names the enclosing object in messages
    (``trainer.``).
    """
    name = prefix + field
    if field not in cfg or cfg[field] is None:
        if default is _MISSING:
            raise SAEFormatError(f"{where}: missing field {name!r}")
        return default
    v = cfg[field]
    if kind in ("int", "pos_int"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not float(v).is_integer():
            _bad(where, name, "an integer", v)
        v = int(v)
        if kind == "pos_int" and v < 1:
            _bad(where, name, "a positive integer", v)
        return v
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            _bad(where, name, "a finite number", v)
        return float(v)
    if kind == "l1":  # an L1 coefficient (= 2 lam): lam = v / 2 must be a positive normal float64
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            _bad(where, name, "a finite number", v)
        if v <= 0:
            _bad(where, name, "a positive finite number", v)
        if float(v) / 2.0 < _LAM_MIN:
            _bad(where, name, f"at least {2 * _LAM_MIN!r} (half of it is lam, which must be a normal float64)", v)
        return float(v)
    if kind == "bool":
        if not isinstance(v, bool):
            _bad(where, name, "a JSON boolean (true or false)", v)
        return v
    if kind == "str":
        if not isinstance(v, str):
            _bad(where, name, "a string", v)
        return v
    if kind == "dict":
        if not isinstance(v, dict):
            _bad(where, name, "a JSON object", v)
        return v
    if kind == "int_list":
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
            _bad(where, name, "a list of positive integers", v)
        return v
    raise ValueError(f"unknown kind {kind!r}")
