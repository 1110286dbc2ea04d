"""The command line's guards (widelimit/cli/_guard.py): Ctrl-C while a compiled kernel runs, a clean stdout
under --json, progress lines in logs. No test waits a fixed time: the interrupt is sent when the child says it
is inside the kernel."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from widelimit.cli._guard import call_interruptibly, line_progress, stdout_to_stderr
from widelimit.engine.local import Progress

REPO = Path(__file__).resolve().parents[2]


def test_call_interruptibly_returns_and_raises_like_the_call():
    assert call_interruptibly(lambda a, b=1: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        call_interruptibly(lambda: 1 / 0)


def test_fd1_writes_go_to_stderr_inside_the_guard(capfd):
    with stdout_to_stderr():
        os.write(1, b"Intel oneMKL ERROR: Parameter 6 was incorrect on entry to DLASWP.\n")  # as MKL writes it
        print("python print")
    os.write(1, b"{}\n")
    out, err = capfd.readouterr()
    assert out == "{}\n"
    assert "DLASWP" in err and "python print" in err


def test_progress_lines_say_the_time_left():
    buf = io.StringIO()
    cb = line_progress(buf, every=3600.0)
    cb(Progress(stage="certify", pass_index=1, rows_done=10, rows_total=40))
    cb(Progress(stage="certify", pass_index=1, rows_done=20, rows_total=40))  # throttled
    cb(Progress(stage="certify", pass_index=1, rows_done=40, rows_total=40, done=True))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("certify: 10/40 (25%)") and "s left" in lines[0]
    assert lines[1].startswith("certify: 40/40 (100%)")


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_ctrl_c_is_taken_while_a_numba_kernel_runs():
    """Before: a kernel in the main thread held SIGINT until it returned (issue 28: ignored for minutes)."""
    script = textwrap.dedent("""
        import sys, numba
        from widelimit._runtime import track_interrupts
        from widelimit.cli._guard import call_interruptibly

        @numba.njit(nogil=True)
        def spin(n):
            s = 0.0
            for i in range(n):
                s += (i % 7) * 1e-9
            return s

        spin(10)  # compiled before the readiness line
        track_interrupts("kernel")

        def work():
            print("ready", file=sys.stderr, flush=True)
            return spin(10 ** 13)  # hours

        try:
            call_interruptibly(work)
        except KeyboardInterrupt:
            print("interrupted in the caller", file=sys.stderr, flush=True)
            sys.exit(130)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-c", script], env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        for line in p.stderr:
            if line.strip() == "ready":
                p.send_signal(signal.SIGINT)
                break
        out, rest = p.communicate(timeout=120)  # a hang guard only: the kernel alone would run for hours
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, rest
