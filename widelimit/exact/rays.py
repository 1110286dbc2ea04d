r"""Rays of the data around a bias: the narrowest globally optimal dictionary.

At the optimal bias ``b``, a point with ``r_i = ||x_i - b|| > lam`` must be
reconstructed by atoms parallel to ``x_i - b`` with total code ``r_i - lam``;
points within ``lam`` get code 0 (theory.md §3). One atom per distinct
direction ("ray") is therefore the narrowest optimal dictionary, and the
1-sparse code ``z_i = <w, x_i - b> - lam`` on the point's own ray is optimal.

Grouping is near-linear: directions are projected onto a few random orthonormal
vectors (two directions within ``tol`` of each other have every projection
within ``tol``) and sorted by the first projection. A run of keys chained by gaps
``<= tol`` whose directions all lie within ``tol`` of its first is one ray (the
common case of repeated directions); the remaining points are binned on a grid
of cell size ``tol`` over two projections, points within ``tol`` of their cell's
first point follow it, and the rest are compared only with the 3 x 3
neighbouring cells (screened on every projection, then in full), then clustered
greedily around leaders. A group has radius at most ``2 tol`` around its
leader, so a tolerance can merge at most slightly different directions; the
caller reports the objective of what it returns either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validation import check_data, check_lam, check_vector, chunk_rows
from ..engine.kernels import grid_pairs, median_rows
from .median_pass import _NO_W
from ..engine import engine_for
from ..engine.local import raise_nonfinite

__all__ = ["RayGroups", "group_rays", "default_ray_tol"]

_WITHIN_RTOL = 1e-12
#: Runs of at most this many keys are tested for tightness all at once (:func:`_tight_short_runs`).
_SHORT_RUN = 64


def default_ray_tol(dtype) -> float:
    """Direction tolerance of the data's precision: ``1e-8`` for float64 data, ``32 eps32 = 3.8e-6`` for float32.

    A float32 point ``x`` is stored to a relative ``eps32 / 2`` per entry, so its direction from
    the bias is known to about ``eps32 ||x|| / r``; ``32 eps32`` merges directions equal to that
    precision for points not much closer to the bias than to the origin, and no more.
    """
    return 1e-8 if np.dtype(dtype) == np.float64 else 32.0 * float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class RayGroups:
    """Points grouped by direction from a bias.

    Attributes
    ----------
    rays : ndarray (N,) of int
        Ray (atom) index of each point, ``-1`` for points within ``lam``.
    leaders : ndarray (k,) of int
        For each ray, the point whose direction defines its atom.
    radii : ndarray (N,)
        ``||x_i - b||``.
    bias : ndarray (n,)
    lam : float
    tol : float
    """

    rays: np.ndarray
    leaders: np.ndarray
    radii: np.ndarray
    bias: np.ndarray
    lam: float
    tol: float
    signed: bool = False
    n_passes: int = 0  #: passes over X made to group (0 when the keys came from another pass)

    @property
    def width(self) -> int:
        """Number of rays: the width of the narrowest optimal dictionary."""
        return int(self.leaders.size)

    def atoms(self, X, dtype=np.float64) -> np.ndarray:
        """Unit atoms ``(k, n)``: the leaders' directions ``(x - b) / ||x - b||``.

        Computed in float64 chunk by chunk and stored in ``dtype``.
        """
        k, n = self.leaders.size, self.bias.size
        out = np.empty((k, n), dtype=dtype)
        rows = chunk_rows(n)
        for s in range(0, k, rows):
            D = np.asarray(X[self.leaders[s : s + rows]], dtype=np.float64) - self.bias
            D /= np.linalg.norm(D, axis=1, keepdims=True)
            if self.signed:
                D *= _sign_canon(D)[:, None]
            out[s : s + rows] = D
        return out

    def code_values(self, X, atoms=None) -> np.ndarray:
        """The 1-sparse optimal code of each point on its ray: ``(<w, x - b> - lam)_+`` (0 off rays).

        With ``signed=True`` the code is ``sign(t)(|t| - lam)_+`` with ``t = <w, x - b>``.
        """
        W = self.atoms(X) if atoms is None else atoms
        N, n = X.shape
        z = np.zeros(N)
        rows = chunk_rows(n)
        for s in range(0, N, rows):
            ray = self.rays[s : s + rows]
            on = ray >= 0
            if not on.any():
                continue
            D = np.asarray(X[s : s + rows][on], dtype=np.float64) - self.bias
            t = np.einsum("ij,ij->i", D, np.asarray(W[ray[on]], dtype=np.float64))
            if self.signed:
                z[s : s + rows][on] = np.sign(t) * np.maximum(np.abs(t) - self.lam, 0.0)
            else:
                z[s : s + rows][on] = np.maximum(t - self.lam, 0.0)
        return z


def _sign_canon(U: np.ndarray) -> np.ndarray:
    """+1/-1 per row so that the first coordinate of ``U`` with ``|u| > 1e-12`` is positive."""
    big = np.abs(U) > 1e-12
    first = np.argmax(big, axis=1)
    return np.where(U[np.arange(U.shape[0]), first] >= 0, 1.0, -1.0)


def _line_sign(proj: np.ndarray) -> np.ndarray:
    """+1/-1 orienting a line by the sign of its projection on a random direction.

    Unlike a fixed coordinate (which data often leave at exactly 0 plus rounding
    noise), a random direction is almost surely far from orthogonal to every
    line: two directions within ``tol`` of each other get opposite orientations
    only when ``|proj| <= tol``, a band of probability ``O(tol sqrt(n))``.
    """
    return np.where(proj >= 0, 1.0, -1.0)


def group_rays(X, b, *, lam, tol=None, signed: bool = False, seed: int = 0) -> RayGroups:
    r"""Group the points beyond ``lam`` from ``b`` by direction.

    Parameters
    ----------
    X : array (N, n)
    b : array (n,)
        Bias (usually the Huber median).
    lam : float
    tol : float, optional
        Two unit directions ``u_i, u_j`` belong to the same ray when they are within
        ``tol`` of each other (groups have radius at most ``2 tol`` around their leader). Points with ``r_i <= lam (1 + 1e-12)`` count as
        within ``lam`` (their best code, ``r_i - lam``, is at rounding level). Default :func:`default_ray_tol` of X's dtype.
    signed : bool
        Group lines instead of rays (``u`` and ``-u`` together), for signed codes.
    seed : int
        Seed of the random projection used to sort directions.

    Returns
    -------
    RayGroups
    """
    X = check_data(X)
    b = check_vector(b, X.shape[1], "b")
    tol = default_ray_tol(X.dtype) if tol is None else float(tol)
    if not (tol >= 0 and np.isfinite(tol)):
        raise ValueError(f"ray_tol must be a finite number >= 0, got {tol!r}")
    return _group_rays(X, b, check_lam(lam), tol, signed, seed)


def _orient(rows, signed):
    """Signed codes group lines: orient each ``[r, keys]`` row by the sign of its first projection."""
    if signed:  # u and -u, and directions near them, agree
        rows[:, 1:] *= _line_sign(rows[:, 1])[:, None]
    return rows


def _keys_chunk(c, s, b, V, signed):
    """Per row of a block: ``[r, V^T (x - b) / r]`` (one pass computes the rays' sort keys)."""
    rows = np.empty((c.shape[0], V.shape[1] + 1))
    value = median_rows(c, b, 1.0, False, 0.0, _NO_W, False, np.ascontiguousarray(V.T), rows)[0]
    if not np.isfinite(value):  # out-of-core data are checked as they are read
        raise_nonfinite(c, s)
    return _orient(rows, signed)


def _projections(n, seed):
    """The ``min(n, 4)`` orthonormal random directions the rays are sorted and binned by."""
    rng = np.random.default_rng(seed)
    return np.linalg.qr(rng.standard_normal((n, min(n, 4))))[0]


class KeysTap:
    """Collects the rays' sort keys inside another pass (see ``median._solve(tap=...)``).

    ``rows`` ``(N, 1 + p)`` receives ``[r, keys]`` of every row; ``point`` is the bias the last
    tapped pass was made at (``None`` before any).
    """

    def __init__(self, N, n, signed=False, seed=0):
        self.V = _projections(n, seed)
        self.VT = np.ascontiguousarray(self.V.T)
        self.signed = signed
        self.seed = seed
        self.rows = np.empty((N, self.V.shape[1] + 1))
        self.point = None

    def store(self, rows, s):
        """Keep the ``[r, keys]`` rows of the block starting at row ``s``."""
        self.rows[s : s + rows.shape[0]] = _orient(rows, self.signed)

    def keys_at(self, b):
        """The collected ``[r, keys]`` if they were taken at exactly ``b``, else ``None``."""
        return self.rows if self.point is not None and np.array_equal(self.point, b) else None


def _tight_short_runs(st, en, K, unit, tol, step) -> np.ndarray:
    """For each run ``[st, en)`` (short): whether every direction is within ``tol`` of the run's first.

    The same test as ``tight`` in :func:`_group_rays`, for many short runs at once (vectorised
    in batches of about ``step`` rows): a Python loop over thousands of two-point runs
    (small ``tol``, many directions) cost more than the rest of the grouping.
    """
    out = np.zeros(st.size, dtype=bool)
    lens = en - st
    r0 = 0
    while r0 < st.size:
        r1 = r0 + max(1, int(np.searchsorted(np.cumsum(lens[r0:]), step, side="right")))
        s_st, s_len = st[r0:r1], lens[r0:r1]
        rid = np.repeat(np.arange(s_st.size), s_len)
        first = np.repeat(s_st, s_len)
        idx = first + (np.arange(int(s_len.sum())) - np.repeat(np.cumsum(s_len) - s_len, s_len))
        ok = np.all(np.abs(K[idx] - K[first]) <= tol, axis=1)  # the cheap screen on the projections
        run_ok = np.ones(s_st.size, dtype=bool)
        np.logical_and.at(run_ok, rid, ok)
        cand = run_ok[rid]
        if cand.any():
            U = unit(idx[cand])
            heads = np.flatnonzero(idx[cand] == first[cand])  # each run's first member, in run order
            U0 = U[np.repeat(heads, s_len[run_ok])]
            close = np.linalg.norm(U - U0, axis=1) <= tol
            ok_c = np.ones(int(run_ok.sum()), dtype=bool)
            np.logical_and.at(ok_c, np.repeat(np.arange(ok_c.size), s_len[run_ok]), close)
            run_ok[np.flatnonzero(run_ok)] = ok_c
        out[r0:r1] = run_ok
        r0 = r1
    return out


def _group_rays(X, b, lam, tol, signed, seed, rk=None) -> RayGroups:
    """:func:`group_rays` on validated input (``rk``: the ``[r, keys]`` rows at ``b`` if already known)."""
    N, n = X.shape
    V = _projections(n, seed)
    passes = int(rk is None)
    if rk is None:
        rk = engine_for(X).map_rows(_keys_chunk, b, V, signed, cols=V.shape[1] + 1, stage="rays")
    radii, keys = rk[:, 0], rk[:, 1:]
    beyond = np.flatnonzero(radii > lam * (1.0 + _WITHIN_RTOL))
    rays = np.full(N, -1, dtype=np.int64)
    if beyond.size == 0:
        return RayGroups(rays, np.zeros(0, dtype=np.int64), radii, b, lam, tol, signed, passes)

    # Sort by the first projection: two directions within tol of each other have every
    # projection within tol, so a ray lies inside one run of keys chained by gaps <= tol.
    order = beyond[np.argsort(keys[beyond, 0])]
    K = keys[order]
    k0 = K[:, 0]
    starts = np.flatnonzero(np.concatenate([[True], np.diff(k0) > tol]))
    ends = np.concatenate([starts[1:], [order.size]])
    label = np.full(order.size, -1, dtype=np.int64)
    leader_of: list = []

    def unit(idx):
        D = np.asarray(X[order[idx]], dtype=np.float64) - b
        D /= np.linalg.norm(D, axis=1, keepdims=True)
        if signed:
            D *= _line_sign(D @ V[:, 0])[:, None]
        return D

    label_next, loose = _label_runs(starts, ends, K, unit, tol, chunk_rows(n), label, leader_of)
    if loose:
        label_next = _label_loose(np.concatenate(loose), K, unit, tol, chunk_rows(n), label, leader_of, label_next)
    # number rays by the smallest point index they contain (deterministic, data order)
    first_point = np.full(label_next, N, dtype=np.int64)
    np.minimum.at(first_point, label, order)
    is_first = np.zeros(N, dtype=bool)  # first points are distinct: rank them without sorting
    is_first[first_point] = True
    renum = (np.cumsum(is_first) - 1)[first_point]
    rays[order] = renum[label]
    leaders = np.empty(label_next, dtype=np.int64)
    leaders[renum] = order[np.asarray(leader_of, dtype=np.int64)]
    return RayGroups(rays, leaders, radii, b, lam, tol, signed, passes)


def _label_runs(starts, ends, K, unit, tol, step, label, leader_of):
    """Label the runs of keys that are one ray each -- a single point, or a tight run (every direction within
    ``tol`` of the first) -- in ``label`` and ``leader_of``; returns the next label and the loose runs."""
    single = (ends - starts) == 1
    sing = starts[single]
    label[sing] = np.arange(sing.size)
    leader_of.extend(sing.tolist())
    label_next = int(sing.size)
    loose = []
    m_st, m_en = starts[~single], ends[~single]
    is_tight = np.zeros(m_st.size, dtype=bool)
    short = (m_en - m_st) <= _SHORT_RUN
    is_tight[short] = _tight_short_runs(m_st[short], m_en[short], K, unit, tol, step)
    for j in np.flatnonzero(~short):
        is_tight[j] = _tight(m_st[j], m_en[j], K, unit, tol, step)
    for st, en, t in zip(m_st, m_en, is_tight):
        if t:  # a tight run: one ray
            label[st:en] = label_next
            leader_of.append(int(st))
            label_next += 1
        else:
            loose.append(np.arange(st, en))
    return label_next, loose


def _tight(st, en, K, unit, tol, step):
    """Whether every direction of the run ``st:en`` is within tol of its first (chunked, early exit)."""
    u0 = unit(np.arange(st, st + 1))[0]
    for c0 in range(st, en, step):
        kk = K[c0 : min(en, c0 + step)]  # cheap screen on the projections first
        if np.any(np.abs(kk - K[st]) > tol):
            return False
        if np.any(np.linalg.norm(unit(np.arange(c0, min(en, c0 + step))) - u0, axis=1) > tol):
            return False
    return True


def _label_loose(pos, K, unit, tol, step, label, leader_of, label_next):
    """Label the points of the loose runs ``pos``: isolated points are rays of their own; the others are
    grouped from their close pairs, leaders in key order taking their free neighbours. Returns the next label."""
    import scipy.sparse as sp

    src, dst, follow, head = _close_pairs(pos, K, unit, tol, step)
    has_edge = np.zeros(K.shape[0], dtype=bool)
    has_edge[src] = True
    has_edge[dst] = True
    has_edge[follow] = True  # followers are labelled through their head
    iso = pos[~has_edge[pos]]
    label[iso] = label_next + np.arange(iso.size)
    leader_of.extend(iso.tolist())
    label_next += int(iso.size)
    if src.size:
        A = sp.csr_array((np.ones(2 * src.size), (np.r_[src, dst], np.r_[dst, src])), shape=(K.shape[0],) * 2)
        reps = pos[has_edge[pos]]
        reps = reps[~np.isin(reps, follow)]
        for h in reps:  # leaders in key order, each takes its free neighbours
            if label[h] >= 0:
                continue
            label[h] = label_next
            nb = A.indices[A.indptr[h] : A.indptr[h + 1]]
            nb = nb[label[nb] < 0]
            label[nb] = label_next
            leader_of.append(int(h))
            label_next += 1
    label[follow] = label[head]
    return label_next


def _close_pairs(pos, K, unit, tol, step):
    """Pairs of directions within ``tol`` among the sorted positions ``pos``.

    Points are binned on a grid of cell size ``tol`` over the first two random
    projections (two directions within ``tol`` fall in the same or adjacent
    cells). A point within ``tol`` of its cell's first point *follows* it (so
    repeated directions cost nothing); the remaining representatives are
    compared with those in the 3 x 3 neighbouring cells, screened on all
    projections, then on the full distance.

    Returns ``(src, dst, follow, head)``: edges between representatives, and
    followers with the head each one follows (all positions into the sorted order).
    """
    empty = np.zeros(0, dtype=np.int64)
    q = min(2, K.shape[1])
    c = np.floor(K[pos, :q] / max(tol, 1e-300)).astype(np.int64)
    c -= c.min(axis=0)
    if q == 2:  # the 3 x 3 neighbouring cells are 3 runs of 3 consecutive keys
        w1 = int(c[:, 1].max()) + 3
        key = c[:, 0] * w1 + c[:, 1] + 1
    else:
        w1 = 0
        key = c[:, 0] + 1
    srt = np.argsort(key)
    P, ks = pos[srt], key[srt]
    first = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
    head_at = np.repeat(first, np.diff(np.concatenate([first, [ks.size]])))
    follows = np.zeros(ks.size, dtype=bool)
    cand = np.flatnonzero(head_at != np.arange(ks.size))
    cand = cand[np.all(np.abs(K[P[cand]] - K[P[head_at[cand]]]) <= tol, axis=1)]  # screen on every projection
    for a in range(0, cand.size, step):
        ii = cand[a : a + step]
        d = np.linalg.norm(unit(P[ii]) - unit(P[head_at[ii]]), axis=1)
        follows[ii[d <= tol]] = True
    follow, head = P[follows], P[head_at[follows]]
    R, rk = P[~follows], ks[~follows]  # representatives, still sorted by cell key
    src, dst = [], []
    i, j = grid_pairs(rk, K[R], w1, q == 2, tol)  # touching cells, screened on every projection
    a, bb = R[i], R[j]
    for s0 in range(0, a.size, step):
        aa, cc = a[s0 : s0 + step], bb[s0 : s0 + step]
        d = np.linalg.norm(unit(aa) - unit(cc), axis=1) <= tol
        src.append(np.minimum(aa[d], cc[d]))
        dst.append(np.maximum(aa[d], cc[d]))
    src = np.concatenate(src) if src else empty
    dst = np.concatenate(dst) if dst else empty
    return src, dst, follow, head
