r"""Dask backend: the exact bound, the medians and the certificates on a cluster.

The algorithms of :mod:`widelimit.exact.median` and :mod:`widelimit.exact.certificate`
are sequences of passes, each a pure per-chunk function followed by an
associative merge, with O(n) state in between (:mod:`widelimit.engine.local`).
:class:`DaskEngine` runs each pass as **one Dask reduction**: a task per row
block of a ``dask.array`` computes the block's partial sums, a binary tree of
merge tasks combines them, and only the O(n) result travels back to the
client, which takes the next step. The same functions run in-process on
NumPy arrays and :class:`~widelimit.data.source.ActivationSource`, so the numbers
agree with the single-machine code to rounding.

Usage: pass a ``dask.array`` wherever an array is expected::

    from dask.distributed import Client
    import widelimit as wl
    from widelimit.engine.dask_engine import from_source

    client = Client("tcp://scheduler:8786")          # or LocalCluster(), dask-jobqueue, dask-kubernetes
    X = from_source(wl.open_activations("/data/acts/"))  # lazy; each worker reads its blocks
    med = wl.huber_median(X, lam=0.05)               # passes run on the workers
    cert = wl.verify(X, 0.05, W, Z, b, median=med)   # Z: in memory, or a dask.array with X's row chunks

With a ``dask.distributed`` client the data are persisted on the workers
before the first pass when they fit in half of the cluster's memory
(``persist="auto"``), so later passes do not re-read the files; otherwise
every pass streams them from storage. A worker that dies mid-pass is
replaced by the scheduler, which recomputes its blocks (re-reading them from
the source); the pass then completes with the same sums, and the client-side
state of earlier passes is never lost (combine with ``checkpoint=`` to
survive the client too).
"""

from __future__ import annotations

import copy

import numpy as np

from .local import LocalEngine, NonFiniteRow, _batches, Progress, chunk_rows, pass_timer, data_fingerprint, is_dask_array, nonfinite_error
from .fingerprint import finish, hashed

__all__ = ["DaskEngine", "from_source", "known_chunks", "PERSIST", "BLOCK_BYTES"]

#: Default persistence policy of :class:`DaskEngine`: ``"auto"``, ``True`` or ``False``.
PERSIST = "auto"

#: Default float64 bytes per Dask block made by :func:`from_source` (one task per block and pass).
BLOCK_BYTES = 1 << 26  # 64 MiB

_BIG_ARG = 1 << 20  # arguments above this many bytes become one shared graph key


def from_source(source, rows: int | None = None):
    """A lazy ``dask.array`` over an :class:`~widelimit.data.source.ActivationSource` (or any row-sliceable array).

    Parameters
    ----------
    source : ActivationSource or array-like (N, n)
    rows : int, optional
        Rows per block (default: :data:`BLOCK_BYTES` of float64 per block; a
        task reduces its block in cache-sized chunks, as the single-process engine does).

    Returns
    -------
    dask.array.Array
        Blocks of ``rows`` whole rows; the task that needs a block reads it from
        the source (on a worker), so the source must be readable there (shared
        file system or object store mount).
    """
    import dask.array as da
    from dask.base import tokenize


    n = int(source.shape[1])
    rows = int(rows or chunk_rows(n, BLOCK_BYTES))
    name = "widelimit-source-" + tokenize(data_fingerprint(source), rows)
    _SOURCES[name] = source
    return da.from_array(source, chunks=(rows, n), asarray=True, lock=False, name=name,
                         meta=np.empty((0, n), dtype=source.dtype))


#: dask array name -> the source it reads (random row access without a pass over the blocks)
_SOURCES: dict = {}


def _client():
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


def _apply(fn, merge, block, start, args, *extras, scale=1.0):
    """One block, reduced on the worker in cache-sized chunks by the single-process engine."""

    return LocalEngine(block, offset=start, prefetch=False, threads=1, scale=scale).reduce(fn, merge, *args,
                                                                                          extras=extras)


def _apply_rows(fn, block, start, args, cols=None, scale=1.0):

    return LocalEngine(block, offset=start, prefetch=False, threads=1, scale=scale).map_rows(fn, *args, cols=cols)


def known_chunks(X, name: str) -> None:
    """Refuse a ``dask.array`` whose chunk sizes are unknown (NaN rows per block, as after boolean indexing):
    the passes split rows by block, so the sizes are needed; one ``ValueError`` saying how to get them."""
    if is_dask_array(X) and any(not np.isfinite(c) for dim in X.chunks for c in dim):
        raise ValueError(f"{name} is a dask array with unknown chunk sizes (shape {tuple(X.shape)}, e.g. after "
                         f"boolean indexing); compute them first: {name} = {name}.compute_chunk_sizes()")



def _workers(client) -> dict:
    """Every worker's info: newer distributed lists only the first few unless ``n_workers=-1`` is asked for."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # distributed before 2025.4 takes no n_workers and lists them all
        info = client.scheduler_info()
    return info.get("workers", {})


class DaskEngine:
    """Run the passes of :mod:`widelimit.engine.local` as Dask reductions over the row blocks of ``X``.

    Parameters
    ----------
    X : dask.array.Array (N, n)
        Float data; column chunks are merged so that every block holds whole rows.
    progress : callable, optional
        Receives one :class:`~widelimit.engine.local.Progress` per pass.
    persist : {"auto", True, False}, optional
        Keep the blocks in worker memory across passes (default :data:`PERSIST`;
        ``"auto"``: with a distributed client, when ``X`` fits in half of the workers' memory).
    """

    def bind(self, progress=None) -> "DaskEngine":
        """This engine (same persisted array) with its own progress callback and pass counter."""
        e = copy.copy(self)
        e.progress, e.passes, e.stage = progress, 0, "pass"
        return e

    def __init__(self, X, progress=None, persist=None, scale: float = 1.0):
        if not is_dask_array(X):
            raise ValueError("DaskEngine needs a dask.array")
        known_chunks(X, "X")
        if len(X.chunks[1]) > 1:
            X = X.rechunk({1: -1})
        if 0 in X.chunks[0] and X.shape[0] > 0:  # blocks of no rows (a selection): a pass has nothing to merge there
            X = X.rechunk({0: tuple(c for c in X.chunks[0] if c > 0)})
        self.source = _SOURCES.get(X.name)
        self.N, self.n = int(X.shape[0]), int(X.shape[1])
        self.scale = float(scale)  # each block is hashed as stored, then multiplied by this (a power of two)
        self.fingerprint = None
        self.progress = progress
        self.passes = 0
        self.stage = "pass"
        persist = PERSIST if persist is None else persist
        if persist == "auto":
            client = _client()
            persist = False
            if client is not None:
                mem = sum(w.get("memory_limit", 0) or 0 for w in _workers(client).values())
                persist = X.nbytes <= 0.5 * mem
        self.persisted = bool(persist)
        self.X = X.persist() if self.persisted else X
        self.offsets = np.concatenate([[0], np.cumsum(self.X.chunks[0])]).astype(np.int64)

    # ------------------------------------------------------------------------------
    def _blocks(self):
        return list(self.X.to_delayed()[:, 0])

    def _extra_blocks(self, x):
        nb = len(self.offsets) - 1
        if x is None:
            return [None] * nb
        if is_dask_array(x):
            chunks = (self.X.chunks[0],) + tuple((d,) for d in x.shape[1:])
            d = x.rechunk(chunks).to_delayed()
            return list(d.reshape(nb, -1)[:, 0]) if x.ndim > 1 else list(d)
        return [x[int(s) : int(e)] for s, e in zip(self.offsets[:-1], self.offsets[1:])]

    @staticmethod
    def _shared(args):
        import dask

        return tuple(dask.delayed(a, pure=True) if isinstance(a, np.ndarray) and a.nbytes > _BIG_ARG else a
                     for a in args)

    def _compute(self, obj):
        import dask

        try:
            return dask.compute(obj)[0]
        except NonFiniteRow as err:
            raise nonfinite_error(self.X, err) from None

    def batches(self, rows: int, *, name: str = "X"):
        """Consecutive blocks of ``rows`` rows as ``(start, block)`` computed one by one (next one ahead)."""
        yield from _batches(self.X, self.N, int(rows), name, prefetch=True)

    def reduce(self, fn, merge, *args, extras=(), stage: str | None = None, fingerprint: bool = False):
        """One pass: ``merge`` over blocks of ``fn(block, start, *args, *extra_blocks)``, as one Dask graph.

        ``fingerprint=True``: the blocks are also hashed on the workers and :attr:`fingerprint` is set.
        """
        import dask

        if fingerprint:

            lanes, out = self.reduce(*hashed(fn, merge), *args, extras=extras, stage=stage)
            self.fingerprint = finish(lanes, (self.N, self.n))
            return out
        self.passes += 1
        since = pass_timer()
        args = self._shared(args)
        ex = [self._extra_blocks(x) for x in extras]
        app = dask.delayed(_apply, pure=True)
        mrg = dask.delayed(merge, pure=True)
        parts = [app(fn, merge, blk, int(s), args, *[e[j] for e in ex], scale=self.scale)
                 for j, (blk, s) in enumerate(zip(self._blocks(), self.offsets[:-1]))]
        while len(parts) > 1:  # binary tree of merges: O(log blocks) depth, O(n) per message
            parts = [mrg(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        out = self._compute(parts[0])
        if self.progress is not None:
            self.progress(Progress(stage or self.stage, self.passes, self.N, self.N, done=True, time_s=since()))
        return out

    def map_rows(self, fn, *args, cols: int | None = None, stage: str | None = None) -> np.ndarray:
        """One pass returning one number (or ``cols`` numbers) per row, gathered on the client (O(N) scalars)."""
        import dask

        self.passes += 1
        app = dask.delayed(_apply_rows, pure=True)
        args = self._shared(args)
        parts = [app(fn, blk, int(s), args, cols, self.scale) for blk, s in zip(self._blocks(), self.offsets[:-1])]
        return np.concatenate(self._compute(parts))

    def take(self, idx) -> np.ndarray:
        """Rows ``idx`` as float64 (gathered on the client; not a pass).

        Data persisted on the workers are gathered from them; an array made by
        :func:`from_source` and not persisted is read from its source directly
        (a random subsample would otherwise load every block it touches).
        """
        idx = np.asarray(idx, dtype=np.int64)
        if self.source is not None and not self.persisted:
            try:
                return np.asarray(self.source[idx], dtype=np.float64) * self.scale
            except OSError:  # the client cannot see the files: let the workers read them
                pass
        return np.asarray(self._compute(self.X[idx]), dtype=np.float64) * self.scale
