"""Activations on disk or in memory, read by row slices: :func:`open_activations` and :class:`ActivationSource`.

One loader for every format (no pickle): ``.npy`` (read in place), ``.npz``
(``key``), ``.safetensors`` (``key``), ``.csv`` / ``.txt``, ``.pt`` / ``.pth``
(``torch.load(weights_only=True)``), ``.arrow``, a folder of ``.npy`` or
``.safetensors`` shards, and a Hugging Face ``datasets`` cache. Every failure
raises :class:`DataError` (a ``ValueError``) in one line naming the file.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from .._params import Boolean, PathLike, String, validate_params
from .._validation import bad_row, chunk_rows, exact_float64, to_numpy, too_large
from . import readers
from .arrow import ArrowShard, arrow_files
from .csv import TableShard, read_table_shard
from .shards import KIND_OF_ITEMSIZE, ArrayShard, DataError, FileShard, Shard, check_path, natural_key, show

__all__ = ["ActivationSource", "DataError", "open_activations", "check_values", "unmapped"]

_NP_FLOATS = {np.dtype("float16"), np.dtype("float32"), np.dtype("float64")}
_FILE_EXTS = (".npy", ".npz", ".safetensors", ".csv", ".txt", ".pt", ".pth", ".arrow")
_KEY_EXTS = (".npz", ".safetensors", ".pt", ".pth")  # formats holding several named arrays
_TEXT_EXTS = (".csv", ".txt")


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

    Use :func:`open_activations` (any path) or :meth:`from_array`.
    """

    ndim = 2

    def __init__(self, shards: list[Shard], label: str):
        if not shards:
            raise DataError(f"{show(label)}: no activation shards found")
        n = shards[0].n
        for sh in shards:
            if sh.n != n:
                raise DataError(f"{show(sh.name)}: shard has {sh.n} dims but {show(shards[0].name)} has {n}")
        self.shards = shards
        self.label = label
        self.starts = np.concatenate([[0], np.cumsum([sh.rows for sh in shards])]).astype(np.int64)
        self.shape = (int(self.starts[-1]), int(n))
        self.dtype = np.dtype(np.float64) if any(sh.kind == "f64" for sh in shards) else np.dtype(np.float32)
        self.storage_dtypes = sorted({sh.kind for sh in shards})
        #: whether row slices may be read from several threads at once (positional file reads
        #: and in-memory arrays; Arrow tables are read by one thread)
        self.concurrent_reads = all(isinstance(sh, (FileShard, ArrayShard)) for sh in shards)

    # construction -----------------------------------------------------------------
    @classmethod
    def from_array(cls, arr, name: str = "<array>") -> "ActivationSource":
        """Wrap an in-memory (or ``np.memmap``) float array of shape (N, n).

        A masked array with masked entries is refused (naming the first masked row):
        drop or fill those rows first.
        """
        a = to_numpy(arr, name)
        if a.ndim != 2:
            raise DataError(f"{name}: must be 2-D (N, n), has shape {a.shape}")
        if a.dtype.kind == "b":
            raise DataError(f"{name}: has dtype bool; expected floating point or integer numbers")
        if a.dtype.kind in "iu" or (a.dtype.kind == "f" and a.dtype not in _NP_FLOATS):
            try:
                a = exact_float64(a, name)
            except ValueError as e:
                raise DataError(str(e)) from None
        elif a.dtype.kind != "f":
            raise DataError(f"{name}: has dtype {a.dtype}; expected real numbers")
        return cls([ArrayShard(a, name)], name)

    @classmethod
    def open(cls, path, *, key: str | None = None, column: str | None = None,
             header: bool | None = None) -> "ActivationSource":
        """The same as :func:`open_activations` (kept for existing code)."""
        return open_activations(path, key=key, column=column, header=header)

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

    def bad_row_message(self, row: int, what: str, norm: float | None = None, label: str | None = None) -> str:
        """The one message for a refused row (global index ``row``): a non-finite value (``what`` is
        ``"NaN"`` / ``"Inf"``) or a row too large to square (``what="large"``, its ``norm``).

        A text table is named by its line and column (1-based, as the parser's messages); other files by
        the row inside the file (0-based) and, for one shard of several, the row among all the rows.
        """
        j = int(np.searchsorted(self.starts, row, side="right") - 1)
        sh, r = self.shards[j], int(row - self.starts[j])
        if isinstance(sh, TableShard):
            if what == "large":
                return sh.describe(r, None, f"values too large to square in float64: {too_large(norm)}")
            bad = np.flatnonzero(~np.isfinite(np.asarray(sh.read(r, r + 1), dtype=np.float64)[0]))
            return sh.describe(r, int(bad[0]) if bad.size else None, "not a finite number")
        at = f"row {r} (0-based" + (f"; row {row} of {show(label or self.label)})" if len(self.shards) > 1 else ")")
        if what == "large":
            return f"{show(sh.name)}: values too large to square in float64 in {at}: {too_large(norm)}"
        return f"{show(sh.name)}: non-finite value ({what}) in {at}"

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
        if dtype is not None:
            a = a.astype(dtype, copy=False)
        if not a.flags.writeable:  # a read-only memory map: hand out a copy (torch warns on read-only arrays)
            a = a.copy()
        return a

    def fingerprint(self) -> list:
        """What identifies this data for checkpoints: shard names, sizes, dtypes, modification times."""
        return [self.shape[0], self.shape[1]] + [sh.fingerprint() for sh in self.shards]


def _check_option(value, name: str, kinds=(str,), allowed: str = "a string") -> None:
    if value is not None and not isinstance(value, kinds):
        raise DataError(f"{name} must be {allowed} or None, got {type(value).__name__} {value!r}"[:200])


_KIND_TEXT = {"npyfolder": "a folder of .npy shards", "stfolder": "a folder of .safetensors shards",
              "datasets": "a datasets / Arrow cache"}


def _unused_options(p: Path, kind: str, key, column, header) -> None:
    """Refuse an option that does not apply to what ``p`` is, naming the option and the file.

    ``kind``: the file's extension, or ``"npyfolder"``, ``"stfolder"``, ``"datasets"``. Messages
    name the option as ``key=...`` (the CLI shows ``--key``).
    """
    this = _KIND_TEXT.get(kind, f"a {kind} file")
    if key is not None and kind not in _KEY_EXTS + ("stfolder",):
        hint = "; choose its column with column=..." if kind in (".arrow", "datasets") else ""
        raise DataError(f"{show(p)}: key=... {key!r} given, but it names an array inside .npz, .safetensors or "
                        f".pt files only, and this is {this}, which holds one array{hint}")
    if column is not None and kind not in (".arrow", "datasets"):
        raise DataError(f"{show(p)}: column=... {column!r} given, but it names a column of an Arrow file or a "
                        f"datasets cache only, and this is {this}")
    if header is not None and kind not in _TEXT_EXTS:
        raise DataError(f"{show(p)}: header=... given, but it applies to text tables (.csv, .txt) only, and "
                        f"this is {this}")


def _file_shards(p: Path, key, column, header) -> list[Shard]:
    ext = p.suffix.lower()
    if ext in _FILE_EXTS:
        _unused_options(p, ext, key, column, header)
    if ext == ".npy":
        return readers.read_npy(p)
    if ext == ".safetensors":
        return readers.read_safetensors(p, key)
    if ext == ".npz":
        return readers.read_npz(p, key)
    if ext in (".pt", ".pth"):
        return readers.read_torch(p, key)
    if ext in _TEXT_EXTS:
        return [read_table_shard(p, header=header)]
    if ext == ".arrow":
        return [ArrowShard(p, column)]
    raise DataError(f"{show(p)}: unsupported file type {ext or '(no extension)'!r} "
                    f"(use {', '.join(_FILE_EXTS)}, a folder of shards or a datasets cache)")


#: What each kind of entry of a folder is called in messages (:func:`folder_kind`).
_FOLDER_KINDS = {".npy": ".npy shards", ".safetensors": ".safetensors shards",
                 "datasets": "a datasets / Arrow cache (.arrow files, state.json)",
                 "datasets-sub": "datasets cache sub-folders (holding state.json)"}


def folder_kind(p: Path) -> str:
    """What folder ``p`` holds: ``".npy"``, ``".safetensors"``, ``"datasets"`` (``.arrow`` files or a
    ``state.json`` here) or ``"datasets-sub"`` (sub-folders holding ``state.json``).

    A folder holding more than one kind of data -- those four, and single data files of another format
    (``.npz``, ``.pt``, ``.csv``, ...) -- is one :class:`DataError` naming every kind with an example file:
    reading one kind and ignoring the others would answer for data other than the folder's. Entries of no
    data format (``dataset_info.json``, a README, other sub-folders) are ignored.
    """
    kinds: dict[str, Path] = {}
    for f in sorted(p.iterdir(), key=natural_key):
        ext = f.suffix.lower()
        if f.is_dir():
            kind = "datasets-sub" if (f / "state.json").exists() else None
        elif f.name == "state.json" or ext == ".arrow":
            kind = "datasets"
        elif ext in _FILE_EXTS:
            kind = ext
        else:
            kind = None
        if kind is not None:
            kinds.setdefault(kind, f)
    if len(kinds) > 1:
        listed = "; ".join(f"{_FOLDER_KINDS.get(k, k + ' files')} (e.g. {show(f.name)})" for k, f in kinds.items())
        raise DataError(f"{show(p)}: holds more than one kind of data: {listed}; keep one kind per folder")
    if not kinds:
        raise DataError(f"{show(p)}: no .npy, .safetensors or Arrow shards in this folder")
    kind, example = next(iter(kinds.items()))
    if kind not in _FOLDER_KINDS:
        raise DataError(f"{show(p)}: holds {kind} files (e.g. {show(example.name)}); a folder is read as .npy or "
                        ".safetensors shards or a datasets cache: give the file itself")
    return kind


def _folder_shards(p: Path, key, column, header) -> list[Shard]:
    """The shards of folder ``p``, one kind of data (:func:`folder_kind`)."""
    kind = folder_kind(p)
    if kind in ("datasets", "datasets-sub"):
        _unused_options(p, "datasets", key, column, header)
        return [ArrowShard(f, column) for f in arrow_files(p)]
    files = sorted((f for f in p.iterdir() if f.suffix.lower() == kind and not f.is_dir()), key=natural_key)
    _unused_options(p, "npyfolder" if kind == ".npy" else "stfolder", key, column, header)
    shards = [sh for f in files for sh in _file_shards(check_path(f), key, column, header)]
    same_tensor(p, shards)
    return shards


def same_tensor(p: Path, shards: list[Shard]) -> None:
    """Refuse shards that hold differently named tensors, each read as "the only one" (``key`` not given):
    rows of different quantities would be stacked as one matrix. One :class:`DataError` listing the names
    with a shard of each, asking for ``key``."""
    names: dict[str, str] = {}
    for sh in shards:
        t = getattr(sh, "tensor", None)
        if t is not None:
            names.setdefault(t, sh.name)
    if len(names) > 1:
        listed = ", ".join(f"{t!r} (e.g. {show(Path(f).name)})" for t, f in names.items())
        raise DataError(f"{show(p)}: its shards hold tensors of different names: {listed}; name the one to read "
                        "with key=... (every shard must hold it)")


def unmapped(X):
    """``X`` read through its file when it is a memory map of a file: an :class:`ActivationSource` whose rows
    are read with ``os.pread`` (:class:`~widelimit.data.shards.FileShard`); ``X`` itself otherwise.

    A pass over a memory map keeps every page it touched resident in the process: streaming a 1.5 GB
    ``np.load(..., mmap_mode="r")`` of 10^6 tokens grew the resident memory by 1.5 GB, where positional
    reads keep one chunk. Applies to a 2-D, C-contiguous float32 / float64 ``np.memmap`` (or a row slice of
    one) in native byte order that shares its file (modes ``r``, ``r+``, ``w+``: reads of the file see
    its writes); a copy-on-write map (mode ``c``) is not its file and stays as it is.
    """
    mm = getattr(X, "_mmap", None)
    if (not isinstance(X, np.memmap) or mm is None or getattr(X, "mode", None) not in ("r", "r+", "w+")
            or X.filename is None or X.ndim != 2 or not X.flags.c_contiguous or not X.dtype.isnative
            or X.dtype not in (np.dtype(np.float32), np.dtype(np.float64)) or X.shape[0] == 0):
        return X
    # the file offset of X's first row: the map starts at the offset rounded down to the allocation granularity
    start = X.offset - X.offset % mmap.ALLOCATIONGRANULARITY
    at = start + X.__array_interface__["data"][0] - np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
    shard = FileShard(Path(X.filename), at, X.shape[0], X.shape[1], X.dtype, KIND_OF_ITEMSIZE[X.dtype.itemsize])
    return ActivationSource([shard], str(X.filename))


@validate_params({"path": PathLike(), "key": [String(), None], "column": [String(), None], "header": [Boolean(), None]},
                 error=DataError)
def open_activations(path, *, key: str | None = None, column: str | None = None,
                     header: bool | None = None) -> ActivationSource:
    """Open activations ``X`` (N, n) at ``path`` as an :class:`ActivationSource` (nothing read up front
    where the format allows it).

    Parameters
    ----------
    path : str or Path
        A file: ``.npy`` (C-ordered float16/32/64 read in place by row ranges;
        other layouts and integer dtypes through a memory map), ``.npz``,
        ``.safetensors`` (float16, bfloat16, float32, float64 read in place),
        ``.csv`` / ``.txt``, ``.pt`` / ``.pth`` (a tensor or a dict of tensors,
        ``torch.load(weights_only=True)``), ``.arrow``. Or a folder: ``.npy`` or
        ``.safetensors`` shards (one kind, read in natural name order: ``2``
        before ``10``); a Hugging Face ``datasets`` folder written by
        ``Dataset.save_to_disk`` (SAELens' activation cache), or a folder of
        such folders (``shard_0``, ``shard_1``, ...).
    key : str, optional
        Array / tensor name inside an ``.npz``, ``.safetensors`` or ``.pt`` holding
        several (or a folder of ``.safetensors`` shards); refused for other formats,
        which hold one array.
    column : str, optional
        Column of an Arrow / ``datasets`` cache (default: its only float column,
        e.g. ``blocks.0.hook_resid_pre``). ``Array2D`` columns of shape
        ``(context, d)`` yield ``context`` rows per dataset row. Refused for other formats.
    header : bool, optional
        Text tables only: ``None`` (default) treats the first row as a header when
        none of its fields is a number; ``True`` / ``False`` force it. Refused for other formats.

    Returns
    -------
    ActivationSource
        Rows come back as float32 (float64 for float64 storage; integers are read as float64).

    Raises
    ------
    DataError
        One line naming the file: missing (a broken symlink and a symlink loop are
        named as such), unreadable, corrupted or truncated, pickled Python objects,
        not 2-D, empty, not numeric (booleans included), a malformed text row (with its line and
        column), an option that does not apply to the format (``key``, ``column``, ``header``).
        Non-finite values are found by :func:`check_values` or by the first pass of a computation.
    """
    if isinstance(path, ActivationSource):
        return path
    _check_option(key, "key")
    _check_option(column, "column")
    _check_option(header, "header", (bool,), "True, False")
    p = check_path(path)
    if p.is_dir():
        src = ActivationSource(_folder_shards(p, key, column, header), str(p))
    elif p.is_file():
        src = ActivationSource(_file_shards(p, key, column, header), str(p))
    else:
        raise DataError(f"{show(p)}: not a regular file or folder")
    if src.shape[0] == 0 or src.shape[1] == 0:
        raise DataError(f"{show(p)}: holds no data (shape {src.shape})")
    return src


def check_values(src: ActivationSource, label: str | None = None) -> None:
    """Read every row once and refuse NaN / Inf and rows too large to square in float64, naming where.

    A text table is named by its line and column (1-based, as the parser's messages); other files by
    the row inside the file (0-based), and its row among all of ``src``'s rows when it is one shard of
    several. Memory: one chunk.
    """
    for j, sh in enumerate(src.shards):
        rows = max(1, chunk_rows(sh.n))
        for s in range(0, sh.rows, rows):
            hit = bad_row(sh.read(s, min(sh.rows, s + rows)))
            if hit is not None:
                i, what, nrm = hit
                raise DataError(src.bad_row_message(int(src.starts[j]) + s + i, what, nrm, label))
