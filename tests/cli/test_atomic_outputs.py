"""Output folders: made on the target's own filesystem, proven writable before the computation, never half-written.

Issue 29: ``--out`` on another filesystem than its parent (a cross-device symlink, a mount point) failed with
EXDEV after the whole computation; ``relax-bench --export`` and ``experiment --out`` wrote in place, so
Ctrl-C left half-written files or files of two runs side by side.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from widelimit.cli import main
from widelimit.cli import _output

SHM = Path("/dev/shm")
OTHER_FS = pytest.mark.skipif(not SHM.is_dir() or not os.access(SHM, os.W_OK),
                              reason="needs a writable /dev/shm (another filesystem than the tests' tmp folder)")


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, np.random.default_rng(0).standard_normal((40, 3)))
    return p


@pytest.fixture
def other_fs(tmp_path):
    """A fresh folder on another filesystem than ``tmp_path`` (skipped where there is none)."""
    if not SHM.is_dir() or not os.access(SHM, os.W_OK) or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a writable /dev/shm on another filesystem than the tests' tmp folder")
    d = Path(tempfile.mkdtemp(prefix="widelimit-test-", dir=SHM))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_out_through_a_cross_device_symlink_is_written(tmp_path, data, other_fs, capsys):
    """The temporary folder was made in the symlink's parent (another filesystem): EXDEV after the solve."""
    link = tmp_path / "out"
    link.symlink_to(other_fs)
    rc, out, err = _run(capsys, "solve", data, "--lam", "0.5", "--out", link, "--json")
    assert rc == 0, err
    assert sorted(p.name for p in other_fs.iterdir()) == ["solution.json", "solution.npz", "solution.png"]
    assert json.loads((other_fs / "solution.json").read_text())["value"] == json.loads(out)["value"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_new_out_below_a_cross_device_symlink(tmp_path, data, other_fs, capsys):
    link = tmp_path / "shm"
    link.symlink_to(other_fs)
    rc, _, err = _run(capsys, "demo", "--out", link / "a" / "b")
    assert rc == 0, err
    assert sorted(p.name for p in (other_fs / "a" / "b").iterdir()) == ["demo.json", "demo.npz", "demo.png"]


def test_a_mount_point_is_staged_inside_itself():
    """/dev/shm is a mount point (its parent /dev is another filesystem): the temporary folder goes inside it."""
    if not SHM.is_dir() or os.stat(SHM).st_dev == os.stat(SHM.parent).st_dev:
        pytest.skip("/dev/shm is not a mount point here")
    assert _output._staging(SHM) == (SHM, False)


def test_pre_check_proves_the_rename_before_computing(tmp_path, data, capsys, monkeypatch):
    """A rename that fails (EXDEV) is found by the pre-check, before the data are even read."""
    import widelimit.cli.solve as solve_cli

    read = []
    monkeypatch.setattr(solve_cli, "load_data", lambda *a, **k: read.append(a) or (_ for _ in ()).throw(
        AssertionError("computed")))

    def exdev(*a, **k):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(_output.os, "rename", exdev)
    (tmp_path / "out").mkdir()
    for target in (tmp_path / "out", tmp_path / "new"):
        rc, _, err = _run(capsys, "solve", data, "--lam", "0.5", "--out", target)
        assert rc == 2 and err.strip() == (f"widelimit solve: error: --out {target}: cannot write here "
                                           f"({os.strerror(errno.EXDEV)})"), err
    assert read == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "x.npy"]  # the probes left nothing


def test_a_new_out_appears_by_one_rename(tmp_path, data, capsys, monkeypatch):
    """A new folder is the finished temporary folder renamed (all files or none), with the usual permissions."""
    calls = []
    real_rename = os.rename
    monkeypatch.setattr(_output.os, "rename", lambda a, b: calls.append((a, b)) or real_rename(a, b))
    out = tmp_path / "new"
    rc, _, err = _run(capsys, "solve", data, "--lam", "0.5", "--out", out)
    assert rc == 0, err
    installs = [c for c in calls if Path(c[1]) == out]
    assert len(installs) == 1 and sorted(p.name for p in out.iterdir()) == ["solution.json", "solution.npz",
                                                                            "solution.png"]
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask


# --------------------------------------------------------------------------------------
# relax-bench --export and experiment --out: interrupted runs leave nothing
# --------------------------------------------------------------------------------------


def test_relax_bench_export_interrupted_leaves_nothing_and_reruns(tmp_path, capsys, monkeypatch):
    import widelimit.relax.export as export

    real = export.write_sdpa

    def half_then_ctrl_c(X, path, **kw):
        Path(path).write_bytes(b"\"half a file\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "write_sdpa", half_then_ctrl_c)
    out = tmp_path / "bench"
    rc, _, err = _run(capsys, "relax-bench", "--family", "rays", "--N", "6", "--export", out)
    assert rc == 130 and err.strip() == "widelimit relax-bench: interrupted", err
    assert list(tmp_path.iterdir()) == []  # no piece of a file, no temporary folder
    monkeypatch.setattr(export, "write_sdpa", real)
    rc, out_json, err = _run(capsys, "relax-bench", "--family", "rays", "--N", "6", "--export", out, "--json")
    assert rc == 0, err
    recs = json.loads((out / "instances.json").read_text())
    assert [r["file"] for r in recs] == [r["file"] for r in json.loads(out_json)["instances"]]
    assert all((out / r["file"]).stat().st_size == r["bytes"] for r in recs)


def test_experiment_interrupted_leaves_the_previous_run(tmp_path, capsys, monkeypatch):
    from widelimit.lab import experiments

    out = tmp_path / "exp"
    out.mkdir()
    (out / "certificate.json").write_text("run 1")
    (out / "sae").mkdir()
    (out / "sae" / "cfg.json").write_text("run 1")

    def killed_half_way(out_dir, quick=False):
        (Path(out_dir) / "sae").mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "sae" / "cfg.json").write_text("run 2")
        raise KeyboardInterrupt

    def finishes(out_dir, quick=False):
        killed = Path(out_dir)
        (killed / "sae").mkdir(parents=True, exist_ok=True)
        (killed / "sae" / "cfg.json").write_text("run 3")
        (killed / "certificate.json").write_text("run 3")
        return {"files": [str(killed / "certificate.json")]}

    monkeypatch.setattr(experiments, "get", lambda name: killed_half_way)
    rc, _, err = _run(capsys, "experiment", "x", "--out", out)
    assert rc == 130, err
    assert (out / "sae" / "cfg.json").read_text() == "run 1" and (out / "certificate.json").read_text() == "run 1"
    assert sorted(p.name for p in out.iterdir()) == ["certificate.json", "sae"]
    monkeypatch.setattr(experiments, "get", lambda name: finishes)
    rc, printed, err = _run(capsys, "experiment", "x", "--out", out, "--json")
    assert rc == 0, err
    assert (out / "sae" / "cfg.json").read_text() == "run 3" and (out / "certificate.json").read_text() == "run 3"
    assert json.loads(printed)["files"] == [str(out / "certificate.json")]  # the final path, not the temporary one


def test_an_empty_working_directory_is_filled_not_replaced(tmp_path, capsys, monkeypatch):
    """``--out .`` in an empty folder: the folder itself stays (a rename over it would leave the shell in a
    deleted directory); the files appear in it."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = os.stat(".").st_ino
    rc, _, err = _run(capsys, "demo", "--out", ".")
    assert rc == 0, err
    assert os.stat(here).st_ino == inode and os.path.samefile(".", here)
    assert sorted(p.name for p in here.iterdir()) == ["demo.json", "demo.npz", "demo.png"]


@pytest.mark.parametrize("target", ["new", "existing"])
def test_ctrl_c_right_after_a_probe_or_staging_folder_is_made_leaves_nothing(tmp_path, monkeypatch, target):
    # a fresh clone's suite saw `.widelimit-probe.*` left after a Ctrl-C: the folder was made (mkdtemp) before the
    # `try` whose `finally` removes it. Now each name is chosen first and made inside that `try`; here the
    # interrupt lands right after each folder is made
    from widelimit.cli._output import atomic_outputs, check_out_dir

    out = tmp_path / "res"
    if target == "existing":
        out.mkdir()
    real_mkdir = os.mkdir

    def interrupted(path, *a, **kw):
        real_mkdir(path, *a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "mkdir", interrupted)
    with pytest.raises(KeyboardInterrupt):
        check_out_dir(out)
    with pytest.raises(KeyboardInterrupt):
        with atomic_outputs(out):
            pass
    monkeypatch.setattr(os, "mkdir", real_mkdir)
    left = sorted(p.name for p in tmp_path.rglob("*"))
    assert left == ([] if target == "new" else ["res"])
