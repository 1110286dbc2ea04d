"""What a long command needs around its solver: Ctrl-C within a second, a clean stdout, progress in logs.

* :func:`call_interruptibly` runs the work in a worker thread while the main thread waits in short
  joins: a SIGINT handler runs only in the main thread and only between bytecodes, so a compiled
  kernel (numba, BLAS, LAPACK) running in the main thread would hold Ctrl-C until it returns; the
  waiting main thread takes it within ``poll`` seconds wherever the worker is.
* :func:`stdout_to_stderr` points file descriptor 1 at stderr while the work runs, so that messages
  libraries write to the C-level stdout (MKL's ``Intel oneMKL ERROR ...``) cannot break ``--json``.
* :func:`line_progress` turns :class:`widelimit.engine.local.Progress` events into plain lines on
  stderr, with the time left, for logs and pipes (stderr not a terminal).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from .._runtime import stdout_to_stderr as _fd1_to_stderr

__all__ = ["call_interruptibly", "stdout_to_stderr", "line_progress"]


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


def line_progress(stream=None, every: float = 2.0):
    """A progress callback writing ``STAGE: DONE/TOTAL (P%), E s elapsed, ~L s left`` lines to ``stream``.

    One line at the first event of each stage, at its last (``done``), and at most one per ``every`` seconds
    between; the time left is the stage's elapsed time scaled by the rows still to do.
    """
    stream = sys.stderr if stream is None else stream
    state = {"stage": None, "t0": 0.0, "last": -1e300}

    def cb(ev):
        now = time.perf_counter()
        if ev.stage != state["stage"]:
            state.update(stage=ev.stage, t0=now, last=-1e300)
        if now - state["last"] < every and not ev.done:
            return
        state["last"] = now
        el = now - state["t0"]
        if ev.rows_total > 0:
            frac = ev.rows_done / ev.rows_total
            left = f"~{el * (1 - frac) / frac:.0f} s left" if frac > 0 else "time left unknown"
            line = f"{ev.stage}: {ev.rows_done}/{ev.rows_total} ({100 * frac:.0f}%), {el:.0f} s elapsed, {left}"
        else:
            line = f"{ev.stage}: {ev.rows_done}, {el:.0f} s elapsed"
        if ev.value is not None:
            line += f", value {ev.value:.6g}"
        print(line, file=stream, flush=True)

    return cb
