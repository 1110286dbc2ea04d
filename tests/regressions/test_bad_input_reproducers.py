"""The reproducers of issue 13 (items 5, 7, 8, 9, 10 and the input-handling ones), one row each, named by
the behaviour it checks: the documented outcome (the exception type, the exit status, the one line and what it
names); each failed before its fix. The documented types: :class:`widelimit.DataError` for files,
``ValueError`` for parameters (``DataError`` is one), exit status 2 with one line on stderr for the CLI, 130
for Ctrl-C.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import widelimit as wl

from fixtures.cli import cli, cli_error, one_line

REPO = Path(__file__).resolve().parents[2]

# ======================================================================================
# the reproducers of issue 13, one row each, named by the behaviour it checks
# ======================================================================================


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def csv_bad_first_row(tmp, capsys, files):
    p = _write(tmp / "b.csv", "1,2,oops\n4,5,6\n7,8,9\n10,11,12\n")
    line = cli_error(capsys, "solve", p, "--lam", "1", "--json")
    assert "line 1, column 3: 'oops' is not a number" in line


def csv_header_only_when_all_fields_are_text(tmp, capsys, files):
    X = np.array([[4.0, 5, 6], [7, 8, 9], [10, 11, 12]])
    p = _write(tmp / "h.csv", "a,b,c\n4,5,6\n7,8,9\n10,11,12\n")
    rc, out, err = cli(capsys, "solve", p, "--lam", "1", "--json")
    assert rc == 0 and err == ""
    d = json.loads(out)
    assert d["n_points"] == 3 and d["value"] == pytest.approx(wl.solve(X, lam=1.0).value, rel=1e-14)


def csv_header_when_asked(tmp, capsys, files):
    p = _write(tmp / "n.csv", "1,2,3\n4,5,6\n7,8,9\n10,11,12\n")
    rc, out, _ = cli(capsys, "solve", p, "--lam", "1", "--json", "--header")
    assert rc == 0 and json.loads(out)["n_points"] == 3
    rc, out, _ = cli(capsys, "solve", p, "--lam", "1", "--json")
    assert rc == 0 and json.loads(out)["n_points"] == 4


def csv_malformed_row_names_line_and_column(tmp, capsys, files):
    p = _write(tmp / "m.csv", "x,y\n1,2\n\n3,,4\n")
    assert "line 4, column 2: '' is not a number" in cli_error(capsys, "bound", p, "--lam", "1")
    p = _write(tmp / "r.csv", "1,2\n3,4,5\n")
    assert "line 2 has 3 fields, line 1 has 2" in cli_error(capsys, "solve", p, "--lam", "1")
    p = _write(tmp / "w.txt", "1 2\n3 four\n")
    assert "line 2, column 2: 'four'" in cli_error(capsys, "solve", p, "--lam", "1")


def masked_array_refused(tmp, capsys, files):
    X = np.ma.masked_array(files["X"], mask=np.zeros(files["X"].shape, bool))
    X.mask[5, 1] = True
    for call in (lambda: wl.solve(X, lam=1.0), lambda: wl.huber_median(X, lam=1.0),
                 lambda: wl.ActivationSource.from_array(X)):
        with pytest.raises(ValueError, match=r"masked array with masked entries \(first in row 5\)"):
            call()
    X.mask[:] = False  # no masked entry: the data are used as they are
    assert wl.huber_median(X, lam=1.0).value == wl.huber_median(files["X"], lam=1.0).value


def fit_width_above_n(tmp, capsys, files):
    line = cli_error(capsys, "fit", files["good"], "--lam", "1", "--width", "400")
    assert "--width 400 exceeds the number of points N = 200" in line
    with pytest.raises(ValueError, match="width=400 exceeds the number of points N = 200"):
        wl.fit_dictionary(np.load(files["good"]), lam=1.0, width=400)


def fit_huge_learning_rate(tmp, capsys, files):
    line = cli_error(capsys, "fit", files["good"], "--lam", "1", "--width", "3", "--encoder", "standard", "--lr", "1e10")
    assert "lower the learning rate" in line


def checkpoint_meta_is_a_list(tmp, capsys, files):
    ck = tmp / "ck.npz"
    np.savez(ck, __meta__=np.frombuffer(json.dumps([1, 2]).encode(), dtype=np.uint8))
    line = cli_error(capsys, "bound", files["npy"], "--lam", "1", "--checkpoint", ck)
    assert "not a widelimit checkpoint (its __meta__ is a JSON list" in line
    with pytest.raises(ValueError, match="__meta__ is a JSON list"):
        wl.huber_median(files["X"], lam=1.0, checkpoint=ck)


def api_parameters(tmp, capsys, files):
    X = files["X"]
    cases = [
        (lambda: wl.huber_median(X, lam=1.0, hess_rows=0), "hess_rows must be an integer >= 1, got 0"),
        (lambda: wl.huber_median(X, lam=1.0, seed="abc"), "seed must be an integer >= 0, got str 'abc'"),
        (lambda: wl.fit_dictionary(X, lam=1.0, width=2, seed="abc"), "seed must be an integer >= 0"),
        (lambda: wl.solve_dnn(X, lam=1.0, Q0=np.full((30, 30), np.nan)), "Q0 has a non-finite value in row 0"),
        (lambda: wl.solve_dnn(X, lam=1.0, check_every=0), "check_every must be an integer >= 1, got 0"),
        (lambda: wl.verify(X, np.eye(4), np.zeros((30, 4)), np.zeros(4), lam=1.0, median="x"),
         "median must be a MedianResult (widelimit.huber_median) or None, got str 'x'"),
        (lambda: wl.ActivationSource.open(None), "path must be a file or folder path"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert msg in one_line(str(e.value))


def ctrl_c_leaves_nothing_half_written(tmp, capsys, files, monkeypatch):
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


def ctrl_c_swallowed_by_a_finaliser(tmp, capsys, files):
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


def dask_local_zero_workers(tmp, capsys, files):
    pytest.importorskip("distributed")
    line = cli_error(capsys, "bound", files["npy"], "--lam", "1", "--dask", "local:0")
    assert "--dask local:0: a local cluster needs at least 1 worker" in line
    assert "expected 'local', 'local:N'" in cli_error(capsys, "bound", files["npy"], "--lam", "1", "--dask", "nonsense")


def dask_unreachable_scheduler_times_out(tmp, capsys, files):
    pytest.importorskip("distributed")
    line = cli_error(capsys, "bound", files["npy"], "--lam", "1", "--dask", "tcp://127.0.0.1:9", "--dask-timeout", "1")
    assert "could not reach the scheduler within 1 s" in line


def out_is_a_file_checked_before_computing(tmp, capsys, files, monkeypatch):
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


def pt_weights_only_advice_rephrased(tmp, capsys, files):
    torch.save({"acts": Payload()}, tmp / "evil.pt")
    for cmd in ("solve", "bound"):
        line = cli_error(capsys, cmd, tmp / "evil.pt", "--lam", "1")
        assert "refused to unpickle" in line and "weights_only" not in line, line


def state_json_outside_the_cache(tmp, capsys, files):
    c = tmp / "cache"
    c.mkdir()
    for name in ("/etc/passwd", "../x.arrow", str(files["dir"] / "x.arrow")):  # a real file outside, with or without pyarrow
        (c / "state.json").write_text(json.dumps({"_data_files": [{"filename": name}]}))
        with pytest.raises(wl.DataError, match="lies outside the cache folder"):
            wl.open_activations(c)
    (c / "state.json").write_text(json.dumps({"_data_files": [{"filename": "/etc/passwd"}]}))
    assert "outside the cache folder" in cli_error(capsys, "bound", c, "--lam", "1")


def npy_negative_shape(tmp, capsys, files):
    p = tmp / "neg.npy"
    with open(p, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (-5, 4)})
        f.write(b"\0" * 256)
    with pytest.raises(wl.DataError, match=r"shape \(-5, 4\) has a negative"):
        wl.open_activations(p)
    for cmd in ("bound", "solve"):
        assert "has a negative" in cli_error(capsys, cmd, p, "--lam", "1")


def safetensors_offsets_not_at_zero(tmp, capsys, files):
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


def newline_in_file_name(tmp, capsys, files):
    p = tmp / "new\nline.csv"
    p.write_text("1,2\n3,x\n")
    line = cli_error(capsys, "solve", p, "--lam", "1")
    assert "new\\nline.csv': line 2, column 2" in line, line
    assert "missing\\nfile.npy': no such file" in cli_error(capsys, "solve", tmp / "missing\nfile.npy", "--lam", "1")


def symlink_loop(tmp, capsys, files):
    (tmp / "loop").symlink_to(tmp / "loop")
    assert "symlink loop" in cli_error(capsys, "solve", tmp / "loop", "--lam", "1")
    (tmp / "dangling").symlink_to(tmp / "nowhere.npy")
    assert "broken symlink" in cli_error(capsys, "bound", tmp / "dangling", "--lam", "1")


def messages_name_the_flags(tmp, capsys, files):
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
    line = cli_error(capsys, "certify", tmp / "acts.npy", tmp / "sae", "--lam", "0.5")
    assert "--norm-scaling-factor" in line and "norm_scaling_factor" not in line, line


def no_warnings_in_normal_use(tmp, capsys, files):
    ro = np.load(files["good"], mmap_mode="r")  # read-only: torch warned on every fit of a .npy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wl.fit_dictionary(ro, lam=1.0, width=3, max_iter=5)
        for argv in (["fit", files["good"], "--lam", "1", "--width", "3", "--max-iter", "5", "--json"],
                     ["solve", files["pt"], "--lam", "1", "--json"], ["bound", files["pt"], "--lam", "1", "--json"],
                     ["bound", files["safetensors"], "--lam", "1", "--json"]):
            rc, out, err = cli(capsys, *argv)
            assert rc == 0 and err == "", (argv, err)


def cli_flags_refuse_nan_inf_negative(tmp, capsys, files):
    for argv, flag in [(["certify", files["npy"], "x", "--lam", "1", "--tol", "-1"], "--tol"),
                       (["certify", files["npy"], "x", "--lam", "1", "--tol", "nan"], "--tol"),
                       (["certify", files["npy"], "x", "--lam", "1", "--norm-scaling-factor", "-1"], "--norm-scaling-factor"),
                       (["solve", files["npy"], "--lam", "inf"], "--lam"),
                       (["fit", files["npy"], "--lam", "1", "--width", "0"], "--width"),
                       (["fit", files["npy"], "--lam", "1", "--width", "2", "--seed", "abc"], "--seed"),
                       (["relax", files["npy"], "--lam", "1", "--tol", "-1"], "--tol"),
                       (["bound", files["npy"], "--lam", "1", "--rows", "0"], "--rows")]:
        assert f"argument {flag}:" in cli_error(capsys, *argv)


def unexpected_exception_is_one_line(tmp, capsys, files, monkeypatch):
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


def sae_config_string_field(tmp, capsys, files):
    d = _sae_cfg(tmp, d_sae="abc")
    with pytest.raises(ValueError, match=r"cfg\.json.*d_sae"):
        wl.load_sae(d)


def sae_config_wrongly_typed_field(tmp, capsys, files):
    d = _sae_cfg(tmp, d_in=[12])
    with pytest.raises(ValueError, match=r"cfg\.json.*d_in"):
        wl.load_sae(d)


def sae_config_json_boolean_only_as_boolean(tmp, capsys, files):
    d = _sae_cfg(tmp, apply_b_dec_to_input="false")
    with pytest.raises(ValueError, match=r"cfg\.json.*apply_b_dec_to_input"):
        wl.load_sae(d)


REPRODUCERS = [
    csv_bad_first_row, csv_header_only_when_all_fields_are_text, csv_header_when_asked,
    csv_malformed_row_names_line_and_column, masked_array_refused,
    fit_width_above_n, fit_huge_learning_rate, checkpoint_meta_is_a_list, api_parameters,
    ctrl_c_leaves_nothing_half_written, ctrl_c_swallowed_by_a_finaliser, dask_local_zero_workers,
    dask_unreachable_scheduler_times_out, out_is_a_file_checked_before_computing,
    pt_weights_only_advice_rephrased, state_json_outside_the_cache, npy_negative_shape,
    safetensors_offsets_not_at_zero, newline_in_file_name, symlink_loop, messages_name_the_flags,
    no_warnings_in_normal_use, cli_flags_refuse_nan_inf_negative, unexpected_exception_is_one_line,
    sae_config_string_field, sae_config_wrongly_typed_field, sae_config_json_boolean_only_as_boolean,
]


@pytest.mark.parametrize("case", REPRODUCERS,
                         ids=[c.__name__ for c in REPRODUCERS])
def test_bad_input_gets_its_documented_outcome(case, tmp_path, capsys, files, monkeypatch):
    import inspect

    kw = {"monkeypatch": monkeypatch} if "monkeypatch" in inspect.signature(case).parameters else {}
    # each reproducer asserts the right answer or the one-line error itself and returns None
    # when every check of it passed (an AssertionError inside fails this test)
    assert case(tmp_path, capsys, files, **kw) is None


def test_certify_and_bound_read_a_folder_of_shards_alike(tmp_path, capsys):
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
        rc, out, err = cli(capsys, "certify", tmp_path / name, tmp_path / "sae", "--lam", "0.5", "--json",
                           "--no-progress")
        assert rc == 0 and err == "", err
        got[name] = json.loads(out)
    for k in ("n_points", "sae_objective", "optimal_code_objective", "lower_bound", "global_gap"):
        assert got["shards"][k] == got["all.npy"][k], k
    assert got["all.npy"]["n_points"] == X.shape[0]
