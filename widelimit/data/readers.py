"""Per-format readers: each returns a list of :class:`~widelimit.data.shards.Shard` for one file.

``.npy`` and ``.safetensors`` are read in place (positional reads of the rows, nothing
loaded up front); ``.npz`` and ``.pt`` / ``.pth`` (``torch.load(weights_only=True)``,
memory-mapped when the file allows it) become in-memory shards; ``.csv`` / ``.txt``
are parsed by :mod:`widelimit.data.csv`, ``.arrow`` by :mod:`widelimit.data.arrow`.
Every failure is a :class:`~widelimit.data.shards.DataError` naming the file.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import struct
import warnings
from pathlib import Path

import numpy as np

from .._validation import exact_float64
from .shards import KIND_OF_ITEMSIZE, ArrayShard, DataError, FileShard, first_line, show

__all__ = ["read_npy", "read_npz", "read_safetensors", "read_torch", "unpickle_reason", "array_shard",
           "plain_tensor", "npy_header"]

_NP_FLOATS = {np.dtype("float16"), np.dtype("float32"), np.dtype("float64")}
_ST_FLOATS = {"F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}
_ST_INTS = {"I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "U8": "<u1", "U16": "<u2", "U32": "<u4",
            "U64": "<u8", "BOOL": "|b1"}
_ST_KIND = {"F16": "f16", "BF16": "bf16", "F32": "f32", "F64": "f64"}


def pick(named: dict, key, path, what: str = "arrays"):
    """The entry ``key`` of ``named`` (the only one when ``key`` is None), else a :class:`DataError`."""
    if key is None:
        if len(named) == 1:
            return next(iter(named.values()))
        if not named:
            raise DataError(f"{show(path)}: holds no {what}")
        raise DataError(f"{show(path)}: holds several {what} ({', '.join(sorted(named))}); choose one with key=")
    if key not in named:
        raise DataError(f"{show(path)}: no {what[:-1]} named {key!r}; it holds: {', '.join(sorted(named)) or 'nothing'}")
    return named[key]


def check_2d(shape, path, what: str = "array") -> None:
    shape = tuple(shape)
    if len(shape) != 2:
        raise DataError(f"{show(path)}: {what} must be 2-D (rows, dims), has shape {shape}; "
                        "flatten batch/position (and head) dimensions first")


def array_shard(arr: np.ndarray, path, what: str = "array", kind: str | None = None) -> ArrayShard:
    """An in-memory shard of a 2-D numeric array (floats kept, integers as float64; booleans refused)."""
    check_2d(arr.shape, path, what)
    if kind is None:
        dt = np.dtype(arr.dtype)
        if dt.kind == "b":
            raise DataError(f"{show(path)}: {what} has dtype bool; expected floating point or integer numbers")
        if dt.kind == "f" and not dt.isnative and dt.newbyteorder("=") in _NP_FLOATS:  # byte-swapped: native copy
            arr = np.ascontiguousarray(arr, dtype=dt.newbyteorder("="))
        elif dt.kind in "iu" or (dt.kind == "f" and dt not in _NP_FLOATS):
            try:
                arr = exact_float64(arr, show(path))
            except ValueError as e:
                raise DataError(str(e)) from None
        elif dt.kind != "f":
            raise DataError(f"{show(path)}: {what} has dtype {dt}; expected floating point (or integer) numbers")
    return ArrayShard(arr, str(path), kind)


# --------------------------------------------------------------------------------------
# .npy
# --------------------------------------------------------------------------------------


#: The .npy format versions numpy reads (``np.load`` refuses every other one, minor versions included).
NPY_VERSIONS = ((1, 0), (2, 0), (3, 0))


def npy_header(f) -> tuple[tuple, bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the open ``.npy`` file ``f`` (left just after the header), read by
    numpy's public header readers, so that a header numpy refuses is refused here too.

    Versions 1.0 and 2.0 have their readers (``numpy.lib.format.read_array_header_1_0`` / ``_2_0``). Version
    3.0 is version 2.0 with a UTF-8 header (numpy >= 2.4 has no public reader for it): an ASCII header, the
    only kind a numeric array has, reads the same in both, so it goes through the 2.0 reader; a header with
    other characters (names of a structured dtype) is refused. Any other version -- ``(1, 5)`` included, which
    only the major number used to be checked for -- is refused as ``np.load`` refuses it.
    """
    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version not in NPY_VERSIONS:
        raise ValueError(f"format version {version[0]}.{version[1]}, which numpy does not read (it reads "
                         f"{', '.join(f'{a}.{b}' for a, b in NPY_VERSIONS)})")
    if version == (1, 0):
        return fmt.read_array_header_1_0(f)
    if version == (2, 0):
        return fmt.read_array_header_2_0(f)
    raw = f.read(4)
    if len(raw) < 4:
        raise ValueError("EOF reading the array header length")
    (hlen,) = struct.unpack("<I", raw)
    if hlen > 1 << 20:
        raise ValueError(f"array header length {hlen} is far above any numpy writes")
    header = f.read(hlen)
    if len(header) < hlen:
        raise ValueError("EOF reading the array header")
    if not header.isascii():
        raise ValueError("a format 3.0 header with non-ASCII characters (a structured dtype); widelimit reads "
                         "numeric arrays only")
    return fmt.read_array_header_2_0(io.BytesIO(raw + header))


def read_npy(path: Path) -> list:
    """A ``.npy`` file: C-ordered float16/32/64 is read in place; other layouts through a memory map."""
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = npy_header(f)
            offset = f.tell()
    except OSError as e:
        raise DataError(f"{show(path)}: could not read .npy file ({e.strerror or first_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - a broken header
        raise DataError(f"{show(path)}: corrupted .npy file (could not read its header: {first_line(e)})") from None
    if not isinstance(shape, tuple) or any(not isinstance(v, int) or v < 0 for v in shape):
        raise DataError(f"{show(path)}: corrupted .npy header (shape {shape!r} has a negative or non-integer size)")
    dtype = np.dtype(dtype)
    check_2d(shape, path)
    if dtype.hasobject:
        raise DataError(f"{show(path)}: holds Python objects (dtype {dtype}); widelimit reads numeric arrays only")
    if dtype.kind == "b":
        raise DataError(f"{show(path)}: array has dtype bool; expected floating point or integer numbers")
    if dtype in _NP_FLOATS and dtype.isnative and (not fortran or shape[0] <= 1 or shape[1] <= 1):
        return [FileShard(path, offset, shape[0], shape[1], dtype, KIND_OF_ITEMSIZE[dtype.itemsize])]
    need = offset + int(np.prod(shape)) * dtype.itemsize
    size = path.stat().st_size
    if size < need:
        raise DataError(f"{show(path)}: truncated .npy file: the header promises {need} bytes, the file has {size}")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{show(path)}: could not read .npy file ({first_line(e)})") from None
    if dtype.newbyteorder("=") in _NP_FLOATS:  # Fortran order or byte-swapped: one C-ordered native copy
        arr = np.ascontiguousarray(arr, dtype=dtype.newbyteorder("="))
    return [array_shard(arr, path)]


# --------------------------------------------------------------------------------------
# .npz
# --------------------------------------------------------------------------------------


def read_npz(path: Path, key: str | None) -> list:
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            pick(dict.fromkeys(names, 0), key, path)
            name = names[0] if key is None else key
            arr = np.asarray(z[name])
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - not a zip, a pickled array, a corrupted member
        raise DataError(f"{show(path)}: could not read .npz file ({first_line(e)})") from None
    return [array_shard(arr, path, f"array {name!r}")]


# --------------------------------------------------------------------------------------
# .safetensors
# --------------------------------------------------------------------------------------


def safetensors_entry(path: Path, key: str | None) -> tuple[str, tuple, int, str]:
    """``(name, shape, absolute byte offset, dtype name)`` of one tensor of a safetensors file, header checked.

    A tensor's ``data_offsets`` are relative to the end of the header; they need not
    start at 0 (a file may hold other tensors, or padding, before it), but must lie
    inside the file and match the shape.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DataError(f"{show(path)}: truncated or corrupted .safetensors file (no header)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > size - 8 or hlen > 100_000_000:
                raise DataError(f"{show(path)}: corrupted or truncated .safetensors file (header length {hlen} "
                                f"does not fit in a {size}-byte file)")
            header = json.loads(f.read(hlen).decode("utf-8"))
    except DataError:
        raise
    except OSError as e:
        raise DataError(f"{show(path)}: could not read .safetensors file ({e.strerror or first_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - bad JSON / encoding
        raise DataError(f"{show(path)}: corrupted .safetensors file (bad header: {type(e).__name__})") from None
    if not isinstance(header, dict):
        raise DataError(f"{show(path)}: corrupted .safetensors file (header is not a JSON object)")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    name = key
    if key is None:
        pick(tensors, None, path, "tensors")
        name = next(iter(tensors))
    else:
        pick(tensors, key, path, "tensors")
    info = tensors[name]
    try:
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dt, str) or not all(type(v) is int for v in list(shape) + list(offs)) or len(offs) != 2:
            raise TypeError
        shape, (b0, b1) = tuple(shape), offs
    except Exception:  # noqa: BLE001
        raise DataError(f"{show(path)}: corrupted .safetensors file (bad header entry for {name!r})") from None
    if any(v < 0 for v in shape):
        raise DataError(f"{show(path)}: corrupted .safetensors file (negative size in the shape {shape} of {name!r})")
    if dt in _ST_FLOATS:
        itemsize = _ST_FLOATS[dt].itemsize
    elif dt in _ST_INTS:
        itemsize = np.dtype(_ST_INTS[dt]).itemsize
    else:
        raise DataError(f"{show(path)}: tensor {name!r} has dtype {dt}; widelimit reads F16, BF16, F32, F64 "
                        "and integer tensors")
    if b0 < 0 or b1 - b0 != int(np.prod(shape)) * itemsize:
        raise DataError(f"{show(path)}: corrupted .safetensors file (data_offsets [{b0}, {b1}] of {name!r} "
                        f"do not match its shape {shape})")
    if 8 + hlen + b1 > size:
        raise DataError(f"{show(path)}: truncated .safetensors file: tensor {name!r} ends at byte {8 + hlen + b1}, "
                        f"the file has {size}")
    return name, shape, 8 + hlen + b0, dt


def read_safetensors(path: Path, key: str | None) -> list:
    """The tensor ``key`` (the only one when ``None``) of a ``.safetensors`` file; the shard's ``tensor`` names it."""
    tensor, shape, offset, dt = safetensors_entry(path, key)
    shards = _read_safetensors(path, key, shape, offset, dt)
    for sh in shards:
        sh.tensor = tensor
    return shards


def _read_safetensors(path: Path, key, shape, offset, dt) -> list:
    check_2d(shape, path, "tensor" if key is None else f"tensor {key!r}")
    if dt == "BOOL":
        raise DataError(f"{show(path)}: {'tensor' if key is None else f'tensor {key!r}'} has dtype BOOL; "
                        "expected floating point or integer numbers")
    if dt in _ST_FLOATS:
        return [FileShard(path, offset, shape[0], shape[1], _ST_FLOATS[dt], _ST_KIND[dt])]
    arr = np.memmap(path, dtype=np.dtype(_ST_INTS[dt]), mode="r", offset=offset, shape=shape)
    return [array_shard(np.asarray(arr), path)]


# --------------------------------------------------------------------------------------
# .pt / .pth
# --------------------------------------------------------------------------------------


def unpickle_reason(e: Exception) -> str:
    """The useful part of torch's weights_only refusal (e.g. ``Unsupported global: GLOBAL mod.Cls``)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"(Unsupported (?:global|operand)[^\n]*?)(?: was not|\.? *\n|\.? *$)", text)
    return m.group(1).strip() if m else "weights_only load refused it"


#: How the files ``torch.save`` writes begin: a zip archive (torch >= 1.6) or a pickle (protocol 2+).
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_PICKLE_PROTO = 0x80


def _check_torch_magic(path: Path) -> None:
    """Refuse a file that is neither a zip archive nor a pickle (a text file named ``.pt``, say), in one line."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise DataError(f"{show(path)}: could not read .pt file ({e.strerror or first_line(e)})") from None
    if not head:
        raise DataError(f"{show(path)}: empty file, not a torch tensor file")
    if head.startswith(_ZIP_MAGIC) or head[0] == _PICKLE_PROTO:
        return
    raise DataError(f"{show(path)}: not a torch tensor file (neither a zip archive nor a pickle, as torch.save "
                    f"writes; it starts with {head!r})")


def torch_load(path: Path):
    """``torch.load(path, weights_only=True)`` (memory-mapped when possible), torch's warnings and advice
    (re-running with ``weights_only=False``) replaced by one :class:`DataError` line."""
    import torch

    _check_torch_magic(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # not a zip-format file (legacy torch.save): mmap impossible
                if "mmap" not in str(e) and "zip" not in str(e).lower():
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise DataError(f"{show(path)}: could not read .pt file: refused to unpickle: the file holds Python objects other than tensors "
                            f"({unpickle_reason(e)}); save a tensor or a dict of tensors") from None
        except Exception as e:  # noqa: BLE001 - truncated / not a torch file
            msg = first_line(e)
            if "weights_only" in msg:
                msg = unpickle_reason(e)
            raise DataError(f"{show(path)}: could not read .pt file ({msg})") from None


def _torch_dtypes():
    """The tensor dtypes widelimit reads (floats as stored; integers exactly as float64; bool refused)."""
    import torch

    return {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
            torch.int64, torch.uint8}


def plain_tensor(t, path, what: str = "tensor"):
    """``t`` if it is a dense tensor holding its values with a dtype widelimit reads, else one :class:`DataError`
    naming the file, ``what`` (the tensor's key) and the dtype or layout.

    Refused: nested tensors, sparse layouts, quantized tensors, tensors on the ``meta`` device (a shape without
    values), complex and bool dtypes, and dtypes without a NumPy counterpart (float8, uint16-64, ...): each
    used to surface as an internal ``TypeError`` / ``NotImplementedError`` of torch or NumPy.
    """
    import torch

    where = f"{show(path)}: {what}"
    if getattr(t, "is_nested", False):
        raise DataError(f"{where} is a nested tensor (rows of different lengths); save a regular tensor")
    if t.layout != torch.strided:
        raise DataError(f"{where} has layout {t.layout}; widelimit reads dense tensors: save tensor.to_dense()")
    if t.is_quantized:
        raise DataError(f"{where} is quantized (dtype {t.dtype}); save tensor.dequantize()")
    if t.device.type == "meta":
        raise DataError(f"{where} is on the meta device: the file holds its shape {tuple(t.shape)} but no values")
    if t.is_complex():
        raise DataError(f"{where} has dtype {t.dtype}; expected real numbers")
    if t.dtype == torch.bool:
        raise DataError(f"{where} has dtype torch.bool; expected floating point or integer numbers")
    if t.dtype not in _torch_dtypes():
        raise DataError(f"{where} has dtype {t.dtype}; widelimit reads float16, bfloat16, float32, float64, int8, "
                        "int16, int32, int64 and uint8 tensors: convert it first (tensor.float())")
    return t


def read_torch(path: Path, key: str | None) -> list:
    import torch

    obj = torch_load(path)
    what = "tensor"
    if isinstance(obj, dict):
        named = {str(k): v for k, v in obj.items()}
        obj = pick(named, key, path, "tensors")
        what = f"tensor {key if key is not None else next(iter(named))!r}"
    if not isinstance(obj, torch.Tensor):
        raise DataError(f"{show(path)}: expected a tensor (or a dict of tensors), found {type(obj).__name__}")
    t = plain_tensor(obj, path, what).detach().cpu()
    check_2d(t.shape, path, what)
    if t.dtype == torch.bfloat16:
        return [array_shard(t.contiguous().view(torch.int16).numpy().view(np.uint16), path, kind="bf16")]
    if not t.is_floating_point():
        t = t.to(torch.float64)
    return [array_shard(t.numpy(), path)]
