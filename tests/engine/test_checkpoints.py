"""Checkpoints: one writer at a time, unique temporary names, and nothing saved trusted for a certificate.

Issue 29: two processes sharing a checkpoint went through one fixed ``PATH.tmp`` (failed renames,
damaged archives installed); an edited ``lb`` in a checkpoint whose fingerprint matched was reported as
the lower bound (``lower_bound 4.189 > value 3.689``, ``gap -0.5``, ``converged: true``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import widelimit as wl
from widelimit.cli import main
from widelimit.engine.checkpoint import CheckpointInUse, checkpoint_lock, load_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[2]


class _Stop(Exception):
    pass


def _stop_after(k):
    def cb(ev):
        if ev.done and ev.pass_index >= k:
            raise _Stop
    return cb


@pytest.fixture(scope="module", autouse=True)
def fixed_threads():
    """One thread count for every run of this module: the default follows the machine's load (BLAS threads
    inside the Newton step), and a resume is compared bit for bit with the uninterrupted run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WIDELIMIT_THREADS", "2")
        yield


@pytest.fixture(scope="module")
def problem():
    """Data, lam and the uninterrupted Huber median (the reference every resume must reproduce)."""
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.standard_normal((300, 6)) + 3.0, rng.standard_normal((200, 6)) * 0.3])
    ref = wl.huber_median(X, lam=1.0)
    assert ref.n_iter >= 3  # room to stop in the middle
    return X, 1.0, ref


def _interrupted(X, lam, ck):
    with pytest.raises(_Stop):
        wl.huber_median(X, lam=lam, checkpoint=ck, progress=_stop_after(3))
    meta, arr = load_checkpoint(ck)
    return meta, arr


def _edit(ck, meta=None, **arrays):
    m, a = load_checkpoint(ck)
    m.update(meta or {})
    a.update(arrays)
    save_checkpoint(ck, m, a)


# --------------------------------------------------------------------------------------
# nothing saved is trusted
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("edit", ["above the value", "just below the value", "huge"])
def test_an_edited_bound_is_never_reported(problem, tmp_path, edit):
    X, lam, ref = problem
    ck = tmp_path / "ck.npz"
    meta, arr = _interrupted(X, lam, ck)
    v = ref.value
    lb = {"above the value": v + 0.5, "just below the value": v * (1 - 1e-15), "huge": 1e300}[edit]
    _edit(ck, {"lb": lb})
    res = wl.huber_median(X, lam=lam, checkpoint=ck)
    # the saved bound is never read: the resume ends where the uninterrupted run does, bit for bit
    assert res.lower_bound <= res.value and res.gap >= 0
    assert res.lower_bound == ref.lower_bound and np.array_equal(res.point, ref.point)
    assert res.certified == ref.certified and res.value == ref.value


def test_an_edited_bound_on_the_command_line(problem, tmp_path, capsys):
    X, lam, ref = problem
    np.save(tmp_path / "x.npy", X)
    ck = tmp_path / "ck.npz"
    _interrupted(np.load(tmp_path / "x.npy", mmap_mode="r"), lam, ck)
    _edit(ck, {"lb": ref.value + 0.5})
    assert main(["bound", str(tmp_path / "x.npy"), "--lam", "1", "--checkpoint", str(ck), "--json",
                 "--no-progress"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["lower_bound"] <= d["value"] and d["gap"] >= 0 and d["lower_bound"] == ref.lower_bound


@pytest.mark.parametrize("field,bad,needle", [
    ("mean", "shift", "its saved mean of the data is"),
    ("mean", "nan", "'mean' is not 6 finite numbers"),
    ("b", "short", "'b' is not 6 finite numbers"),
    ("history", "bound above value", "its history's value 0"),
    ("e_mean", -1.0, "'e_mean' is not a finite number >= 0"),
    ("it", "three", "'it', 'passes' or 'small_step'"),
])
def test_a_damaged_checkpoint_is_refused_in_one_line(problem, tmp_path, field, bad, needle):
    X, lam, _ = problem
    ck = tmp_path / "ck.npz"
    meta, arr = _interrupted(X, lam, ck)
    if field in ("e_mean", "it"):
        _edit(ck, {field: bad})
    elif bad == "shift":
        _edit(ck, mean=arr["mean"] + 1e-3)
    elif bad == "nan":
        _edit(ck, mean=np.full(6, np.nan))
    elif bad == "short":
        _edit(ck, b=arr["b"][:3])
    else:
        h = arr["history"].copy()
        h[0, 1] = h[0, 0] + 0.5
        _edit(ck, history=h)
    with pytest.raises(ValueError) as e:
        wl.huber_median(X, lam=lam, checkpoint=ck)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{ck}: damaged or edited checkpoint") and needle in msg, msg


def test_a_saved_mean_within_rounding_is_used_with_a_rigorous_error():
    """A saved mean moved by less than its rounding bound is accepted; its error bound then covers the move."""
    from widelimit.exact.median_checkpoint import verified_mean

    mean = np.array([1.0, 2.0, 3.0])
    saved = mean + np.array([1e-13, 0.0, 0.0])
    kept, e = verified_mean("ck", saved, 0.0, mean, 1e-12)  # the file claims an exact mean
    shift = float(saved[0] - mean[0])  # exact (Sterbenz), about 1e-13
    assert kept is saved and e >= shift + 1e-12
    with pytest.raises(ValueError, match="damaged or edited"):
        verified_mean("ck", mean + 1e-9, 1e-12, mean, 1e-12)


def test_a_bound_above_the_value_is_never_returned():
    """The invariant at the end of the median: a bound above its value beyond rounding raises, never reported."""
    from widelimit.exact.gap import InconsistentBound, check_consistent

    with pytest.raises(InconsistentBound, match="below the certified lower bound"):
        check_consistent(3.689, 1e-15, 4.189, "the median's objective")
    check_consistent(3.689, 1e-15, 3.689, "the median's objective")  # equal: consistent


# --------------------------------------------------------------------------------------
# one writer at a time, unique temporary names
# --------------------------------------------------------------------------------------


_HOLDER = ("import sys\nfrom widelimit.engine.checkpoint import checkpoint_lock\n"
           "with checkpoint_lock(sys.argv[1]):\n    print('ready', flush=True)\n    sys.stdin.read()\n")


def test_a_second_process_on_the_same_checkpoint_is_refused(problem, tmp_path, capsys):
    X, lam, ref = problem
    np.save(tmp_path / "x.npy", X)
    ck = tmp_path / "ck.npz"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(ck)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "ready"  # it holds the lock now
        argv = ["bound", str(tmp_path / "x.npy"), "--lam", "1", "--checkpoint", str(ck), "--json", "--no-progress"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("widelimit bound: error: ")
        assert f"{ck}: checkpoint in use by another run (process {holder.pid})" in err, err
        assert not ck.exists()  # the refused run wrote nothing
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    assert main(argv) == 0  # the lock went with its holder
    assert json.loads(capsys.readouterr().out)["lower_bound"] == ref.lower_bound
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz", "x.npy"]  # no lock or temporary file left


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    ck = tmp_path / "ck.npz"
    with checkpoint_lock(ck):
        with pytest.raises(CheckpointInUse, match="checkpoint in use by another run"):
            with checkpoint_lock(ck):
                pass
    with checkpoint_lock(ck):  # released
        pass
    assert list(tmp_path.iterdir()) == []


def test_temporary_names_are_unique(problem, tmp_path):
    """The old fixed name PATH.tmp: a file or folder of that name (another writer's) broke every save."""
    X, lam, ref = problem
    ck = tmp_path / "ck.npz"
    (tmp_path / "ck.npz.tmp").mkdir()
    res = wl.huber_median(X, lam=lam, checkpoint=ck)
    assert res.lower_bound == ref.lower_bound and load_checkpoint(ck)[0]["fingerprint"] == res.fingerprint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz", "ck.npz.tmp"]
