"""Output folders and files of the subcommands: checked before any computation, written atomically.

Every ``--out`` / ``--export`` folder goes through :func:`check_out_dir` (before the computation) and
:func:`atomic_outputs` (at the end); every output *file* (``--checkpoint``) through :func:`check_out_file`.

Atomic means: the results are written in a temporary folder and appear in the target by renames,
so an interrupted run (an error, Ctrl-C, ``kill -9``) leaves the target as it was. A rename is only
atomic within one filesystem, so the temporary folder is made on the filesystem the files end up
on (:func:`_staging`): next to the target after resolving symlinks when the two share a device,
else inside the target itself (a mount point such as ``/dev/shm``, a Docker volume, a symlink into
another filesystem). The pre-check proves the final rename works by making one, before the
computation (a rename that fails with ``EXDEV`` after the computation would discard the results).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from ..data.shards import first_line, show

__all__ = ["check_out_dir", "check_out_file", "atomic_outputs", "moved", "cannot_write"]


def cannot_write(flag: str, path, e: OSError) -> ValueError:
    """The one-line error for an output path that cannot be written, naming ``flag`` and ``path`` as given."""
    return ValueError(f"{flag} {show(path)}: cannot write here ({e.strerror or first_line(e)})")


def _same_device(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def _staging(real: Path) -> tuple[Path, bool]:
    """``(folder, beside)``: where the temporary folder for the resolved target ``real`` is made.

    ``beside`` (the target's parent, on the target's filesystem): the finished folder can become a new
    target by one rename. Otherwise (the target is a mount point, or its parent cannot be written)
    the temporary folder is made inside the target and its files are renamed into it one by one.
    """
    if not real.is_dir():  # a new folder is made in its parent: the parent's filesystem
        return real.parent, True
    parent = real.parent
    if parent != real and _same_device(parent, real) and os.access(parent, os.W_OK | os.X_OK):
        return parent, True
    return real, False


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def check_out_dir(out, flag: str = "--out"):
    """Refuse an output folder whose results could not be written, before any computation.

    ``out`` may exist (a folder) or not (its nearest existing parent must be a writable folder). The
    check makes the temporary folder where :func:`atomic_outputs` will, and renames a file from it into
    the target (``out`` existing) or renames the folder itself (``out`` new): the same renames the
    results take, on the same filesystems, so a target on another filesystem (``EXDEV``) is refused here.
    """
    if out is None:
        return None
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {show(out)}: is a file, a folder is needed")
    if out.is_symlink() and not out.exists():
        raise ValueError(f"{flag} {show(out)}: is a broken symlink")
    probe = out
    while not probe.exists():
        if probe.is_symlink():
            raise ValueError(f"{flag} {show(out)}: {show(probe)} is a broken symlink")
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{flag} {show(out)}: {show(probe)} is a file, a folder is needed")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {show(out)}: {show(probe)} is not writable")
    real = Path(os.path.realpath(out))
    try:  # permissions do not tell everything (/proc, read-only mounts, other filesystems): do the renames
        # every name is chosen before anything is made, and made inside the ``try`` whose ``finally`` removes
        # it: a Ctrl-C between making the probe and entering the ``try`` left a ``.widelimit-probe.*`` folder
        token = f".widelimit-probe.{os.getpid()}.{secrets.token_hex(6)}"
        if real.is_dir():
            stage, _ = _staging(real)
            tmp, dest = Path(stage) / token, real / token
            try:
                os.mkdir(tmp)
                (tmp / "probe").touch()
                os.rename(tmp / "probe", dest)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(dest)
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp = Path(os.path.realpath(_nearest_existing(real))) / token
            moved_to = tmp.with_name(token + ".renamed")
            try:
                os.mkdir(tmp)
                os.rename(tmp, moved_to)
            finally:
                for p in (tmp, moved_to):
                    with contextlib.suppress(OSError):
                        os.rmdir(p)
    except OSError as e:
        raise cannot_write(flag, out, e) from None
    return out


def check_out_file(path, flag: str):
    """Refuse an output *file* (a checkpoint) that cannot be written, before any computation.

    Its folder must exist and be writable (tested by creating a file there and renaming it, as the
    writer does); ``path`` must not be a folder. Every message names ``flag`` and ``path`` as given.
    """
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {show(path)}: is a folder, a file is needed")
    parent = path.parent
    probe = _nearest_existing(parent)
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{flag} {show(path)}: its parent {show(probe)} is a file, not a folder")
    if not parent.exists():
        raise ValueError(f"{flag} {show(path)}: cannot write here (its folder {show(parent)} does not exist)")
    name = str(parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.probe")
    try:
        try:  # (made inside the ``try`` that removes it, as check_out_dir's probe)
            os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            os.rename(name, name + ".renamed")
        finally:
            for p in (name, name + ".renamed"):
                with contextlib.suppress(OSError):
                    os.unlink(p)
    except OSError as e:
        raise cannot_write(flag, path, e) from None
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_outputs(out, flag: str = "--out"):
    """Yield a temporary folder; on success its files appear in ``out`` by renames.

    The temporary folder is on ``out``'s own filesystem (:func:`_staging`, after resolving symlinks).
    A new ``out`` is the finished folder renamed (all files or none); into an existing folder each file is
    moved by one ``os.replace`` (never half-written). On an
    error or Ctrl-C the temporary folder is removed and ``out`` is left as it was. A folder that cannot be
    made or written is one ``ValueError`` naming ``flag`` and ``out`` as given (never the temporary name).
    """
    given = out
    try:
        real = Path(os.path.realpath(out))
        if not real.is_dir():
            real.parent.mkdir(parents=True, exist_ok=True)
        stage, beside = _staging(real)
    except OSError as e:
        raise cannot_write(flag, given, e) from None
    # the name first, the folder made inside the ``try`` that removes it: a Ctrl-C between making it and
    # entering the ``try`` left it behind
    tmp = Path(stage) / f".{real.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    try:
        try:
            os.mkdir(tmp, 0o700)
        except FileExistsError as e:  # not ours: left alone
            tmp = None
            raise cannot_write(flag, given, e) from None
        except OSError as e:
            raise cannot_write(flag, given, e) from None
        yield tmp
        try:
            if beside and _install_folder(tmp, real):
                return
            real.mkdir(parents=True, exist_ok=True)
            for f in sorted(tmp.rglob("*")):
                if f.is_file():
                    dest = real / f.relative_to(tmp)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(f, dest)
        except OSError as e:
            raise cannot_write(flag, given, e) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _install_folder(tmp: Path, real: Path) -> bool:
    """Rename the finished folder ``tmp`` to ``real`` when ``real`` does not exist (one atomic rename);
    ``False`` (nothing done) when it exists, and the files are then moved into it one by one. An existing
    folder is never replaced, even an empty one: it may be someone's working directory."""
    if real.exists() or real.is_symlink():
        return False
    os.chmod(tmp, 0o777 & ~_umask())  # made private (0o700); the results get the usual permissions
    try:
        os.rename(tmp, real)
    except OSError:
        if real.exists():  # made meanwhile: merge instead
            return False
        raise
    return True


def moved(files, tmp, out) -> list[Path]:
    """The final paths in ``out`` of ``files`` written under ``tmp`` by :func:`atomic_outputs`."""
    return [Path(out) / Path(f).relative_to(tmp) for f in files]
