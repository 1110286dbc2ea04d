"""Bad input, on purpose: every loader, CLI subcommand and public function answers with one line.

Hypothesis property tests (derandomised by tests/conftest.py) over random bad input: corrupted and random
files of every format, random text tables checked against an independent parser, random bad values of the
public parameters, random command lines. The reproducers of issue 13 are in
``tests/regressions/test_bad_input_reproducers.py``.

``WIDELIMIT_FUZZ_SCALE=50 HYPOTHESIS_PROFILE=explore python3 -m pytest tests/test_fuzz.py`` searches
harder (50 times the examples, fresh ones each run). The documented types: :class:`widelimit.DataError` for files, ``ValueError`` for parameters
(``DataError`` is one), exit status 2 with one line on stderr for the CLI, 130 for Ctrl-C.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import widelimit as wl

from fixtures.cli import cli, one_line
from fixtures.stability import nonneg_lasso_min

#: examples per property test; WIDELIMIT_FUZZ_SCALE=50 (with HYPOTHESIS_PROFILE=explore) searches harder
SCALE = float(os.environ.get("WIDELIMIT_FUZZ_SCALE", "1"))
FAST = settings(max_examples=int(40 * SCALE), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ======================================================================================
# property tests: loaders
# ======================================================================================

EXTS = [".npy", ".npz", ".safetensors", ".csv", ".txt", ".pt", ".arrow"]


def _open_and_read(path, **kw):
    """Open and read every row; the only exception allowed is a one-line DataError."""
    try:
        S = wl.open_activations(path, **kw)
        A = np.asarray(S)
    except wl.DataError as e:
        assert "\n" not in str(e) and str(e), repr(str(e))
        return None
    assert isinstance(S, wl.ActivationSource) and A.shape == S.shape and A.ndim == 2
    return A


def _needs_reader(kind: str) -> None:
    """Arrow files need pyarrow (the arrow extra): without it their cases skip, the others run."""
    if kind.lstrip(".") == "arrow":
        pytest.importorskip("pyarrow")


PER_FORMAT = settings(max_examples=max(1, int(8 * SCALE)), deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("ext", EXTS)
@PER_FORMAT
@given(data=st.binary(max_size=400))
def test_random_bytes_in_every_format(tmp_path_factory, ext, data):
    _needs_reader(ext)
    p = tmp_path_factory.mktemp("rand") / f"f{ext}"
    p.write_bytes(data)
    A = _open_and_read(p)  # a one-line DataError (None) or the rows it holds
    # whatever random bytes decode to, reading is deterministic: a second read gives the same rows
    assert A is None or np.array_equal(A, _open_and_read(p), equal_nan=True)


@pytest.mark.parametrize("kind", ["npy", "npz", "safetensors", "pt", "arrow"])
@PER_FORMAT
@given(cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=4))
def test_corrupted_files(files, tmp_path_factory, kind, cut, flips):
    """Truncated and byte-flipped valid files: either still readable (then the values are the
    file's own, checked against NumPy where the header survived) or one DataError line."""
    _needs_reader(kind)
    raw = bytearray(files[kind].read_bytes())
    for pos, val in flips:
        raw[int(pos * (len(raw) - 1))] = val
    raw = raw[: max(0, int(cut * len(raw)) if cut < 0.9 else len(raw))]
    p = tmp_path_factory.mktemp("corrupt") / f"c.{kind}"
    p.write_bytes(bytes(raw))
    A = _open_and_read(p)
    if A is not None and kind == "npy" and not flips:  # an intact .npy: exactly its rows
        assert np.array_equal(A, files["X"])


def _ref_table(lines):
    """Independent reference for text tables: ("ok", rows) | ("field", line, col) | ("width", line) | ("empty",)."""

    def num(t):
        try:
            float(t)
            return True
        except ValueError:
            return False

    body = [(i + 1, [f.strip() for f in ln.split(",")]) for i, ln in enumerate(lines) if ln.strip()]
    if not body:
        return ("empty",)
    if not any(num(f) for f in body[0][1]):  # header
        body = body[1:]
    width = None
    for ln, fields in body:
        for j, f in enumerate(fields, 1):
            if not num(f):
                return ("field", ln, j)
        if width is None:
            width, first = len(fields), ln
        elif len(fields) != width:
            return ("width", ln)
    if not body:
        return ("empty",)
    return ("ok", np.array([[float(f) for f in fields] for _, fields in body]))


NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-10**9, 10**9).map(str))
JUNK = st.sampled_from(["oops", "x1", "1.2.3", "--", "", "1e", "abc", "0x10", "n an", "1 2"])
ROW = st.lists(st.one_of(NUMBER, NUMBER, NUMBER, JUNK), min_size=1, max_size=4)


@FAST
@given(rows=st.lists(ROW, min_size=1, max_size=6))
def test_csv_matches_reference(tmp_path_factory, rows):
    lines = [",".join(r) for r in rows]
    p = tmp_path_factory.mktemp("csv") / "t.csv"
    p.write_text("\n".join(lines) + "\n")
    ref = _ref_table(lines)
    try:
        A = np.asarray(wl.open_activations(p))
    except wl.DataError as e:
        msg = one_line(str(e))
        assert ref[0] != "ok", (lines, msg)
        if ref[0] == "field":
            assert f"line {ref[1]}, column {ref[2]}:" in msg, (lines, msg)
        elif ref[0] == "width":
            assert f"line {ref[1]} has" in msg, (lines, msg)
        else:
            assert "no rows" in msg or "no data" in msg, (lines, msg)
        return
    assert ref[0] == "ok", (lines, ref)
    assert np.array_equal(A, ref[1], equal_nan=True)


# ======================================================================================
# property tests: public parameters
# ======================================================================================


def _bad(kind: str, low=None, none_ok=False):
    """Values that are never valid for a parameter of this kind."""
    common = [st.text(max_size=4), st.booleans(), st.lists(st.integers(), max_size=2), st.just({})]
    if not none_ok:
        common.append(st.none())
    if kind == "int":
        return st.one_of(*common, st.floats(allow_nan=True), st.integers(max_value=low - 1))
    strict = kind == "real>"
    bad_floats = st.floats(allow_nan=True, allow_infinity=True).filter(
        lambda v: not np.isfinite(v) or (v <= low if strict else v < low))
    return st.one_of(*common, bad_floats, st.just(complex(1, 1)))


SMALL = np.random.default_rng(3).standard_normal((20, 3))

PARAMS = [  # (function, parameter, kind, lower bound, None allowed)
    (lambda **kw: wl.huber_median(SMALL, lam=1.0, **kw), "hess_rows", "int", 1, False),
    (lambda **kw: wl.huber_median(SMALL, lam=1.0, **kw), "seed", "int", 0, False),
    (lambda **kw: wl.huber_median(SMALL, lam=1.0, **kw), "max_iter", "int", 1, False),
    (lambda **kw: wl.huber_median(SMALL, lam=1.0, **kw), "tol", "real", 0, False),
    (lambda **kw: wl.geometric_median(SMALL, **kw), "xtol", "real", 0, False),
    (lambda **kw: wl.huber_median(SMALL, **kw), "lam", "real>", 0, False),
    (lambda **kw: wl.solve(SMALL, **kw), "lam", "real>", 0, False),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, **kw), "width", "int", 1, False),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "seed", "int", 0, False),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "lr", "real>", 0, False),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "rtol", "real", 0, False),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "max_iter", "int", 0, True),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "batch_size", "int", 1, True),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "time_limit", "real>", 0, True),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "window", "int", 1, False),
    (lambda **kw: wl.crossvalidate(SMALL, lam=1.0, **kw), "seed", "int", 0, False),
    (lambda **kw: wl.crossvalidate(SMALL, lam=1.0, **kw), "n_restarts", "int", 1, False),
    (lambda **kw: wl.frontier(SMALL, lam=1.0, widths=[1], **kw), "n_restarts", "int", 1, False),
    (lambda **kw: wl.solve_dnn(SMALL, lam=0.5, **kw), "check_every", "int", 1, False),
    (lambda **kw: wl.solve_dnn(SMALL, lam=0.5, **kw), "max_iter", "int", 1, False),
    (lambda **kw: wl.solve_dnn(SMALL, lam=0.5, **kw), "time_limit", "real>", 0, True),
    (lambda **kw: wl.solve_dnn(SMALL, lam=0.5, **kw), "step0", "real>", 0, True),
]


@pytest.mark.parametrize("fn, name, kind, low, none_ok", PARAMS, ids=[f"{p[1]}-{i}" for i, p in enumerate(PARAMS)])
@settings(max_examples=int(15 * SCALE), deadline=None)
@given(data=st.data())
def test_bad_parameter_values_name_the_parameter(fn, name, kind, low, none_ok, data):
    v = data.draw(_bad(kind, low, none_ok), label=name)
    with pytest.raises(ValueError) as e:
        fn(**{name: v})
    msg = one_line(str(e.value))
    assert name in msg, msg


@settings(max_examples=int(25 * SCALE), deadline=None)
@given(v=st.one_of(st.none(), st.integers(), st.floats(), st.lists(st.text(max_size=3), max_size=2), st.just(b"x.npy"),
                   st.just({})))
def test_open_activations_path_must_be_a_path(v):
    with pytest.raises(wl.DataError, match=r"^path must be a file or folder path"):
        wl.open_activations(v)


@settings(max_examples=int(25 * SCALE), deadline=None)
@given(name=st.sampled_from(["key", "column", "header"]),
       v=st.one_of(st.integers(), st.floats(), st.lists(st.integers(), max_size=2), st.just(b"acts")))
def test_open_activations_options_are_typed(files, name, v):
    with pytest.raises(wl.DataError, match=rf"^{name} must be"):
        wl.open_activations(files["npz"], **{name: v})


# ======================================================================================
# property test: command lines
# ======================================================================================

FLAG_VALUES = st.sampled_from(["1", "0", "-1", "nan", "inf", "-inf", "1e400", "abc", "", "0.5", "2", "1e-300"])


@settings(max_examples=int(40 * SCALE), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cmd=st.sampled_from(["solve", "bound"]), data_kind=st.sampled_from(["npy", "csv", "npz", "missing", "dir", "bad"]),
       flags=st.lists(st.tuples(st.sampled_from(["--lam", "--key", "--ray-tol", "--rows", "--dask", "--checkpoint",
                                                  "--out", "--column"]), FLAG_VALUES), max_size=3),
       extra=st.lists(st.sampled_from(["--json", "--geometric", "--signed", "--no-progress", "--header", "--bogus"]),
                      max_size=2))
def test_random_command_lines(files, capsys, cmd, data_kind, flags, extra):
    d = files["dir"]
    (d / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    path = {"missing": d / "missing.npy", "dir": d, "bad": d / "bad.npy"}.get(data_kind) or files[data_kind]
    argv = [cmd, path]
    for flag, val in flags:
        if flag == "--dask":
            val = {"1": "local:0", "0": "local:x", "": "tcp://", "abc": "nonsense"}.get(val, "local:-1")
        if flag in ("--out", "--checkpoint"):
            val = str(files["npy"]) if val == "abc" else str(d)  # a file where a folder is needed, or a folder
        argv += [flag, val]
    argv += ["--json", *extra]
    rc, out, err = cli(capsys, *argv)
    assert rc in (0, 2), (argv, rc, err)
    if rc == 2:
        assert one_line(err).startswith("widelimit"), err
    else:
        header = "--header" in extra and data_kind == "csv"  # asked for: the first row is a header
        assert err == "" and json.loads(out)["n_points"] == (29 if header else 30), (argv, err)


# ======================================================================================
# issue 29 (outputs, checkpoints, readers, one-line answers): generated cases per class
# ======================================================================================

SOME = settings(max_examples=int(20 * SCALE), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _other_fs_dir(tmp):
    """A fresh folder on another filesystem than ``tmp`` (``/dev/shm``), or ``None`` where there is none."""
    import tempfile
    from pathlib import Path

    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(tmp).st_dev:
        return None
    return Path(tempfile.mkdtemp(prefix="widelimit-fuzz-", dir=shm))


@SOME
@given(state=st.sampled_from(["new", "empty", "full"]), link=st.sampled_from(["none", "same-fs", "other-fs"]),
       depth=st.integers(0, 2), files=st.lists(st.sampled_from(["a.json", "b.npz", "sub/c.png", "sub/d/e.csv"]),
                                               min_size=1, max_size=4, unique=True),
       stop=st.one_of(st.none(), st.integers(0, 3)))
def test_outputs_land_whole_or_not_at_all(tmp_path_factory, state, link, depth, files, stop):
    """Classes 1-3: any target (new, empty, holding files; behind a symlink on this or another filesystem,
    nested) gets every file of a finished run and nothing of an interrupted one; no temporary folder is left."""
    import shutil
    from pathlib import Path

    from widelimit.cli._output import atomic_outputs, check_out_dir

    root = tmp_path_factory.mktemp("atomic")
    real = root / "real" if link != "other-fs" else _other_fs_dir(root)
    if real is None:
        return  # no second filesystem here: the other cases cover the rest
    try:
        real.mkdir(exist_ok=True)
        target = real / "t"
        if link != "none":
            (root / "link").symlink_to(real)
            target = root / "link" / "t"
        for i in range(depth):
            target = target / f"n{i}"
        if state != "new":
            Path(os.path.realpath(target)).mkdir(parents=True)
            if state == "full":
                (Path(os.path.realpath(target)) / "old.txt").write_text("old")
        before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        check_out_dir(target)
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # the probe left nothing
        try:
            with atomic_outputs(target) as tmp:
                for k, name in enumerate(files):
                    if stop is not None and k == stop:
                        raise KeyboardInterrupt
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / name).write_text(name)
        except KeyboardInterrupt:
            assert stop is not None and stop < len(files)
        finished = stop is None or stop >= len(files)
        t = Path(os.path.realpath(target))
        got = sorted(str(p.relative_to(t)) for p in t.rglob("*") if p.is_file()) if t.exists() else []
        want = sorted(files) if finished else []
        assert got == sorted(want + (["old.txt"] if state == "full" else [])), (got, want)
        leftovers = [p for p in list(root.rglob(".*")) + list(real.rglob(".*")) if p.name.endswith(".tmp")]
        assert leftovers == []
        if finished:
            assert all((t / name).read_text() == name for name in files)
    finally:
        if link == "other-fs":
            shutil.rmtree(real, ignore_errors=True)


@SOME
@given(junk=st.lists(st.sampled_from(["tmp-dir", "tmp-file", "stale-lock", "hidden-tmp"]), unique=True),
       nested=st.integers(1, 3))
def test_checkpoint_writes_and_the_lock(tmp_path_factory, junk, nested):
    """Class 4: whatever another writer left beside a checkpoint (its old fixed temporary name as a file or a
    folder, a stale lock file, a hidden temporary), a save installs a whole archive; while one writer holds
    the lock every further attempt (``nested`` of them) is refused in one line; released, it is free again."""
    from widelimit.engine.checkpoint import CheckpointInUse, checkpoint_lock, load_checkpoint, save_checkpoint

    d = tmp_path_factory.mktemp("ck")
    ck = d / "ck.npz"
    if "tmp-dir" in junk:
        (d / "ck.npz.tmp").mkdir()
    if "tmp-file" in junk:
        (d / "ck.npz.tmp").write_bytes(b"half an archive") if "tmp-dir" not in junk else None
    if "stale-lock" in junk:
        (d / "ck.npz.lock").write_text("99999999")
    if "hidden-tmp" in junk:
        (d / ".ck.npz.abc.tmp").write_bytes(b"junk")
    before = sorted(p.name for p in d.iterdir())
    with checkpoint_lock(ck):
        save_checkpoint(ck, {"i": 1}, {"b": np.arange(3.0)})
        for _ in range(nested):
            with pytest.raises(CheckpointInUse) as e:
                with checkpoint_lock(ck):
                    pass
            assert "\n" not in str(e.value) and str(e.value).startswith(f"{ck}: checkpoint in use by another run")
    meta, arr = load_checkpoint(ck)
    assert meta == {"i": 1} and np.array_equal(arr["b"], np.arange(3.0))
    assert sorted(p.name for p in d.iterdir()) == sorted(set(before) - {"ck.npz.lock"} | {"ck.npz"})
    with checkpoint_lock(ck):
        pass


@pytest.fixture(scope="module")
def _median_ckpt(tmp_path_factory):
    """Data, the uninterrupted Huber median and a checkpoint of an interrupted run of it."""
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.standard_normal((300, 6)) + 3.0, rng.standard_normal((200, 6)) * 0.3])
    ref = wl.huber_median(X, lam=1.0)
    ck = tmp_path_factory.mktemp("median") / "ck.npz"

    class Stop(Exception):
        pass

    def stop(ev):
        if ev.done and ev.pass_index >= 3:
            raise Stop

    with pytest.raises(Stop):
        wl.huber_median(X, lam=1.0, checkpoint=ck, progress=stop)
    return X, ref, ck.read_bytes()


_NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10**6),
                     st.sampled_from([0.0, 1e-300, 1e300, -1.0]))


@SOME
@given(field=st.sampled_from(["lb", "e_mean", "prev_step", "it", "passes", "small_step", "mean", "b", "history",
                              "pairs"]),
       value=_NUMBERS, scale=st.sampled_from([0.0, 1e-15, 1e-9, 1e-3, 1.0]))
def test_edited_checkpoints_never_certify_a_false_bound(tmp_path_factory, _median_ckpt, field, value, scale):
    """Class 7: any single edit of a checkpoint (a number in its JSON, or a shift of a saved array) is refused in
    one line naming the file, or resumes to a bound at most the value of the uninterrupted run's optimum."""
    from widelimit.engine.checkpoint import load_checkpoint, save_checkpoint

    X, ref, raw = _median_ckpt
    ck = tmp_path_factory.mktemp("edit") / "ck.npz"
    ck.write_bytes(raw)
    meta, arr = load_checkpoint(ck)
    if field in ("mean", "b", "history", "pairs"):
        if field not in arr or arr[field].size == 0:
            return
        shift = scale * (value if isinstance(value, float) else float(value))
        a = arr[field].copy()
        a.flat[0] = a.flat[0] + shift if np.isfinite(shift) else shift
        arr[field] = a
    else:
        meta[field] = value
    save_checkpoint(ck, meta, arr)
    try:
        res = wl.huber_median(X, lam=1.0, checkpoint=ck)
    except ValueError as e:
        assert "\n" not in str(e) and str(e).startswith(str(ck)), str(e)
        return
    assert res.lower_bound <= res.value and res.gap >= 0
    assert res.lower_bound <= ref.value  # the exact minimum is at most any objective value
    if field in ("lb", "history"):  # never read for the bound: the resume is the uninterrupted run's
        assert res.lower_bound == ref.lower_bound or res.lower_bound <= ref.lower_bound * (1 + 1e-12)


_KIND_WORDS = {"npy": ".npy shards", "safetensors": ".safetensors shards", "arrow": "a datasets / Arrow cache",
               "state": "a datasets / Arrow cache", "sub": "datasets cache sub-folders", "npz": ".npz files",
               "csv": ".csv files", "pt": ".pt files"}


@SOME
@given(entries=st.lists(st.sampled_from(["npy", "npy", "npy", "safetensors", "arrow", "state", "sub", "npz", "csv",
                                         "pt", "readme", "info"]), min_size=1, max_size=6))
def test_a_folder_holds_one_kind_of_data(tmp_path_factory, entries):
    """Class 5: a folder's data files of more than one kind are refused naming every kind; one kind of shards is
    read whole, in natural order (checked against the files' own arrays)."""
    import torch
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(len(entries))
    parts = []
    for i, e in enumerate(entries):
        a = rng.standard_normal((3 + i, 4))
        if e == "npy":
            np.save(d / f"part_{i}.npy", a)
            parts.append(a)
        elif e == "safetensors":
            save_file({"acts": a.astype(np.float32)}, str(d / f"s_{i}.safetensors"))
        elif e == "arrow":
            import pyarrow as pa

            t = pa.table({"acts": pa.array(a.tolist(), type=pa.list_(pa.float64()))})
            with pa.ipc.new_stream(str(d / f"a_{i}.arrow"), t.schema) as w:
                w.write_table(t)
        elif e == "state":
            (d / "state.json").write_text('{"_data_files": []}')
        elif e == "sub":
            (d / f"shard_{i}").mkdir()
            (d / f"shard_{i}" / "state.json").write_text('{"_data_files": []}')
        elif e == "npz":
            np.savez(d / f"z_{i}.npz", a=a)
        elif e == "csv":
            np.savetxt(d / f"c_{i}.csv", a, delimiter=",")
        elif e == "pt":
            torch.save(torch.tensor(a), d / f"p_{i}.pt")
        elif e == "readme":
            (d / "README.md").write_text("notes")
        else:
            (d / "dataset_info.json").write_text("{}")
    kinds = {_KIND_WORDS[e] for e in entries if e in _KIND_WORDS}
    try:
        A = np.asarray(wl.open_activations(d))
    except wl.DataError as e:
        msg = one_line(str(e))
        if len(kinds) > 1:
            assert msg.startswith(f"{d}: holds more than one kind of data: ") and msg.endswith("keep one kind per folder")
            assert all(k in msg for k in kinds), (kinds, msg)
        else:
            assert kinds != {".npy shards"}, msg  # one kind of .npy shards is always read
        return
    assert len(kinds) == 1, (entries, kinds)
    if kinds == {".npy shards"}:
        assert np.array_equal(A, np.concatenate(parts))


@SOME
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=8), nested=st.booleans(), seed=st.integers(0, 99))
def test_arrow_rows_of_different_lengths(tmp_path_factory, lengths, nested, seed):
    """Class 6: an Arrow column whose rows differ in length is refused naming the first such row (checked
    against the lengths), whatever the total; equal rows are read exactly."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(k).tolist() for k in lengths]
    if nested:  # Array2D-like: each row a block of two vectors, the second one of the given length
        rows = [[r[:1] * len(r), r] for r in rows]
        tp = pa.list_(pa.list_(pa.float64()))
    else:
        tp = pa.list_(pa.float64())
    p = tmp_path_factory.mktemp("ragged") / "r.arrow"
    t = pa.table({"acts": pa.array(rows, type=tp)})
    with pa.ipc.new_stream(str(p), t.schema) as w:
        w.write_table(t)
    bad = next((i for i, k in enumerate(lengths) if k != lengths[0]), None)
    try:
        A = np.asarray(wl.open_activations(p))
    except wl.DataError as e:
        msg = one_line(str(e))
        assert bad is not None, msg
        assert f"ragged rows in column 'acts': row {bad} holds a list of {lengths[bad]} values where row 0 holds " \
               f"{lengths[0]}" in msg, msg
        return
    assert bad is None
    want = np.array([v for r in rows for v in (r if not nested else r)], dtype=np.float64).reshape(-1, lengths[0])
    assert np.array_equal(A, want)


@SOME
@given(names=st.lists(st.sampled_from(["acts", "resid", "x"]), min_size=1, max_size=4),
       key=st.sampled_from([None, "acts", "resid"]))
def test_shard_tensor_names(tmp_path_factory, names, key):
    """Class 8: shards holding tensors of different names are refused without a key, listing the names; with a
    key every shard must hold it; otherwise the rows are the shards' own, in order."""
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("names")
    parts = []
    for i, nm in enumerate(names):
        a = np.full((2, 3), float(i), dtype=np.float32)
        save_file({nm: a}, str(d / f"s_{i}.safetensors"))
        parts.append(a)
    try:
        A = np.asarray(wl.open_activations(d, key=key))
    except wl.DataError as e:
        msg = one_line(str(e))
        if key is None:
            assert len(set(names)) > 1 and "its shards hold tensors of different names: " in msg, msg
            assert all(f"{nm!r}" in msg for nm in set(names)) and "key=" in msg
        else:
            assert any(nm != key for nm in names) and f"no tensor named {key!r}" in msg, msg
        return
    assert (key is None and len(set(names)) == 1) or (key is not None and set(names) == {key})
    assert np.array_equal(A, np.concatenate(parts))


@SOME
@given(major=st.integers(0, 4), minor=st.integers(0, 3), dtype=st.sampled_from(["<f8", "<f4", "<f2", ">f8", "<i4"]),
       fortran=st.booleans())
def test_npy_versions_as_numpy_reads_them(tmp_path_factory, major, minor, dtype, fortran):
    """Class 8: a ``.npy`` is read exactly when numpy reads it (its own loader is the reference), with numpy's
    rows; every version numpy refuses is one DataError."""
    import io

    X = np.arange(12, dtype=dtype).reshape(4, 3)
    X = np.asfortranarray(X) if fortran else X
    b = io.BytesIO()
    np.lib.format.write_array(b, X, version=(2, 0) if major == 2 else ((3, 0) if major == 3 else (1, 0)))
    raw = bytearray(b.getvalue())
    raw[6], raw[7] = major, minor
    p = tmp_path_factory.mktemp("npyv") / "x.npy"
    p.write_bytes(bytes(raw))
    try:
        ref = np.load(p)
    except Exception:  # noqa: BLE001 - numpy refuses it
        ref = None
    try:
        A = np.asarray(wl.open_activations(p))
    except wl.DataError as e:
        one_line(str(e))
        assert ref is None, (major, minor, str(e))
        return
    assert ref is not None and np.array_equal(A, ref.astype(np.float64)), (major, minor)


def _exotic_tensors():
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = torch.arange(12, dtype=torch.float32).reshape(4, 3)
        out = {str(dt): (base.to(dt), str(dt)) for dt in (
            torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
            torch.int64, torch.uint8, torch.bool, torch.complex64, torch.uint16, torch.uint32, torch.uint64)}
        for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
            out[str(dt)] = (base.to(dt), str(dt))
        out["meta"] = (torch.empty(4, 3, device="meta"), "meta device")
        out["sparse_coo"] = (base.to_sparse(), "torch.sparse_coo")
        out["sparse_csr"] = (base.to_sparse_csr(), "torch.sparse_csr")
        out["quantized"] = (torch.quantize_per_tensor(base, 0.5, 0, torch.quint8), "quantized")
        out["nested"] = (torch.nested.nested_tensor([base[0], base[1, :2]]), "nested tensor")
    return out


_READ_AS = {"torch.float16", "torch.bfloat16", "torch.float32", "torch.float64", "torch.int8", "torch.int16",
            "torch.int32", "torch.int64", "torch.uint8"}


@SOME
@given(kind=st.sampled_from(sorted(_exotic_tensors())), in_dict=st.booleans())
def test_pt_tensors_of_every_kind(tmp_path_factory, kind, in_dict):
    """Class 9: every tensor dtype and layout torch saves is read exactly (the readable ones, against torch's own
    conversion) or refused in one line naming the file, the key and the dtype or layout."""
    import torch

    t, word = _exotic_tensors()[kind]
    p = tmp_path_factory.mktemp("pt") / "x.pt"
    torch.save({"acts": t} if in_dict else t, p)
    try:
        A = np.asarray(wl.open_activations(p), dtype=np.float64)
    except wl.DataError as e:
        msg = one_line(str(e))
        assert kind not in _READ_AS, msg
        assert msg.startswith(f"{p}: tensor{' ' + repr('acts') if in_dict else ''} ") and word in msg, msg
        return
    assert kind in _READ_AS
    assert np.array_equal(A, t.to(torch.float64).numpy())


@SOME
@given(n=st.one_of(st.integers(-5, 64), st.integers(10**3, 10**12), st.sampled_from(["x", "1.5", "", "nan"])))
def test_thread_counts(n):
    """Class 10: a thread count is accepted from 1 to 4 per usable core and refused otherwise in one line, by the
    CLI's --threads and the library alike (1000 threads ended in MemoryError)."""
    import argparse

    from widelimit._runtime import check_threads, max_threads
    from widelimit.cli._common import threads_int

    ok = isinstance(n, int) and 1 <= n <= max_threads()
    try:
        got = threads_int(str(n))
    except argparse.ArgumentTypeError as e:
        assert not ok and "\n" not in str(e)
    else:
        assert ok and got == n
    if isinstance(n, int):
        try:
            assert check_threads(n) == n and ok
        except ValueError as e:
            assert not ok and str(e).startswith("threads must be ")


@SOME
@given(dest=st.sampled_from(["solver", "key", "column", "max_iter"]),
       value=st.text(alphabet="abcXYZ019 _-./$*", min_size=1, max_size=8), quote=st.sampled_from(["'", '"']),
       before=st.sampled_from(["use ", "got ", "("]), after=st.sampled_from(["", ".", ", or a smaller N", ")"]))
def test_flag_values_in_messages(dest, value, quote, before, after):
    """Class 10: a library's ``name='value'`` in a message becomes ``--name value`` as the shell reads it."""
    import shlex

    from widelimit.cli import flagify

    flag = "--" + dest.replace("_", "-")
    msg = flagify(f"{before}{dest}={quote}{value}{quote}{after}", {dest: flag})
    assert msg.startswith(before + flag + " ") and msg.endswith(after), msg
    word = msg[len(before + flag + " "):len(msg) - len(after)]
    assert shlex.split(word) == [value], (msg, word)


@SOME
@given(row=st.integers(0, 119), col=st.integers(0, 4), bad=st.sampled_from([np.nan, np.inf, -np.inf, -1.0]),
       chunk=st.sampled_from([7, 40, 120]))
def test_bad_dask_codes_name_z(row, col, bad, chunk):
    """Class 10: a NaN / Inf / negative code in a Dask ``Z`` is named as ``Z[row, col]`` (a NaN blamed X; a
    negative code of the objective's unsigned Dask codes was not seen at all)."""
    da = pytest.importorskip("dask.array")
    import dask

    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 3))
    W = rng.standard_normal((5, 3))
    Z = np.abs(rng.standard_normal((120, 5)))
    Z[row, col] = bad
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(ValueError) as e:
            wl.sae_objective(da.from_array(X, chunks=(chunk, 3)), W, da.from_array(Z, chunks=(chunk, 5)),
                             np.zeros(3), lam=0.5)
    assert str(e.value) == f"Z must be finite and >= 0 (nonnegative codes); Z[{row}, {col}] = {bad:.3g}"


@settings(max_examples=int(5 * SCALE), deadline=None)
@given(keep=st.lists(st.booleans(), min_size=40, max_size=40))
def test_dask_arrays_with_unknown_chunks(keep):
    """Class 10: any boolean selection of a Dask array's rows (unknown chunk sizes) is one line saying how to get
    them (it was "cannot convert float NaN to integer"); with the sizes computed the data are accepted."""
    da = pytest.importorskip("dask.array")
    if not any(keep):
        keep[0] = True
    X = np.random.default_rng(3).standard_normal((40, 2))
    D = da.from_array(X, chunks=(10, 2))
    sel = D[da.from_array(np.asarray(keep), chunks=10)]
    with pytest.raises(ValueError, match=r"^X is a dask array with unknown chunk sizes .*compute_chunk_sizes\(\)$"):
        wl.huber_median(sel, lam=0.5)
    known = sel.compute_chunk_sizes()  # the advice works: the rows are the selected ones, in order
    assert np.array_equal(np.asarray(known), X[np.asarray(keep)])
    from widelimit._validation import check_data

    assert check_data(known).shape == (sum(keep), 2)


@settings(max_examples=int(4 * SCALE), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(banner=st.binary(min_size=1, max_size=64), close=st.booleans())
def test_servers_that_are_not_dask(files, capsys, banner, close):
    """Class 10: whatever a non-Dask server answers (any bytes, then a close or silence), ``--dask`` at its
    address is one line naming the address (it was "Unable to allocate 3.01 EiB" or an internal error)."""
    pytest.importorskip("distributed")
    from fixtures.servers import banner_server

    with banner_server(banner, close) as addr:
        rc, out, err = cli(capsys, "bound", files["npy"], "--lam", "1", "--dask", addr, "--dask-timeout", "3",
                           "--no-progress")
    assert rc == 2 and out == "", (rc, err)
    line = one_line(err)
    assert line.startswith(f"widelimit bound: error: --dask {addr}: ") and "EiB" not in line, line


# ======================================================================================
# issue 29: memory estimated and refused before it is allocated; nothing blocks; SAE files consistent
# ======================================================================================


class _Reached(Exception):
    """Raised by a stand-in for the first allocation: the work got past its memory check."""


def _reached(*a, **k):
    raise _Reached


@settings(max_examples=int(25 * SCALE), deadline=None)
@given(N=st.integers(2, 14), n=st.integers(1, 5), cone=st.sampled_from(["nonneg", "dnn", "sdd", "nndd", "diagonal"]),
       solver=st.sampled_from(["SCS", "CLARABEL"]), budget=st.integers(2**20, 2**26))
def test_relax_refused_exactly_above_the_budget_before_building(N, n, cone, solver, budget):
    """relax: a MemoryBudgetError line iff the measured-model estimate is above the budget, and then no model
    was built; below it the model is built (the stand-in is reached)."""
    from unittest import mock

    import cvxpy

    from widelimit._memory import MemoryBudgetError
    from widelimit.relax.cones import estimate_memory

    X = np.random.default_rng(N * 7 + n).standard_normal((N, n))
    est = estimate_memory(N, n, cone, solver)
    assert estimate_memory(N + 1, n, cone, solver) > est and estimate_memory(N, n + 1, cone, solver) > est
    with mock.patch.object(cvxpy, "Variable", _reached):
        try:
            wl.relax(X, lam=1.0, cone=cone, solver=solver, max_memory=budget)
            raise AssertionError("neither refused nor built")
        except MemoryBudgetError as e:
            assert est > budget and "\n" not in str(e) and f"N = {N}, n = {n}" in str(e)
        except _Reached:
            assert est <= budget


@settings(max_examples=int(25 * SCALE), deadline=None)
@given(N=st.integers(1, 10**6), n=st.integers(1, 10**5), hess=st.integers(1, 8192), budget=st.integers(1, 2**34))
def test_median_subsample_is_the_largest_that_fits(N, n, hess, budget):
    from widelimit._memory import MemoryBudgetError
    from widelimit.exact.newton import median_bytes, subsample_rows

    try:
        m = subsample_rows(N, n, hess, budget=budget)
    except MemoryBudgetError as e:
        assert median_bytes(1, n) > budget and f"dimension n = {n}" in str(e)
        return
    assert 1 <= m <= min(N, hess) and median_bytes(m, n) <= budget
    assert m == min(N, hess) or median_bytes(m + 1, n) > budget


@settings(max_examples=int(30 * SCALE), deadline=None)
@given(m=st.integers(1, 8), extra=st.integers(1, 60), P=st.integers(0, 2), precise=st.booleans(),
       seed=st.integers(0, 2**16), lam=st.floats(0.05, 5.0))
def test_low_rank_newton_direction_is_the_dense_solve(m, extra, P, precise, seed, lam):
    """Few subsample rows in many dimensions: the direction without the n x n matrix equals the solve with the
    matrix written out (a I - D^T diag(c) D plus the BFGS terms), where that matrix is well conditioned."""
    import widelimit.exact.newton as nw

    rng = np.random.default_rng(seed)
    n = 3 * (m + 2 * P) + extra
    Xs, b, g = rng.standard_normal((m, n)), 0.1 * rng.standard_normal(n), rng.standard_normal(n)
    pairs = [(s, s + 0.1 * rng.standard_normal(n)) for s in rng.standard_normal((P, n))]
    D = Xs - b
    r = np.linalg.norm(D, axis=1)
    cw = np.where(r > lam, lam / r**3, 0.0)
    a = float(m) if not precise else float(cw @ (r * r))
    B = a * np.eye(n) - D.T @ (cw[:, None] * D)
    for s_, y_ in pairs:
        sy, Bs = float(s_ @ y_), B @ s_
        if sy > 1e-12 * np.linalg.norm(s_) * np.linalg.norm(y_) and float(s_ @ Bs) > 0:
            B = B + np.outer(y_, y_) / sy - np.outer(Bs, Bs) / float(s_ @ Bs)
    mu = np.linalg.eigvalsh(B)
    if a <= 0 or mu.min() < 1e-3 * mu.max():  # floored eigenvalues: not a plain solve
        return
    got = nw.newton_direction(Xs, np.ones(m), b, lam, "huber", 0.0, float(m), 0.0, pairs, g, precise)
    np.testing.assert_allclose(got, np.linalg.solve(B, g), rtol=1e-6 if not precise else 1e-9,
                               atol=1e-9 * np.abs(np.linalg.solve(B, g)).max())


@settings(max_examples=int(15 * SCALE), deadline=None)
@given(N=st.integers(5, 40), n=st.integers(1, 4), width=st.integers(1, 40), budget=st.integers(2**20, 2**28),
       batch=st.sampled_from([None, 4, 64]))
def test_fit_refused_exactly_above_the_budget_before_starting(N, n, width, budget, batch):
    from unittest import mock

    import widelimit.learn.gradient as g
    from widelimit._memory import ENV, MemoryBudgetError

    width = min(width, N)
    X = np.random.default_rng(N + width).standard_normal((N, n)).astype(np.float32)
    need = g.fit_bytes(N, n, width, batch=batch)
    with mock.patch.dict(os.environ, {ENV: str(budget)}), mock.patch.object(g, "huber_median", _reached):
        try:
            g.fit_dictionary(X, lam=0.5, width=width, batch_size=batch, device="cpu")
            raise AssertionError("neither refused nor started")
        except MemoryBudgetError as e:
            assert need > budget and f"at width {width} on N = {N} points" in str(e)
        except _Reached:
            assert need <= budget


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
@settings(max_examples=int(20 * SCALE), deadline=None)
@given(kind=st.sampled_from(["fifo", "socket", "device"]), ext=st.sampled_from([".npy", ".safetensors", ".npz", ".csv",
                                                                                ".pt", ".arrow"]),
       inside=st.booleans())
def test_special_files_are_refused_never_read(tmp_path_factory, kind, ext, inside):
    """A named pipe, a socket or a device, as the data file or as a shard of a folder: one DataError naming it,
    without blocking (a FIFO without a writer blocks open() forever; /dev/zero never ends)."""
    import socket
    import threading

    d = tmp_path_factory.mktemp("special")
    target = d / f"s{ext}"
    if inside:
        np.save(d / "a.npy", np.ones((3, 2)))
        target = d / "b.npy"
    sock = None
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(target))
    else:
        os.symlink("/dev/zero", target)
    box = {}

    def run():
        try:
            wl.open_activations(d if inside else target)
        except Exception as e:  # noqa: BLE001
            box["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if sock is not None:
        sock.close()
    assert not t.is_alive(), "blocked"
    e = box.get("e")
    what = {"fifo": "a named pipe (FIFO)", "socket": "a socket", "device": "a character device"}[kind]
    assert isinstance(e, wl.DataError) and str(e).startswith(f"{target}: is {what}, not a regular file"), e


@settings(max_examples=int(20 * SCALE), deadline=None)
@given(extra=st.integers(1, 10**9))
def test_dask_local_workers_above_the_cores_refused_without_starting(extra):
    pytest.importorskip("distributed")
    from unittest import mock

    import distributed

    from widelimit._runtime import usable_cores
    from widelimit.cli.bound import _dask_client

    n = usable_cores() + extra
    with mock.patch.object(distributed, "LocalCluster", _reached):
        with pytest.raises(ValueError) as e:
            _dask_client(f"local:{n}", 5.0)
    assert str(e.value).startswith(f"--dask local:{n}: at most {usable_cores()} local worker processes")


@settings(max_examples=int(5 * SCALE), deadline=None)
@given(widths=st.lists(st.integers(1, 6), min_size=1, max_size=4), limit=st.sampled_from([1e-9, 1e9]))
def test_frontier_fits_or_skips_every_width(widths, limit):
    X = np.random.default_rng(len(widths)).standard_normal((12, 2))
    events = []
    fr = wl.frontier(X, lam=0.5, widths=widths, n_restarts=1, max_iter=5, inits=("data",), time_limit=limit,
                     progress=events.append)
    want = sorted(set(widths))
    assert fr.widths + fr.skipped_widths == want and fr.widths[0] == want[0]
    assert fr.status == ("time_limit" if fr.skipped_widths else "done")
    assert (fr.skipped_widths == []) == (limit == 1e9 or len(want) == 1)
    assert [e.stage for e in events] == [f"width {w}" for w in fr.widths]  # progress for each width fitted


def _jumprelu_folder(tmp, t):
    from widelimit.sae.formats import save_saelens
    from widelimit.sae.model import SAE

    rng = np.random.default_rng(0)
    sae = SAE(W_dec=rng.standard_normal((t.size, 3)), b_dec=np.zeros(3), W_enc=rng.standard_normal((3, t.size)),
              b_enc=np.zeros(t.size), threshold=t, architecture="jumprelu", dtype="float64", l1_coefficient=0.4)
    return save_saelens(sae, tmp)


@settings(max_examples=int(20 * SCALE), deadline=None)
@given(rel=st.sampled_from([0.0, 1e-15, 1e-9, 1e-6, 1e-3, 0.5, -0.3]), entry=st.integers(0, 4),
       name=st.text("abcdefgh_.", min_size=1, max_size=8), l1=st.sampled_from([0.4, 0.41, 0.8]))
def test_saelens_files_refused_when_two_forms_disagree_or_tensors_are_extra(tmp_path_factory, rel, entry, name, l1):
    import torch
    from safetensors.torch import load_file, save_file

    from widelimit.sae.formats import load_sae
    from widelimit.sae.model import SAEFormatError

    t = np.linspace(0.1, 0.5, 5)
    folder = _jumprelu_folder(tmp_path_factory.mktemp("jr"), t)
    f = folder / "sae_weights.safetensors"
    sd = load_file(str(f))
    lt = np.log(t)
    lt[entry] = np.log(t[entry] * (1 + rel))
    sd["log_threshold"] = torch.as_tensor(lt)
    save_file(sd, str(f))
    if abs(rel) > 1e-12:  # beyond float64's rounding of log and exp
        with pytest.raises(SAEFormatError, match=rf"tensor 'threshold' = .* but exp\(tensor 'log_threshold'\) = .* "
                                                 rf"at entry {entry}; they disagree"):
            load_sae(folder)
        return
    assert any("'threshold' used" in w for w in load_sae(folder).warnings)
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["l1_coefficient"] = l1  # next to metadata.training_architecture_details.l1_coefficient = 0.4
    (folder / "cfg.json").write_text(json.dumps(cfg))
    if l1 != 0.4:
        with pytest.raises(SAEFormatError, match=rf"field 'l1_coefficient' = {l1} but field "
                                                 r"'metadata.training_architecture_details.l1_coefficient' = 0.4"):
            load_sae(folder)
        return
    assert load_sae(folder).l1_coefficient == 0.4
    if name in sd or name in ("threshold", "log_threshold", "scaling_factor", "finetuning_scaling_factor"):
        return
    sd[name] = torch.zeros(2)
    save_file(sd, str(f))
    with pytest.raises(SAEFormatError, match=rf"tensor '{name}' not used by a jumprelu SAE"):
        load_sae(folder)


# ======================================================================================
# issue 29: the classes the cases above did not generate (coding scale, storage rounding, C stdout, the order of
# bound and value, relax's advice, Ctrl-C after the answer)
# ======================================================================================


@settings(max_examples=int(20 * SCALE), deadline=None)
@given(k=st.integers(1, 4), n=st.integers(1, 4), N=st.integers(1, 4), log_lam=st.floats(-2, 9), log_z=st.floats(-9, 0.5),
       alg=st.sampled_from(["cd", "working_set", "fista"]), seed=st.integers(0, 2**16))
def test_coding_gaps_are_judged_at_each_tokens_own_scale(k, n, N, log_lam, log_z, alg, seed):
    """Class 8 (per-token coding test): whatever ``lam`` is against the data's scale (10^-2 .. 10^9 here) and
    whatever the warm start (an encoder's constant codes ``z``, 10^-9 .. 3), each token's code is within ``tol`` of its own
    exact minimum (support enumeration), relative to its own objective (the floor ``lam^2 2^-52`` only), and
    ``P - gap`` never exceeds it. Was: ``gap <= tol max(P, lam^2)`` passed the warm start for a large ``lam``."""
    from widelimit.coding import optimal_codes

    rng = np.random.default_rng(seed)
    U = rng.standard_normal((k, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = rng.standard_normal((N, n))
    lam, tol = 10.0**log_lam, 1e-6
    r = optimal_codes(X, U, np.zeros(n), lam=lam, tol=tol, Z0=np.full((N, k), 10.0**log_z), device="cpu",
                      algorithm=alg)
    truth = np.array([nonneg_lasso_min(x, U, lam, max_cond=1e8) for x in X])
    P, gap = r.point_values, r.point_gaps
    slack = 1e-12 * (P + truth + 1.0)  # float64 rounding of both sides
    assert np.all(P - gap <= truth + slack), (P, gap, truth)
    floor = lam * lam * 2.0**-52  # the spec's floor, written out (not the coders' gap_floor)
    assert r.certified and np.all(P - truth <= tol * np.maximum(P, floor) + slack), (P, truth, lam)


@settings(max_examples=int(15 * SCALE), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(["<f2", ">f2", "bfloat16", "<f4", ">f4", "<f8"]),
       how=st.sampled_from(["array", "npy", "folder", "torch"]), seed=st.integers(0, 99))
def test_violation_rounding_is_the_storage_dtypes(tmp_path_factory, dtype, how, seed):
    """Class 9 (violation flags' rounding): an exactly optimal SAE on its data rounded to the storage dtype, however
    the data arrive (an array, a ``.npy`` of either byte order, a folder of shards, a torch tensor), lists no
    violation, and its threshold is ``kkt_tol lam + 8 eps scale`` with the *storage* dtype's ``eps`` (bfloat16:
    ``2^-7``). Was: float16 / bfloat16 judged at the widened float32's eps (8 violations), big-endian float16
    as float64."""
    import torch

    from fixtures.saes import orthogonal_rays_sae

    X, sae = orthogonal_rays_sae(0.5, seed=seed, n_pairs=2, dim=4, points_per_ray=4)
    if dtype == "bfloat16":
        t = torch.tensor(X).to(torch.bfloat16)
        stored, eps = t.to(torch.float64).numpy(), 2.0**-7
        acts = t if how == "torch" else stored.astype(np.float32) if how == "array" else None
        if acts is None:  # numpy has no bfloat16 file: a safetensors shard holds it
            from safetensors.torch import save_file

            d = tmp_path_factory.mktemp("bf")
            save_file({"acts": t}, str(d / "a.safetensors"))
            acts = wl.open_activations(d / "a.safetensors")
        if how == "array":
            eps = float(np.finfo(np.float32).eps)  # a float32 array is float32 storage
    else:
        A = X.astype(dtype)
        stored, eps = A.astype(np.float64), float(np.finfo(np.dtype(dtype)).eps)
        d = tmp_path_factory.mktemp("st")
        if how == "npy":
            np.save(d / "x.npy", A)
            acts = wl.open_activations(d / "x.npy")
        elif how == "folder":
            np.save(d / "a.npy", A[:8])
            np.save(d / "b.npy", A[8:])
            acts = wl.open_activations(d)
        elif how == "torch":
            acts = torch.from_numpy(A.astype(A.dtype.newbyteorder("=")))
        else:
            acts = A
    cert = wl.certify_sae(acts, sae, lam=0.5, device="cpu")
    scale = float(np.linalg.norm(stored, axis=1).max() + np.linalg.norm(sae.b_dec))
    assert cert.violations == [], (dtype, how)
    assert cert.violation_tolerance == pytest.approx(1e-6 * 0.5 + 8.0 * eps * scale, rel=1e-9), (dtype, how)


@SOME
@given(text=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=80),
       pieces=st.integers(1, 4), fail=st.booleans())
def test_c_level_stdout_of_a_solver_goes_to_stderr(capfd, text, pieces, fail):
    """Class 12 (SCS's ``ERROR: work memory allocation failure`` on stdout broke ``--json``): whatever a C library
    writes to file descriptor 1 while a solver runs lands on stderr, in order; stdout is restored afterwards,
    also when the solver fails."""
    from widelimit._runtime import stdout_to_stderr

    capfd.readouterr()
    try:
        with stdout_to_stderr():
            for i in range(pieces):
                os.write(1, f"{text}{i}\n".encode())
            if fail:
                raise RuntimeError("solver failed")
    except RuntimeError:
        assert fail
    os.write(1, b"{}\n")
    out, err = capfd.readouterr()
    assert out == "{}\n" and err == "".join(f"{text}{i}\n" for i in range(pieces)), (out, err)


@SOME
@given(value=st.floats(-1e300, 1e300), e=st.integers(-60, 2), frac=st.floats(-1, 1),
       rounding=st.sampled_from([0.0, 1e-300, 1e-9, 1.0]))
def test_no_result_reports_a_bound_above_its_value(value, e, frac, rounding):
    """Class 7 (a checkpoint's ``lb`` edited above its value gave ``gap -0.5``, ``converged: true``): for any pair, a
    result either has ``lower_bound <= value`` and ``gap >= 0`` -- the bound unchanged when ordered, the value
    when above it by rounding (``ORDER_RTOL`` of the larger magnitude plus the result's own rounding bound),
    so an exact optimum's gap is 0 -- or is refused with :class:`InconsistentBound` beyond rounding."""
    from widelimit.exact.median_result import MedianResult
    from widelimit.results import ORDER_RTOL, InconsistentBound

    lb = value + frac * 2.0**e * max(abs(value), 1e-300)
    slack = ORDER_RTOL * max(abs(value), abs(lb)) + rounding
    try:
        r = MedianResult(point=np.zeros(1), value=value, lower_bound=lb, gap=value - lb, segment=np.zeros((2, 1)),
                         n_passes=1, n_iter=1, certified=False, method="newton", kind="huber", lam=1.0,
                         rounding=rounding)
    except InconsistentBound as e_:
        assert lb - value > slack and "\n" not in str(e_), (value, lb)
        return
    assert lb - value <= slack
    assert r.lower_bound <= r.value and r.gap >= 0 and r.as_dict()["gap"] >= 0
    assert (r.lower_bound, r.gap) == ((lb, value - lb) if lb <= value else (value, 0.0))


@settings(max_examples=int(40 * SCALE), deadline=None)
@given(N=st.integers(2, 4000), n=st.integers(1, 64), cone=st.sampled_from(["nonneg", "dnn", "dnn_horn", "sdd", "nndd",
                                                                         "diagonal"]),
       solver=st.sampled_from(["SCS", "CLARABEL", "TORCH"]), budget=st.integers(2**20, 2**36))
def test_relax_refusal_advises_exactly_the_solvers_that_fit(N, n, cone, solver, budget):
    """Class 16 (``relax`` refusing SCS advised ``--solver 'SCS'``, whatever SCS's own need): a refusal names every
    other solver whose estimate fits the budget, with that estimate, unquoted, and no other; none fitting, it says
    so. TORCH (widelimit's DNN solver) solves the ``dnn`` cone only."""
    import re

    from widelimit._memory import MemoryBudgetError, gib
    from widelimit.relax.cones import check_relax_memory, estimate_memory
    from widelimit.relax.dnn import dnn_bytes

    if solver == "TORCH" and cone != "dnn":
        cone = "dnn"
    est = {s: estimate_memory(N, n, cone, s) for s in ("SCS", "CLARABEL")}
    if cone == "dnn":
        est["TORCH"] = dnn_bytes(N)
    try:
        check_relax_memory(N, n, cone, solver, budget, names={s: f"--solver {s}" for s in est})
    except MemoryBudgetError as e:
        msg = str(e)
        assert est[solver] > budget and "\n" not in msg and "'" not in msg.split(" needs ")[1], msg
        named = re.findall(r"--solver (\w+) \(about ([^)]+)\)", msg)
        fit = sorted((s for s in est if s != solver and est[s] <= budget), key=est.get)
        assert named == [(s, gib(est[s])) for s in fit], (msg, est, budget)
        assert msg.endswith("or a smaller N" if fit else "no solver fits within it: use a smaller N"), msg
        return
    assert est[solver] <= budget


_LATE_CHILD = """
import json, sys, time, types

fake = types.ModuleType("widelimit.cli")  # the command line's entry with a command that answers at once


def main():
    print(json.dumps({"value": 1.0}))
    return 0


fake.main = main
sys.modules["widelimit.cli"] = fake


class Teardown:  # a slow interpreter shutdown (torch's and numba's teardown take about a second)
    def __del__(self, err=sys.stderr, sleep=time.sleep):
        err.write("teardown\\n")
        err.flush()
        sleep(5)


keep = Teardown()
sys.argv = ["widelimit"] + sys.argv[1:]
from widelimit.__main__ import entry
entry()
"""


@settings(max_examples=int(8 * SCALE), deadline=None)
@given(cmd=st.sampled_from(["bound", "solve", "certify", "fit"]), delay=st.floats(0.0, 0.3))
def test_ctrl_c_after_the_answer(cmd, delay):
    """Class 16 (Ctrl-C in the second after the JSON is printed: the process died by the signal, no line): through
    the console script's entry, a SIGINT at any moment after the answer (here during a slow shutdown) ends the
    process with status 0 and nothing more, or with the interrupted line and 130; never by the signal, never
    another line. (tests/cli/test_one_line_answers.py runs the real ``bound``.)"""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-c", _LATE_CHILD, cmd], cwd=repo, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(p.stdout.readline()) == {"value": 1.0}  # the answer is out
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert out == "" and (p.returncode, lines) in ((0, []), (130, [f"widelimit {cmd}: interrupted"])), \
        (p.returncode, lines)


@SOME
@given(kind=st.sampled_from(sorted(_exotic_tensors())), seed=st.integers(0, 3))
def test_sae_pt_tensors_of_every_kind(tmp_path_factory, kind, seed):
    """Class 16 (exotic ``.pt`` tensors gave internal type errors not naming the file), for SAE files as for data
    files: a dictionary_learning ``ae.pt`` with any one tensor replaced by a tensor of any dtype or layout either
    loads or is refused in one :class:`SAEFormatError` line naming the file -- and, for a dtype or layout that
    cannot be read as numbers, the tensor and that dtype or layout."""
    import torch

    from fixtures.saes import orthogonal_rays_sae, save_dictionary_learning
    from widelimit.sae.formats import load_sae
    from widelimit.sae.model import SAEFormatError

    _, sae = orthogonal_rays_sae(0.5, n_pairs=2, dim=3, points_per_ray=2)
    d = save_dictionary_learning(sae, tmp_path_factory.mktemp("dl"))
    p = d / "ae.pt"
    sd = torch.load(p, weights_only=True)
    name = sorted(sd)[seed % len(sd)]
    t, word = _exotic_tensors()[kind]
    sd[name] = t
    torch.save(sd, p)
    try:
        load_sae(d)
    except SAEFormatError as e:
        msg = one_line(str(e))
        assert msg.startswith(str(d)), msg
        if kind not in _READ_AS and kind != "torch.bool":
            assert msg.startswith(f"{p}: tensor {name!r} ") and word in msg, msg
