"""Reading data matrices from files, safely (no pickle).

Supported: ``.npy`` (memory-mapped), ``.npz`` (with ``key``), ``.csv`` / ``.txt``,
``.safetensors`` (with ``key``), ``.pt`` / ``.pth`` (``torch.load(weights_only=True)``).
Every failure raises :class:`DataError` (a ``ValueError``) naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["DataError", "load_array"]


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
