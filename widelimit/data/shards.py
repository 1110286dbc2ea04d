"""Shards: one file (or in-memory array) of activation rows, read by row ranges.

:class:`DataError` (a ``ValueError``) is what every reader raises; its message is
one line naming the file (quoted when the name holds a newline or another
unprintable character).
"""

from __future__ import annotations

import abc
import errno
import hashlib
import os
import re
import threading
from pathlib import Path

import numpy as np

from .._files import show, special_file, special_message

__all__ = ["DataError", "show", "check_path", "special_file"]


class DataError(ValueError):
    """A data file is missing, unreadable, or does not hold what was asked for."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name."""
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def check_path(path, what: str = "path") -> Path:
    """``Path(path)`` after checking that it exists; a broken symlink or a symlink loop is named as such.

    Raises :class:`DataError` for ``None`` or a non-path ``path`` (naming ``what``)
    and for a missing, unreachable or looping path (naming the path).
    """
    if path is None or not isinstance(path, (str, os.PathLike)):
        raise DataError(f"{what} must be a file or folder path (str or os.PathLike), got {type(path).__name__}"
                        + ("" if path is None else f" {path!r}"[:80]))
    p = Path(path)
    if str(path) == "":
        raise DataError(f"{what} is an empty string")
    try:
        st = os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DataError(f"{show(p)}: symlink loop (too many levels of symbolic links)") from None
        if e.errno == errno.ENOENT and p.is_symlink():
            raise DataError(f"{show(p)}: broken symlink (its target {show(os.readlink(p))} does not exist)") from None
        if e.errno == errno.ENOENT:
            raise DataError(f"{show(p)}: no such file or folder") from None
        if e.errno == errno.ENOTDIR:
            raise DataError(f"{show(p)}: no such file or folder (a parent is not a folder)") from None
        if e.errno == errno.ENAMETOOLONG:
            raise DataError(f"{show(p)[:200]}...: file name too long") from None
        raise DataError(f"{show(p)}: {e.strerror or first_line(e)}") from None
    except ValueError as e:  # embedded NUL byte
        raise DataError(f"{show(p)}: invalid path ({first_line(e)})") from None
    kind = special_file(p, st)
    if kind is not None:
        raise DataError(special_message(p, kind))
    if not os.access(p, os.R_OK):
        raise DataError(f"{show(p)}: not readable (permission denied)")
    return p


def natural_key(p: Path):
    """Sort key: ``part_2`` before ``part_10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def widen(raw: np.ndarray, kind: str) -> np.ndarray:
    """float16 / bfloat16 (as uint16 bits) / float32 / float64 -> float32 or float64."""
    if kind == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if raw.dtype == np.float16:
        return raw.astype(np.float32)
    return raw


KIND_OF_ITEMSIZE = {2: "f16", 4: "f32", 8: "f64"}


class Shard(abc.ABC):
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


class FileShard(Shard):
    """Rows stored contiguously in a file at byte ``offset`` (C order): read with ``os.pread``.

    Positional reads keep the resident memory at one chunk (a memory map would
    count every page touched) and are safe from several threads.
    """

    def __init__(self, path: Path, offset: int, rows: int, n: int, raw_dtype: np.dtype, kind: str):
        self.path = Path(path)
        self.name = str(self.path)
        self.offset, self.rows, self.n = int(offset), int(rows), int(n)
        if self.rows < 0 or self.n < 0 or self.offset < 0:
            raise DataError(f"{show(self.path)}: corrupted header (negative shape or offset: "
                            f"rows {self.rows}, dims {self.n}, offset {self.offset})")
        self.raw_dtype, self.kind = np.dtype(raw_dtype), kind
        self._fd = None
        need = self.offset + self.rows * self.n * self.raw_dtype.itemsize
        st = self.path.stat()
        if st.st_size < need:
            raise DataError(f"{show(self.path)}: truncated shard: the header promises {need} bytes, "
                            f"the file has {st.st_size}")
        self._stat = (st.st_size, st.st_mtime_ns)

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
                    raise DataError(f"{show(self.path)}: truncated shard: could not read rows {s}..{e} "
                                    "(file changed?)")
                got += k
        except OSError as err:
            raise DataError(f"{show(self.path)}: could not read shard ({err.strerror or err})") from None
        raw = buf.view(self.raw_dtype).reshape(e - s, self.n)
        return widen(raw, self.kind)

    def fingerprint(self) -> list:
        return super().fingerprint() + list(self._stat)


class ArrayShard(Shard):
    """An in-memory (or memory-mapped) 2-D array; ``kind="bf16"`` for bfloat16 bits stored as uint16."""

    def __init__(self, arr: np.ndarray, name: str = "<array>", kind: str | None = None):
        self.arr, self.name = arr, name
        self.rows, self.n = arr.shape
        self.kind = kind or KIND_OF_ITEMSIZE[arr.dtype.itemsize]

    def read(self, s: int, e: int) -> np.ndarray:
        return widen(np.asarray(self.arr[s:e]), self.kind)

    def fingerprint(self) -> list:
        h = hashlib.sha1()
        h.update(np.ascontiguousarray(self.arr[: min(self.rows, 64)]).tobytes())
        return super().fingerprint() + [h.hexdigest()]
