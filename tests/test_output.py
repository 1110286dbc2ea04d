"""Outputs people look at: figures never touch pyplot's backend; JSON is strict, non-finite numbers as null."""

import json
import math

import matplotlib
import numpy as np
import pytest

import widelimit as wl
from widelimit._json import dumps, to_jsonable, write_json
from widelimit.plot import plot_solution, save_figure, subplots


@pytest.fixture
def pdf_backend():
    """Switch pyplot to a backend that is not Agg (as a notebook user would have one), restore after."""
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    plt.switch_backend("pdf")
    yield "pdf"
    plt.switch_backend(before)


def test_plots_leave_the_backend_and_pyplot_alone(tmp_path, pdf_backend):
    import matplotlib.pyplot as plt

    X = np.random.default_rng(0).standard_normal((40, 2))
    sol = wl.solve(X, lam=0.6)
    n_figs = len(plt.get_fignums())
    png = plot_solution(X, sol, tmp_path / "s.png")
    fr = wl.frontier(X, lam=0.6, widths=[1, 2], n_restarts=1, max_iter=5, out=tmp_path / "f.png")
    assert matplotlib.get_backend() == pdf_backend  # the old pyplot() helper switched it to Agg
    assert len(plt.get_fignums()) == n_figs  # no figure registered with pyplot
    for p in (png, fr.plot):
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_save_figure_writes_a_png_of_the_requested_size(tmp_path, pdf_backend):
    fig, ax = subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    p = save_figure(fig, tmp_path / "a" / "b.png", dpi=50)
    assert matplotlib.get_backend() == pdf_backend
    head = p.read_bytes()[:24]
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (width, height) == (100, 50)  # 2 x 1 inches at 50 dpi, from the PNG header


def test_json_non_finite_is_null_and_strict(tmp_path):
    obj = {"a": float("inf"), "b": -np.inf, "c": np.float32("nan"), "d": np.array([1.5, np.inf]),
           "e": (np.int64(3), np.bool_(True)), 4: 0.25}
    expected = {"a": None, "b": None, "c": None, "d": [1.5, None], "e": [3, True], "4": 0.25}
    assert to_jsonable(obj) == expected
    text = dumps(obj)
    assert "inf" not in text.lower() and "nan" not in text.lower()

    def refuse(token):
        raise ValueError(token)

    assert json.loads(text, parse_constant=refuse) == expected  # no Infinity/NaN tokens either
    p = write_json(tmp_path / "x.json", obj)
    assert json.loads(p.read_text(), parse_constant=refuse) == expected


def test_cli_prints_strict_json(capsys):
    from widelimit.cli._common import print_json

    print_json({"gap": np.float64(np.inf), "rel_gap": -math.inf, "value": 1.25})
    text = capsys.readouterr().out
    assert text.count("\n") == 1
    assert json.loads(text, parse_constant=lambda t: pytest.fail(t)) == {"gap": None, "rel_gap": None, "value": 1.25}
