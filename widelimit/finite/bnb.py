r"""Certified global optimum at a finite width ``k``: spatial branch and bound over the atoms' directions.

Problem (theory.md §1), for ``k`` unit atoms:

.. math:: L^*(k) = \min_{\|w_j\|=1,\ Z\ge 0,\ b}\ \frac1N\sum_i \Big\|\sum_j z_{ij} w_j + b - x_i\Big\|^2
          + \frac{2\lambda}{N}\sum_{ij} z_{ij}.

The search space is the atoms' directions. Each direction is branched on the faces of the cube
``[-1, 1]^n`` (a face and a box of the face's coordinates, its image on the sphere lies in a
spherical cap); a node fixes one box per atom. Its lower bound is the cone relaxation of
docs/theory.md §7.2 (products ``y_ij = z_ij w_j`` free in the caps' convex cones),
solved by block-coordinate descent and certified by an explicit dual point (docs/theory.md §7.3); it is a valid
lower bound at every node and tends to the node's optimum as the caps shrink. The atoms'
permutation symmetry is broken by ordering them by (face, first face coordinate) (docs/theory.md §7.4).
Once every cap is narrower than 0.15 rad a node also gets the second-order bound of docs/theory.md §7.6
(``_taylor.py``: the exact fixed-dictionary optimum at the caps' centres and a dual point kept feasible
as the atoms tilt), whose loss is ``O(theta |grad| + theta^2)`` instead of ``O(theta)``; that optimum
is also an upper bound. Upper bounds also come from alternating minimisation started at the
relaxation's directions.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .._memory import memory_budget
from .._runtime import default_threads
from ..results import CertifiedResult, ordered_bound, shared_dict
from ..engine.local import Progress
from ..exact.gap import is_certified, relative_gap
from ..exact.objective import sae_objective
from . import _kernels as K
from . import _taylor as T

__all__ = ["FiniteSolution", "FiniteLimits", "solve_finite", "node_lower_bound"]


@dataclass(frozen=True)
class FiniteLimits:
    """Sizes beyond which the exact search refuses (use the gradient solver, ``widelimit fit``), and the
    memory at which it stops."""

    max_dim: int = 3
    max_width: int = 4
    max_points: int = 5000
    #: memory of the open nodes (estimated from their arrays) at which the search stops with
    #: status ``"memory_limit"``, returning its best solution and certified gap as at a time limit;
    #: ``None``: the memory budget (:func:`widelimit._memory.memory_budget`: half of the machine's memory,
    #: or ``--memory-budget`` / ``WIDELIMIT_MEMORY_BUDGET``)
    max_queue_bytes: int | None = None


@dataclass(frozen=True)
class FiniteSolution(CertifiedResult):
    """Global optimum at width ``k`` (or the best found, with its certified gap).

    Attributes
    ----------
    value : float
        Objective of the returned ``(dictionary, codes, bias)``, evaluated by
        :func:`widelimit.sae_objective` (not assumed).
    lower_bound : float
        Certified lower bound on ``L*(k)`` (min of the open nodes' certified dual bounds).
    gap, rel_gap : float
        ``value - lower_bound`` and ``gap / |value|``.
    certified : bool
        ``rel_gap <= tol``.
    dictionary : ndarray (k, n)
        Unit atoms.
    codes : ndarray (N, k)
        Nonnegative codes.
    bias : ndarray (n,)
    lam : float
    tol : float
        The relative gap the search was asked for.
    status : str
        ``"optimal"``, ``"time_limit"``, ``"node_limit"``, ``"memory_limit"`` (the open nodes reached
        ``FiniteLimits.max_queue_bytes``), ``"resolution_limit"`` (every node was closed or could not be
        split further, yet the certified gap is above ``tol``: a ``tol`` near the rounding level
        of the objective) or ``"closed_form"`` (width >= number of rays).
    n_iter : int
        Nodes whose bound was computed.
    n_rays : int
        Width of the narrowest wide-limit optimum.
    wide_lower_bound : float
        The wide-limit bound (valid at every width).
    time_s : float
        Seconds (of the search; :func:`widelimit.solve` sets the whole call's).
    history : list of (seconds, lower_bound, value)
        The certified bounds as the search went (a row each time the relative gap passed a
        power of ten, and at the end).
    certificate : Certificate or None
        The certificate of the returned ``(W, Z, b)`` against the wide-limit bound (valid at every width:
        its ``lower_bound`` is ``wide_lower_bound`` and its ``certified`` says whether this width already
        reaches the wide-limit optimum), with its dual quantities; set by :func:`widelimit.solve`.
    """

    value: float
    lower_bound: float
    gap: float
    rel_gap: float
    certified: bool
    dictionary: np.ndarray
    codes: np.ndarray
    bias: np.ndarray
    lam: float
    tol: float
    status: str
    n_iter: int
    n_rays: int
    wide_lower_bound: float
    time_s: float
    history: tuple = ()
    certificate: object = None

    @property
    def width(self) -> int:
        return int(self.dictionary.shape[0])

    @property
    def sparse_codes(self) -> sp.csr_array:
        return sp.csr_array(self.codes)

    def as_dict(self) -> dict:
        """Summary as plain Python (JSON-serialisable): the wide solve's keys plus the search's."""
        return {
            **shared_dict(self), "width": self.width, "bias": [float(v) for v in self.bias],
            "lam": self.lam, "n_points": int(self.codes.shape[0]), "dim": int(self.bias.size),
            "dictionary": [[float(v) for v in row] for row in self.dictionary],
            "n_rays": self.n_rays, "wide_lower_bound": self.wide_lower_bound,
            "certificate": None if self.certificate is None else self.certificate.as_dict(),
        }


# --------------------------------------------------------------------------------------------
# geometry: cube-face boxes and their enclosing caps (docs/theory.md §7.1)


def face_directions(face: int, P: np.ndarray, n: int) -> np.ndarray:
    """Unit vectors of face ``face`` (axis ``face // 2``, sign ``+`` if even) at face coordinates ``P`` (..., n-1)."""
    axis, sign = divmod(face, 2)
    P = np.asarray(P, dtype=np.float64)
    v = np.insert(P, axis, -1.0 if sign else 1.0, axis=-1)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def face_of(w: np.ndarray) -> tuple[int, np.ndarray]:
    """The face (largest |coordinate|, ties to the lowest axis) and face coordinates of a nonzero vector."""
    w = np.asarray(w, dtype=np.float64)
    axis = int(np.argmax(np.abs(w)))
    face = 2 * axis + (1 if w[axis] < 0 else 0)
    return face, np.delete(w / abs(w[axis]), axis)


def box_cap(face: int, lo: np.ndarray, hi: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    """Centre and angle of a spherical cap containing the directions of a face box.

    The directions of a face box form the intersection of the sphere with the convex cone over
    the box; ``<w, c>/||w||`` is quasi-concave on the box, so its minimum (the cap's angle) is at
    a corner. A margin of 1e-12 rad covers the rounding of the corners' angles.
    """
    c = np.empty(n)
    th = K.box_cap(int(face), np.asarray(lo, np.float64), np.asarray(hi, np.float64), n, c)
    return c, float(th)


_BATCH = 64  # children bounded together (on the threads) per round of the search; fixed, so the search
# is the same on any number of threads
_PROGRESS_EVERY = 0.5  # seconds between progress events of the search
_TAYLOR_MAX_ANGLE = 0.15  # caps narrower than this get the second-order bound (docs/theory.md §7.6)


class _Layout:
    """Where each array of a node lies in its one float64 buffer (one layout per search)."""

    def __init__(self, N, k, n):
        self.k, self.n, self.Y_shape = k, n, (N, k, n)
        sizes = (("Y", N * k * n), ("lo", k * (n - 1)), ("hi", k * (n - 1)), ("C", k * n), ("cth", k),
                 ("sth", k), ("th", k), ("mass", k))
        self.slices, at = {}, 0
        for name, size in sizes:
            self.slices[name] = slice(at, at + size)
            at += size
        self.size = at


class _Node:
    """Boxes of the atoms (face -1: unrestricted), their caps, the relaxation's iterate and bound.

    The arrays are views of one float64 buffer (:class:`_Layout`): an open node is four Python objects
    (itself, its buffer, its faces, its heap entry) instead of a dozen arrays, a quarter less memory with
    millions of open nodes (measured in docs/benchmarks.md). ``mass`` (the relaxation's code mass per atom,
    which guides branching) is NaN until the node is bounded.
    """

    __slots__ = ("lay", "faces", "buf", "lb", "Z0", "b0")

    def __init__(self, lay, faces, buf, lb, ref=None):
        self.lay, self.faces, self.buf, self.lb = lay, faces, buf, lb
        self.Z0, self.b0 = ref if ref is not None else (None, None)

    @classmethod
    def root(cls, N, k, n):
        """All atoms unrestricted, the relaxation's iterate 0, the boxes the whole face ``[-1, 1]^(n-1)``."""
        lay = _Layout(N, k, n)
        node = cls(lay, -np.ones(k, dtype=np.int64), np.zeros(lay.size), -np.inf)
        node.lo[:] = -1.0
        node.hi[:] = 1.0
        node.mass[:] = np.nan
        for j in range(k):
            node.recap(j, n)
        return node

    def _view(self, name):
        return self.buf[self.lay.slices[name]]

    Y = property(lambda self: self._view("Y").reshape(self.lay.Y_shape))
    lo = property(lambda self: self._view("lo").reshape(self.lay.k, self.lay.n - 1))
    hi = property(lambda self: self._view("hi").reshape(self.lay.k, self.lay.n - 1))
    C = property(lambda self: self._view("C").reshape(self.lay.k, self.lay.n))
    cth = property(lambda self: self._view("cth"))
    sth = property(lambda self: self._view("sth"))
    th = property(lambda self: self._view("th"))
    mass = property(lambda self: self._view("mass"))
    # caps of pi/2 or more (and unrestricted atoms, th = pi) are relaxed to R^n
    free = property(lambda self: self._view("th") >= 0.5 * math.pi)

    def child(self, j):
        """A copy with its own arrays, whose atom ``j``'s box the caller changes, then :meth:`recap` ``j``."""
        ref = None if self.Z0 is None else (self.Z0.copy(), self.b0.copy())
        return _Node(self.lay, self.faces.copy(), self.buf.copy(), self.lb, ref)

    def recap(self, j, n):
        """Recompute atom ``j``'s cap from its box."""
        C, th = self.C, self.th
        if self.faces[j] < 0:
            th[j] = math.pi
            C[j] = 0.0
            C[j, 0] = 1.0
            return
        th[j] = K.box_cap(int(self.faces[j]), self.lo[j], self.hi[j], n, C[j])
        if th[j] < 0.5 * math.pi:  # else the cap's convex hull is R^n (or a half-space): relaxed to R^n
            self.cth[j], self.sth[j] = math.cos(th[j]), math.sin(th[j])


def _symmetric_ok(node: _Node) -> bool:
    """Can the boxes hold atoms ordered by (face, first face coordinate)? (docs/theory.md §7.4)"""
    if node.lo.shape[1] == 0:
        return K.symmetric_ok(node.faces, np.zeros(0), np.zeros(0))
    return K.symmetric_ok(node.faces, node.lo[:, 0].copy(), node.hi[:, 0].copy())


def node_lower_bound(X, lam, caps, *, max_sweeps: int = 20000, tol_abs: float = 1e-13, Y=None):
    """Certified lower bound of the cone relaxation for atoms in given caps (docs/theory.md §7.2-§7.3).

    Parameters
    ----------
    X : array (N, n)
    lam : float
    caps : sequence of (centre (n,), angle) or None
        One per atom; ``None`` (or an angle >= pi/2) means the atom is unrestricted.

    Returns
    -------
    (dual, primal) : certified lower bound and the relaxation's value at the final iterate.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    N, n = X.shape
    k = len(caps)
    C = np.zeros((k, n))
    cth = np.zeros(k)
    sth = np.ones(k)
    free = np.zeros(k, dtype=np.bool_)
    for j, cap in enumerate(caps):
        if cap is None or cap[1] >= 0.5 * math.pi:
            free[j] = True
            C[j, 0] = 1.0
        else:
            C[j] = np.asarray(cap[0], dtype=np.float64) / np.linalg.norm(cap[0])
            cth[j], sth[j] = math.cos(cap[1]), math.sin(cap[1])
    Y = np.zeros((N, k, n)) if Y is None else np.array(Y, dtype=np.float64)
    dual, primal, _ = K.node_solve(X, float(lam), C, cth, sth, free, Y, np.inf, tol_abs, max_sweeps, 20)
    return float(dual), float(primal)


def _polish(X, lam, W, b, iters=60):
    W = np.array(W, dtype=np.float64)
    b = np.array(b, dtype=np.float64)
    Z = np.zeros((X.shape[0], W.shape[0]))
    val = K.polish(X, float(lam), W, b, Z, iters, 3)
    return float(val), W, Z, b


def _initial(X, lam, k, rng, wide, n_starts, deadline=math.inf):
    """Multistart alternating minimisation: wide-limit rays, data directions, random directions (after the first
    start, none begins past ``deadline``, a ``time.perf_counter()`` value)."""
    N, n = X.shape
    best = None
    starts = []
    Wwide = np.asarray(wide.dictionary, dtype=np.float64)
    bw = np.asarray(wide.bias, dtype=np.float64)
    if Wwide.shape[0] >= k:
        cnt = np.bincount(wide.rays[wide.rays >= 0], weights=wide.code_values[wide.rays >= 0],
                          minlength=Wwide.shape[0])
        starts.append((Wwide[np.argsort(-cnt)[:k]], bw))
    for _ in range(n_starts):
        D = X[rng.choice(N, size=min(k, N), replace=False)] - bw
        D = np.vstack([D, rng.standard_normal((k - D.shape[0], n))]) if D.shape[0] < k else D
        D += 1e-9 * rng.standard_normal(D.shape)
        starts.append((D / np.linalg.norm(D, axis=1, keepdims=True), bw))
    for W0, b0 in starts:
        if best is not None and time.perf_counter() > deadline:
            break
        cand = _polish(X, lam, W0, b0, 200)
        if best is None or cand[0] < best[0]:
            best = cand
    return best


def solve_finite(X, lam, width, *, tol=1e-6, time_limit=600.0, max_iter=None, seed=0, n_starts=20,
                 wide=None, limits: FiniteLimits = FiniteLimits(), progress=None, threads=None) -> FiniteSolution:
    r"""Certified global optimum of the sparse dictionary-learning objective at width ``k``.

    See :func:`widelimit.solve` (``width=k``), which validates the input and dispatches here.
    ``wide`` is the wide-limit solution (its bound is valid at every width; at ``k >=`` its
    number of rays it *is* the optimum, padded with unused atoms). ``progress`` receives
    :class:`widelimit.Progress` events (stage ``"branch and bound"``, ``rows_done`` = nodes bounded,
    ``rows_total`` = ``max_iter`` (the node budget) or 0, ``value`` = best value so far, ``lower_bound`` = certified
    bound so far) every half second of the search, whenever the relative gap passes a power of ten,
    and once at the end (``done``, the returned value and bound). ``threads`` (default
    :func:`widelimit._runtime.default_threads`): each round of the search branches the best open nodes
    and bounds their children (about 64) on this many threads (the compiled kernels release the GIL); best
    first expands every node below the final target anyway, and the search and its result are the same on
    any number of threads.
    """
    t0 = time.perf_counter()
    n_threads = default_threads() if threads is None else threads

    X = np.ascontiguousarray(X, dtype=np.float64)
    N, n = X.shape
    k = int(width)
    if k >= int(wide.width):  # closed form: the wide-limit optimum, padded with unused atoms
        sol = _closed_form(X, lam, k, wide, tol, t0)
        _event(progress, 0, max_iter, sol.value, sol.lower_bound, True)
        return sol
    if n > limits.max_dim or k > limits.max_width or N > limits.max_points:
        raise ValueError(
            f"the exact search at width {k} handles dim <= {limits.max_dim}, width <= {limits.max_width} and "
            f"N <= {limits.max_points} points (got dim {n}, N {N}); this problem is too large for it: use the "
            "gradient solver (widelimit.fit_dictionary / `widelimit fit`) and compare with the wide-limit bound")
    rng = np.random.default_rng(seed)
    incumbent = _initial(X, lam, k, rng, wide, n_starts, deadline=t0 + float(time_limit))
    search = _Search(X, lam, k, incumbent, tol=tol, wide=wide, limits=limits, progress=progress,
                     max_iter=max_iter, t0=t0, threads=n_threads)
    return search.run(float(time_limit))


def _closed_form(X, lam, k, wide, tol, t0) -> FiniteSolution:
    """At a width of at least the wide limit's number of rays: its optimum, padded with unused atoms."""
    N, n = X.shape
    n_rays = int(wide.width)
    wlb = float(wide.lower_bound)
    W = np.asarray(wide.dictionary, dtype=np.float64)
    pad = np.zeros((k - W.shape[0], n))
    pad[:, 0] = 1.0
    W = np.vstack([W, pad])
    Z = np.hstack([wide.codes, np.zeros((N, k - n_rays))])
    val = float(sae_objective(X, W, Z, wide.bias, lam=lam).value)
    return _result(val, max(wlb, -np.inf), W, Z, np.asarray(wide.bias, np.float64), lam, tol, "closed_form", 0,
                   n_rays, wlb, t0, certified_hint=wide.certified)


class _Search:
    """One best-first branch and bound over the atoms' directions: the incumbent ``(ub, W, Z, b)``, the
    queue of open nodes, the bounds of closed ones, the progress marks and the bounding threads."""

    def __init__(self, X, lam, k, incumbent, *, tol, wide, limits, progress, max_iter, t0, threads):
        N, n = X.shape
        self.X, self.lam, self.k, self.tol, self.t0 = X, lam, k, tol, t0
        self.progress, self.max_iter, self.threads = progress, max_iter, threads
        self.n_rays, self.wlb = int(wide.width), float(wide.lower_bound)
        self.ub, self.W_best, self.Z_best, self.b_best = incumbent
        # the best value's certificate is computed by the project's objective at the end
        self.root = _Node.root(N, k, n)
        # the fixed-dictionary optimum's warm start (Z0, b0) exists only below the second-order bound's angle
        # (docs/theory.md §7.6): coarse nodes, most of the queue, do not carry it
        self.no_ref = (np.zeros((0, k)), np.zeros(0))
        # an open node's memory: its buffer (the relaxation's iterate Y, its boxes and caps) and about 520 bytes of
        # Python objects, array headers and allocator overhead (measured: 3.66 KB per open node at N = 40,
        # n = k = 3, 4.94 KB before the buffer; most open nodes are coarse and carry no warm start Z0)
        self.node_bytes = 8 * self.root.lay.size + 520
        self.queue_bytes = memory_budget() if limits.max_queue_bytes is None else limits.max_queue_bytes
        self.scale = max(abs(self.ub), 1e-300)
        self.tol_abs = 1e-3 * tol * self.scale  # the relaxation's own gap, far below the search's
        self.n_nodes = 0
        self.history = []
        self.next_mark = 1.0  # record the bounds each time the relative gap passes the next power of ten
        self.next_event = time.perf_counter() + _PROGRESS_EVERY
        self.pool = None

    def target(self):
        return self.ub - self.tol * self.scale * 0.999

    def bound(self, node: _Node):
        """Certify ``node.lb``; return an explicit candidate ``(value, W, Z, b)`` or None (thread-safe: it
        writes only into ``node``, and ``ub`` does not change while children are bounded)."""
        X, k = self.X, self.k
        if node.Z0 is None and node.th.max() < _TAYLOR_MAX_ANGLE:  # from here on the node's descendants carry it
            node.Z0, node.b0 = np.zeros((X.shape[0], k)), X.mean(axis=0)
        Z0, b0 = self.no_ref if node.Z0 is None else (node.Z0, node.b0)
        lb, cval, node.mass[:] = T.bound_node(X, float(self.lam), node.C, node.cth, node.sth, node.free, node.th,
                                              node.Y, Z0, b0, node.lb, self.wlb, self.target(), self.tol_abs,
                                              _TAYLOR_MAX_ANGLE)
        node.lb = float(lb)
        return None if cval == np.inf else (float(cval), node.C, node.Z0, node.b0)

    def bound_all(self, kids):
        """``bound`` of each node, the list split over the pool's threads and this one, in order."""
        n_threads = self.threads
        if self.pool is None or len(kids) < 2:
            return [self.bound(ch) for ch in kids]
        parts = [kids[t::n_threads] for t in range(n_threads)]
        futs = [self.pool.submit(lambda part: [self.bound(ch) for ch in part], part) for part in parts[1:] if part]
        got = [[self.bound(ch) for ch in parts[0]]] + [f.result() for f in futs]
        out = [None] * len(kids)
        for t, res in enumerate(got):
            out[t::n_threads] = res
        return out

    def mark(self, lb_now):
        """Record the bounds when the relative gap passes the next power of ten; report every half second."""
        g = (self.ub - lb_now) / self.scale
        now = time.perf_counter()
        if g <= self.next_mark:
            self.history.append((now - self.t0, float(lb_now), float(self.ub)))
            while self.next_mark >= g and self.next_mark > 1e-12:
                self.next_mark /= 10.0
        elif now < self.next_event:
            return
        _event(self.progress, self.n_nodes, self.max_iter, self.ub, max(lb_now, self.wlb), False)
        self.next_event = now + _PROGRESS_EVERY

    def offer(self, ch, cand):
        """The bounded child's candidates (the fixed-dictionary optimum at its caps' centres, early on a
        heuristic from its relaxation) replace the incumbent when lower."""
        if cand is not None and cand[0] < self.ub:
            self.ub, self.W_best, self.Z_best, self.b_best = cand[0], cand[1].copy(), cand[2].copy(), cand[3].copy()
        if self.n_nodes < 2000 or self.n_nodes % 16 == 0:  # upper bounds matter most early on
            cand = K.heuristic(self.X, float(self.lam), ch.Y, ch.C, 30)
            if cand[0] < self.ub:
                self.ub, self.W_best, self.Z_best, self.b_best = cand

    def run(self, time_limit: float) -> FiniteSolution:
        """Best first until the open nodes' bound meets the target or a limit is hit; the certified result."""
        t0, n = self.t0, self.X.shape[1]
        root = self.root
        if time.perf_counter() - t0 <= time_limit:  # else the root stays at -inf: the bound is the wide limit's
            self.bound(root)
            self.n_nodes = 1
        self.pool = ThreadPoolExecutor(self.threads - 1) if self.threads > 1 else None
        heap = [(root.lb, 0, root)]
        counter = itertools.count(1)
        leaves_lb = np.inf  # bounds of nodes that cannot be split further
        closed_lb = np.inf  # bounds of nodes pruned or closed (each >= the target of its time)
        status = "optimal"
        try:
            while heap:
                status = self._limit(time_limit, len(heap))
                if status != "optimal":
                    break
                # the _BATCH best open nodes are branched together and their children bounded on the threads;
                # best-first expands every node below the final target anyway, so batching adds (almost) no nodes
                first = heap[0][0]
                self.mark(min(first, leaves_lb, closed_lb))
                if first >= self.target():
                    closed_lb = min(closed_lb, first)
                    heap.clear()
                    break
                children = []
                while heap and len(children) < _BATCH and heap[0][0] < self.target():
                    lb, _, node = heapq.heappop(heap)
                    kids = _branch(node, n, 1e-9)
                    if kids is None:
                        leaves_lb = min(leaves_lb, lb)
                        continue
                    children += [ch for ch in kids if _symmetric_ok(ch)]
                for ch, cand in zip(children, self.bound_all(children)):  # all bounded against the same ub
                    self.n_nodes += 1
                    self.offer(ch, cand)
                    if ch.lb < self.target():
                        heapq.heappush(heap, (ch.lb, next(counter), ch))
                    else:
                        closed_lb = min(closed_lb, ch.lb)
        finally:
            if self.pool is not None:
                self.pool.shutdown()
        return self._result(status, min([h[0] for h in heap] + [leaves_lb, closed_lb, self.ub]))

    def _limit(self, time_limit, n_open) -> str:
        """``"optimal"`` while the search may go on, else the limit it hit."""
        if time.perf_counter() - self.t0 > time_limit:
            return "time_limit"
        if self.max_iter is not None and self.n_nodes >= self.max_iter:
            return "node_limit"
        if n_open * self.node_bytes > self.queue_bytes:
            return "memory_limit"
        return "optimal"

    def _result(self, status, open_lb) -> FiniteSolution:
        val = float(sae_objective(self.X, self.W_best, self.Z_best, self.b_best, lam=self.lam).value)
        self.history.append((time.perf_counter() - self.t0, float(max(open_lb, self.wlb)), val))
        sol = _result(val, max(open_lb, self.wlb), self.W_best, self.Z_best, self.b_best, self.lam, self.tol,
                      status, self.n_nodes, self.n_rays, self.wlb, self.t0, history=tuple(self.history))
        _event(self.progress, self.n_nodes, self.max_iter, sol.value, sol.lower_bound, True)
        return sol


def _event(progress, n_nodes, max_iter, value, lower_bound, done):
    """One :class:`widelimit.Progress` event of the search (nothing without a callback)."""
    if progress is not None:
        progress(Progress(stage="branch and bound", pass_index=int(n_nodes), rows_done=int(n_nodes),
                          rows_total=0 if max_iter is None else int(max_iter), value=float(value),
                          lower_bound=float(lower_bound), done=bool(done)))


def _branch(node: _Node, n: int, min_width: float):
    """Children of a node: the first free atom over the 2n faces, else bisect the widest box side."""
    free = np.flatnonzero(node.faces < 0)
    kids = []
    if free.size:
        j = int(free[0])
        f0 = int(node.faces[j - 1]) if j > 0 else 0
        for f in range(f0, 2 * n):
            ch = node.child(j)
            ch.faces[j] = f
            ch.recap(j, n)
            kids.append(ch)
        return kids
    if n == 1:
        return None
    # split the atom whose relaxed products spread the most over the widest cap
    ext = node.hi - node.lo  # (k, n-1)
    mass = node.mass
    if np.isnan(mass[0]):  # not bounded (the tests' hand-made nodes)
        mass = np.linalg.norm(node.Y, axis=2).sum(axis=0)  # (k,)
    score = ext.max(axis=1) * (mass + 1e-12 * (mass.max() + 1.0))
    score[ext.max(axis=1) < min_width] = -1.0
    j = int(np.argmax(score))
    if score[j] < 0:
        return None
    d = int(np.argmax(ext[j]))
    mid = 0.5 * (node.lo[j, d] + node.hi[j, d])
    for lo_d, hi_d in ((node.lo[j, d], mid), (mid, node.hi[j, d])):
        ch = node.child(j)
        ch.lo[j, d], ch.hi[j, d] = lo_d, hi_d
        ch.recap(j, n)
        kids.append(ch)
    return kids


def _result(val, lb, W, Z, b, lam, tol, status, n_nodes, n_rays, wlb, t0, certified_hint=None, history=()):
    # a bound above the value: within rounding lowered to it (gap 0); beyond, InconsistentBound (never clipped)
    lb = ordered_bound(val, lb, what="value of the search's best candidate", bound="search's lower bound")
    gap = val - lb
    rel = relative_gap(gap, val)
    cert = is_certified(gap, val, tol=tol) and status in ("optimal", "closed_form")
    if status == "optimal" and not cert:  # every node closed, yet the gap is above tol: the search's resolution
        status = "resolution_limit"
    if certified_hint is not None:
        cert = cert and bool(certified_hint)
    return FiniteSolution(value=val, lower_bound=lb, gap=gap, rel_gap=rel, certified=bool(cert),
                          dictionary=np.asarray(W, np.float64), codes=np.asarray(Z, np.float64),
                          bias=np.asarray(b, np.float64), lam=float(lam), tol=float(tol), status=status,
                          n_iter=int(n_nodes), n_rays=n_rays, wide_lower_bound=wlb,
                          time_s=time.perf_counter() - t0, history=tuple(history))
