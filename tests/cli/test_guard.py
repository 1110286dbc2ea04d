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

from widelimit.cli._guard import call_interruptibly, duration_text, line_progress, stdout_to_stderr
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


def test_progress_lines_say_the_rate_and_the_time_left():
    """Issue 31 item 5: a pass's events carry their time (``time_s``); the line gives tokens/s and the time left
    at that rate, worked out by hand here: 120,000 tokens in 120,000 / 2,710 s, 880,000 left = 324.7 s."""
    buf = io.StringIO()
    now = [0.0]
    cb = line_progress(buf, every=2.0, unit="tokens", clock=lambda: now[0])
    t = 120_000 / 2_710
    cb(Progress(stage="certify", pass_index=1, rows_done=120_000, rows_total=1_000_000, time_s=t))
    now[0] = 1.0
    cb(Progress(stage="certify", pass_index=1, rows_done=123_000, rows_total=1_000_000, time_s=t + 1))  # throttled
    now[0] = 400.0
    cb(Progress(stage="certify", pass_index=1, rows_done=1_000_000, rows_total=1_000_000, done=True, time_s=400.0))
    assert buf.getvalue().splitlines() == [
        "certify: 120,000/1,000,000 tokens (12%), 2,710 tokens/s, 44 s elapsed, 5 min 25 s left",
        "certify: 1,000,000/1,000,000 tokens (100%), 2,500 tokens/s, 6 min 40 s elapsed"]


def test_progress_lines_of_untimed_events_scale_the_time_so_far():
    """Iteration events carry no ``time_s``: the time since the stage's first event, scaled by the steps left."""
    buf = io.StringIO()
    now = [10.0]
    cb = line_progress(buf, every=3600.0, clock=lambda: now[0])
    cb(Progress(stage="calibrate lam", pass_index=1, rows_done=1, rows_total=4))
    now[0] = 40.0
    cb(Progress(stage="calibrate lam", pass_index=2, rows_done=2, rows_total=4))  # throttled
    cb(Progress(stage="calibrate lam", pass_index=3, rows_done=3, rows_total=4, done=True, value=1.5))
    assert buf.getvalue().splitlines() == [
        "calibrate lam: 1/4 (25%), 0 s elapsed, time left unknown",
        "calibrate lam: 3/4 (75%), 30 s elapsed, ~10 s left, value 1.5"]


@pytest.mark.parametrize("s,text", [(0.4, "0 s"), (59.6, "1 min 0 s"), (324.7, "5 min 25 s"), (3600, "1 h 00 min"),
                                    (7384, "2 h 03 min")])
def test_durations_as_people_read_them(s, text):
    assert duration_text(s) == text


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


def test_the_terminal_bar_shows_the_rate_and_the_time_left():
    from rich.console import Console

    from widelimit.cli._common import progress_display

    buf = io.StringIO()
    with progress_display(Console(file=buf, force_terminal=True, width=200), unit="tokens") as cb:
        cb(Progress(stage="certify", pass_index=1, rows_done=120_000, rows_total=1_000_000, time_s=120_000 / 2_710))
    out = buf.getvalue()
    assert "2,710 tokens/s, 5 min 25 s left" in out
