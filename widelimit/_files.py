"""Files that are not regular files: named pipes, devices, sockets (refused by every reader, never opened).

Opening a named pipe (FIFO) with no writer blocks forever; a character device such as ``/dev/zero``
never ends. Every reader of data, SAE files and checkpoints asks :func:`special_file` first and
refuses such a path in one line (:func:`special_message`).
"""

from __future__ import annotations

import os
import stat

__all__ = ["show", "special_file", "special_message"]


def show(p) -> str:
    """A path for a one-line message: as is when printable, else ``repr`` (a newline reads as ``\\n``)."""
    s = os.fspath(p) if isinstance(p, os.PathLike) else str(p)
    return s if s.isprintable() else repr(s)


_SPECIAL = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_file(p, st: os.stat_result | None = None) -> str | None:
    """What ``p`` is when it is neither a regular file nor a folder (``"a named pipe (FIFO)"``, ...), else ``None``.

    Reading such a file can block forever (a FIFO with no writer) or never end (``/dev/zero``):
    every reader refuses it up front, naming it, with :func:`special_message`.
    """
    if st is None:
        try:
            st = os.stat(p)
        except OSError:
            return None  # missing files are the caller's to report
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return next((kind for test, kind in _SPECIAL if test(st.st_mode)), "not a regular file")


def special_message(p, kind: str) -> str:
    """The one line refusing a special file ``p`` of kind ``kind`` (:func:`special_file`)."""
    return (f"{show(p)}: is {kind}, not a regular file; refused (reading it could block forever): "
            "give a regular file")
