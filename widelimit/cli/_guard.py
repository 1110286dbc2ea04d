"""What a long command needs around its solver: Ctrl-C within a second, a clean stdout, progress in logs.

* :func:`call_interruptibly` runs the work in a worker thread while the main thread waits in short
  joins: a SIGINT handler runs only in the main thread and only between bytecodes, so a compiled
  kernel (numba, BLAS, LAPACK) running in the main thread would hold Ctrl-C until it returns; the
  waiting main thread takes it within ``poll`` seconds wherever the worker is.
* :func:`stdout_to_stderr` points file descriptor 1 at stderr while the work runs, so that messages
  libraries write to the C-level stdout (MKL's ``Intel oneMKL ERROR ...``) cannot break ``--json``.
* :func:`line_progress` turns :class:`widelimit.engine.local.Progress` events into plain lines on
  stderr, with the rate and the time left, for logs and pipes (stderr not a terminal);
  :func:`rate_text` is the rate and time left of one event, for the lines and the terminal's bar.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from .._runtime import stdout_to_stderr as _fd1_to_stderr

__all__ = ["call_interruptibly", "stdout_to_stderr", "line_progress", "rate_text", "duration_text"]


def call_interruptibly(fn, *args, poll: float = 0.1, **kwargs):
    """``fn(*args, **kwargs)`` in a daemon worker thread; the caller waits in joins of ``poll`` seconds.

    A KeyboardInterrupt (the command line's SIGINT handler) reaches the caller within ``poll`` seconds and
    propagates; the worker is abandoned (a daemon: the process exits without waiting for it). The worker's
    exception, if any, is raised in the caller.
    """
    box: dict = {}

    def work():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=work, name="widelimit-work", daemon=True)
    t.start()
    while t.is_alive():
        t.join(poll)
    if "error" in box:
        raise box["error"]
    return box.get("value")


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True):
    """File descriptor 1 (:class:`widelimit._runtime.stdout_to_stderr`) and ``sys.stdout`` point at stderr inside
    the block; restored after it."""
    if not enabled:
        yield
        return
    with _fd1_to_stderr(), contextlib.redirect_stdout(sys.stderr):
        yield


def duration_text(seconds: float) -> str:
    """``"12 s"``, ``"5 min 24 s"``, ``"2 h 03 min"``: a duration as people read it (rounded to the second)."""
    s = int(round(max(0.0, float(seconds))))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def rate_text(ev, unit: str = "rows", elapsed: bool = False) -> str:
    """``"2,710 tokens/s, 5 min 25 s left"``: the rate and time left of a :class:`~widelimit.engine.local.Progress`
    event (its ``rows_per_s`` and ``time_left_s``, from the ``time_s`` its pass stamps), with ``elapsed`` also
    ``"44 s elapsed"`` between them; ``""`` without a rate; no time left once the pass is done."""
    rate, left = ev.rows_per_s, ev.time_left_s
    if rate is None:
        return ""
    parts = [f"{rate:,.0f} {unit}/s" if rate >= 10 else f"{rate:.3g} {unit}/s"]
    if elapsed:
        parts.append(f"{duration_text(ev.time_s)} elapsed")
    if left is not None and not ev.done:
        parts.append(f"{duration_text(left)} left")
    return ", ".join(parts)


def line_progress(stream=None, every: float = 2.0, unit: str = "rows", clock=time.perf_counter):
    """A progress callback writing lines like ``certify: 120,000/1,000,000 tokens (12%), 2,710 tokens/s,
    44 s elapsed, 5 min 25 s left`` to ``stream``.

    One line at the first event of each stage, at its last (``done``), and at most one per ``every`` seconds
    (on ``clock``) between. Events of a pass over rows carry their time since the pass began (``time_s``):
    the line gives the rate in ``unit`` per second and the time left at that rate (:func:`rate_text`).
    Other events (iterations of a solver) get the time since the stage's first event and the time left
    scaled by the iterations still to do.
    """
    stream = sys.stderr if stream is None else stream
    state = {"stage": None, "t0": 0.0, "last": -1e300}

    def cb(ev):
        now = clock()
        if ev.stage != state["stage"]:
            state.update(stage=ev.stage, t0=now, last=-1e300)
        if now - state["last"] < every and not ev.done:
            return
        state["last"] = now
        pct = f" ({100 * ev.rows_done / ev.rows_total:.0f}%)" if ev.rows_total > 0 else ""
        if ev.rows_per_s is not None:  # a pass over rows, timed where it runs
            line = f"{ev.stage}: {ev.rows_done:,}/{ev.rows_total:,} {unit}{pct}, {rate_text(ev, unit, elapsed=True)}"
        else:
            el = now - state["t0"] if ev.time_s is None else ev.time_s
            line = f"{ev.stage}: {ev.rows_done}" + (f"/{ev.rows_total}" if ev.rows_total > 0 else "")
            line += f"{pct}, {duration_text(el)} elapsed"
            if ev.rows_total > 0:
                frac = ev.rows_done / ev.rows_total
                line += f", ~{duration_text(el * (1 - frac) / frac)} left" if frac > 0 and el > 0 else \
                    ", time left unknown"
        if ev.value is not None:
            line += f", value {ev.value:.6g}"
        print(line, file=stream, flush=True)

    return cb
