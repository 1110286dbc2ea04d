"""Reading data matrices from files, safely (no pickle).

Supported: ``.npy`` (memory-mapped), ``.npz`` (with ``key``), ``.csv`` / ``.txt``,
``.safetensors`` (with ``key``), ``.pt`` / ``.pth`` (``torch.load(weights_only=True)``).
Every failure raises :class:`DataError` (a ``ValueError``) naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["DataError", "load_array", "load_activations", "RowConverter"]


class DataError(ValueError):
    """A data file is missing, unreadable, or does not hold what was asked for."""


def _pick(named: dict, key, path) -> np.ndarray:
    if key is None:
        if len(named) == 1:
            return next(iter(named.values()))
        raise DataError(f"{path}: holds several arrays ({', '.join(sorted(named))}); choose one with --key")
    if key not in named:
        raise DataError(f"{path}: no array named {key!r}; it holds: {', '.join(sorted(named)) or 'nothing'}")
    return named[key]


def load_array(path, key: str | None = None) -> np.ndarray:
    """Load a 2-D data array from ``path``.

    Parameters
    ----------
    path : str or Path
        ``.npy``, ``.npz``, ``.csv``/``.txt``, ``.safetensors`` or ``.pt``/``.pth``.
    key : str, optional
        Name of the array inside an ``.npz``, ``.safetensors`` or ``.pt`` dict
        (needed when the file holds more than one).

    Returns
    -------
    ndarray
        As stored (float16/bfloat16 become float32); ``.npy`` files are memory-mapped.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    if p.is_dir():
        raise DataError(f"{p}: is a directory, expected a data file")
    if not os.access(p, os.R_OK):
        raise DataError(f"{p}: not readable")
    ext = p.suffix.lower()
    try:
        if ext == ".npy":
            return np.load(p, mmap_mode="r", allow_pickle=False)
        if ext == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return np.asarray(_pick({k: z[k] for k in z.files}, key, p))
        if ext in (".csv", ".txt"):
            delim = "," if ext == ".csv" else None
            try:
                arr = np.loadtxt(p, delimiter=delim, ndmin=2)
            except ValueError:  # a header line
                arr = np.loadtxt(p, delimiter=delim, ndmin=2, skiprows=1)
            return arr
        if ext == ".safetensors":
            from safetensors.numpy import load_file

            try:
                named = load_file(str(p))
            except Exception:  # bf16 tensors cannot be read as numpy: go through torch
                from safetensors.torch import load_file as load_torch

                named = {k: v.float().numpy() if v.dtype.is_floating_point else v.numpy()
                         for k, v in load_torch(str(p)).items()}
            return np.asarray(_pick(named, key, p))
        if ext in (".pt", ".pth"):
            import torch

            obj = torch.load(p, map_location="cpu", weights_only=True)
            if isinstance(obj, dict):
                obj = _pick({str(k): v for k, v in obj.items()}, key, p)
            if not isinstance(obj, torch.Tensor):
                raise DataError(f"{p}: expected a tensor (or a dict of tensors), found {type(obj).__name__}")
            if obj.dtype in (torch.bfloat16, torch.float16):
                obj = obj.float()
            return obj.detach().cpu().numpy()
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - every reader failure becomes one clear line
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{p}: could not read {ext} file ({msg})") from None
    raise DataError(f"{p}: unsupported file type {ext!r} (use .npy, .npz, .csv, .safetensors or .pt)")


# --------------------------------------------------------------------------------------
# activations: memory-mapped, read in row batches
# --------------------------------------------------------------------------------------


def unpickle_reason(e: Exception) -> str:
    """The useful part of torch's weights_only refusal (e.g. ``Unsupported global: GLOBAL mod.Cls``)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"(Unsupported (?:global|operand)[^\n]*?)(?: was not|\.? *\n|\.? *$)", text)
    return m.group(1).strip() if m else "weights_only load refused it"


class RowConverter:
    """A read-only 2-D array view that converts rows to float32 when sliced.

    Wraps a memory-mapped bfloat16 array (stored as ``uint16``) so that only
    the rows asked for are converted: ``acts[s:e]`` is a float32 ndarray.
    It has ``shape``, ``dtype`` (float32), ``ndim``, ``len()`` and, for code
    that needs a whole array, ``__array__`` (which converts everything).
    """

    def __init__(self, raw: np.ndarray, source: str = "bfloat16"):
        self._raw = raw
        self.source = source
        self.shape = tuple(raw.shape)
        self.ndim = raw.ndim
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    @staticmethod
    def _bf16_to_f32(u16: np.ndarray) -> np.ndarray:
        return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)

    def __getitem__(self, idx):
        return self._bf16_to_f32(self._raw[idx])

    def __array__(self, dtype=None, copy=None):
        out = self._bf16_to_f32(self._raw[:])
        return out if dtype is None else out.astype(dtype)


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def _safetensors_mmap(p: Path, key):
    """Memory-map one tensor of a safetensors file (header parsed directly; no copy)."""
    import json
    import struct

    with open(p, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise DataError(f"{p}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise DataError(f"{p}: not a safetensors file (implausible header size)")
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise DataError(f"{p}: not a safetensors file (unreadable header)") from None
    header.pop("__metadata__", None)
    info = _pick(header, key, p)
    name = key if key is not None else next(iter(header))
    dt = info.get("dtype")
    if dt not in _ST_DTYPES:
        raise DataError(f"{p}: tensor {name!r} has dtype {dt}; activations must be F64, F32, F16 or BF16")
    shape = tuple(info["shape"])
    begin, end = info["data_offsets"]
    raw = np.memmap(p, dtype=_ST_DTYPES[dt], mode="r", offset=8 + n + begin, shape=shape)
    if raw.nbytes != end - begin:
        raise DataError(f"{p}: tensor {name!r} size does not match its shape {shape}")
    return RowConverter(raw) if dt == "BF16" else raw


def load_activations(path, key: str | None = None):
    """Open a file of token activations ``(N, d_in)`` for reading in row batches.

    Nothing is loaded up front where the format allows it: ``.npy`` and
    ``.safetensors`` are memory-mapped, ``.pt`` is opened with
    ``torch.load(weights_only=True, mmap=True)``. float16 stays float16 (callers
    convert each batch), bfloat16 is exposed through :class:`RowConverter`
    (float32 per batch). Every result supports ``acts[s:e]``, ``.shape``,
    ``.dtype`` and ``len()``.

    Parameters
    ----------
    path : str or Path
        ``.npy``, ``.safetensors``, ``.pt``/``.pth`` (a tensor or a dict of tensors),
        or ``.npz``/``.csv`` (read into memory).
    key : str, optional
        Tensor name inside a ``.safetensors`` / ``.pt`` / ``.npz`` holding several.

    Returns
    -------
    array-like (N, d_in)

    Raises
    ------
    DataError
        Naming the file: missing, unreadable, arbitrary pickled objects, not 2-D, not floating point.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    if p.is_dir():
        raise DataError(f"{p}: is a directory, expected an activations file")
    ext = p.suffix.lower()
    try:
        if ext == ".safetensors":
            acts = _safetensors_mmap(p, key)
        elif ext in (".pt", ".pth"):
            import pickle

            import torch

            try:
                obj = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
            except pickle.UnpicklingError as e:
                raise DataError(f"{p}: refused to unpickle: the file holds Python objects other than tensors "
                                f"({unpickle_reason(e)})") from None
            except RuntimeError:  # not a zip-format file (legacy torch.save): mmap impossible
                obj = torch.load(p, map_location="cpu", weights_only=True)
            if isinstance(obj, dict):
                obj = _pick({str(k): v for k, v in obj.items()}, key, p)
            if not isinstance(obj, torch.Tensor):
                raise DataError(f"{p}: expected a tensor (or a dict of tensors), found {type(obj).__name__}")
            if obj.dtype == torch.bfloat16:
                acts = RowConverter(obj.view(torch.int16).numpy().view(np.uint16))
            else:
                acts = obj.detach().numpy()
        else:
            acts = load_array(p, key=key)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - every reader failure becomes one clear line
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{p}: could not read {ext} file ({msg})") from None
    if len(acts.shape) != 2:
        raise DataError(f"{p}: activations must be 2-D (tokens, d_in), got shape {tuple(acts.shape)}; "
                        "flatten batch/position (and head) dimensions first")
    if np.dtype(acts.dtype).kind != "f":
        raise DataError(f"{p}: activations must be floating point, got dtype {acts.dtype}")
    if acts.shape[0] == 0 or acts.shape[1] == 0:
        raise DataError(f"{p}: activations are empty: shape {tuple(acts.shape)}")
    return acts
