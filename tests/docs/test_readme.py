"""The README's Python example runs as written and prints what its comments say, checked independently."""

import re
from pathlib import Path

import numpy as np
import pytest

_FLOAT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def test_readme_python_example_runs(capsys):
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", text, flags=re.S)
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
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", text, flags=re.S)
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


# --------------------------------------------------------------------------------------
# the set-up commands
# --------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _bash_lines(text: str) -> list[str]:
    """The command lines of the README's bash blocks (comments and blank lines left out)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _requirements(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_ci_runs_exactly_the_readme_set_up_and_test_command():
    """Two commands; each makes and activates the virtual environment first; CI runs the second as written."""
    lines = _bash_lines((ROOT / "README.md").read_text())
    commands = [ln for ln in lines if "pip install" in ln]
    assert len(commands) == 2 and commands[1].endswith("pytest -q")
    for ln in commands:
        assert ln.startswith("python3 -m venv .venv && . .venv/bin/activate && "), ln
    ci = [ln for ln in _requirements(ROOT / ".ci" / "run") if not ln.startswith(("set ", "cd "))]
    assert ci == [commands[1]]


def test_both_commands_install_torch_cpu_build_first_from_the_cpu_index():
    """Step one asks the PyTorch CPU index about torch alone (--no-deps: an unreachable index costs one
    look-up, not one per package), at the pinned version; every later install keeps the pin."""
    lines = _bash_lines((ROOT / "README.md").read_text())
    installs = [ln for ln in lines if "pip install" in ln]
    assert len(installs) == 2
    for ln in installs:
        steps = [s.strip() for s in ln.split("&&")][2:]  # after making and activating the environment
        assert steps[0] == "python3 -m pip install --no-deps -r torch-cpu.txt", steps
        assert steps[1].startswith("python3 -m pip install -c constraints-cpu.txt -e "), steps
    assert _requirements(ROOT / "torch-cpu.txt") == [f"--extra-index-url {CPU_INDEX}", "-c constraints-cpu.txt", "torch"]


@pytest.mark.parametrize("platform, want, refused", [
    ("linux", "2.13.0+cpu", ["2.13.0", "2.13.1+cpu", "2.13.0+cu128"]),  # PyPI's Linux build is the CUDA one
    ("darwin", "2.13.0", ["2.13.1"]),  # PyPI's macOS and Windows wheels are CPU builds
    ("win32", "2.13.0", ["2.13.1"]),
])
def test_the_pin_admits_only_the_cpu_build(platform, want, refused):
    from packaging.requirements import Requirement

    pins = [Requirement(ln) for ln in _requirements(ROOT / "constraints-cpu.txt")]
    env = {"sys_platform": platform}
    active = [r for r in pins if r.marker is None or r.marker.evaluate(env)]
    assert len(active) == 1 and active[0].name == "torch"
    assert active[0].specifier.contains(want) and not any(active[0].specifier.contains(v) for v in refused)
    # the package itself accepts the pinned build
    pyproject = (ROOT / "pyproject.toml").read_text()
    torch_req = Requirement(re.search(r'"(torch[^"]*)"', pyproject).group(1))
    assert torch_req.specifier.contains(want)
