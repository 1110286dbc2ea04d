"""Bad input, on purpose: every loader, CLI subcommand and public function answers with one line.

Two parts:

* hypothesis property tests (derandomised by tests/conftest.py) over random bad input: corrupted
  and random files of every format, random text tables checked against an independent parser,
  random bad values of the public parameters, random command lines;
* a table with the reproducers of issue 13 (items 5, 7, 8, 9, 10 and the input-handling ones),
  each checked for the documented outcome: the exception type, the exit status, the one line and
  what it names.

``WIDELIMIT_FUZZ_SCALE=50 HYPOTHESIS_PROFILE=explore python3 -m pytest tests/test_fuzz.py`` searches
harder (50 times the examples, fresh ones each run). The documented types: :class:`widelimit.DataError` for files, ``ValueError`` for parameters
(``DataError`` is one), exit status 2 with one line on stderr for the CLI, 130 for Ctrl-C.
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import widelimit as wl
from widelimit.cli import main

REPO = Path(__file__).resolve().parents[1]
#: examples per property test; WIDELIMIT_FUZZ_SCALE=50 (with HYPOTHESIS_PROFILE=explore) searches harder
SCALE = float(os.environ.get("WIDELIMIT_FUZZ_SCALE", "1"))
FAST = settings(max_examples=int(40 * SCALE), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and text.count("\n") <= 1, text
    return lines[0]


def cli(capsys, *argv):
    """``(exit status, stdout, stderr)`` of ``widelimit argv`` run in this process."""
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def cli_error(capsys, *argv, status=2) -> str:
    rc, out, err = cli(capsys, *argv)
    assert rc == status, (rc, out, err)
    line = one_line(err)
    assert line.startswith("widelimit"), line
    assert "Traceback" not in err
    return line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small valid files of every format (30 x 4 float64 unless said otherwise) and a 200 x 5 .npy."""
    d = tmp_path_factory.mktemp("fuzzdata")
    rng = np.random.default_rng(7)
    X = rng.standard_normal((30, 4))
    out = {"X": X, "dir": d}
    np.save(d / "x.npy", X)
    np.savez(d / "x.npz", acts=X)
    np.savetxt(d / "x.csv", X, delimiter=",")
    save_file({"acts": X.astype(np.float32)}, str(d / "x.safetensors"))
    torch.save({"acts": torch.tensor(X)}, d / "x.pt")
    import pyarrow as pa

    table = pa.table({"acts": pa.array(list(X.astype(np.float32)), type=pa.list_(pa.float32()))})
    with pa.ipc.new_stream(str(d / "x.arrow"), table.schema) as w:
        w.write_table(table)
    np.save(d / "good.npy", rng.standard_normal((200, 5)))
    for k in ("npy", "npz", "csv", "safetensors", "pt", "arrow"):
        out[k] = d / f"x.{k}"
    out["good"] = d / "good.npy"
    return out


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


@FAST
@given(ext=st.sampled_from(EXTS), data=st.binary(max_size=400))
def test_random_bytes_in_every_format(tmp_path_factory, ext, data):
    p = tmp_path_factory.mktemp("rand") / f"f{ext}"
    p.write_bytes(data)
    A = _open_and_read(p)  # a one-line DataError (None) or the rows it holds
    # whatever random bytes decode to, reading is deterministic: a second read gives the same rows
    assert A is None or np.array_equal(A, _open_and_read(p), equal_nan=True)


@FAST
@given(kind=st.sampled_from(["npy", "npz", "safetensors", "pt", "arrow"]), cut=st.floats(0, 1),
       flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=4))
def test_corrupted_files(files, tmp_path_factory, kind, cut, flips):
    """Truncated and byte-flipped valid files: either still readable (then the values are the
    file's own, checked against NumPy where the header survived) or one DataError line."""
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
# the reproducers of issue 13, one row each
# ======================================================================================


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def r5_csv_bad_first_row(tmp, capsys, files):
    p = _write(tmp / "b.csv", "1,2,oops\n4,5,6\n7,8,9\n10,11,12\n")
    line = cli_error(capsys, "solve", p, "--lam", "1", "--json")
    assert "line 1, column 3: 'oops' is not a number" in line


def r5_csv_header_only_when_all_fields_are_text(tmp, capsys, files):
    X = np.array([[4.0, 5, 6], [7, 8, 9], [10, 11, 12]])
    p = _write(tmp / "h.csv", "a,b,c\n4,5,6\n7,8,9\n10,11,12\n")
    rc, out, err = cli(capsys, "solve", p, "--lam", "1", "--json")
    assert rc == 0 and err == ""
    d = json.loads(out)
    assert d["n_points"] == 3 and d["value"] == pytest.approx(wl.solve(X, lam=1.0).value, rel=1e-14)


def r5_csv_header_when_asked(tmp, capsys, files):
    p = _write(tmp / "n.csv", "1,2,3\n4,5,6\n7,8,9\n10,11,12\n")
    rc, out, _ = cli(capsys, "solve", p, "--lam", "1", "--json", "--header")
    assert rc == 0 and json.loads(out)["n_points"] == 3
    rc, out, _ = cli(capsys, "solve", p, "--lam", "1", "--json")
    assert rc == 0 and json.loads(out)["n_points"] == 4


def r5_csv_malformed_row_names_line_and_column(tmp, capsys, files):
    p = _write(tmp / "m.csv", "x,y\n1,2\n\n3,,4\n")
    assert "line 4, column 2: '' is not a number" in cli_error(capsys, "bound", p, "--lam", "1")
    p = _write(tmp / "r.csv", "1,2\n3,4,5\n")
    assert "line 2 has 3 fields, line 1 has 2" in cli_error(capsys, "solve", p, "--lam", "1")
    p = _write(tmp / "w.txt", "1 2\n3 four\n")
    assert "line 2, column 2: 'four'" in cli_error(capsys, "solve", p, "--lam", "1")


def r5_masked_array_refused(tmp, capsys, files):
    X = np.ma.masked_array(files["X"], mask=np.zeros(files["X"].shape, bool))
    X.mask[5, 1] = True
    for call in (lambda: wl.solve(X, lam=1.0), lambda: wl.huber_median(X, lam=1.0),
                 lambda: wl.ActivationSource.from_array(X)):
        with pytest.raises(ValueError, match=r"masked array with masked entries \(first in row 5\)"):
            call()
    X.mask[:] = False  # no masked entry: the data are used as they are
    assert wl.huber_median(X, lam=1.0).value == wl.huber_median(files["X"], lam=1.0).value


def r8_fit_width_above_n(tmp, capsys, files):
    line = cli_error(capsys, "fit", files["good"], "--lam", "1", "--width", "400")
    assert "--width 400 exceeds the number of points N = 200" in line
    with pytest.raises(ValueError, match="width=400 exceeds the number of points N = 200"):
        wl.fit_dictionary(np.load(files["good"]), lam=1.0, width=400)


def r8_fit_huge_learning_rate(tmp, capsys, files):
    line = cli_error(capsys, "fit", files["good"], "--lam", "1", "--width", "3", "--encoder", "standard", "--lr", "1e10")
    assert "lower the learning rate" in line


def r8_checkpoint_meta_is_a_list(tmp, capsys, files):
    ck = tmp / "ck.npz"
    np.savez(ck, __meta__=np.frombuffer(json.dumps([1, 2]).encode(), dtype=np.uint8))
    line = cli_error(capsys, "bound", files["npy"], "--lam", "1", "--checkpoint", ck)
    assert "not a widelimit checkpoint (its __meta__ is a JSON list" in line
    with pytest.raises(ValueError, match="__meta__ is a JSON list"):
        wl.huber_median(files["X"], lam=1.0, checkpoint=ck)


def r8_api_parameters(tmp, capsys, files):
    X = files["X"]
    cases = [
        (lambda: wl.huber_median(X, lam=1.0, hess_rows=0), "hess_rows must be an integer >= 1, got 0"),
        (lambda: wl.huber_median(X, lam=1.0, seed="abc"), "seed must be an integer >= 0, got str 'abc'"),
        (lambda: wl.fit_dictionary(X, lam=1.0, width=2, seed="abc"), "seed must be an integer >= 0"),
        (lambda: wl.solve_dnn(X, lam=1.0, Q0=np.full((30, 30), np.nan)), "Q0 has a non-finite value in row 0"),
        (lambda: wl.solve_dnn(X, lam=1.0, check_every=0), "check_every must be an integer >= 1, got 0"),
        (lambda: wl.verify(X, np.eye(4), np.zeros((30, 4)), np.zeros(4), lam=1.0, median="x"),
         "median: a Huber median at lam=1.0 of 4-dimensional data is needed, got str"),
        (lambda: wl.ActivationSource.open(None), "path must be a file or folder path"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert msg in one_line(str(e.value))


def r9_ctrl_c_leaves_nothing_half_written(tmp, capsys, files, monkeypatch):
    import widelimit.plot

    out = tmp / "o"
    out.mkdir()
    (out / "solution.json").write_text("old")

    def interrupted(*a, **k):  # after solution.npz and solution.json were written
        raise KeyboardInterrupt

    monkeypatch.setattr(widelimit.plot, "plot_solution", interrupted)
    monkeypatch.setattr("widelimit.cli._common.plot_solution", interrupted, raising=False)  # if imported there
    line = cli_error(capsys, "solve", files["npy"], "--lam", "1", "--out", out, status=130)
    assert line == "widelimit solve: interrupted"
    assert sorted(os.listdir(out)) == ["solution.json"] and (out / "solution.json").read_text() == "old"
    assert sorted(p.name for p in tmp.iterdir()) == ["o"]  # no temporary folder left


def r9_ctrl_c_real_signal(tmp, capsys, files):
    """A real SIGINT to `widelimit fit` while it runs: one line, status 130, no output folder.

    ``--rtol 0`` keeps the fit from converging before the signal on a fast machine."""
    big = tmp / "big.npy"
    np.save(big, np.random.default_rng(0).standard_normal((3000, 20)))
    out = tmp / "fitout"
    p = subprocess.Popen([sys.executable, "-m", "widelimit", "fit", str(big), "--lam", "0.5", "--width", "100",
                          "--max-iter", "1000000", "--rtol", "0", "--time-limit", "300", "--out", str(out)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    maps = Path(f"/proc/{p.pid}/maps")
    if not maps.exists():
        p.kill()
        pytest.skip("needs /proc to see when the fit has started")
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:  # torch is imported by the fit, not at start-up
        try:
            if "libtorch" in maps.read_text():
                break
        except OSError:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert one_line(err) == "widelimit fit: interrupted"
    assert not out.exists()


def _interrupt_after_numpy_loads(tmp, delay):
    """Start `widelimit fit`, wait until numpy's C extension is mapped (the solvers are being imported),
    then ``delay`` seconds, then SIGINT. ``None`` without /proc."""
    big = tmp / "big.npy"
    if not big.exists():
        np.save(big, np.random.default_rng(0).standard_normal((3000, 20)))
    out = tmp / f"fitout{delay}"
    p = subprocess.Popen([sys.executable, "-m", "widelimit", "fit", str(big), "--lam", "0.5", "--width", "100",
                          "--max-iter", "1000000", "--rtol", "0", "--time-limit", "300", "--out", str(out)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    maps = Path(f"/proc/{p.pid}/maps")
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        try:
            if "_multiarray_umath" in maps.read_text():
                break
        except OSError:
            p.kill()
            p.communicate()
            return None
        time.sleep(0.005)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    return p.returncode, err, out


def r9_ctrl_c_during_start_up(tmp, capsys, files):
    """A SIGINT while the command's imports run (numpy, scipy, numba and torch initialising, the lazy
    torch import of the fit): still one line and status 130, never a traceback or a death by SIGINT.

    Before the fix, a signal in this phase printed a 10-50-line traceback and the process died with
    -SIGINT; one landing inside an extension's initialisation gave ``ImportError``. (The interpreter's
    own start, before numpy loads, is not covered: no Python program can catch a signal there.)"""
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6):
        got = _interrupt_after_numpy_loads(tmp, delay)
        if got is None:
            pytest.skip("needs /proc to see when the imports have started")
        status, err, out = got
        assert status == 130, (delay, err[-1500:])
        assert one_line(err) in ("widelimit: interrupted", "widelimit fit: interrupted"), (delay, err[-1500:])
        assert not out.exists()


def r9_ctrl_c_swallowed_by_a_finaliser(tmp, capsys, files):
    """A SIGINT that lands while Python runs a finaliser or callback (seen in a fresh clone: an import
    lock's weakref callback during the first, compiling run) raises KeyboardInterrupt there; Python
    prints "Exception ignored" and drops it, and `widelimit fit` ran on to its time limit. The CLI's
    hook now ends the process: one line, status 130."""
    code = ("from widelimit._runtime import track_interrupts\n"
            "track_interrupts()\n"
            "class Finaliser:\n"
            "    def __del__(self):\n"
            "        raise KeyboardInterrupt  # what the SIGINT handler does when it runs here\n"
            "Finaliser()\n"
            "import time; time.sleep(30)\n"
            "print('ran on')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 130, p.stderr[-1500:]
    assert one_line(p.stderr) == "widelimit: interrupted"
    assert p.stdout == ""


def r9_dask_local_zero_workers(tmp, capsys, files):
    pytest.importorskip("distributed")
    line = cli_error(capsys, "bound", files["npy"], "--lam", "1", "--dask", "local:0")
    assert "--dask local:0: a local cluster needs at least 1 worker" in line
    assert "expected 'local', 'local:N'" in cli_error(capsys, "bound", files["npy"], "--lam", "1", "--dask", "nonsense")


def r9_dask_unreachable_scheduler_times_out(tmp, capsys, files):
    pytest.importorskip("distributed")
    line = cli_error(capsys, "bound", files["npy"], "--lam", "1", "--dask", "tcp://127.0.0.1:9", "--dask-timeout", "1")
    assert "could not reach the scheduler within 1 s" in line


def r9_out_is_a_file_checked_before_computing(tmp, capsys, files, monkeypatch):
    import widelimit.exact.solve

    def never(*a, **k):
        raise AssertionError("computed before checking --out")

    monkeypatch.setattr(widelimit.exact.solve, "solve", never)
    monkeypatch.setattr("widelimit.cli.solve.solve", never, raising=False)  # if imported there
    f = _write(tmp / "afile", "")
    for argv in (["solve", files["npy"], "--lam", "1"], ["fit", files["npy"], "--lam", "1", "--width", "2"],
                 ["frontier", files["npy"], "--lam", "1", "--widths", "1"], ["demo"],
                 ["solve", files["npy"], "--lam", "1", "--out-sub"]):
        if argv[-1] == "--out-sub":  # a file in the middle of the path
            argv = argv[:-1] + ["--out", str(f / "sub")]
        else:
            argv = argv + ["--out", str(f)]
        line = cli_error(capsys, *argv)
        assert "--out" in line and "is a file, a folder is needed" in line, line


class Payload:
    """Any Python object other than a tensor: torch.load(weights_only=True) refuses it."""


def r10_pt_weights_only_advice_rephrased(tmp, capsys, files):
    torch.save({"acts": Payload()}, tmp / "evil.pt")
    for cmd in ("solve", "bound"):
        line = cli_error(capsys, cmd, tmp / "evil.pt", "--lam", "1")
        assert "refused to unpickle" in line and "weights_only" not in line, line


def r10_state_json_outside_the_cache(tmp, capsys, files):
    c = tmp / "cache"
    c.mkdir()
    for name in ("/etc/passwd", "../x.arrow", str(files["arrow"])):
        (c / "state.json").write_text(json.dumps({"_data_files": [{"filename": name}]}))
        with pytest.raises(wl.DataError, match="lies outside the cache folder"):
            wl.open_activations(c)
    (c / "state.json").write_text(json.dumps({"_data_files": [{"filename": "/etc/passwd"}]}))
    assert "outside the cache folder" in cli_error(capsys, "bound", c, "--lam", "1")


def r10_npy_negative_shape(tmp, capsys, files):
    p = tmp / "neg.npy"
    with open(p, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (-5, 4)})
        f.write(b"\0" * 256)
    with pytest.raises(wl.DataError, match=r"shape \(-5, 4\) has a negative"):
        wl.open_activations(p)
    for cmd in ("bound", "solve"):
        assert "has a negative" in cli_error(capsys, cmd, p, "--lam", "1")


def r10_safetensors_offsets_not_at_zero(tmp, capsys, files):
    X = files["X"].astype("<f4")
    hdr = json.dumps({"pad": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
                      "acts": {"dtype": "F32", "shape": list(X.shape), "data_offsets": [16, 16 + X.nbytes]}}).encode()
    p = tmp / "off.safetensors"
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 16 + X.tobytes())
    assert np.array_equal(wl.open_activations(p, key="acts")[:], X)
    from safetensors.numpy import load_file

    assert np.array_equal(load_file(str(p))["acts"], X)  # the reference reader agrees
    res = {}
    for cmd in ("solve", "bound"):
        rc, out, err = cli(capsys, cmd, p, "--key", "acts", "--lam", "1", "--json")
        assert rc == 0 and err == ""
        res[cmd] = json.loads(out)
    assert res["solve"]["n_points"] == res["bound"]["n_points"] == 30
    assert res["bound"]["lower_bound"] <= res["solve"]["value"] * (1 + 1e-12)
    # an offset beyond the end of the file is a truncation, named as such
    hdr = json.dumps({"acts": {"dtype": "F32", "shape": list(X.shape), "data_offsets": [64, 64 + X.nbytes]}}).encode()
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + X.tobytes())
    with pytest.raises(wl.DataError, match="truncated .safetensors file"):
        wl.open_activations(p)


def r10_newline_in_file_name(tmp, capsys, files):
    p = tmp / "new\nline.csv"
    p.write_text("1,2\n3,x\n")
    line = cli_error(capsys, "solve", p, "--lam", "1")
    assert "new\\nline.csv': line 2, column 2" in line, line
    assert "missing\\nfile.npy': no such file" in cli_error(capsys, "solve", tmp / "missing\nfile.npy", "--lam", "1")


def r10_symlink_loop(tmp, capsys, files):
    (tmp / "loop").symlink_to(tmp / "loop")
    assert "symlink loop" in cli_error(capsys, "solve", tmp / "loop", "--lam", "1")
    (tmp / "dangling").symlink_to(tmp / "nowhere.npy")
    assert "broken symlink" in cli_error(capsys, "bound", tmp / "dangling", "--lam", "1")


def r10_messages_name_the_flags(tmp, capsys, files):
    np.savez(tmp / "two.npz", a=files["X"], b=files["X"])
    line = cli_error(capsys, "solve", tmp / "two.npz", "--lam", "1")
    assert line.endswith("choose one with --key") and "key=" not in line
    from fixtures.saes import orthogonal_rays_sae
    from widelimit.sae.formats import save_saelens

    X, sae = orthogonal_rays_sae(0.5, seed=1)
    save_saelens(sae, tmp / "sae")
    cfg = json.loads((tmp / "sae" / "cfg.json").read_text())
    cfg["normalize_activations"] = "expected_average_only_in"
    (tmp / "sae" / "cfg.json").write_text(json.dumps(cfg))
    np.save(tmp / "acts.npy", X)
    line = cli_error(capsys, "certify", tmp / "sae", tmp / "acts.npy", "--lam", "0.5")
    assert "--norm-scaling-factor" in line and "norm_scaling_factor" not in line, line


def r10_no_warnings_in_normal_use(tmp, capsys, files):
    ro = np.load(files["good"], mmap_mode="r")  # read-only: torch warned on every fit of a .npy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wl.fit_dictionary(ro, lam=1.0, width=3, max_iter=5)
        for argv in (["fit", files["good"], "--lam", "1", "--width", "3", "--max-iter", "5", "--json"],
                     ["solve", files["pt"], "--lam", "1", "--json"], ["bound", files["pt"], "--lam", "1", "--json"],
                     ["bound", files["safetensors"], "--lam", "1", "--json"]):
            rc, out, err = cli(capsys, *argv)
            assert rc == 0 and err == "", (argv, err)


def r10_cli_flags_refuse_nan_inf_negative(tmp, capsys, files):
    for argv, flag in [(["certify", "x", files["npy"], "--lam", "1", "--tol", "-1"], "--tol"),
                       (["certify", "x", files["npy"], "--lam", "1", "--tol", "nan"], "--tol"),
                       (["certify", "x", files["npy"], "--lam", "1", "--norm-scaling-factor", "-1"], "--norm-scaling-factor"),
                       (["solve", files["npy"], "--lam", "inf"], "--lam"),
                       (["fit", files["npy"], "--lam", "1", "--width", "0"], "--width"),
                       (["fit", files["npy"], "--lam", "1", "--width", "2", "--seed", "abc"], "--seed"),
                       (["relax", files["npy"], "--lam", "1", "--tol", "-1"], "--tol"),
                       (["bound", files["npy"], "--lam", "1", "--rows", "0"], "--rows")]:
        assert f"argument {flag}:" in cli_error(capsys, *argv)


def r_unexpected_exception_is_one_line(tmp, capsys, files, monkeypatch):
    import widelimit.exact.solve

    def boom(*a, **k):
        raise RuntimeError("something\nunexpected")

    monkeypatch.setattr(widelimit.exact.solve, "solve", boom)
    monkeypatch.setattr("widelimit.cli.solve.solve", boom, raising=False)
    assert cli_error(capsys, "solve", files["npy"], "--lam", "1") == \
        "widelimit solve: error: RuntimeError: something unexpected"


# SAE config fields (issue 13 item 7): validated by widelimit.sae (branch issue14-sae, merged)


def _sae_cfg(tmp, **changes):
    from fixtures.saes import orthogonal_rays_sae
    from widelimit.sae.formats import save_saelens

    _, sae = orthogonal_rays_sae(0.5, seed=2)
    save_saelens(sae, tmp / "s")
    cfg = json.loads((tmp / "s" / "cfg.json").read_text())
    cfg.update(changes)
    (tmp / "s" / "cfg.json").write_text(json.dumps(cfg))
    return tmp / "s"


def r7_sae_config_string_field(tmp, capsys, files):
    d = _sae_cfg(tmp, d_sae="abc")
    with pytest.raises(ValueError, match=r"cfg\.json.*d_sae"):
        wl.load_sae(d)


def r7_sae_config_wrongly_typed_field(tmp, capsys, files):
    d = _sae_cfg(tmp, d_in=[12])
    with pytest.raises(ValueError, match=r"cfg\.json.*d_in"):
        wl.load_sae(d)


def r7_sae_config_json_boolean_only_as_boolean(tmp, capsys, files):
    d = _sae_cfg(tmp, apply_b_dec_to_input="false")
    with pytest.raises(ValueError, match=r"cfg\.json.*apply_b_dec_to_input"):
        wl.load_sae(d)


REPRODUCERS = [
    r5_csv_bad_first_row, r5_csv_header_only_when_all_fields_are_text, r5_csv_header_when_asked,
    r5_csv_malformed_row_names_line_and_column, r5_masked_array_refused,
    r8_fit_width_above_n, r8_fit_huge_learning_rate, r8_checkpoint_meta_is_a_list, r8_api_parameters,
    r9_ctrl_c_leaves_nothing_half_written, r9_ctrl_c_real_signal, r9_ctrl_c_during_start_up,
    r9_ctrl_c_swallowed_by_a_finaliser, r9_dask_local_zero_workers,
    r9_dask_unreachable_scheduler_times_out, r9_out_is_a_file_checked_before_computing,
    r10_pt_weights_only_advice_rephrased, r10_state_json_outside_the_cache, r10_npy_negative_shape,
    r10_safetensors_offsets_not_at_zero, r10_newline_in_file_name, r10_symlink_loop, r10_messages_name_the_flags,
    r10_no_warnings_in_normal_use, r10_cli_flags_refuse_nan_inf_negative, r_unexpected_exception_is_one_line,
    r7_sae_config_string_field, r7_sae_config_wrongly_typed_field, r7_sae_config_json_boolean_only_as_boolean,
]


@pytest.mark.parametrize("case", REPRODUCERS,
                         ids=[c.__name__ for c in REPRODUCERS])
def test_issue13_reproducer(case, tmp_path, capsys, files, monkeypatch):
    import inspect

    kw = {"monkeypatch": monkeypatch} if "monkeypatch" in inspect.signature(case).parameters else {}
    # each reproducer asserts the right answer or the one-line error itself and returns None
    # when every check of it passed (an AssertionError inside fails this test)
    assert case(tmp_path, capsys, files, **kw) is None


def test_issue12_certify_and_bound_read_a_folder_of_shards(tmp_path, capsys):
    """`widelimit certify sae/ shards/` said "is a directory" while `bound shards/` worked: one loader now.
    The folder and the single file holding the same rows give the same certificate, number for number."""
    from fixtures.saes import orthogonal_rays_sae
    from widelimit.sae.formats import save_saelens

    X, sae = orthogonal_rays_sae(0.5, seed=3)
    save_saelens(sae, tmp_path / "sae")
    (tmp_path / "shards").mkdir()
    cut = X.shape[0] // 3
    for i, part in enumerate((X[:cut], X[cut:2 * cut], X[2 * cut:])):
        np.save(tmp_path / "shards" / f"part_{i}.npy", part)
    np.save(tmp_path / "all.npy", X)
    got = {}
    for name in ("shards", "all.npy"):
        rc, out, err = cli(capsys, "certify", tmp_path / "sae", tmp_path / name, "--lam", "0.5", "--json")
        assert rc == 0 and err == "", err
        got[name] = json.loads(out)
    for k in ("n_tokens", "sae_objective", "optimal_code_objective", "lower_bound", "global_gap"):
        assert got["shards"][k] == got["all.npy"][k], k
    assert got["all.npy"]["n_tokens"] == X.shape[0]
