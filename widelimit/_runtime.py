"""Runtime settings shared by the solvers: torch device selection and one thread limiter for torch, numba and BLAS."""

from __future__ import annotations
import contextlib
import functools
import os
import signal
import sys
import threading
import time

__all__ = ["resolve_device", "torch_dtype", "usable_cores", "max_threads", "check_threads", "default_threads",
           "limit_threads", "with_thread_limit", "stdout_to_stderr"]


def resolve_device(device="auto"):
    """Return a ``torch.device`` for ``device``.

    ``"auto"`` (or ``None``) picks CUDA when it is available and the CPU otherwise;
    ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` are taken as given.
    Asking for CUDA on a machine without a usable CUDA device is a
    :class:`ValueError` (one line), not a deep torch traceback.
    """
    import torch

    if device is None or (isinstance(device, str) and device.lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available on this machine "
                             "(use device='cpu' or 'auto')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or a CUDA device, got {device!r}")
    return dev


def torch_dtype(dtype):
    """``torch.float32`` or ``torch.float64`` from a name or dtype; anything else is a ValueError."""
    import torch

    table = {"float32": torch.float32, "float64": torch.float64, torch.float32: torch.float32,
             torch.float64: torch.float64, "single": torch.float32, "double": torch.float64}
    try:
        return table[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}") from None


# --------------------------------------------------------------------------------------
# threads: one limiter for torch, numba and BLAS
# --------------------------------------------------------------------------------------


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


#: Threads per usable core that a thread count may ask for: more only contend for the cores (and each BLAS
#: thread allocates its own buffers: 1000 threads ended in MemoryError).
THREADS_PER_CORE = 4


def max_threads() -> int:
    """The largest thread count accepted: :data:`THREADS_PER_CORE` times the usable cores."""
    return THREADS_PER_CORE * usable_cores()


def check_threads(threads, name: str = "threads") -> int:
    """``threads`` as an int if it is an integer in ``1 .. max_threads()``; else one ``ValueError`` naming ``name``."""
    try:
        ok = not isinstance(threads, bool) and int(threads) == threads and int(threads) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a positive integer, got {threads!r}")
    top = max_threads()
    if int(threads) > top:
        raise ValueError(f"{name} must be at most {top} ({THREADS_PER_CORE} per usable core; this machine lets "
                         f"the process use {usable_cores()}), got {int(threads)}")
    return int(threads)


def default_threads() -> int:
    """The thread count the solvers use: ``WIDELIMIT_THREADS`` if set, else ``OMP_NUM_THREADS`` if set (at most
    the usable cores), else the usable cores (at most 8), or 1 when the 1-minute load average is at least the
    usable cores plus one (other processes already hold the cores).

    One count for every pool (torch intra-op, numba, BLAS): the pools run one after the
    other, so each may use every core, but not more (measured in
    ``benchmarks/certify_speed.py``: one thread against this default).
    """

    env = os.environ.get("WIDELIMIT_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"WIDELIMIT_THREADS must be a positive integer, got {env!r}")
        return check_threads(n, "WIDELIMIT_THREADS")
    cores = min(8, usable_cores())
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:  # the user's (or a benchmark's) count for every OpenMP pool
        return min(cores, int(omp))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not available
        load = 0.0
    if cores > 1 and load >= cores + 1:
        # the cores are already held by other processes: every barrier of a multi-threaded pool
        # then waits for a descheduled thread (measured: one thread was 3x faster for certify_sae and
        # the forward pass at a load of 16 on 2 cores; at a load of 3.4-5 on 2 cores the screened
        # coder's batched small solves took 26 s on two threads against 4.8 s on one, 768 x 16,384)
        return 1
    return cores


_CONTROLLER: list = [None, -1]  # threadpoolctl's controller, and len(sys.modules) when it was made


def _controller():
    """A cached ``threadpoolctl.ThreadpoolController`` (finding the libraries reads ``/proc``: 1.3 ms a call),
    made again when modules were imported since (a new extension may have loaded a new pool)."""
    from threadpoolctl import ThreadpoolController

    if _CONTROLLER[0] is None or _CONTROLLER[1] != len(sys.modules):
        _CONTROLLER[0] = ThreadpoolController()
        _CONTROLLER[1] = len(sys.modules)
    return _CONTROLLER[0]


class limit_threads:
    """Context manager: torch, numba and BLAS (OpenBLAS / MKL / OpenMP pools) on ``threads`` threads.

    ``threads=None`` uses :func:`default_threads`, or keeps the setting of an enclosing
    ``limit_threads`` (so a solver's default does not undo its caller's choice). On exit the
    previous settings come back. :func:`with_thread_limit` applies it to a whole function.
    The three pools oversubscribe the cores when each sizes itself independently (torch and
    BLAS spin-wait after a call while numba's workers start); with one count for all of
    them, each call gets the cores to itself.

    ``blas_threads``: a separate count for the BLAS libraries numpy and scipy load (OpenBLAS).
    Their workers spin for up to about 0.1 s after each call (OpenBLAS's thread timeout), while
    torch and numba share one OpenMP pool; code that interleaves many short numpy products with
    torch and numba work (``certify_sae``) runs its large products in torch and sets
    ``blas_threads=1``, so that no spinning worker holds a core the next parallel region needs
    (measured: a 0.2 ms torch reduction took 40-48 ms right after a numpy-BLAS median on 2 cores).

    >>> from widelimit._runtime import limit_threads
    >>> with limit_threads(1):
    ...     import torch; torch.get_num_threads()
    1
    """

    _depth = 0  # open limit_threads contexts: a nested one with threads=None keeps the outer setting

    def __init__(self, threads: int | None = None, *, blas_threads: int | None = None):
        self.inherit = threads is None and limit_threads._depth > 0
        if threads is None:
            threads = default_threads()
        self.threads = check_threads(threads)
        self.blas_threads = None if blas_threads is None else check_threads(blas_threads, "blas_threads")
        self._saved = None

    def __enter__(self):
        import numba
        import torch

        limit_threads._depth += 1
        if self.inherit:
            return self
        n = self.threads
        self._saved = (torch.get_num_threads(), numba.get_num_threads())
        torch.set_num_threads(n)
        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
        ctl = _controller()
        self._blas_ctx = ctl.limit(limits=n)  # every BLAS / OpenMP library loaded by now
        if self.blas_threads is not None:  # (restored with the rest: the context saved the originals)
            ctl.limit(limits=self.blas_threads, user_api="blas")
        return self

    def __exit__(self, *exc):
        import numba
        import torch

        limit_threads._depth -= 1
        if self.inherit:
            return False
        self._blas_ctx.restore_original_limits()
        torch.set_num_threads(self._saved[0])
        numba.set_num_threads(self._saved[1])
        return False


def matmul(A, B):
    """``A @ B`` for 2-D numpy arrays of one dtype, by torch's BLAS (a numpy array back).

    torch's BLAS runs on the OpenMP pool numba also uses, so code that alternates products
    with numba kernels keeps to one pool (numpy's BLAS then stays idle, see
    :class:`limit_threads`' ``blas_threads``). Transposed views cost no copy.
    """
    import torch

    def tensor(M):  # torch cannot hold a read-only buffer (a memory map, a user's frozen array): copy those
        return torch.from_numpy(M if M.flags.writeable else M.copy())

    return (tensor(A) @ tensor(B)).numpy()


def with_thread_limit(fn):
    """Decorator: run ``fn`` inside ``limit_threads()`` (the default thread count, or the caller's)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with limit_threads():
            return fn(*args, **kwargs)

    return wrapper


class stdout_to_stderr:
    """Context manager: file descriptor 1 (the C libraries' ``printf``) goes to stderr while it is open.

    A solver never prints (``--json`` must be the only thing on stdout), but C solvers write to fd 1
    directly: SCS prints ``ERROR: work memory allocation failure`` there, past ``sys.stdout``. Python's
    own ``sys.stdout`` is flushed before and after and left alone; fd 1 is restored on exit.
    Where fd 1 or 2 is not a real descriptor (an embedding host), nothing is redirected.
    """

    def __enter__(self):
        self._saved = None
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            self._saved = os.dup(1)
            os.dup2(2, 1)
        except (OSError, ValueError, AttributeError):
            if self._saved is not None:
                os.close(self._saved)
            self._saved = None
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(self._saved, 1)
            os.close(self._saved)
        return False


_SIGINT_SEEN = False
#: the interrupted line's prefix: ``widelimit fit`` as soon as the command line names its subcommand
_LABEL = "widelimit"
#: ``True`` while a command runs: Ctrl-C then unwinds it (its temporary outputs are removed on the way out);
#: outside a command (start-up, the end) there is nothing to undo and the process ends at once
_UNWIND = False
_T0 = time.perf_counter()


def _on_sigint(signum, frame):
    global _SIGINT_SEEN
    _SIGINT_SEEN = True
    if not _UNWIND:
        exit_interrupted(f"{_LABEL}: interrupted")
    raise KeyboardInterrupt


def track_interrupts(label: str = "widelimit") -> None:
    """Install the command line's SIGINT handler: Ctrl-C prints one line, ``LABEL: interrupted``, and ends the
    process with status 130, wherever it lands.

    For the command line only (a library does not touch signal handlers). Outside a command's run (the
    imports of start-up, argument parsing, the end) the handler ends the process at once: no Python code is
    interrupted halfway, so no traceback can be printed and no ``ImportError`` can stand for the interrupt.
    While :func:`unwinding_interrupts` is active (a command runs) it raises KeyboardInterrupt, as Python's
    does, so the command removes its temporary outputs; two ways that interrupt can go astray are covered:

    - a Ctrl-C inside a C extension's initialisation (a lazy import of torch) surfaces as ``ImportError:
      initialization failed``, not KeyboardInterrupt: :func:`interrupted` lets the command line still report
      it as an interrupt (status 130) instead of an error;
    - a KeyboardInterrupt raised while Python runs a callback or finaliser (an import lock's
      weakref callback, a ``__del__``) is printed as "Exception ignored" and dropped, and the
      command would run on: ``sys.unraisablehook`` then ends the process as interrupted.

    Not covered: the interpreter's own start-up before any of widelimit's code runs (``site``, the
    package's ``__init__``): there Python's default handler applies.
    """
    global _LABEL
    if threading.current_thread() is not threading.main_thread():
        return
    _LABEL = label
    signal.signal(signal.SIGINT, _on_sigint)
    previous = sys.unraisablehook

    def hook(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            exit_interrupted(f"{_LABEL}: interrupted")
        previous(unraisable)

    sys.unraisablehook = hook


@contextlib.contextmanager
def unwinding_interrupts():
    """While a command runs: Ctrl-C raises KeyboardInterrupt (caught by the command line, which prints the
    line) instead of ending the process at once. Without :func:`track_interrupts` it changes nothing."""
    global _UNWIND
    before, _UNWIND = _UNWIND, True
    try:
        yield
    finally:
        _UNWIND = before


def trace(stage: str) -> None:
    """With ``WIDELIMIT_TRACE=1``, write ``widelimit trace: STAGE T s`` on stderr: how far the command line
    has come (``handler``: Ctrl-C is handled; ``imported``: the solvers are imported; ``parsed``: the
    arguments are read; ``running``: the command runs) and the seconds since it started, for a slow start-up
    (and for the tests, which interrupt each stage when its line appears)."""
    if os.environ.get("WIDELIMIT_TRACE") == "1":
        try:
            sys.stderr.write(f"widelimit trace: {stage} {time.perf_counter() - _T0:.3f} s\n")
            sys.stderr.flush()
        except (OSError, ValueError, RuntimeError):  # a closed pipe or stream is no reason to fail
            pass


def exit_interrupted(message: str | None = None) -> None:
    """Write ``message`` (one line) to stderr, flush, and end the process with status 130 now.

    ``os._exit``: an interrupt that passed through C code running Python (``PyRun_String``, e.g.
    inside an extension's import) leaves CPython's "unhandled KeyboardInterrupt" flag set, and the
    interpreter would kill itself with SIGINT at a normal exit even though the interrupt was
    handled. Outputs are written atomically, so exiting now loses nothing. The message goes straight to
    the file descriptor: the signal may have landed while ``sys.stderr`` was itself writing."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe or a re-entered writer must not turn 130 into a traceback
            pass
    if message:
        try:
            os.write(2, (message + "\n").encode())
        except OSError:
            pass
    os._exit(130)


def exit_now(status: int) -> None:
    """Flush stdout and stderr and end the process with ``status`` now (the command has finished).

    The command line ends this way, not through the interpreter's shutdown: a Ctrl-C during the shutdown
    (a second of atexit handlers and module teardown, after the JSON is printed) came after Python had
    given SIGINT back to its default action, and the process died by the signal without a line. Nothing
    is lost: outputs are written atomically, and the command's own resources (a Dask cluster, thread
    pools) are closed before it returns. An interrupt landing here (outside a command, so the handler of
    :func:`track_interrupts` ends the process itself) is the interrupt's one line and 130.
    """
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be written
                pass
    except KeyboardInterrupt:
        exit_interrupted(f"{_LABEL}: interrupted")
    os._exit(status)


def interrupted() -> bool:
    """Whether a SIGINT reached the handler of :func:`track_interrupts`."""
    return _SIGINT_SEEN
