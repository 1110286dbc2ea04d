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
    from widelimit.exact.median import median_bytes, subsample_rows

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
    fr = wl.frontier(X, lam=0.5, widths=widths, n_restarts=1, max_steps=5, inits=("data",), time_limit=limit,
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
