"""Reading data matrices from files, safely (no pickle).

Supported: ``.npy`` (memory-mapped), ``.npz`` (with ``key``), ``.csv`` / ``.txt``,
``.safetensors`` (with ``key``), ``.pt`` / ``.pth`` (``torch.load(weights_only=True)``).
Every failure raises :class:`DataError` (a ``ValueError``) naming the file.
"""

from __future__ import annotations

import abc
import os
import threading
from pathlib import Path

import numpy as np

__all__ = ["ActivationSource", "DataError", "load_array", "load_activations", "RowConverter"]


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
# out-of-core activation sources
# --------------------------------------------------------------------------------------

_NP_FLOATS = {np.dtype("float16"), np.dtype("float32"), np.dtype("float64")}
_ST_RAW = {"F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}


def _natural_key(p: Path):
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _widen(raw: np.ndarray, kind: str) -> np.ndarray:
    """float16 / bfloat16 (as uint16 bits) / float32 / float64 -> float32 or float64."""
    if kind == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if raw.dtype == np.float16:
        return raw.astype(np.float32)
    return raw


class _Shard(abc.ABC):
    """One file (or array) of rows: ``name``, ``rows``, ``n``, ``kind``, ``read(s, e)``."""

    name: str
    rows: int
    n: int
    kind: str  # "f16", "bf16", "f32", "f64"

    @abc.abstractmethod
    def read(self, s: int, e: int) -> np.ndarray:
        """Rows ``s:e`` of this shard as float32 (float64 for float64 storage)."""

    def fingerprint(self) -> list:
        return [self.name, self.rows, self.n, self.kind]


_OPEN_LOCK = threading.Lock()


class _FileShard(_Shard):
    """Rows stored contiguously in a file at byte ``offset`` (C order): read with ``os.pread``.

    Positional reads keep the resident memory at one chunk (a memory map would
    count every page touched) and are safe from several threads.
    """

    def __init__(self, path: Path, offset: int, rows: int, n: int, raw_dtype: np.dtype, kind: str):
        self.path = Path(path)
        self.name = str(self.path)
        self.offset, self.rows, self.n = int(offset), int(rows), int(n)
        self.raw_dtype, self.kind = np.dtype(raw_dtype), kind
        self._fd = None
        need = self.offset + self.rows * self.n * self.raw_dtype.itemsize
        size = self.path.stat().st_size
        if size < need:
            raise DataError(f"{self.path}: truncated shard: the header promises {need} bytes, the file has {size}")
        self._stat = (size, self.path.stat().st_mtime_ns)

    def __getstate__(self):  # picklable (Dask): reopen on the other side
        d = dict(self.__dict__)
        d["_fd"] = None
        return d

    def _file(self) -> int:
        if self._fd is None:
            with _OPEN_LOCK:  # passes read shards from several threads
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass

    def read(self, s: int, e: int) -> np.ndarray:
        row_bytes = self.n * self.raw_dtype.itemsize
        nbytes = (e - s) * row_bytes
        buf = np.empty(nbytes, dtype=np.uint8)  # not zero-filled, unlike bytearray
        view = memoryview(buf)
        got, pos = 0, self.offset + s * row_bytes
        try:
            fd = self._file()
            while got < nbytes:
                k = os.preadv(fd, [view[got:]], pos + got)
                if k <= 0:
                    raise DataError(f"{self.path}: truncated shard: could not read rows {s}..{e} (file changed?)")
                got += k
        except OSError as err:
            raise DataError(f"{self.path}: could not read shard ({err.strerror or err})") from None
        raw = buf.view(self.raw_dtype).reshape(e - s, self.n)
        return _widen(raw, self.kind)

    def fingerprint(self) -> list:
        return super().fingerprint() + list(self._stat)


def _npy_shard(path: Path) -> _FileShard:
    try:
        with open(path, "rb") as f:
            major, _minor = np.lib.format.read_magic(f)
            if major == 1:
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except OSError as e:
        raise DataError(f"{path}: could not read shard ({e.strerror or e})") from None
    except Exception as e:  # noqa: BLE001 - a broken header
        raise DataError(f"{path}: corrupted .npy shard (bad header: {str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    dtype = np.dtype(dtype)
    if dtype not in _NP_FLOATS:
        raise DataError(f"{path}: shard dtype {dtype} is not float16/float32/float64")
    if len(shape) != 2:
        raise DataError(f"{path}: shard must be 2-D (rows, dims), has shape {shape}")
    if fortran and shape[0] > 1 and shape[1] > 1:
        raise DataError(f"{path}: Fortran-ordered shard; save it in C order (np.ascontiguousarray) to stream it")
    kind = {2: "f16", 4: "f32", 8: "f64"}[dtype.itemsize]
    return _FileShard(path, offset, shape[0], shape[1], dtype, kind)


def _safetensors_entry(path: Path, key: str | None) -> tuple[list, int, np.dtype, str]:
    """``(shape, byte offset, raw dtype, kind)`` of one tensor of a safetensors file (header checked)."""
    import json
    import struct

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DataError(f"{path}: truncated or corrupted .safetensors shard (no header)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > size - 8 or hlen > 100_000_000:
                raise DataError(f"{path}: corrupted or truncated .safetensors shard (header length {hlen} "
                                f"does not fit in a {size}-byte file)")
            header = json.loads(f.read(hlen).decode("utf-8"))
    except DataError:
        raise
    except OSError as e:
        raise DataError(f"{path}: could not read shard ({e.strerror or e})") from None
    except Exception as e:  # noqa: BLE001 - bad JSON / encoding
        raise DataError(f"{path}: corrupted .safetensors shard (bad header: {type(e).__name__})") from None
    if not isinstance(header, dict):
        raise DataError(f"{path}: corrupted .safetensors shard (header is not a JSON object)")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if key is None:
        if len(tensors) != 1:
            raise DataError(f"{path}: holds several tensors ({', '.join(sorted(tensors))}); choose one with key=")
        key = next(iter(tensors))
    if key not in tensors:
        raise DataError(f"{path}: no tensor named {key!r}; it holds: {', '.join(sorted(tensors)) or 'nothing'}")
    info = tensors[key]
    try:
        dt, shape, (b0, b1) = info["dtype"], [int(v) for v in info["shape"]], [int(v) for v in info["data_offsets"]]
    except Exception:  # noqa: BLE001
        raise DataError(f"{path}: corrupted .safetensors shard (bad entry for {key!r})") from None
    if dt not in _ST_RAW:
        raise DataError(f"{path}: tensor {key!r} has dtype {dt}; streaming reads F16, BF16, F32, F64")
    raw = _ST_RAW[dt]
    if b1 - b0 != int(np.prod(shape)) * raw.itemsize or b0 < 0:
        raise DataError(f"{path}: corrupted .safetensors shard (offsets of {key!r} do not match its shape)")
    kind = {"F16": "f16", "BF16": "bf16", "F32": "f32", "F64": "f64"}[dt]
    return shape, 8 + hlen + b0, raw, kind


def _safetensors_shard(path: Path, key: str | None) -> _FileShard:
    shape, offset, raw, kind = _safetensors_entry(path, key)
    if len(shape) != 2:
        raise DataError(f"{path}: tensor {key or 'in it'!r} must be 2-D (rows, dims), has shape {tuple(shape)}")
    return _FileShard(path, offset, shape[0], shape[1], raw, kind)


class _ArrowShard(_Shard):
    """One Arrow IPC stream file of a Hugging Face ``datasets`` cache (memory-mapped, zero copy).

    A column holds one activation vector per dataset row (``Sequence(float)``)
    or a ``(context, d)`` block per row (``Array2D``, as SAELens caches them);
    blocks are read as ``context`` consecutive rows.
    """

    def __init__(self, path: Path, column: str | None):
        self.path = Path(path)
        self.name = str(self.path)
        self.column = column
        self._table = None
        t = self._open()
        self.column = self._pick_column(t)
        col = t.column(self.column)
        per = self._row_shape(col.type)
        self.per_row, self.n = per
        self.rows = t.num_rows * self.per_row
        self._stat = (self.path.stat().st_size, self.path.stat().st_mtime_ns)

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_table"] = None
        return d

    def _open(self):
        if self._table is None:
            import pyarrow as pa

            try:
                src = pa.memory_map(str(self.path), "r")
                try:
                    self._table = pa.ipc.open_stream(src).read_all()
                except pa.ArrowInvalid:
                    self._table = pa.ipc.open_file(src).read_all()
            except FileNotFoundError:
                raise DataError(f"{self.path}: no such file") from None
            except Exception as e:  # noqa: BLE001 - truncated / corrupted IPC data
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise DataError(f"{self.path}: corrupted or truncated Arrow shard ({msg})") from None
        return self._table

    def _pick_column(self, t) -> str:
        names = t.column_names
        if self.column is not None:
            if self.column not in names:
                raise DataError(f"{self.path}: no column {self.column!r}; it has: {', '.join(names)}")
            return self.column
        floats = [c for c in names if self._value_type(t.column(c).type) is not None]
        if len(floats) != 1:
            raise DataError(f"{self.path}: choose the activation column with column= (float columns: "
                            f"{', '.join(floats) or 'none'})")
        return floats[0]

    @staticmethod
    def _storage(tp):
        return tp.storage_type if hasattr(tp, "storage_type") else tp

    def _value_type(self, tp):
        import pyarrow as pa

        tp = self._storage(tp)
        while pa.types.is_list(tp) or pa.types.is_large_list(tp) or pa.types.is_fixed_size_list(tp):
            tp = self._storage(tp.value_type)
        if pa.types.is_float16(tp) or pa.types.is_float32(tp) or pa.types.is_float64(tp):
            return tp
        return None

    def _row_shape(self, tp):
        """``(vectors per dataset row, vector length)`` from the column's first row."""
        vt = self._value_type(tp)
        if vt is None:
            raise DataError(f"{self.path}: column {self.column!r} is not a float array column")
        self.kind = {2: "f16", 4: "f32", 8: "f64"}[vt.bit_width // 8]
        t = self._open()
        if t.num_rows == 0:
            raise DataError(f"{self.path}: Arrow shard has no rows")
        arr = _unwrap(t.column(self.column).slice(0, 1).combine_chunks())
        if not _is_list(arr):
            raise DataError(f"{self.path}: column {self.column!r} holds scalars, not vectors")
        vectors = arr
        while _is_list(_unwrap(vectors.flatten())):  # down to the list of vectors
            vectors = _unwrap(vectors.flatten())
        total = self._flat(0, 1).size
        per_row = 1 if vectors is arr else len(vectors)
        return per_row, total // max(1, per_row)

    def _flat(self, r0: int, r1: int) -> np.ndarray:
        arr = _unwrap(self._open().column(self.column).slice(r0, r1 - r0).combine_chunks())
        while _is_list(arr):
            arr = _unwrap(arr.flatten())
        if arr.null_count:
            raise DataError(f"{self.path}: column {self.column!r} has missing values in rows {r0}..{r1}")
        return arr.to_numpy(zero_copy_only=False)

    def read(self, s: int, e: int) -> np.ndarray:
        r0, r1 = s // self.per_row, -(-e // self.per_row)
        try:
            flat = self._flat(r0, r1)
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001
            raise DataError(f"{self.path}: corrupted Arrow shard ({type(err).__name__})") from None
        if flat.size != (r1 - r0) * self.per_row * self.n:
            raise DataError(f"{self.path}: ragged rows in column {self.column!r} (rows {r0}..{r1})")
        block = flat.reshape(-1, self.n)[s - r0 * self.per_row : e - r0 * self.per_row]
        return _widen(np.asarray(block), self.kind)

    def fingerprint(self) -> list:
        return super().fingerprint() + list(self._stat) + [self.column]


def _unwrap(arr):
    """The storage array of an extension array (``datasets``' Array2D), else ``arr``."""
    return arr.storage if hasattr(arr, "storage") else arr


def _is_list(arr) -> bool:
    import pyarrow as pa

    tp = arr.type
    return pa.types.is_list(tp) or pa.types.is_large_list(tp) or pa.types.is_fixed_size_list(tp)


class _ArrayShard(_Shard):
    def __init__(self, arr: np.ndarray, name: str = "<array>"):
        self.arr, self.name = arr, name
        self.rows, self.n = arr.shape
        self.kind = {2: "f16", 4: "f32", 8: "f64"}[arr.dtype.itemsize]

    def read(self, s: int, e: int) -> np.ndarray:
        return _widen(np.asarray(self.arr[s:e]), self.kind)

    def fingerprint(self) -> list:
        import hashlib

        h = hashlib.sha1()
        h.update(np.ascontiguousarray(self.arr[: min(self.rows, 64)]).tobytes())
        return super().fingerprint() + [h.hexdigest()]


def _arrow_files(p: Path) -> list[Path]:
    """The ``.arrow`` files of a ``datasets.save_to_disk`` folder (or of its ``shard_*`` sub-folders)."""
    import json

    state = p / "state.json"
    if state.exists():
        try:
            files = [p / d["filename"] for d in json.loads(state.read_text())["_data_files"]]
        except Exception:  # noqa: BLE001
            raise DataError(f"{state}: corrupted datasets state.json") from None
        return files
    subs = sorted((d for d in p.iterdir() if d.is_dir() and (d / "state.json").exists()), key=_natural_key)
    if subs:
        return [f for d in subs for f in _arrow_files(d)]
    return sorted(p.glob("*.arrow"), key=_natural_key)


class ActivationSource:
    r"""Activation vectors ``X`` (N, n) on disk or in memory, read by row slices.

    An array-like for the streaming algorithms: ``shape``, ``dtype``, ``ndim``,
    ``len`` and ``X[s:e]`` / ``X[idx]`` (rows, returned as NumPy arrays);
    nothing is loaded until a slice is asked for. Rows are numbered across
    shards in file order, so a folder of shards reads as one matrix.

    Storage may be float16, bfloat16 (``.safetensors``), float32 or float64;
    slices come back as float32 (float64 for float64 storage) and every
    algorithm accumulates in float64. A shard whose header is corrupted or
    that is shorter than its header promises raises :class:`DataError` naming
    the shard, when the source is opened.

    Use :meth:`open` (any path) or :meth:`from_array`.
    """

    ndim = 2

    def __init__(self, shards: list[_Shard], label: str):
        if not shards:
            raise DataError(f"{label}: no activation shards found")
        n = shards[0].n
        for sh in shards:
            if sh.n != n:
                raise DataError(f"{sh.name}: shard has {sh.n} dims but {shards[0].name} has {n}")
        self.shards = shards
        self.label = label
        self.starts = np.concatenate([[0], np.cumsum([sh.rows for sh in shards])]).astype(np.int64)
        self.shape = (int(self.starts[-1]), int(n))
        self.dtype = np.dtype(np.float64) if any(sh.kind == "f64" for sh in shards) else np.dtype(np.float32)
        self.storage_dtypes = sorted({sh.kind for sh in shards})
        #: whether row slices may be read from several threads at once (positional file reads
        #: and in-memory arrays; Arrow tables are read by one thread)
        self.concurrent_reads = all(isinstance(sh, (_FileShard, _ArrayShard)) for sh in shards)

    # construction -----------------------------------------------------------------
    @classmethod
    def from_array(cls, arr, name: str = "<array>") -> "ActivationSource":
        """Wrap an in-memory (or ``np.memmap``) float array of shape (N, n)."""
        from .._validation import to_numpy

        a = to_numpy(arr, name)
        if a.ndim != 2:
            raise DataError(f"{name}: must be 2-D (N, n), has shape {a.shape}")
        if a.dtype not in _NP_FLOATS:
            a = a.astype(np.float64)
        return cls([_ArrayShard(a, name)], name)

    @classmethod
    def open(cls, path, *, key: str | None = None, column: str | None = None) -> "ActivationSource":
        """Open activations at ``path``.

        Parameters
        ----------
        path : str or Path
            A ``.npy`` or ``.safetensors`` file; a folder of ``.npy`` or
            ``.safetensors`` shards (read in natural name order: ``2`` before
            ``10``); a ``.arrow`` file; or a Hugging Face ``datasets`` folder
            written by ``Dataset.save_to_disk`` (SAELens' activation cache), or
            a folder of such folders (SAELens' ``shard_0``, ``shard_1``, ...).
        key : str, optional
            Tensor name inside ``.safetensors`` shards holding several.
        column : str, optional
            Column of an Arrow / ``datasets`` cache (default: its only float
            column, e.g. ``blocks.0.hook_resid_pre``). ``Array2D`` columns of
            shape ``(context, d)`` yield ``context`` rows per dataset row.
        """
        p = Path(path)
        if not p.exists():
            raise DataError(f"{p}: no such file or folder")
        if p.is_file():
            return cls([cls._shard(p, key, column)], str(p))
        if (p / "state.json").exists() or any(p.glob("*.arrow")) or any(
            (d / "state.json").exists() for d in p.iterdir() if d.is_dir()
        ):
            files = _arrow_files(p)
            for f in files:
                if not f.exists():
                    raise DataError(f"{f}: listed in the datasets cache but missing")
            return cls([_ArrowShard(f, column) for f in files], str(p))
        files = sorted((f for f in p.iterdir() if f.suffix.lower() in (".npy", ".safetensors")), key=_natural_key)
        if not files:
            raise DataError(f"{p}: no .npy, .safetensors or Arrow shards in this folder")
        exts = {f.suffix.lower() for f in files}
        if len(exts) > 1:
            raise DataError(f"{p}: mixes .npy and .safetensors shards; keep one kind per folder")
        return cls([cls._shard(f, key, column) for f in files], str(p))

    @staticmethod
    def _shard(p: Path, key, column) -> _Shard:
        ext = p.suffix.lower()
        if ext == ".npy":
            return _npy_shard(p)
        if ext == ".safetensors":
            return _safetensors_shard(p, key)
        if ext == ".arrow":
            return _ArrowShard(p, column)
        raise DataError(f"{p}: unsupported shard type {ext!r} (use .npy, .safetensors or .arrow)")

    # array protocol -----------------------------------------------------------------
    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the float32/float64 rows (not of the storage)."""
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def __repr__(self) -> str:
        return (f"ActivationSource({self.label!r}, shape={self.shape}, storage={'/'.join(self.storage_dtypes)}, "
                f"shards={len(self.shards)})")

    def locate(self, row: int) -> tuple[str, int]:
        """``(shard name, row inside the shard)`` of global row ``row``."""
        j = int(np.searchsorted(self.starts, row, side="right") - 1)
        return self.shards[j].name, int(row - self.starts[j])

    def _read(self, s: int, e: int) -> np.ndarray:
        if e <= s:
            return np.zeros((0, self.shape[1]), dtype=self.dtype)
        j0 = int(np.searchsorted(self.starts, s, side="right") - 1)
        j1 = int(np.searchsorted(self.starts, e, side="left"))
        parts = []
        for j in range(j0, j1):
            a, b = max(s, self.starts[j]), min(e, self.starts[j + 1])
            if b > a:
                parts.append(self.shards[j].read(int(a - self.starts[j]), int(b - self.starts[j])))
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return out.astype(self.dtype, copy=False)

    def __getitem__(self, key):
        cols = None
        if isinstance(key, tuple):
            if len(key) == 0:
                key = slice(None)
            elif len(key) > 2:
                raise IndexError(f"too many indices for a 2-D source: {key!r}")
            else:
                key, cols = key[0], (key[1] if len(key) == 2 else None)
        N = self.shape[0]
        if isinstance(key, slice):
            s, e, step = key.indices(N)
            out = self._read(s, max(s, e)) if step == 1 else self[np.arange(s, e, step)]
        elif isinstance(key, (int, np.integer)):
            i = int(key) + (N if key < 0 else 0)
            if not 0 <= i < N:
                raise IndexError(f"row {key} is out of range for {N} rows")
            out = self._read(i, i + 1)[0]
        else:
            idx = np.asarray(key)
            if idx.dtype == bool:
                idx = np.flatnonzero(idx)
            idx = idx.astype(np.int64).ravel()
            idx = np.where(idx < 0, idx + N, idx)
            if idx.size and (idx.min() < 0 or idx.max() >= N):
                raise IndexError(f"row index out of range for {N} rows")
            out = np.empty((idx.size, self.shape[1]), dtype=self.dtype)
            order = np.argsort(idx, kind="stable")
            srt = idx[order]
            # read runs of consecutive rows in one go
            brk = np.flatnonzero(np.diff(srt) != 1) + 1
            pos = 0
            for run in np.split(srt, brk) if srt.size else []:
                block = self._read(int(run[0]), int(run[-1]) + 1)
                out[order[pos : pos + run.size]] = block
                pos += run.size
        if cols is not None:
            out = out[..., cols]
        return out

    def __array__(self, dtype=None, copy=None):
        """Materialise all rows (only for data that fits in memory)."""
        a = self._read(0, self.shape[0])
        return a if dtype is None else a.astype(dtype)

    def fingerprint(self) -> list:
        """What identifies this data for checkpoints: shard names, sizes, dtypes, modification times."""
        return [self.shape[0], self.shape[1]] + [sh.fingerprint() for sh in self.shards]


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
        return _widen(np.asarray(u16, dtype=np.uint16), "bf16")

    def __getitem__(self, idx):
        return self._bf16_to_f32(self._raw[idx])

    def __array__(self, dtype=None, copy=None):
        out = self._bf16_to_f32(self._raw[:])
        return out if dtype is None else out.astype(dtype)


def _safetensors_mmap(p: Path, key):
    """Memory-map one tensor of a safetensors file (no copy; bfloat16 through :class:`RowConverter`)."""
    shape, offset, raw, kind = _safetensors_entry(p, key)
    need = offset + int(np.prod(shape)) * raw.itemsize
    if p.stat().st_size < need:
        raise DataError(f"{p}: truncated .safetensors file: the header promises {need} bytes, the file has "
                        f"{p.stat().st_size}")
    arr = np.memmap(p, dtype=raw, mode="r", offset=offset, shape=tuple(shape))
    return RowConverter(arr) if kind == "bf16" else arr


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
