"""Checkpoint files: O(n) state written atomically after every completed pass, one writer at a time.

A checkpoint is an ``.npz`` archive: a JSON ``__meta__`` entry and small float64 arrays. It is
written to a temporary file with a unique name in the checkpoint's own folder and renamed over the
checkpoint (never half-written, and two writers never share a temporary file), and a run that
writes it holds :func:`checkpoint_lock` for its whole length: a second process (or thread) that
names the same checkpoint is refused in one line instead of interleaving its archives with the
first one's. What a checkpoint holds is never trusted for a certificate: the solver that reads it
recomputes or verifies every certified quantity on the data (docs/theory.md §8.5).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .._files import special_file, special_message

try:  # POSIX; elsewhere only the unique temporary names protect a shared checkpoint
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_lock", "CheckpointInUse"]


class CheckpointInUse(ValueError):
    """Another process (or thread) holds the checkpoint's lock: it is writing the same checkpoint."""


def save_checkpoint(path, meta: dict, arrays: dict) -> None:
    """Write ``meta`` (JSON-able) and small float arrays to ``path`` (.npz) atomically.

    The archive is written to a uniquely named temporary file beside ``path`` (same folder, so the
    rename is atomic), flushed to disk and renamed over ``path``; on any error it is removed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                     **{k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_checkpoint(path) -> tuple[dict, dict] | None:
    """``(meta, arrays)`` from a checkpoint written by :func:`save_checkpoint`, or ``None`` if absent."""
    path = Path(path)
    if not path.exists():
        return None
    kind = special_file(path)
    if kind is not None:  # a named pipe would block the read forever
        raise ValueError(special_message(path, kind))
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["__meta__"]).decode())
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{path}: not a readable widelimit checkpoint ({type(e).__name__})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a widelimit checkpoint (its __meta__ is a JSON {type(meta).__name__}, "
                         "not an object); delete it or choose another path")
    return meta, arrays


def _holder(lock: Path) -> str:
    try:
        pid = lock.read_text().strip()
    except OSError:
        return ""
    return f" (process {pid})" if pid.isdigit() else ""


@contextlib.contextmanager
def checkpoint_lock(path):
    """Hold the lock of checkpoint ``path`` (the file ``PATH.lock``, ``fcntl.flock``) while the block runs.

    Raises :class:`CheckpointInUse` (one line naming the checkpoint and the holder's process id) when
    another writer holds it; never waits. The lock file is removed on exit; a lock file left by a
    killed process holds no lock and is taken over.
    """
    path = Path(path)
    if fcntl is None:  # pragma: no cover
        yield
        return
    lock = path.with_name(path.name + ".lock")
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointInUse(f"{path}: checkpoint in use by another run{_holder(lock)}; one run at a time "
                                  "may write a checkpoint: wait for it to finish or choose another path") from None
        try:  # the holder before us may have removed the file after we opened it: lock the file that is there
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still holding it: the next writer then locks a fresh file
        os.close(fd)
