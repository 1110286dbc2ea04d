"""Ctrl-C at any moment, start-up included: one line, ``widelimit SUBCOMMAND: interrupted``, status 130.

No test here waits a fixed time: each one sends SIGINT when the child says, on stderr, that it has reached
a stage (``WIDELIMIT_TRACE=1``: ``widelimit trace: STAGE``), so the signal lands at that stage or later,
and the outcome checked is the same wherever it lands. Before: a signal during the imports printed
"widelimit: interrupted" (the subcommand unnamed) or, before the handler, a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TRACE = "widelimit trace: "

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")


def _env():
    env = dict(os.environ, WIDELIMIT_TRACE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _interrupt_at(stage: str, argv: list[str], cwd: Path) -> tuple[int, list[str], list[str], str]:
    """Run ``python -m widelimit argv``, send SIGINT once its stderr says it reached ``stage``.

    Returns the exit status, the stages it traced, its other stderr lines and its stdout."""
    p = subprocess.Popen([sys.executable, "-m", "widelimit", *argv], cwd=cwd, env=_env(), text=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stages, early = [], []
    try:
        for line in p.stderr:  # blocks until the child writes a line or ends
            if not line.startswith(TRACE):  # a line before the stage: the child failed (shown below)
                early.append(line.rstrip("\n"))
                continue
            stages.append(line[len(TRACE):].split()[0])
            if stages[-1] == stage:
                p.send_signal(signal.SIGINT)
                break
        out, rest = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert stage in stages and not early, (stage, stages, early, rest[-2000:])
    lines = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith(TRACE)]
    return p.returncode, stages, lines, out


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    path = tmp_path_factory.mktemp("interrupt") / "big.npy"
    np.save(path, np.random.default_rng(0).standard_normal((3000, 20)))
    return path


# the fit runs for minutes unless interrupted (--rtol 0: no convergence stop); each stage: where the signal
# lands at the earliest -- handler: the solvers' imports; imported: argument parsing; running: loading the
# data and importing torch (lazily, inside the command); computing: the fit's steps
@pytest.mark.parametrize("stage", ["handler", "imported", "running", "computing"])
def test_ctrl_c_at_each_stage_prints_one_line(stage, big, tmp_path):
    out = tmp_path / "fitout"
    argv = ["fit", str(big), "--lam", "0.5", "--width", "100", "--max-iter", "1000000", "--rtol", "0",
            "--time-limit", "600", "--out", str(out)]
    status, stages, lines, stdout = _interrupt_at(stage, argv, tmp_path)
    assert status == 130, (stages, lines)
    assert lines == ["widelimit fit: interrupted"], (stages, lines)
    assert stdout == ""
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary folder left


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=120)


def test_outside_a_command_the_handler_ends_the_process_at_once():
    """Start-up and the end have nothing to undo: the handler writes the line and exits, so no Python code is
    interrupted halfway (no traceback, no ImportError standing for the interrupt)."""
    p = _child("import os, signal\n"
               "from widelimit._runtime import track_interrupts\n"
               "track_interrupts('widelimit fit')\n"
               "os.kill(os.getpid(), signal.SIGINT)\n"  # delivered before the next line runs
               "print('ran on')\n")
    assert p.returncode == 130 and p.stderr == "widelimit fit: interrupted\n" and p.stdout == ""


def test_while_a_command_runs_the_interrupt_unwinds_it():
    """Inside :func:`unwinding_interrupts` the same signal raises KeyboardInterrupt (so a command removes its
    temporary outputs); after it, the handler ends the process again."""
    p = _child("import os, signal\n"
               "from widelimit._runtime import track_interrupts, unwinding_interrupts\n"
               "track_interrupts('widelimit fit')\n"
               "try:\n"
               "    with unwinding_interrupts():\n"
               "        os.kill(os.getpid(), signal.SIGINT)\n"
               "        print('not reached')\n"
               "except KeyboardInterrupt:\n"
               "    print('unwound', flush=True)\n"
               "os.kill(os.getpid(), signal.SIGINT)\n"
               "print('ran on')\n")
    assert p.returncode == 130 and p.stdout == "unwound\n" and p.stderr == "widelimit fit: interrupted\n"


def test_the_subcommand_is_named_before_the_solvers_are_imported():
    """The entry point's list of subcommands (known before any import) is the command line's."""
    from widelimit.__main__ import SUBCOMMANDS, label
    from widelimit.cli import COMMANDS

    assert list(SUBCOMMANDS) == [name for name, _, _ in COMMANDS]
    assert label(["fit", "x.npy"]) == "widelimit fit" and label(["relax-bench"]) == "widelimit relax-bench"
    assert label([]) == label(["--version"]) == label(["fitt"]) == "widelimit"  # no (valid) subcommand yet


def test_trace_is_silent_unless_asked(capsys, monkeypatch):
    from widelimit._runtime import trace

    monkeypatch.delenv("WIDELIMIT_TRACE", raising=False)
    trace("handler")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("WIDELIMIT_TRACE", "1")
    trace("handler")
    err = capsys.readouterr().err
    assert err.startswith("widelimit trace: handler ") and err.endswith(" s\n") and err.count("\n") == 1
