r"""Content fingerprints of the data, taken inside a pass (no extra pass).

A certificate is a statement about one data set; a checkpoint or a median is only reusable on
that same data. The fingerprint identifies the *whole content*: every byte of every row.

**Definition.** Row ``i`` (its bytes as stored, float32 or float64) is hashed with XXH64
(xxHash, a fast non-cryptographic hash) seeded with ``i``, giving ``h_i``; the fingerprint is
the pair of sums ``(sum_i h_i, sum_i h_i^2) mod 2^64`` with the shape and the dtype. Sums make it
independent of how a pass cuts the rows into chunks (in-process chunks, Dask blocks of any
size, any number of threads), so the same data always have the same fingerprint, and partial
results merge by addition. Seeding with the row index makes it depend on the order of the rows.
Any change of content changes it but for chance (probability about ``2^-64`` per lane).

XXH64 runs row by row in a numba kernel (checked against the ``xxhash`` library in the tests;
the library hashes the final string). It reads each chunk once more while it is in cache,
which costs a few percent of the pass that reads the rows anyway.

:meth:`widelimit.engine.local.LocalEngine.reduce` (and the Dask engine) take ``fingerprint=True``:
the pass then hashes every chunk as read (before any scaling) and leaves the result in
``engine.fingerprint``.
"""

from __future__ import annotations

from functools import partial

import numba as nb
import numpy as np
import xxhash

__all__ = ["hashed", "finish", "mismatch_error", "row_hashes"]

_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P3 = np.uint64(1609587929392839161)
_P4 = np.uint64(9650029242287828579)
_P5 = np.uint64(2870177450012600261)
_M64 = (1 << 64) - 1


@nb.njit(inline="always")
def _rotl(x, r):  # pragma: no cover - compiled
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@nb.njit(inline="always")
def _round(acc, inp):  # pragma: no cover - compiled
    acc = acc + inp * _P2
    acc = _rotl(acc, 31)
    return acc * _P1


@nb.njit(inline="always")
def _merge_round(acc, val):  # pragma: no cover - compiled
    acc = acc ^ _round(np.uint64(0), val)
    return acc * _P1 + _P4


@nb.njit(nogil=True, cache=True)
def _xxh64_rows(words, start, out):  # pragma: no cover - compiled
    """XXH64 of each row of ``words`` (uint32 little-endian words of the row bytes), seed = global row index."""
    m, nw = words.shape
    length = np.uint64(4 * nw)
    for i in range(m):
        seed = np.uint64(start + i)
        j = 0
        if nw >= 8:
            v1 = seed + _P1 + _P2
            v2 = seed + _P2
            v3 = seed
            v4 = seed - _P1
            while j + 8 <= nw:
                v1 = _round(v1, np.uint64(words[i, j]) | (np.uint64(words[i, j + 1]) << np.uint64(32)))
                v2 = _round(v2, np.uint64(words[i, j + 2]) | (np.uint64(words[i, j + 3]) << np.uint64(32)))
                v3 = _round(v3, np.uint64(words[i, j + 4]) | (np.uint64(words[i, j + 5]) << np.uint64(32)))
                v4 = _round(v4, np.uint64(words[i, j + 6]) | (np.uint64(words[i, j + 7]) << np.uint64(32)))
                j += 8
            h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
            h = _merge_round(h, v1)
            h = _merge_round(h, v2)
            h = _merge_round(h, v3)
            h = _merge_round(h, v4)
        else:
            h = seed + _P5
        h = h + length
        while j + 2 <= nw:
            k = _round(np.uint64(0), np.uint64(words[i, j]) | (np.uint64(words[i, j + 1]) << np.uint64(32)))
            h = h ^ k
            h = _rotl(h, 27) * _P1 + _P4
            j += 2
        if j < nw:
            h = h ^ (np.uint64(words[i, j]) * _P1)
            h = _rotl(h, 23) * _P2 + _P3
        h = h ^ (h >> np.uint64(33))
        h = h * _P2
        h = h ^ (h >> np.uint64(29))
        h = h * _P3
        h = h ^ (h >> np.uint64(32))
        out[i] = h


def row_hashes(c: np.ndarray, start: int) -> np.ndarray:
    """XXH64 of the bytes of each row of ``c`` (float32/float64, global rows ``start, start + 1, ...``), seeded by row index."""
    c = np.ascontiguousarray(c)
    words = c.view(np.uint32).reshape(c.shape[0], -1)
    out = np.empty(c.shape[0], dtype=np.uint64)
    _xxh64_rows(words, int(start), out)
    return out


def _lanes(c: np.ndarray, start: int) -> tuple:
    h = row_hashes(c, start)
    with np.errstate(over="ignore"):
        return (int(h.sum(dtype=np.uint64)), int((h * h).sum(dtype=np.uint64)), c.dtype.str)


def _hashed_chunk(fn, c, s, *rest):
    return _lanes(c, s), fn(c, s, *rest)


def _add_lanes(p, q):
    dt = p[2] if p[2] == q[2] else p[2] + "," + q[2]
    return ((p[0] + q[0]) & _M64, (p[1] + q[1]) & _M64, dt)


def _hashed_merge(merge, p, q):
    return _add_lanes(p[0], q[0]), merge(p[1], q[1])


def hashed(fn, merge):
    """``(fn', merge')``: the chunk function and merge of a pass that also hashes every row.

    ``fn'`` returns ``(lanes, fn(...))``; picklable (module-level functions in partials), so
    it runs on Dask workers too.
    """
    return partial(_hashed_chunk, fn), partial(_hashed_merge, merge)


def finish(lanes: tuple, shape) -> str:
    """The fingerprint string from the summed lanes of a whole pass."""
    N, n = int(shape[0]), int(shape[1])
    dts = sorted(set(lanes[2].split(",")))
    name = "/".join(np.dtype(t).name for t in dts)
    digest = xxhash.xxh3_128_hexdigest(f"{N}x{n}:{','.join(dts)}:{lanes[0]:016x}{lanes[1]:016x}".encode())
    return f"xxh64sum:{N}x{n}:{name}:{digest}"


def _none(c, s):
    return None


def _keep(a, b):
    return None


def mismatch_error(what: str, expected: str, found: str) -> ValueError:
    """The one-line error for data whose fingerprint is not the one ``what`` was computed on."""
    return ValueError(f"{what} was computed on other data (fingerprint {expected}); "
                      f"this data has fingerprint {found}")
