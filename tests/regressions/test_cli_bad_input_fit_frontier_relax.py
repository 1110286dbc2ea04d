"""Bad input to ``fit``, ``frontier``, ``relax`` and ``relax-bench``: one line naming the flag and the value, status 2.

The project rule: bad input gets a one-line error that says what is wrong and where, exit status 2
on the CLI, never a traceback and never a silent default. Each test below is one reviewed defect,
named by the behaviour it checks; each failed before its fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from widelimit.cli import main
from widelimit.relax.families import make_bench_instance
from fixtures.cli import one_line_error


@pytest.fixture
def good(tmp_path) -> str:
    """Small data: 8 points in 3-D."""
    path = tmp_path / "good.npy"
    np.save(path, np.random.default_rng(0).standard_normal((8, 3)))
    return str(path)


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------------------
# relax --device: refused with the cvxpy solvers, checked with TORCH
# --------------------------------------------------------------------------------------


def test_relax_device_refused_without_torch(good, capsys):
    err = one_line_error(capsys, ["relax", good, "--lam", "0.5", "--device", "bogus"])
    assert "--device applies only with --solver TORCH" in err and "bogus" in err, err
    err = one_line_error(capsys, ["relax", good, "--lam", "0.5", "--solver", "clarabel", "--device", "cpu"])
    assert "--device applies only with --solver TORCH" in err and "--device cpu" in err, err


def test_relax_device_checked_with_torch(good, capsys):
    err = one_line_error(capsys, ["relax", good, "--lam", "0.5", "--solver", "torch", "--device", "bogus"])
    assert "--device must be" in err and "'bogus'" in err, err


def test_fit_device_checked_before_the_data(good, capsys):
    err = one_line_error(capsys, ["fit", good, "--lam", "0.5", "--width", "2", "--device", "bogus"])
    assert "--device must be" in err and "'bogus'" in err, err


# --------------------------------------------------------------------------------------
# fit --encoder topk needs --topk; the k used is shown
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [["fit", "--width", "2"], ["frontier", "--widths", "1,2"]])
def test_topk_encoder_without_topk_is_refused(good, capsys, cmd):
    argv = [cmd[0], good, "--lam", "0.5", *cmd[1:], "--encoder", "topk"]
    err = one_line_error(capsys, argv)
    assert "--encoder topk needs --topk" in err, err


@pytest.mark.parametrize("cmd,needles", [
    (["fit", "--width", "2"], ["--topk must be at most --width 2", "--topk 3"]),
    (["frontier", "--widths", "2,1"], ["--topk must be at most the smallest of --widths, 1", "--topk 3"]),
])
def test_topk_beyond_the_width_is_refused(good, capsys, cmd, needles):
    err = one_line_error(capsys, [cmd[0], good, "--lam", "0.5", *cmd[1:], "--encoder", "topk", "--topk", "3"])
    assert all(s in err for s in needles), err


def test_topk_shown_in_table_and_json(good, capsys):
    argv = ["fit", good, "--lam", "0.5", "--width", "2", "--encoder", "topk", "--topk", "1", "--max-iter", "5",
            "--device", "cpu"]
    assert main(argv) == 0
    assert "topk (k = 1)" in capsys.readouterr().out
    assert _json(capsys, [*argv, "--json"])["encoder_k"] == 1


# --------------------------------------------------------------------------------------
# relax-bench parameters: integers, ranges, sizes, --seed
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,needles", [
    (["--family", "rays", "--param", "n_rays=2.5", "--json"], ["--param n_rays must be an integer", "got 2.5"]),
    (["--family", "random", "--param", "dim=2.7", "--json"], ["--param dim must be an integer", "got 2.7"]),
    (["--family", "rays", "--param", "n_rays=1.5"], ["--param n_rays must be an integer", "got 1.5"]),
    (["--family", "ties", "--param", "copies=2.5"], ["--param copies must be an integer", "got 2.5"]),
    (["--family", "rays", "--param", "n_rays=1000000000"], ["--param n_rays", "N = 10", "got 1000000000"]),
    (["--family", "ties", "--param", "copies=11"], ["--param copies", "N = 10", "got 11"]),
    (["--family", "scaled", "--param", "decades=-1"], ["--param decades", "[0, 100]", "got -1"]),
    (["--family", "scaled", "--param", "decades=1000"], ["--param decades", "[0, 100]", "got 1000"]),
    (["--family", "scaled", "--param", "magnitude=200"], ["--param magnitude", "[-100, 100]", "got 200"]),
    (["--family", "rays", "--param", "lam=1e300"], ["--param lam", "[0.001, 1000]", "got 1e+300"]),
    (["--family", "collinear", "--param", "gap=1e300"], ["--param gap", "[0, 1000]", "got 1e+300"]),
    (["--N", "1000000000"], ["--N must be at most 3000", "got 1000000000"]),
    (["--param", "dim=1e9"], ["--param dim must be at most 1000", "got 1e9"]),
    (["--param", "dim=3", "--param", "dim=4"], ["--param dim is given twice", "dim=4"]),
    (["--seed", "-1"], ["--seed", "must be an integer >= 0, got -1"]),
])
def test_bad_relax_bench_parameters_are_refused(capsys, argv, needles):
    err = one_line_error(capsys, ["relax-bench", *argv])
    assert all(s in err for s in needles) and not any(s in err for s in ["got 1\n", "got 2\n", "got inf"]), err


def test_bad_family_parameters_are_refused_by_the_api():
    with pytest.raises(ValueError, match=r"^n_rays must be an integer, got 2.5$"):
        make_bench_instance("rays", 10, n_rays=2.5)
    with pytest.raises(ValueError, match=r"n_rays must be at most N = 10 .*got 12$"):
        make_bench_instance("rays", 10, n_rays=12)
    with pytest.raises(ValueError, match=r"decades must be a number in \[0, 100\], got -1$"):
        make_bench_instance("scaled", 10, decades=-1)
    # an integral float is the integer, and n_rays = N (one point per ray) is allowed
    assert make_bench_instance("rays", 6, n_rays=6.0).params["n_rays"] == 6


# --------------------------------------------------------------------------------------
# flags given but unused are refused
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd,argv,needles", [
    ("fit", ["--width", "2", "--lr", "0.01"], ["--lr applies only with --encoder", "--encoder none"]),
    ("fit", ["--width", "2", "--topk", "1"], ["--topk applies only with --encoder topk", "--encoder none"]),
    ("frontier", ["--widths", "1,2", "--lr", "0.01"], ["--lr applies only with --encoder"]),
    ("frontier", ["--widths", "1,2", "--exact-time-limit", "5"],
     ["--exact-time-limit applies only with --exact", "--exact-time-limit 5"]),
])
def test_unused_fit_flags_are_refused(good, capsys, cmd, argv, needles):
    err = one_line_error(capsys, [cmd, good, "--lam", "0.5", *argv])
    assert all(s in err for s in needles), err


@pytest.mark.parametrize("argv,needles", [
    (["--format", "cbf"], ["--format applies only with --export", "--format cbf"]),
    (["--cone", "nonneg"], ["--cone applies only with --export", "--cone nonneg"]),
])
def test_unused_relax_bench_flags_are_refused(capsys, argv, needles):
    err = one_line_error(capsys, ["relax-bench", *argv])
    assert all(s in err for s in needles), err


# --------------------------------------------------------------------------------------
# lists: no empty items, no duplicates
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("widths,needles", [
    ("1,,2", ["--widths has an empty item", "'1,,2'"]),
    ("1,2,", ["--widths has an empty item", "'1,2,'"]),
    ("1,1", ["--widths lists 1 twice", "'1,1'"]),
])
def test_frontier_widths_with_empty_or_repeated_items_are_refused(good, capsys, widths, needles):
    err = one_line_error(capsys, ["frontier", good, "--lam", "0.5", "--widths", widths])
    assert all(s in err for s in needles), err


@pytest.mark.parametrize("argv,needles", [
    (["--N", "10,"], ["--N has an empty item", "'10,'"]),
    (["--N", "10,10"], ["--N lists 10 twice", "'10,10'"]),
    (["--family", "random,,rays"], ["--family has an empty item", "'random,,rays'"]),
    (["--family", "rays,rays"], ["--family lists rays twice", "'rays,rays'"]),
])
def test_relax_bench_lists_with_empty_or_repeated_items_are_refused(capsys, argv, needles):
    err = one_line_error(capsys, ["relax-bench", *argv])
    assert all(s in err for s in needles), err


# --------------------------------------------------------------------------------------
# --exact-time-limit checked at parse time, by its flag
# --------------------------------------------------------------------------------------


def test_negative_exact_time_limit_is_refused_at_parse_time(good, capsys):
    argv = ["frontier", good, "--lam", "0.5", "--widths", "1,2", "--exact", "--exact-time-limit", "-1"]
    err = one_line_error(capsys, argv)
    assert "argument --exact-time-limit" in err and "got -1" in err and not any(s in err for s in ["time_limit"]), err


# --------------------------------------------------------------------------------------
# echo what the user typed; a file is not a folder
# --------------------------------------------------------------------------------------


def test_relax_solver_echoed_as_typed(good, capsys):
    err = one_line_error(capsys, ["relax", good, "--lam", "0.5", "--solver", "bogus"])
    assert "--solver" in err and "'bogus'" in err and not any(s in err for s in ["BOGUS"]), err


def test_relax_bench_export_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "good.csv"
    f.write_text("1,2\n3,4\n")
    err = one_line_error(capsys, ["relax-bench", "--export", str(f)])
    assert "--export" in err, err
    assert "good.csv" in err, err
    assert "is a file" in err, err
    assert not any(s in err for s in ["folder 'good.csv'", "not empty"]), err
    assert f.read_text() == "1,2\n3,4\n"


# --------------------------------------------------------------------------------------
# frontier records the plot's final path
# --------------------------------------------------------------------------------------


def test_frontier_records_the_final_plot_path(good, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = _json(capsys, ["frontier", good, "--lam", "0.5", "--widths", "1,2", "--out", "fr", "--json",
                       "--max-iter", "5", "--restarts", "1", "--device", "cpu"])
    assert d["plot"] == os.path.join("fr", "frontier.png") and Path(d["plot"]).is_file()
    assert json.loads(Path("fr/frontier.json").read_text())["plot"] == d["plot"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr", "good.npy"]  # no temporary folder left


# --------------------------------------------------------------------------------------
# fit says when the batch is the whole data
# --------------------------------------------------------------------------------------


def test_fit_batch_at_least_n_is_the_full_data(good, capsys):
    argv = ["fit", good, "--lam", "0.5", "--width", "2", "--batch-size", "100", "--max-iter", "5", "--device", "cpu"]
    d = _json(capsys, [*argv, "--json"])
    assert d["batch_size"] == 8 and d["full_batch"] is True
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.replace("\u2502", " ").split())  # the table's text, unwrapped
    assert "full data" in out and "--batch-size 100 >= N = 8" in out
