r"""Passes over the data as map-reduce: one engine for arrays, on-disk sources and Dask.

Every algorithm that certifies (the medians, :func:`widelimit.verify`,
``certify_sae``) reads ``X`` only through *passes*: a pure per-chunk function
``fn(chunk, start, *args, *row_aligned_blocks) -> partial`` applied to
consecutive row blocks (float32 or float64 as stored, at most ``widelimit.engine.local.CHUNK_BYTES``
of float64 each; the functions accumulate in float64: ``chunk - b`` with a float64 ``b``
is float64 and exact, sums take ``dtype=np.float64``),
and an associative ``merge(partial, partial)``. The state between passes is
O(n) (a bias, a gradient, a few sums), so

* :class:`LocalEngine` runs a pass chunk by chunk in this process (NumPy arrays,
  ``np.memmap``, :class:`widelimit.data.source.ActivationSource`), reading the next
  chunk in a background thread while the current one is reduced; peak memory is a few chunks,
  independent of N;
* :class:`widelimit.engine.dask_engine.DaskEngine` runs the same functions as one Dask
  reduction over the chunks of a ``dask.array`` (workers of a
  ``dask.distributed`` cluster).

:func:`engine_for` picks the engine from the type of ``X``. Progress is
reported through an optional callback receiving :class:`Progress` events;
solvers never print.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from .._runtime import check_threads, default_threads  # noqa: F401  (default_threads re-exported)
from .checkpoint import load_checkpoint, save_checkpoint  # noqa: F401 (re-exported)
from .fingerprint import _hashed_chunk
import hashlib
from .fingerprint import finish, hashed
from .fingerprint import _lanes

__all__ = [
    "CHUNK_BYTES", "chunk_rows",
    "Progress", "pass_timer", "LocalEngine", "NonFiniteRow", "is_dask_array", "save_checkpoint",
    "load_checkpoint", "data_fingerprint", "raise_nonfinite", "nonfinite_error",
]

#: Bytes of float64 working memory one chunk of rows may use. Small enough that a chunk
#: and its temporaries stay in the CPU cache (each pass makes several sweeps over a
#: chunk; at 32 MiB they all went to RAM and a pass ran ~3.5x slower), large enough
#: that per-chunk overhead is negligible.
CHUNK_BYTES = 1 << 23  # 8 MiB


def chunk_rows(n_cols: int, budget: int | None = None) -> int:
    """Rows per chunk so that a float64 chunk of ``n_cols`` columns fits in ``budget`` bytes (default :data:`CHUNK_BYTES`)."""
    budget = CHUNK_BYTES if budget is None else budget
    return max(1, budget // (8 * max(1, n_cols)))




@dataclass(frozen=True)
class Progress:
    """One progress event: the one progress protocol of every solver (``progress=`` callbacks).

    Passes over the data report rows; iterative solvers (``fit_dictionary``, ``solve_dnn``,
    ``frontier``, the superposition trainer) report iterations in ``rows_done`` of
    ``rows_total`` (0 when there is no fixed budget) with the current ``value`` (and
    ``lower_bound`` where the solver has one).

    Attributes
    ----------
    stage : str
        What the pass computes (``"mean"``, ``"newton"``, ``"certificate"``, ...).
    pass_index : int
        Passes over the data started so far (this one included).
    rows_done, rows_total : int
        Rows of the current pass reduced so far, and N.
    value, lower_bound : float or None
        After an iteration of a median: the objective at the current point and
        the best certified lower bound so far (``None`` in chunk events).
    done : bool
        ``True`` for the engine's event that closes a pass, and for the solver's
        event after each iteration (which carries ``value`` and ``lower_bound``).
    time_s : float or None
        Seconds since the pass started (:func:`pass_timer`), in the events of a pass over
        rows (the engine's passes, ``certify_sae``'s batches); ``None`` in iteration events.
        With it, :attr:`rows_per_s` and :attr:`time_left_s`.
    """

    stage: str
    pass_index: int
    rows_done: int
    rows_total: int
    value: float | None = None
    lower_bound: float | None = None
    done: bool = False
    time_s: float | None = None

    @property
    def rows_per_s(self) -> float | None:
        """Rows (tokens) per second over the pass so far, ``rows_done / time_s``; ``None`` without ``time_s``
        or before a row is done."""
        if self.time_s is None or self.rows_done <= 0 or self.time_s <= 0:
            return None
        return self.rows_done / self.time_s

    @property
    def time_left_s(self) -> float | None:
        """Seconds to the end of the pass at its rate so far, ``(rows_total - rows_done) / rows_per_s``
        (0 when done); ``None`` without a rate or a total."""
        rate = self.rows_per_s
        if rate is None or self.rows_total <= 0:
            return None
        return max(0, self.rows_total - self.rows_done) / rate


ProgressFn = Callable[[Progress], None]

#: The monotonic clock of :func:`pass_timer` (tests replace it, so that rates and times left are exact).
clock = time.perf_counter


def pass_timer() -> Callable[[], float]:
    """A function returning the seconds since this call on :data:`clock`: the ``time_s`` of a pass's
    :class:`Progress` events (started when the pass starts, before its first read)."""
    t0 = clock()
    return lambda: clock() - t0


class NonFiniteRow(ValueError):
    """Raised inside a pass: global row ``row`` holds NaN or Inf (the engine adds where it lives)."""

    def __init__(self, row: int, what: str):
        super().__init__(f"non-finite value ({what}) in row {row}")
        self.row, self.what = int(row), what

    def __reduce__(self):  # survives pickling back from a Dask worker
        return (NonFiniteRow, (self.row, self.what))


class FloatOverflow(ValueError):
    """Finite data whose squares or sums left the float64 range (the solvers rescale and retry once)."""


def raise_nonfinite(chunk: np.ndarray, start: int) -> None:
    """Raise :class:`NonFiniteRow` for the first row of ``chunk`` (global row ``start + i``) that is not finite."""
    ok = np.isfinite(chunk).all(axis=1)
    if ok.all():  # finite data whose squares or sums left the float64 range
        big = float(np.abs(chunk).max()) if chunk.size else 0.0
        raise FloatOverflow(f"X: float64 overflow in rows {start}..{start + chunk.shape[0] - 1} (entries up to "
                            f"{big:.3g}): the rows differ in magnitude by more than about 1e150")
    i = int(np.flatnonzero(~ok)[0])
    raise NonFiniteRow(start + i, "NaN" if np.isnan(chunk[i]).any() else "Inf")


_SCRATCH = threading.local()


def scratch(shape, slot: str = "a") -> np.ndarray:
    """A reusable float64 work array of ``shape`` for this thread (contents undefined).

    Chunk functions write their large temporaries into it instead of allocating a
    fresh chunk-sized array per chunk: allocations of that size are served by
    ``mmap`` and page-faulted in on every chunk when the process runs with a small
    ``MALLOC_TRIM_THRESHOLD_`` (as Dask workers do), which made passes 2x slower.
    Callers must not return or keep the array.
    """
    cache = getattr(_SCRATCH, "arrays", None)
    if cache is None:
        cache = _SCRATCH.arrays = {}
    buf = cache.get(slot)
    size = int(np.prod(shape))
    if buf is None or buf.size < size:
        buf = cache[slot] = np.empty(size)
    return buf[:size].reshape(shape)


def is_dask_array(X) -> bool:
    """Whether ``X`` is a ``dask.array.Array`` (without importing dask)."""
    return type(X).__module__.split(".")[0] == "dask" and hasattr(X, "chunks") and hasattr(X, "dask")


def nonfinite_error(X, err: NonFiniteRow, name: str = "X") -> ValueError:
    """The user-facing error for a non-finite row; a source names its file and row (or line) itself."""
    msg = getattr(X, "bad_row_message", None)
    if msg is not None:
        return ValueError(msg(err.row, err.what))
    return ValueError(f"{name} has a non-finite value ({err.what}) in row {err.row} (0-based)")


def _batches(X, N: int, rows: int, name: str, prefetch: bool):
    """:meth:`LocalEngine.batches` / :meth:`DaskEngine.batches`: blocks of ``X`` (NumPy) with a finiteness check."""
    if rows < 1:
        raise ValueError(f"batch rows must be >= 1, got {rows}")

    def load(s):
        c = np.asarray(X[s : min(N, s + rows)])
        return c if c.dtype in (np.float32, np.float64) else c.astype(np.float64)

    def checked(s, c):
        if not np.isfinite(c).all():
            ok = np.isfinite(c).all(axis=1)
            i = int(np.flatnonzero(~ok)[0])
            err = NonFiniteRow(s + i, "NaN" if np.isnan(c[i]).any() else "Inf")
            raise nonfinite_error(X, err, name) from None
        return s, c

    if not prefetch or N <= rows:
        for s in range(0, N, rows):
            yield checked(s, load(s))
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        nxt = pool.submit(load, 0)
        for s in range(0, N, rows):
            cur = nxt.result()
            if s + rows < N:
                nxt = pool.submit(load, s + rows)
            yield checked(s, cur)


class LocalEngine:
    """Run passes chunk by chunk in this process.

    Parameters
    ----------
    X : array-like (N, n)
        Anything with ``.shape`` and row slicing ``X[s:e]``: a NumPy array, an
        ``np.memmap``, an :class:`~widelimit.data.source.ActivationSource`.
    rows : int, optional
        Rows per chunk (default: a float64 chunk of ``_validation.CHUNK_BYTES``).
    progress : callable, optional
        Receives a :class:`Progress` after every chunk.
    prefetch : bool, optional
        Read the next chunk in a background thread (default: for sources that
        are not in-memory arrays).
    offset : int
        Global index of ``X``'s first row (when ``X`` is one block of a larger matrix).
    """

    def __init__(self, X, rows: int | None = None, progress: ProgressFn | None = None, prefetch: bool | None = None,
                 offset: int = 0, threads: int | None = None, scale: float = 1.0):
        self.X = X
        if isinstance(X, ScaledRows):  # read the stored rows, scale each chunk after hashing it
            X, scale = X.base, X.factor * scale
        self.base = X
        self.scale = float(scale)
        self.fingerprint = None
        self.offset = int(offset)
        self.N, self.n = int(X.shape[0]), int(X.shape[1])
        self.rows = int(rows or chunk_rows(self.n))
        self.progress = progress
        self.passes = 0
        self.stage = "pass"
        self.prefetch = (not isinstance(X, np.ndarray)) if prefetch is None else bool(prefetch)
        # in-memory arrays and sources that allow concurrent reads are reduced by several threads,
        # each reading and reducing its own chunks (NumPy, BLAS and file reads release the GIL);
        # other row sources keep one reader with a prefetch thread
        # (in fixed row ranges whatever the thread count, so the results do not depend on it)
        self.parallel = ((isinstance(X, np.ndarray) or getattr(X, "concurrent_reads", False))
                         and self.N >= 2 * TASK_CHUNKS * self.rows)
        self.threads = (default_threads() if threads is None else check_threads(threads)) if self.parallel else 1

    def bind(self, progress: ProgressFn | None = None) -> "LocalEngine":
        """This engine with its own progress callback and pass counter (the set-up is shared)."""
        e = copy.copy(self)
        e.progress, e.passes, e.stage = progress, 0, "pass"
        return e

    def batches(self, rows: int, *, name: str = "X"):
        """Consecutive blocks of ``rows`` rows as ``(start, block)``, in row order (a sequential pass).

        For loops that keep state between blocks (``certify_sae``'s batches). Sources are read
        one block ahead in a background thread; a NaN or Inf row raises the engine's one-line
        error naming the row and, for sources, its shard (``name`` names the data).
        """
        yield from _batches(self.X, self.N, int(rows), name, prefetch=self.prefetch)

    def _load(self, s):
        c = np.asarray(self.base[s : min(self.N, s + self.rows)])
        return c if c.dtype in (np.float32, np.float64) else c.astype(np.float64)

    def _chunks(self):
        N, rows = self.N, self.rows
        starts = range(0, N, rows)
        if not self.prefetch or N <= rows:
            for s in starts:
                yield s, self._load(s)
            return
        with ThreadPoolExecutor(max_workers=1) as pool:
            nxt = pool.submit(self._load, 0)
            for s in starts:
                cur = nxt.result()
                if s + rows < N:
                    nxt = pool.submit(self._load, s + rows)
                yield s, cur

    def _tasks(self, work):
        """Run ``work(s, e)`` over consecutive row ranges of :data:`TASK_CHUNKS` chunks, yielding
        ``(e, result)`` in row order.

        The ranges do not depend on the number of threads, so neither do the results
        (partial sums are always merged in the same order).
        """
        span = self.rows * TASK_CHUNKS
        ranges = [(s, min(self.N, s + span)) for s in range(0, self.N, span)]
        if self.threads == 1:
            for s, e in ranges:
                yield e, work(s, e)
            return
        with one_blas_thread(), ThreadPoolExecutor(max_workers=self.threads) as pool:
            ahead = 2 * self.threads  # bounded look-ahead: memory stays O(threads x chunk)
            futs = [pool.submit(work, s, e) for s, e in ranges[:ahead]]
            for i, (s, e) in enumerate(ranges):
                res = futs[i].result()
                if i + ahead < len(ranges):
                    futs.append(pool.submit(work, *ranges[i + ahead]))
                futs[i] = None
                yield e, res

    def reduce(self, fn, merge, *args, extras=(), stage: str | None = None, fingerprint: bool = False):
        """``merge`` of ``fn(chunk, start, *args, *extra_blocks)`` over all row chunks (one pass).

        ``extras`` are row-aligned arrays (weights ``(N,)``, codes ``(N, k)``,
        dense or scipy.sparse, or ``None``) sliced like the chunk. Partial results are
        merged in row order whatever the number of threads. With ``fingerprint=True`` the
        pass also hashes every row as stored (:mod:`widelimit.engine.fingerprint`) and sets
        :attr:`fingerprint`.
        """
        if fingerprint:

            hfn, hmerge = hashed(fn, merge)
            lanes, out = self.reduce(hfn, hmerge, *args, extras=extras, stage=stage)
            self.fingerprint = finish(lanes, (self.N, self.n))  # of this block only when offset > 0
            return out
        self.passes += 1
        stage = stage or self.stage
        off = self.offset
        f = self.scale

        def part(s, c):
            e = s + c.shape[0]
            if f != 1.0:  # the chunk as stored goes to the hash (if any) first, then is scaled
                if isinstance(fn, partial) and fn.func is _hashed_chunk:

                    return _lanes(c, off + s), fn.args[0](_times(c, f), off + s, *args,
                                                          *[None if x is None else x[s:e] for x in extras])
                c = _times(c, f)
            return fn(c, off + s, *args, *[None if x is None else x[s:e] for x in extras])

        acc = None
        since = pass_timer()
        try:
            if not self.parallel:
                for s, c in self._chunks():
                    p = part(s, c)
                    acc = p if acc is None else merge(acc, p)
                    if self.progress is not None:
                        e = s + c.shape[0]
                        self.progress(Progress(stage, self.passes, e, self.N, done=e == self.N, time_s=since()))
                return acc

            def work(s0, e0):
                a = None
                for s in range(s0, e0, self.rows):
                    p = part(s, self._load(s))
                    a = p if a is None else merge(a, p)
                return a

            for e, p in self._tasks(work):
                acc = p if acc is None else merge(acc, p)
                if self.progress is not None:
                    self.progress(Progress(stage, self.passes, e, self.N, done=e == self.N, time_s=since()))
        except NonFiniteRow as err:
            if self.offset:  # one block of a larger matrix: the caller knows where the row lives
                raise
            raise nonfinite_error(self.base, err) from None
        return acc

    def map_rows(self, fn, *args, cols: int | None = None, stage: str | None = None) -> np.ndarray:
        """Concatenate ``fn(chunk, start, *args)`` over all chunks (one pass).

        ``fn`` returns one number per row (``cols=None``, result ``(N,)``) or ``cols`` numbers
        per row (result ``(N, cols)``).
        """
        self.passes += 1
        out = np.empty(self.N if cols is None else (self.N, cols))
        off = self.offset

        f = self.scale

        def work(s0, e0):
            for s in range(s0, e0, self.rows):
                c = self._load(s)
                out[s : s + c.shape[0]] = fn(_times(c, f), off + s, *args)

        try:
            if not self.parallel:
                for s, c in self._chunks():
                    out[s : s + c.shape[0]] = fn(_times(c, f), off + s, *args)
            else:
                for _e, _ in self._tasks(work):
                    pass
        except NonFiniteRow as err:
            if self.offset:
                raise
            raise nonfinite_error(self.base, err) from None
        return out

    def take(self, idx) -> np.ndarray:
        """Rows ``idx`` (sorted or not) as float64 (random access; not counted as a pass)."""
        rows = np.asarray(self.base[np.asarray(idx)], dtype=np.float64)
        return rows if self.scale == 1.0 else rows * self.scale


def _times(c: np.ndarray, f: float) -> np.ndarray:
    """``f c`` in float64 (``c`` as stored when ``f = 1``): a power of two times float32 rows, done in float32,
    flushed entries near ``1e-20`` to zero at ``f = 2^-100`` and overflowed at ``f > 2^128``."""
    return c if f == 1.0 else np.asarray(c, dtype=np.float64) * f


class ScaledRows:
    """The rows of ``X`` times ``factor``, an exact power of two, read lazily (the solvers' normalisation).

    Multiplying by a power of two is exact in floating point (away from overflow and
    subnormals), so a computation on the scaled rows is the same computation on ``X`` in other
    units (docs/theory.md §8.4). The engines read ``base`` and scale each chunk after
    hashing it, so the fingerprint is that of ``X`` itself.
    """

    def __init__(self, X, factor: float):
        self.base, self.factor = X, float(factor)
        self.shape = tuple(int(d) for d in X.shape)
        self.dtype = np.dtype(X.dtype)
        self.ndim = 2

    @property
    def concurrent_reads(self) -> bool:
        return isinstance(self.base, np.ndarray) or bool(getattr(self.base, "concurrent_reads", False))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx) -> np.ndarray:
        return np.asarray(self.base[idx], dtype=np.float64) * self.factor


_BLAS = None


def one_blas_thread():
    """Context in which BLAS runs on one thread (the passes' own threads use the cores).

    Multi-threaded BLAS calls between passes (the Newton matrix, its eigendecomposition) leave
    OpenBLAS threads spinning for a while, which slowed the next pass by up to a third.
    """
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


#: Chunks per task of a multi-threaded pass (fixed, so results do not depend on the thread count).
TASK_CHUNKS = 4


def data_fingerprint(X) -> list:
    """What identifies ``X`` for a checkpoint: shard names/sizes/mtimes, a Dask name, or a content hash."""
    if hasattr(X, "fingerprint"):
        return ["source"] + X.fingerprint()
    if is_dask_array(X):
        return ["dask", X.name, list(X.shape)]

    h = hashlib.sha1()
    N = X.shape[0]
    for idx in (slice(0, 64), slice(max(0, N - 64), N)):
        h.update(np.ascontiguousarray(np.asarray(X[idx], dtype=np.float64)).tobytes())
    return ["array", list(X.shape), str(X.dtype), h.hexdigest()]
