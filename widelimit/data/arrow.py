"""Arrow IPC files and Hugging Face ``datasets`` caches (``Dataset.save_to_disk``, SAELens' activation cache)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .shards import DataError, Shard, first_line, natural_key, show, special_file, special_message, widen

__all__ = ["ArrowShard", "arrow_files"]


class ArrowShard(Shard):
    """One Arrow IPC stream file of a Hugging Face ``datasets`` cache (memory-mapped, zero copy).

    A column holds one activation vector per dataset row (``Sequence(float)``)
    or a ``(context, d)`` block per row (``Array2D``, as SAELens caches them);
    blocks are read as ``context`` consecutive rows.
    """

    def __init__(self, path: Path, column: str | None):
        self.path = Path(path)
        self.name = str(self.path)
        kind = special_file(self.path)
        if kind is not None:
            raise DataError(special_message(self.path, kind))
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
                raise DataError(f"{show(self.path)}: no such file") from None
            except Exception as e:  # noqa: BLE001 - truncated / corrupted IPC data
                msg = first_line(e)
                raise DataError(f"{show(self.path)}: corrupted or truncated Arrow shard ({msg})") from None
        return self._table

    def _pick_column(self, t) -> str:
        names = t.column_names
        if self.column is not None:
            if self.column not in names:
                raise DataError(f"{show(self.path)}: no column {self.column!r}; it has: {', '.join(names)}")
            return self.column
        floats = [c for c in names if self._value_type(t.column(c).type) is not None]
        if len(floats) != 1:
            raise DataError(f"{show(self.path)}: choose the activation column with column= (float columns: "
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
        """``(vectors per dataset row, vector length)`` from the column's first row (every row must match it)."""
        vt = self._value_type(tp)
        if vt is None:
            raise DataError(f"{show(self.path)}: column {self.column!r} is not a float array column")
        self.kind = {2: "f16", 4: "f32", 8: "f64"}[vt.bit_width // 8]
        t = self._open()
        if t.num_rows == 0:
            raise DataError(f"{show(self.path)}: Arrow shard has no rows")
        arr = _unwrap(t.column(self.column).slice(0, 1).combine_chunks())
        if not _is_list(arr):
            raise DataError(f"{show(self.path)}: column {self.column!r} holds scalars, not vectors")
        shape = []  # the first row's length at each nesting level: (d,) or (context, d)
        while _is_list(arr):
            if arr.null_count:
                raise DataError(f"{show(self.path)}: column {self.column!r} has missing values in row 0")
            if len(arr) == 0:
                raise DataError(f"{show(self.path)}: column {self.column!r}: row 0 holds an empty list")
            shape.append(int(_lengths(arr)[0]))
            arr = _unwrap(arr.flatten())
        self._shape = tuple(shape)
        self._flat(0, 1)  # checks the first row's values
        return int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]

    def _flat(self, r0: int, r1: int) -> np.ndarray:
        """The values of dataset rows ``r0 .. r1 - 1``, after checking that each has the first row's shape.

        A row of another length (a ragged column: vectors of 4, 2, 6 values) is one :class:`DataError` naming
        the row; a check of the total alone would re-cut such rows into vectors that are not in the data.
        """
        arr = _unwrap(self._open().column(self.column).slice(r0, r1 - r0).combine_chunks())
        per = 1  # entries of this nesting level per dataset row
        for want in self._shape:
            if not _is_list(arr):
                raise DataError(f"{show(self.path)}: column {self.column!r}: row {r0} is not nested like row 0")
            if arr.null_count:
                raise DataError(f"{show(self.path)}: column {self.column!r} has missing values in rows {r0}..{r1}")
            bad = np.flatnonzero(_lengths(arr) != want)
            if bad.size:
                j = int(bad[0])
                raise DataError(f"{show(self.path)}: ragged rows in column {self.column!r}: row {r0 + j // per} "
                                f"holds a list of {int(_lengths(arr)[j])} values where row 0 holds {want}; every "
                                "row must have the same shape")
            per *= want
            arr = _unwrap(arr.flatten())
        if _is_list(arr):
            raise DataError(f"{show(self.path)}: column {self.column!r}: rows {r0}..{r1} are nested deeper than row 0")
        if arr.null_count:
            raise DataError(f"{show(self.path)}: column {self.column!r} has missing values in rows {r0}..{r1}")
        return arr.to_numpy(zero_copy_only=False)

    def read(self, s: int, e: int) -> np.ndarray:
        r0, r1 = s // self.per_row, -(-e // self.per_row)
        try:
            flat = self._flat(r0, r1)
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001
            raise DataError(f"{show(self.path)}: corrupted Arrow shard ({type(err).__name__})") from None
        if flat.size != (r1 - r0) * self.per_row * self.n:
            raise DataError(f"{show(self.path)}: ragged rows in column {self.column!r} (rows {r0}..{r1})")
        block = flat.reshape(-1, self.n)[s - r0 * self.per_row : e - r0 * self.per_row]
        return widen(np.asarray(block), self.kind)

    def fingerprint(self) -> list:
        return super().fingerprint() + list(self._stat) + [self.column]


def _unwrap(arr):
    """The storage array of an extension array (``datasets``' Array2D), else ``arr``."""
    return arr.storage if hasattr(arr, "storage") else arr


def _is_list(arr) -> bool:
    import pyarrow as pa

    tp = arr.type
    return pa.types.is_list(tp) or pa.types.is_large_list(tp) or pa.types.is_fixed_size_list(tp)


def arrow_files(p: Path) -> list[Path]:
    """The ``.arrow`` files of a ``datasets.save_to_disk`` folder (or of its ``shard_*`` sub-folders).

    The file names listed in ``state.json`` must be relative paths inside the folder:
    an absolute path or one leading out of it (``..``) is refused.
    """
    state = p / "state.json"
    if state.exists():
        kind = special_file(state)
        if kind is not None:
            raise DataError(special_message(state, kind))
        try:
            listed = json.loads(state.read_text())["_data_files"]
            names = [d["filename"] for d in listed]
        except Exception:  # noqa: BLE001
            raise DataError(f"{show(state)}: corrupted datasets state.json (no _data_files list of filenames)") from None
        root = p.resolve()
        files = []
        for name in names:
            if not isinstance(name, str) or not name:
                raise DataError(f"{show(state)}: corrupted datasets state.json (filename {name!r} is not a file name)")
            f = (p / name)
            if Path(name).is_absolute() or not f.resolve().is_relative_to(root):
                raise DataError(f"{show(state)}: filename {show(name)} lies outside the cache folder; "
                                "only files inside it are read")
            if not f.is_file():
                raise DataError(f"{show(f)}: listed in the datasets cache but missing")
            files.append(f)
        return files
    subs = sorted((d for d in p.iterdir() if d.is_dir() and (d / "state.json").exists()), key=natural_key)
    if subs:
        return [f for d in subs for f in arrow_files(d)]
    return sorted(p.glob("*.arrow"), key=natural_key)


def _lengths(arr) -> np.ndarray:
    """The length of every list of the list array ``arr`` (int64)."""
    import pyarrow.compute as pc

    return np.asarray(pc.list_value_length(arr).to_numpy(zero_copy_only=False), dtype=np.int64)
