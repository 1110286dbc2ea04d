import json
import pickle

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from widelimit.cli import main

KEYS = {"value", "lower_bound", "gap", "certified", "width", "bias", "lam", "n_points", "dim"}


def _json(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out  # exactly one JSON object
    return json.loads(lines[0])


@pytest.fixture
def data(rng):
    return rng.standard_normal((30, 4))


@pytest.mark.parametrize("fmt", ["npy", "npz", "csv", "safetensors", "pt"])
def test_solve_reads_every_format(tmp_path, capsys, data, fmt):
    path = tmp_path / f"x.{fmt}"
    extra = []
    if fmt == "npy":
        np.save(path, data)
    elif fmt == "npz":
        np.savez(path, acts=data, other=data[:2])
        extra = ["--key", "acts"]
    elif fmt == "csv":
        np.savetxt(path, data, delimiter=",")
    elif fmt == "safetensors":
        save_file({"acts": data.astype(np.float32)}, str(path))
    else:
        torch.save({"acts": torch.tensor(data)}, path)
    d = _json(capsys, ["solve", str(path), "--lam", "0.5", "--json", *extra])
    assert KEYS <= d.keys()
    assert d["certified"] is True and d["n_points"] == 30 and d["dim"] == 4 and d["lam"] == 0.5
    assert d["gap"] <= 1e-9 * d["value"]


def test_solve_builtin_and_out(tmp_path, capsys):
    d = _json(capsys, ["solve", "rays", "--json", "--out", str(tmp_path / "o")])
    assert d["width"] == 6 and d["certified"]
    for f in ("solution.npz", "solution.json", "solution.png"):
        assert (tmp_path / "o" / f).stat().st_size > 0
    z = np.load(tmp_path / "o" / "solution.npz")
    assert z["dictionary"].shape == (6, 10)


def test_human_table(capsys):
    assert main(["solve", "collinear", "--lam", "1"]) == 0
    out = capsys.readouterr().out
    assert "lower bound" in out and "certified" in out


def test_demo(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "certified" in out and "geometric median" in out
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def _err(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert len(err.splitlines()) == 1, err
    return err


def test_cli_errors(tmp_path, capsys, data):
    assert "no such file" in _err(capsys, ["solve", str(tmp_path / "nope.npy"), "--lam", "1"])
    np.savez(tmp_path / "two.npz", a=data, b=data)
    assert "--key" in _err(capsys, ["solve", str(tmp_path / "two.npz"), "--lam", "1"])
    assert "no array named 'c'" in _err(capsys, ["solve", str(tmp_path / "two.npz"), "--lam", "1", "--key", "c"])
    bad = data.copy()
    bad[7, 2] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    assert "row 7" in _err(capsys, ["solve", str(tmp_path / "nan.npy"), "--lam", "1"])
    np.save(tmp_path / "x.npy", data)
    assert "lam" in _err(capsys, ["solve", str(tmp_path / "x.npy"), "--lam", "0"])
    assert "lam" in _err(capsys, ["solve", str(tmp_path / "x.npy"), "--lam", "nan"])
    assert "lam" in _err(capsys, ["solve", str(tmp_path / "x.npy")])
    np.save(tmp_path / "v.npy", data[0])
    assert "2-D" in _err(capsys, ["solve", str(tmp_path / "v.npy"), "--lam", "1"])
    (tmp_path / "junk.npy").write_bytes(b"not a numpy file")
    assert "could not read" in _err(capsys, ["solve", str(tmp_path / "junk.npy"), "--lam", "1"])
    (tmp_path / "d.xyz").write_text("1,2\n")
    assert "unsupported" in _err(capsys, ["solve", str(tmp_path / "d.xyz"), "--lam", "1"])


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pt_with_arbitrary_objects_is_refused(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"acts": Evil()}, f)
    err = _err(capsys, ["solve", str(path), "--lam", "1"])
    assert "could not read .pt" in err and "pwned" not in capsys.readouterr().out
