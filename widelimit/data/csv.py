"""Text tables: ``.csv`` (comma separated) and ``.txt`` (whitespace separated).

The first row is a header only when *every* field of it is non-numeric, or when
``header=True`` asks for one (``header=False`` forbids one). A row that is not
all numbers, or that has a different number of fields, is an error naming its
line and column (1-based, as an editor shows them). Blank lines and lines
starting with ``#`` are skipped.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .shards import ArrayShard, DataError, first_line, show

__all__ = ["read_table", "read_table_shard", "TableShard"]


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _split(line: str, delim: str | None) -> list[str]:
    return [f.strip() for f in line.split(delim)] if delim is not None else line.split()


def _rows(path: Path):
    """``(line number, text)`` of the non-blank, non-comment lines."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            for i, line in enumerate(f, 1):
                s = line.strip()
                if s and not s.startswith("#"):
                    yield i, s
    except UnicodeDecodeError as e:
        raise DataError(f"{show(path)}: not a UTF-8 text file ({first_line(e)})") from None
    except OSError as e:
        raise DataError(f"{show(path)}: could not read ({e.strerror or first_line(e)})") from None


def _locate_error(path: Path, delim: str | None, skip_line: int | None) -> None:
    """Raise a :class:`DataError` naming the first malformed line and column (a pure-Python pass)."""
    width = first = None
    for ln, text in _rows(path):
        if ln == skip_line:
            continue
        fields = _split(text, delim)
        for j, fld in enumerate(fields, 1):
            if not _is_number(fld):
                raise DataError(f"{show(path)}: line {ln}, column {j}: {fld[:40]!r} is not a number")
        if width is None:
            width, first = len(fields), ln
        elif len(fields) != width:
            raise DataError(f"{show(path)}: line {ln} has {len(fields)} fields, line {first} has {width}")


class TableShard(ArrayShard):
    """The rows of a text table, which knows the line of the file each row came from (for messages)."""

    def __init__(self, arr: np.ndarray, path: Path, header_line: int | None):
        super().__init__(arr, str(path))
        self.path, self.header_line = Path(path), header_line

    def line_of(self, row: int) -> tuple[int, list[str]]:
        """``(line number, fields)`` of data row ``row`` (0-based) in the file (1-based lines, as an editor shows)."""
        delim = "," if self.path.suffix.lower() == ".csv" else None
        k = -1
        for ln, text in _rows(self.path):
            if ln == self.header_line:
                continue
            k += 1
            if k == row:
                return ln, _split(text.split("#", 1)[0], delim)
        raise IndexError(row)  # pragma: no cover - the file changed since it was read

    def describe(self, row: int, col: int | None, what: str) -> str:
        """``path: line L, column C: 'text' is <what>`` (``col`` 0-based, or None for the whole line)."""
        try:
            ln, fields = self.line_of(row)
        except (IndexError, DataError):  # pragma: no cover - the file changed since it was read
            return f"{show(self.path)}: data row {row} (0-based): {what}"
        if col is None or col >= len(fields):
            return f"{show(self.path)}: line {ln}: {what}"
        return f"{show(self.path)}: line {ln}, column {col + 1}: {fields[col][:40]!r} is {what}"


def read_table(path: Path, header: bool | None = None) -> np.ndarray:
    """Read a numeric table as a float64 ``(rows, columns)`` array (see :func:`read_table_shard`)."""
    return read_table_shard(path, header).arr


def read_table_shard(path: Path, header: bool | None = None) -> TableShard:
    """Read a numeric table as a float64 ``(rows, columns)`` array.

    A :class:`TableShard`: it maps rows back to the file's lines for messages.

    Parameters
    ----------
    path : Path
        ``.csv`` (comma separated) or any other text file (whitespace separated).
    header : bool, optional
        ``None`` (default): the first row is a header iff none of its fields is a number.
        ``True``: the first row is a header. ``False``: there is none.
    """
    if header not in (None, True, False):
        raise DataError(f"header must be True, False or None, got {header!r}")
    delim = "," if path.suffix.lower() == ".csv" else None
    first = next(_rows(path), None)
    if first is None:
        raise DataError(f"{show(path)}: holds no rows")
    ln, text = first
    fields = _split(text, delim)
    if header is None:
        header = not any(_is_number(f) for f in fields)
    skip = ln if header else None
    try:
        with warnings.catch_warnings():  # "input contained no data": reported below
            warnings.simplefilter("ignore")
            arr = np.loadtxt(path, delimiter=delim, ndmin=2, comments="#", skiprows=ln if header else 0,
                             dtype=np.float64, encoding="utf-8-sig")
    except Exception as e:  # noqa: BLE001 - find the line and column ourselves
        _locate_error(path, delim, skip)
        raise DataError(f"{show(path)}: could not read as a table of numbers ({first_line(e)})") from None
    if arr.size == 0:
        raise DataError(f"{show(path)}: holds no rows" + (" after its header" if header else ""))
    return TableShard(arr, path, skip)
