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


def _table(out):
    """``{quantity: value}`` from a rich table (first two columns; wrapped continuation rows skipped)."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("\u2502")[1:-1]]  # the vertical bar rich draws
        if len(cells) >= 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_human_table(tmp_path, capsys):
    """The table's numbers are the optimum (by a 1-D computation) and its verdicts follow the certificate."""
    from scipy.optimize import minimize_scalar

    from widelimit.data import datasets

    assert main(["solve", "collinear", "--lam", "1"]) == 0
    t = _table(capsys.readouterr().out)
    # collinear data x_i = o + t_i u: the wide limit is the 1-D Huber problem min_beta mean h(|t_i - beta|)
    _, truth = datasets.collinear(seed=0)
    s = truth["t"]

    def h(r):
        return np.where(r <= 1.0, r * r, 2.0 * r - 1.0)

    opt = minimize_scalar(lambda beta: h(np.abs(s - beta)).mean(), bounds=(s.min(), s.max()), method="bounded",
                          options={"xatol": 1e-12})
    assert float(t["value"]) == pytest.approx(opt.fun, rel=1e-9)
    assert float(t["lower bound"]) == pytest.approx(opt.fun, rel=1e-9)
    assert float(t["gap"]) <= 1e-9 * opt.fun
    both_sides = bool((s - opt.x > 1).any() and (s - opt.x < -1).any())  # a ray on each side of the bias
    assert int(t["width"]) == 1 + both_sides == 2
    assert t["points N x dims n"] == "50 x 5" and t["certified"] == "yes"
    # a one-step width-1 fit on spread-out data is far from the optimum: the verdict is NO
    X = np.random.default_rng(0).standard_normal((40, 3)) * 3
    np.save(tmp_path / "x.npy", X)
    assert main(["fit", str(tmp_path / "x.npy"), "--lam", "0.5", "--width", "1", "--max-iter", "1"]) == 0
    f = _table(capsys.readouterr().out)
    assert float(f["relative gap"]) > 1e-4 and f["certified"] == "NO"
    assert float(f["value"]) - float(f["lower bound"]) == pytest.approx(float(f["gap"]), rel=1e-6)


def _notes(out):
    """``{quantity: note}`` from a rich table: the third column, wrapped continuation rows joined."""
    notes, key = {}, None
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("\u2502")[1:-1]]
        if len(cells) >= 3:
            key = cells[0] or key
            notes[key] = (notes.get(key, "") + " " + cells[2]).strip()
    return notes


def test_table_says_why_a_certificate_does_not_certify(tmp_path, capsys):
    """At lam = 1e-18 on unit data the gap alone is within the tolerance but float64 cannot resolve it: the
    verdict is NO, and the table says it is the rounding error, with the numbers of the JSON certificate."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((20, 3)))
    d = _json(capsys, ["solve", str(tmp_path / "x.npy"), "--lam", "1e-18", "--json"])["certificate"]
    allowed = d["tol"] * d["value"]
    assert d["gap"] <= allowed < d["gap"] + d["rounding_error"] and d["certified"] is False
    assert main(["solve", str(tmp_path / "x.npy"), "--lam", "1e-18"]) == 0
    out = capsys.readouterr().out
    t, notes = _table(out), _notes(out)
    assert t["certified"] == "NO" and float(t["rounding error"]) == pytest.approx(d["rounding_error"], rel=1e-9)
    assert notes["certified"].startswith(f"its rounding error {d['rounding_error']:.1e} is above the {allowed:.1e} "
                                         "the tolerance allows")
    # a gap above the tolerance is named as such
    from types import SimpleNamespace

    from widelimit.cli._common import _why_not

    c = SimpleNamespace(gap=3e-6, value=2.0, tol=1e-6, atol=1e-7, rounding_error=0.0)
    assert _why_not(c) == "gap 3.0e-06 is above the 2.1e-06 the tolerance allows"


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
