"""The README's Python example runs as written and prints what its comments say, checked independently."""

import re
from pathlib import Path

import numpy as np
import pytest

_FLOAT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def test_readme_python_example_runs(capsys):
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    X, lam, sol, med = np.asarray(ns["X"], dtype=np.float64), 2.0, ns["sol"], ns["med"]
    W, Z, b = sol.dictionary, sol.sparse_codes.toarray(), sol.bias

    def objective(bias):  # theory.md §1, from scratch
        R = X - Z @ W - bias
        return float(np.mean(np.sum(R * R, axis=1)) + 2 * lam * Z.sum() / len(X))

    # line 1: "value width certified" of the optimum
    value, width, certified = lines[0].split()
    assert float(value) == pytest.approx(objective(b), rel=1e-6)
    assert int(width) == W.shape[0] == int(np.count_nonzero(Z.any(axis=0)))
    assert certified == "True"
    # line 2: "gap certified" of the shifted bias: the gap is at least what the shift costs
    gap, certified = lines[1].split()
    cost = objective(b + 0.1) - objective(b)
    assert cost > 0.01 and float(gap) == pytest.approx(cost, rel=1e-4)
    assert certified == "False"
    # line 3: "[b_1 b_2 b_3] gap" of the Huber median, the optimal bias: its Huber gradient vanishes
    nums = [float(v) for v in re.findall(_FLOAT, lines[2])]
    assert len(nums) == 4
    np.testing.assert_allclose(nums[:3], med.point[:3], rtol=1e-6, atol=1e-8)
    D = X - med.point
    r = np.linalg.norm(D, axis=1, keepdims=True)
    psi = np.where(r <= lam, D, lam * D / np.maximum(r, 1e-300))  # -grad of h_lam(||x - b||) / 2
    assert np.linalg.norm(psi.mean(axis=0)) <= 1e-6 * lam
    assert 0 <= nums[3] <= 1e-6 * objective(b)


def test_readme_second_example_streams_the_same_optimum(capsys, tmp_path, monkeypatch):
    """The README's on-disk example (run in a scratch folder): the memory-mapped file gives the same optimum."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    capsys.readouterr()
    exec(compile(blocks[1], "README.md", "exec"), ns)
    assert capsys.readouterr().out.split() == ["True"]
    assert (tmp_path / "acts.npy").exists()
    # the printed True is the comparison of two independently computed optima
    assert ns["src"].shape == ns["X"].shape
