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
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "max_steps", "int", 0, True),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "batch_size", "int", 1, True),
    (lambda **kw: wl.fit_dictionary(SMALL, lam=1.0, width=2, **kw), "max_time", "real>", 0, True),
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
