"""Bad input to ``solve``, ``bound``, ``certify``, ``demo``, ``experiment`` and the shared loader: one line
naming the flag, file, field or row, status 2.

The project rule: bad input gets a one-line error that says what is wrong and where (parameter, file,
field, row), exit status 2 on the CLI, never a traceback and never a silent default. Each test below is
one reviewed defect, named by the behaviour it checks; each failed before its fix. The end-to-end tests
(the smallest accepted lam, data just below the largest accepted magnitude) check the result too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import widelimit as wl
from fixtures.saes import orthogonal_rays_sae
from widelimit.cli import main
from widelimit.sae.formats import save_saelens
from fixtures.cli import one_line_error

TINY = float(np.finfo(np.float64).tiny)  # the smallest normal float64: the smallest lam accepted
LIMIT = 2.0**565  # the largest row norm accepted (widelimit._validation.SQUARE_LIMIT)
LINUX_PROC = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")


@pytest.fixture
def X():
    return np.random.default_rng(0).standard_normal((8, 2))


@pytest.fixture
def good(tmp_path, X) -> str:
    path = tmp_path / "good.npy"
    np.save(path, X)
    return str(path)


@pytest.fixture
def good_csv(tmp_path, X) -> str:
    path = tmp_path / "good.csv"
    np.savetxt(path, X, delimiter=",")
    return str(path)


@pytest.fixture
def sae_dir(tmp_path) -> tuple[str, str]:
    """A SAELens folder and activations (12-D) it reads."""
    acts, sae = orthogonal_rays_sae(0.5, seed=10)
    save_saelens(sae, tmp_path / "sae")
    np.save(tmp_path / "acts.npy", acts)
    return str(tmp_path / "sae"), str(tmp_path / "acts.npy")


def _csv(row) -> str:
    return ",".join(repr(float(v)) for v in row)


def _json(capsys, argv):
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    cap = capsys.readouterr()
    assert cap.err == "", cap.err
    return json.loads(cap.out)


# --------------------------------------------------------------------------------------
# boolean arrays are refused as data, like complex ones
# --------------------------------------------------------------------------------------

BOOL = np.array([[True, False], [False, True], [True, True]])


@pytest.mark.parametrize("argv", [["solve", "--lam", "0.5"], ["bound", "--lam", "0.5"],
                                  ["fit", "--lam", "0.5", "--width", "2"], ["relax", "--lam", "0.5"],
                                  ["frontier", "--lam", "0.5", "--widths", "1"]])
def test_bool_npy_refused(tmp_path, capsys, argv):
    p = tmp_path / "bool.npy"
    np.save(p, BOOL)
    err = one_line_error(capsys, [argv[0], p, *argv[1:]])
    assert "bool.npy: array has dtype bool" in err and "expected floating point or integer numbers" in err, err


def test_bool_activations_refused_by_certify(tmp_path, capsys, sae_dir):
    sae, acts = sae_dir
    p = tmp_path / "bool_acts.npy"
    np.save(p, np.load(acts) > 0)
    err = one_line_error(capsys, ["certify", p, sae, "--lam", "0.5"])
    assert "bool_acts.npy: array has dtype bool" in err and "floating point or integer" in err, err


def test_bool_in_every_format_and_the_api(tmp_path):
    save_file({"m": BOOL}, str(tmp_path / "b.safetensors"))
    torch.save(torch.tensor(BOOL), tmp_path / "b.pt")
    np.savez(tmp_path / "b.npz", m=BOOL)
    for name in ("b.safetensors", "b.pt", "b.npz"):
        with pytest.raises(wl.DataError, match=r"dtype (bool|BOOL|torch\.bool); expected floating point or integer"):
            wl.open_activations(tmp_path / name)
    with pytest.raises(ValueError, match="X has dtype bool; widelimit needs floating point or integer data"):
        wl.solve(BOOL, lam=0.5)
    with pytest.raises(ValueError, match="dtype bool"):
        wl.ActivationSource.from_array(BOOL)


# --------------------------------------------------------------------------------------
# --time-limit / --tol: only with --width, checked when parsed
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, value, needle", [
    ("--time-limit", "5", "--time-limit applies only with --width"),
    ("--time-limit", "-1", "argument --time-limit: must be a finite number >= 0, got -1"),  # a bad value first
    ("--tol", "-5", "argument --tol: must be a finite number >= 0, got -5"),
])
def test_width_options_without_width_are_refused(good, capsys, flag, value, needle):
    err = one_line_error(capsys, ["solve", good, "--lam", "0.5", flag, value])
    assert needle in err, err


@pytest.mark.parametrize("flag, value, needle", [
    ("--time-limit", "-1", "argument --time-limit: must be a finite number >= 0, got -1"),
    ("--time-limit", "nan", "argument --time-limit"),
    ("--tol", "5", "--tol must be a finite number in (0, 1) with --width, got 5"),
    ("--tol", "0", "--tol must be a finite number in (0, 1) with --width, got 0"),
    ("--tol", "1", "--tol must be a finite number in (0, 1) with --width"),
    ("--tol", "nan", "argument --tol: must be a finite number >= 0, got nan"),
])
def test_width_option_values_checked_at_parse_time(good, capsys, flag, value, needle):
    err = one_line_error(capsys, ["solve", good, "--lam", "0.5", "--width", "1", flag, value])
    assert needle in err, err


def test_width_options_with_width_are_used(good, capsys, X):
    """Both options reach the search, checked by an outcome no machine speed or load can change: a time limit
    of 0 s stops the search before its first node, after one start (it once asked for a certificate within
    60 s, which a loaded machine missed), and the tolerance is the one reported."""
    d = _json(capsys, ["solve", good, "--lam", "0.5", "--width", "1", "--time-limit", "0", "--tol", "1e-4",
                       "--json", "--no-progress"])
    ref = wl.solve(X, lam=0.5, width=1, tol=1e-4, time_limit=0)
    assert d["status"] == ref.status == "time_limit" and not d["certified"] and d["n_iter"] == 0
    assert d["tol"] == 1e-4 and d["width"] == 1
    assert d["value"] == ref.value and d["lower_bound"] == ref.lower_bound
    # the default (no --time-limit) is not 0: the same search certifies, to the tolerance given
    d = _json(capsys, ["solve", good, "--lam", "0.5", "--width", "1", "--tol", "0.5", "--json", "--no-progress"])
    assert d["certified"] and d["status"] == "optimal" and d["rel_gap"] <= 0.5 and d["tol"] == 0.5


# --------------------------------------------------------------------------------------
# options given but unused are refused
# --------------------------------------------------------------------------------------


def test_key_on_single_array_files_is_refused(good, good_csv, capsys, sae_dir):
    for cmd in ("solve", "bound"):
        for path, name in ((good, "good.npy"), (good_csv, "good.csv")):
            err = one_line_error(capsys, [cmd, path, "--lam", "0.5", "--key", "acts"])
            assert f"{name}: --key 'acts' given" in err and ".npz, .safetensors or .pt files only" in err, err
    sae, acts = sae_dir
    err = one_line_error(capsys, ["certify", acts, sae, "--lam", "0.5", "--key", "acts"])
    assert "acts.npy: --key 'acts' given" in err, err


def test_header_on_non_text_files_and_builtin_datasets_is_refused(good, tmp_path, capsys, X):
    np.savez(tmp_path / "x.npz", acts=X)
    for cmd in ("solve", "bound"):
        err = one_line_error(capsys, [cmd, good, "--lam", "0.5", "--header"])
        assert "good.npy: --header given" in err and "text tables (.csv, .txt) only" in err, err
        err = one_line_error(capsys, [cmd, tmp_path / "x.npz", "--lam", "0.5", "--header"])
        assert "x.npz: --header given" in err, err
        err = one_line_error(capsys, [cmd, "rays", "--header"])
        assert "--header applies only to data files, not to the built-in dataset 'rays'" in err, err
    err = one_line_error(capsys, ["solve", "rays", "--key", "a"])
    assert "--key applies only to data files" in err, err


def test_column_on_npy_is_refused(good, capsys, sae_dir):
    err = one_line_error(capsys, ["bound", good, "--lam", "0.5", "--column", "acts"])
    assert "good.npy: --column 'acts' given" in err and "Arrow file or a datasets cache only" in err, err
    sae, acts = sae_dir
    err = one_line_error(capsys, ["certify", acts, sae, "--lam", "0.5", "--column", "acts"])
    assert "acts.npy: --column 'acts'" in err, err


@pytest.mark.parametrize("flag, value", [("--dask-timeout", "3"), ("--rows", "3")])
def test_dask_options_without_dask_are_refused(good, capsys, flag, value):
    err = one_line_error(capsys, ["bound", good, "--lam", "0.5", flag, value])
    assert f"{flag} applies only with --dask" in err, err


def test_options_that_apply_are_still_accepted(tmp_path, capsys, X):
    np.savez(tmp_path / "x.npz", acts=X, other=X[:2])
    (tmp_path / "h.csv").write_text("a,b\n" + "\n".join(_csv(r) for r in X) + "\n")
    ref = wl.solve(X, lam=0.5).value
    assert _json(capsys, ["solve", tmp_path / "x.npz", "--lam", "0.5", "--key", "acts", "--json"])["value"] == \
        pytest.approx(ref, rel=1e-12)
    assert _json(capsys, ["solve", tmp_path / "h.csv", "--lam", "0.5", "--header", "--json"])["value"] == \
        pytest.approx(ref, rel=1e-12)


# --------------------------------------------------------------------------------------
# output paths: every error names the flag and the path as given
# --------------------------------------------------------------------------------------


@LINUX_PROC
def test_unwritable_out_names_flag_and_path(good, capsys, sae_dir):
    err = one_line_error(capsys, ["solve", good, "--lam", "0.5", "--out", "/proc/x.json"])
    assert "--out /proc/x.json: cannot write here (No such file or directory)" in err, err
    assert not any(s in err for s in (".tmp",)), err
    err = one_line_error(capsys, ["solve", good, "--lam", "0.5", "--width", "1", "--out", "/proc/x.json"])
    assert "--out /proc/x.json: cannot write here" in err and not any(s in err for s in (".tmp",)), err
    err = one_line_error(capsys, ["demo", "--out", "/proc/x"])
    assert "--out /proc/x: cannot write here" in err and not any(s in err for s in (".tmp",)), err
    err = one_line_error(capsys, ["experiment", "rays", "--quick", "--out", "/proc/x"])
    assert "--out /proc/x: cannot write here" in err, err
    sae, acts = sae_dir
    err = one_line_error(capsys, ["certify", acts, sae, "--lam", "0.5", "--out", "/proc/x"])
    assert "--out /proc/x: cannot write here" in err and not any(s in err for s in (".tmp",)), err
    err = one_line_error(capsys, ["fit", good, "--lam", "0.5", "--width", "1", "--out", "/proc/x"])
    assert "--out /proc/x: cannot write here" in err and not any(s in err for s in (".tmp",)), err
    if Path("/sys/kernel").is_dir():
        err = one_line_error(capsys, ["solve", good, "--lam", "0.5", "--out", "/sys/kernel/x"])
        assert "--out /sys/kernel/x: cannot write here (" in err and not any(s in err for s in (".tmp",)), err


@LINUX_PROC
def test_unwritable_checkpoint_names_flag_and_path(good, tmp_path, capsys):
    err = one_line_error(capsys, ["bound", good, "--lam", "0.5", "--checkpoint", "/proc/x.ckpt"])
    assert "--checkpoint /proc/x.ckpt: cannot write here (No such file or directory)" in err, err
    assert not any(s in err for s in (".tmp",)), err
    missing = tmp_path / "nonexist_dir" / "ck"
    err = one_line_error(capsys, ["bound", good, "--lam", "0.5", "--checkpoint", missing])
    assert f"--checkpoint {missing}: cannot write here (its folder {missing.parent} does not exist)" in err, err
    assert not any(s in err for s in (".tmp",)), err


def test_checkpoint_that_is_another_file_or_under_a_file_is_refused(good, good_csv, capsys):
    before = Path(good_csv).read_bytes()
    err = one_line_error(capsys, ["bound", good, "--lam", "0.5", "--checkpoint", good_csv])
    assert f"--checkpoint {good_csv}: exists and is not a widelimit checkpoint" in err, err
    assert "a checkpoint is an .npz archive; this file is not one" in err, err
    assert not any(s in err for s in ("(ValueError)",)), err
    assert Path(good_csv).read_bytes() == before  # never overwritten
    err = one_line_error(capsys, ["bound", good, "--lam", "0.5", "--checkpoint", good_csv + "/sub"])
    assert f"--checkpoint {good_csv}/sub: its parent {good_csv} is a file, not a folder" in err, err


def test_npz_that_is_not_a_checkpoint_is_refused(good, tmp_path, capsys):
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    err = one_line_error(capsys, ["bound", good, "--lam", "0.5", "--checkpoint", tmp_path / "other.npz"])
    assert "is not a widelimit checkpoint (an .npz archive without its __meta__ entry; it holds a)" in err, err


def test_a_good_checkpoint_still_resumes(good, tmp_path, capsys):
    ck = tmp_path / "ck.npz"
    first = _json(capsys, ["bound", good, "--lam", "0.5", "--checkpoint", ck, "--json", "--no-progress"])
    assert ck.is_file()
    again = _json(capsys, ["bound", good, "--lam", "0.5", "--checkpoint", ck, "--json", "--no-progress"])
    assert again["lower_bound"] == pytest.approx(first["lower_bound"], rel=1e-12)
    assert not list(tmp_path.glob(".*probe*")) and not list(tmp_path.glob("*.tmp"))  # the write test left nothing


# --------------------------------------------------------------------------------------
# --width above the number of points
# --------------------------------------------------------------------------------------


def test_width_above_n_refused(good, capsys, X):
    err = one_line_error(capsys, ["solve", good, "--lam", "0.5", "--width", "1000000000000"])
    assert "--width 1000000000000 exceeds the number of points N = 8" in err, err
    with pytest.raises(ValueError, match=r"width=1000000000000 exceeds the number of points N = 8 "
                                         r"\(width must be <= N\)"):
        wl.solve(X, lam=0.5, width=10**12)
    with pytest.raises(ValueError, match="width=9 exceeds"):
        wl.solve(X, lam=0.5, width=9)


# --------------------------------------------------------------------------------------
# --width with --signed
# --------------------------------------------------------------------------------------


def test_width_with_signed_is_refused(good, capsys, X):
    err = one_line_error(capsys, ["solve", good, "--lam", "0.5", "--width", "2", "--signed"])
    assert "--width and --signed cannot be combined: the finite-width search supports nonnegative codes" in err, err
    assert "--signed False" not in err, err
    with pytest.raises(ValueError, match="width= cannot be combined with signed=True"):
        wl.solve(X, lam=0.5, width=2, signed=True)


# --------------------------------------------------------------------------------------
# an SAE config's l1_coefficient: the file and the field are blamed, not a flag
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-3, 0, 1e-320])
def test_bad_l1_coefficient_in_cfg_names_the_file_and_field(sae_dir, capsys, value):
    sae, acts = sae_dir
    cfg_path = Path(sae) / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["l1_coefficient"] = value
    cfg_path.write_text(json.dumps(cfg))
    needle = "must be a positive finite number" if value <= 0 else "(half of it is lam, which must be a normal float64)"
    err = one_line_error(capsys, ["certify", acts, sae])
    assert f"{cfg_path}: field 'l1_coefficient' must be" in err, err
    assert needle in err, err
    assert not any(s in err for s in ("--l1-coefficient",)), err


def test_bad_l1_in_metadata_names_the_file_and_field(sae_dir, capsys):
    sae, acts = sae_dir
    cfg_path = Path(sae) / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("metadata", {})["training_architecture_details"] = {"l1_coefficient": -3}
    cfg_path.write_text(json.dumps(cfg))
    err = one_line_error(capsys, ["certify", acts, sae])
    assert "field 'metadata.training_architecture_details.l1_coefficient' must be a positive finite number" in err, err
    assert not any(s in err for s in ("--l1-coefficient",)), err


# --------------------------------------------------------------------------------------
# lam below the smallest normal float64
# --------------------------------------------------------------------------------------


def test_subnormal_lam_refused(good, capsys, sae_dir, X):
    for cmd in ("solve", "bound"):
        err = one_line_error(capsys, [cmd, good, "--lam", "1e-320"])
        assert f"argument --lam: must be at least {TINY!r} (the smallest normal float64" in err, err
        assert not any(s in err for s in ("inconsistent certificate",)), err
    sae, acts = sae_dir
    err = one_line_error(capsys, ["certify", acts, sae, "--lam", "1e-320"])
    assert "argument --lam: must be at least" in err, err
    err = one_line_error(capsys, ["fit", good, "--lam", "1e-320", "--width", "1"])
    assert "lam must be at least" in err, err
    for fn in (lambda: wl.solve(X, lam=1e-320), lambda: wl.huber_median(X, lam=5e-324)):
        with pytest.raises(ValueError, match="lam must be at least"):
            fn()


def test_the_smallest_accepted_lam_works_end_to_end(good, capsys, X):
    """At lam = the smallest normal float64 every point is beyond lam: the Huber median is the geometric
    median and the bound is 2 lam times its mean distance (theory.md §3), computed without error."""
    geo = wl.geometric_median(X)
    d = _json(capsys, ["solve", good, "--lam", repr(TINY), "--json", "--no-progress"])
    assert d["lam"] == TINY and d["width"] == 8 and d["n_points"] == 8
    assert d["lower_bound"] == pytest.approx(2 * TINY * geo.value, rel=1e-9)
    assert d["lower_bound"] <= d["value"]
    np.testing.assert_allclose(d["bias"], geo.point, rtol=1e-9, atol=1e-12)
    b = _json(capsys, ["bound", good, "--lam", repr(TINY), "--json", "--no-progress"])
    assert b["certified"] and b["value"] == pytest.approx(2 * TINY * geo.value, rel=1e-9)
    assert b["lower_bound"] <= b["value"] and b["lower_bound"] == pytest.approx(b["value"], rel=1e-9)


# --------------------------------------------------------------------------------------
# NaN / Inf: the file named by every subcommand; CSV by line and column, arrays by 0-based row
# --------------------------------------------------------------------------------------

NAN_CMDS = [["solve", "--lam", "0.5"], ["bound", "--lam", "0.5"], ["fit", "--lam", "0.5", "--width", "1"],
            ["frontier", "--lam", "0.5", "--widths", "1"], ["relax", "--lam", "0.5"]]


@pytest.mark.parametrize("argv", NAN_CMDS, ids=[a[0] for a in NAN_CMDS])
def test_nonfinite_npy_names_the_file_and_a_0_based_row(tmp_path, capsys, X, argv):
    Y = X.copy()
    Y[2, 1] = np.nan
    np.save(tmp_path / "nan.npy", Y)
    err = one_line_error(capsys, [argv[0], tmp_path / "nan.npy", *argv[1:]])
    assert "nan.npy: non-finite value (NaN) in row 2 (0-based)" in err, err


@pytest.mark.parametrize("argv", NAN_CMDS, ids=[a[0] for a in NAN_CMDS])
def test_nonfinite_csv_names_line_and_column(tmp_path, capsys, X, argv):
    lines = ["x,y"] + [_csv(r) for r in X[:3]] + ["", "# a comment", f"{float(X[3, 0])!r},inf"] + \
        [_csv(r) for r in X[4:]]
    (tmp_path / "inf.csv").write_text("\n".join(lines) + "\n")
    # data row 3 (0-based) is on line 7 of the file, after the header, a blank line and a comment
    err = one_line_error(capsys, [argv[0], tmp_path / "inf.csv", *argv[1:]])
    assert "inf.csv: line 7, column 2: 'inf' is not a finite number" in err, err


def test_shards_of_a_folder_name_the_shard(tmp_path, capsys, X):
    (tmp_path / "acts").mkdir()
    Y = X.copy()
    Y[5, 0] = np.inf
    np.save(tmp_path / "acts" / "part_1.npy", Y[:4])
    np.save(tmp_path / "acts" / "part_2.npy", Y[4:])
    err = one_line_error(capsys, ["solve", tmp_path / "acts", "--lam", "0.5"])
    assert "part_2.npy: non-finite value (Inf) in row 1 (0-based; row 5 of " in err, err


def test_api_rows_are_0_based(X):
    Y = X.copy()
    Y[2, 0] = np.inf
    with pytest.raises(ValueError, match=r"X has a non-finite value \(Inf\) in row 2 \(0-based\)"):
        wl.verify(Y, np.eye(2), np.zeros((8, 2)), np.zeros(2), lam=0.5)


# --------------------------------------------------------------------------------------
# data too large to square in float64
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["solve", "--lam", "0.5"], ["bound", "--lam", "0.5"],
                                  ["fit", "--lam", "0.5", "--width", "2"], ["relax", "--lam", "0.5"]])
def test_huge_data_refused_naming_file_and_row(tmp_path, capsys, X, argv):
    Y = X.copy()
    Y[3] *= 1e200
    np.save(tmp_path / "huge.npy", Y)
    err = one_line_error(capsys, [argv[0], tmp_path / "huge.npy", *argv[1:]])
    assert "huge.npy: values too large to square in float64 in row 3 (0-based)" in err, err
    assert "above 2^565" in err, err
    assert not any(s in err for s in ("learning rate",)), err


def test_huge_data_refused_by_the_api(X):
    with pytest.raises(ValueError, match=r"X has values too large to square in float64 in row 0 \(0-based\)"):
        wl.solve(X * 1e200, lam=0.5)
    with pytest.raises(ValueError, match="too large to square"):
        wl.fit_dictionary(X * 1e200, lam=0.5, width=2)


def test_csv_huge_row_named_by_line(tmp_path, capsys, X):
    (tmp_path / "h.csv").write_text("\n".join(_csv(r) for r in X[:2]) + "\n1e200,1\n")
    err = one_line_error(capsys, ["solve", tmp_path / "h.csv", "--lam", "0.5"])
    assert "h.csv: line 3: values too large to square in float64" in err, err


def test_just_below_the_limit_is_solved(tmp_path, capsys, X):
    """Rows up to 2^565 are accepted: the passes run rescaled by a power of two, and at a lam where the
    objective fits in float64 the bound is right (2 lam times the geometric median's value)."""
    X0 = X / np.linalg.norm(X, axis=1).max()
    s = 0.99 * LIMIT
    Y = X0 * s
    assert s * np.linalg.norm(X0, axis=1).max() < LIMIT
    np.save(tmp_path / "big.npy", Y)
    lam = s * 1e-40  # every point beyond lam; the objective about 2 lam |x| ~ 1e300
    geo = wl.geometric_median(X0)
    b = _json(capsys, ["bound", tmp_path / "big.npy", "--lam", repr(lam), "--json", "--no-progress"])
    assert b["certified"] and b["lower_bound"] == pytest.approx(2 * lam * s * geo.value, rel=1e-9)
    d = _json(capsys, ["solve", tmp_path / "big.npy", "--lam", repr(lam), "--json", "--no-progress"])
    assert np.isfinite(d["value"]) and d["lower_bound"] <= d["value"]
    assert d["lower_bound"] == pytest.approx(b["lower_bound"], rel=1e-9)
    # just above: refused
    np.save(tmp_path / "above.npy", X0 * (1.01 * LIMIT))
    err = one_line_error(capsys, ["bound", tmp_path / "above.npy", "--lam", repr(lam)])
    assert "too large to square in float64" in err, err


def test_rows_above_1e154_are_solved_where_the_objective_fits(tmp_path, capsys, X):
    """Squares of rows above sqrt(max float64) overflow, yet the rescaled solve certifies them when the
    objective fits in float64; where it does not (lam too large), one line instead of value null (the
    library refuses to return an infinite value as certified)."""
    X0 = X / np.linalg.norm(X, axis=1).max()
    s = 2.0**520  # about 3.4e156
    np.save(tmp_path / "big.npy", X0 * s)
    ref = wl.solve(X0, lam=1e-10)
    d = _json(capsys, ["solve", tmp_path / "big.npy", "--lam", repr(1e-10 * s), "--json", "--no-progress"])
    assert d["certified"] and d["value"] / s / s == pytest.approx(ref.value, rel=1e-9) and d["width"] == ref.width
    for cmd in ("solve", "bound"):
        err = one_line_error(capsys, [cmd, tmp_path / "big.npy", "--lam", repr(0.5 * s)])
        assert "the objective of these data is about" in err, err
        assert "beyond the float64 range" in err, err
        assert "divide X and lam by the same power of two" in err, err
        assert not any(s in err for s in ("null",)), err


# --------------------------------------------------------------------------------------
# a file named .pt that is not a torch file
# --------------------------------------------------------------------------------------


def test_text_named_pt_is_refused(tmp_path, capsys):
    (tmp_path / "text.pt").write_text("1,2\n3,4\n")
    err = one_line_error(capsys, ["solve", tmp_path / "text.pt", "--lam", "0.5"])
    assert "text.pt: not a torch tensor file (neither a zip archive nor a pickle" in err, err
    assert not any(s in err for s in ("Unsupported operand", "Python objects")), err
    (tmp_path / "empty.pt").write_bytes(b"")
    err = one_line_error(capsys, ["bound", tmp_path / "empty.pt", "--lam", "0.5"])
    assert "empty.pt: empty file, not a torch tensor file" in err, err


def test_real_torch_files_still_read(tmp_path, X):
    torch.save(torch.tensor(X), tmp_path / "zip.pt")
    torch.save(torch.tensor(X), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    for name in ("zip.pt", "legacy.pt"):
        np.testing.assert_array_equal(np.asarray(wl.open_activations(tmp_path / name)), X)


def test_bound_geometric_refuses_lam(tmp_path, capsys, X):
    """--geometric computes a median with no lam: a --lam given with it is refused, not dropped."""
    np.save(tmp_path / "good.npy", X)
    err = one_line_error(capsys, ["bound", tmp_path / "good.npy", "--geometric", "--lam", "0.5"])
    assert "--lam applies only without --geometric" in err, err
    assert main(["bound", str(tmp_path / "good.npy"), "--geometric", "--json", "--no-progress"]) == 0
