r"""Certified optimal codes by working-set coordinate descent on the Gram matrix (CPU, numba).

Same problem and the same certificate as :func:`widelimit.coding.fista.fista_codes` (FISTA)
(theory.md §8.6): per token, on unit atoms ``u_d`` (rows of ``U``) and ``xt = x - b``,

.. math:: P(y) = \|xt - y U\|^2 + 2\lambda \textstyle\sum_d y_d, \qquad y \ge 0 ,

certified by the dual point ``s r`` (``r = xt - y U``, ``s`` the best feasible
scaling, ``gap = P - D(s r) >= P - P*``). Built for the SAE regime, many atoms
and few active per token (``L0 << k``), and warm starts that are already good
(an SAE's own encoder codes):

1. **Correlations.** ``c = U r`` for every token of a batch is one matrix product
   ``R U^T`` (or given by the caller: ``certify_sae`` has it); the Gram ``G = U U^T`` is
   formed once per dictionary.
2. **Working set per token.** ``W`` = the current support plus the atoms that
   violate dual feasibility (``c_d > lam``), most violating first, capped at
   ``ws_extra`` new atoms a round; atoms the gap-safe rule removes
   (``s c_d + sqrt(gap) < lam`` proves ``y*_d = 0``; Fercoq, Gramfort & Salmon 2015,
   with the radius of the 1-strongly concave dual ``D``) are never added.
3. **Restricted solve.** Cyclic coordinate descent on ``W`` with the block
   ``G_WW`` (a sweep costs ``|W|^2`` flops), maintaining ``c_W = q_W - G_WW y``;
   every few sweeps a Newton step on the current support ``A`` solves
   ``G_AA y_A = q_A - lam`` (Cholesky), accepted if positive and better, which
   makes the solve exact once the support is found. Stops at the restricted gap
   ``0.1 tol`` (relative). Tokens run in parallel (numba ``prange``).
4. **Certificate, float64.** ``r = xt - y U`` (sparse), per-token ``gap`` from
   ``||r||^2``, ``<r, xt>``, ``max_d c_d`` and ``sum y``. For up to 1,024 atoms the
   correlations are updated inside the round from the Gram (``c -= delta G``, with a
   rigorous bound on their rounding, theory.md §8.6); for wider dictionaries a new
   product ``R U^T`` (float32, its maximum made exact in float64). Tokens meeting
   ``gap <= tol max(P, gap_floor(lam))`` are done; the others go back to step 2.

Tokens still uncertified after ``max_iter`` rounds go to :func:`widelimit.coding.fista.fista_codes`
(float64, warm-started), so every returned gap is certified the same way.
"""

from __future__ import annotations

import dataclasses
import math

import numba as nb
import numpy as np
import scipy.sparse as sp
import time
from ._restricted import solve_token as _solve_token
from .fista import finish_rows
from .lasso import check_problem, dual_scale, gap_floor, lasso_gap, token_gap as _token_gap, unit_atoms
from .result import CodingResult
from .._runtime import matmul
from .._validation import check_codes
from ..engine.local import Progress

__all__ = ["cd_codes", "GramCoder"]

_JIT = dict(nogil=True, cache=True)
GRAM_UPDATE_LIMIT = 1024  # widest dictionary certified by Gram updates (GramCoder's gram_updates)


@nb.njit(parallel=True, **_JIT)
def _round(G, U, xt, R, C, crow, cerr, xx, P, rr, rx, gaps, todo, idx, val, cnt, lam, tol, floor, ws_extra, margin,
           max_sweeps, newton_every, update):  # pragma: no cover - compiled
    r"""One working-set round for the tokens ``todo``: grow each working set, solve on it.

    ``idx/val/cnt`` (m, cap): per token the atoms of its working set and their codes.
    ``R`` (m, n): the current residuals (float64); ``C``: their correlations ``R U^T``, row ``crow[t]``
    for token ``todo[t]``. ``rr, rx, gaps``: ``||r||^2``, ``<r, xt>`` and the certified gap of the
    current residual (for the gap-safe rule).
    A working set gains at most ``ws_extra`` atoms: those with ``c_d > (1 - margin) lam``
    that survive the gap-safe rule, most correlated first. Returns the sweeps used per token.

    ``update=False``: ``C`` may be of any precision (it only chooses the working set; the solve
    recomputes ``c_W = U_W r`` in float64) and the caller certifies the new codes (:func:`_certify`).

    ``update=True``: ``C`` is float64, every entry within ``cerr[i]`` of the exact ``<u_d, r_i>``;
    the round certifies its own result without a matrix product (theory.md §8.6). With
    ``delta_a`` the change of the code of working atom ``a``,

    .. math:: c_d \leftarrow c_d - \textstyle\sum_a \delta_a G_{a d} ,

    ``|W_delta| k`` flops per token against ``n k`` for ``R U^T``; the residual is recomputed
    from the codes (``R``, ``rr``, ``rx``) and ``cerr`` grows by the rounding of the update
    (:func:`_update_error`). The certificate uses ``max_d c_d + cerr``, so it stays a true bound.
    """
    k = C.shape[1]
    n = R.shape[1]
    used = np.zeros(todo.shape[0], np.int64)
    for t in nb.prange(todo.shape[0]):
        i = todo[t]
        ct = crow[t]
        nw = _grow_working_set(C[ct], rr[i], rx[i], gaps[i], idx[i], val[i], cnt[i], lam, ws_extra, margin)
        cnt[i] = nw
        if nw == 0:
            continue
        w_idx = idx[i, :nw].copy()
        cw = np.empty(nw)
        for a in range(nw):
            d = w_idx[a]
            if update:
                cw[a] = C[ct, d]
            else:
                acc = 0.0
                for j in range(n):
                    acc += U[d, j] * R[i, j]
                cw[a] = acc
        y = val[i, :nw].copy()
        used[t] = _solve_token(G, cw, xx[i], w_idx, y, lam, tol, floor, max_sweeps, newton_every)
        if update:
            cerr[i] += _update_correlations(C[ct], G, w_idx, y, val[i], n)
        for a in range(nw):
            val[i, a] = y[a]
        if update:
            P[i], gaps[i], rr[i], rx[i] = _token_certificate(xt[i], U, R[i], C[ct], w_idx, val[i], nw, cerr[i], lam)
    return used


@nb.njit(**_JIT)
def _grow_working_set(c, rr, rx, gap, idx, val, cnt, lam, ws_extra, margin):  # pragma: no cover - compiled
    """One token's working set for the next solve, in place on its row ``idx, val`` (``cnt`` entries).

    Keeps the support (drops zero codes) and adds at most ``ws_extra`` atoms with
    ``c_d > (1 - margin) lam`` that survive the gap-safe rule (``s c_d + sqrt(gap) >= lam``, ``s`` the
    dual scaling of the current residual), most correlated first. Returns the new size.
    """
    k = c.shape[0]
    cap = idx.shape[0]
    mx = -np.inf
    for d in range(k):
        if c[d] > mx:
            mx = c[d]
    s = dual_scale(rr, rx, mx, lam)
    radius = math.sqrt(gap) * (1.0 + 1e-6) + 1e-6 * lam  # slack for the precision of C
    thr = (1.0 - margin) * lam
    # keep the support, drop zeros
    inw = np.zeros(k, np.bool_)
    nw = 0
    for a in range(cnt):
        if val[a] > 0.0:
            idx[nw] = idx[a]
            val[nw] = val[a]
            inw[idx[nw]] = True
            nw += 1
    # candidates: atoms near dual feasibility's boundary that survive the gap-safe rule
    nc = 0
    for d in range(k):
        if not inw[d] and c[d] > thr and s * c[d] + radius >= lam:
            nc += 1
    if nc == 0:
        return nw
    cand = np.empty(nc, np.int64)
    cv = np.empty(nc)
    j = 0
    for d in range(k):
        if not inw[d] and c[d] > thr and s * c[d] + radius >= lam:
            cand[j] = d
            cv[j] = -c[d]
            j += 1
    take = min(nc, ws_extra, cap - nw)
    order = np.argsort(cv) if take < nc else np.arange(nc)
    for j in range(take):
        idx[nw] = cand[order[j]]
        val[nw] = 0.0
        nw += 1
    return nw


@nb.njit(**_JIT)
def _update_correlations(c, G, w_idx, y, y_old, n):  # pragma: no cover - compiled
    """``c <- c - sum_a delta_a G[w_a, :]`` (float64, ``delta_a = y_a - y_old_a``), in place; returns the bound
    on the rounding it adds (:func:`_update_error`)."""
    k = c.shape[0]
    cmax = 0.0
    for d in range(k):
        if abs(c[d]) > cmax:
            cmax = abs(c[d])
    sd = 0.0
    nd = 0
    for a in range(w_idx.shape[0]):
        delta = y[a] - y_old[a]
        if delta != 0.0:
            nd += 1
            sd += abs(delta)
            row = w_idx[a]
            for d in range(k):
                c[d] -= delta * G[row, d]
    return _update_error(n, nd, cmax, sd)


@nb.njit(**_JIT)
def _token_certificate(xt, U, r, c, w_idx, val, nw, cerr, lam):  # pragma: no cover - compiled
    """The residual ``r = xt - sum_a val_a u_(w_a)`` recomputed from the codes (in place) and the token's
    certified ``(P, gap, ||r||^2, <r, xt>)`` with ``max_d c_d + cerr`` as the largest correlation."""
    n = xt.shape[0]
    l1 = 0.0
    for j in range(n):
        r[j] = xt[j]
    for a in range(nw):
        v = val[a]
        l1 += v
        if v != 0.0:
            d = w_idx[a]
            for j in range(n):
                r[j] -= v * U[d, j]
    r2 = 0.0
    r1 = 0.0
    for j in range(n):
        r2 += r[j] * r[j]
        r1 += r[j] * xt[j]
    mx = -np.inf
    for d in range(c.shape[0]):
        if c[d] > mx:
            mx = c[d]
    P, gap = _token_gap(r2, r1, mx + cerr, l1, lam)
    return P, gap, r2, r1


@nb.njit(**_JIT)
def _gamma(m):  # pragma: no cover - compiled (also called from Python)
    """Higham's ``gamma_m = m u / (1 - m u)`` for float64 (``u = 2^-53``)."""
    u = 2.0 ** -53
    return m * u / (1.0 - m * u)


@nb.njit(**_JIT)
def _update_error(n, nd, cmax, sd):  # pragma: no cover - compiled
    """Bound on the rounding added to every ``c_d`` by ``c_d - sum_a delta_a G_ad`` (``nd`` terms).

    With ``gamma_m = m u / (1 - m u)`` (Higham Thm 3.5, unit roundoff ``u = 2^-53``): each ``G_ad``
    is an ``n``-term float64 dot product of unit rows (error ``<= gamma_(n+2)``, the ``+2`` for the
    rows' own normalisation), each ``delta_a`` one subtraction (relative error ``u``), and the
    ``nd + 1``-term sum of ``c_d`` and the products errs by ``gamma_(nd+1) (|c_d| + sum |delta_a G_ad|)``.
    With ``|G_ad| <= 1 + gamma_(n+2)`` all of it is below
    ``gamma_(n+nd+4) (max_d |c_d| + 3 sum_a |delta_a|)``.
    """
    return _gamma(n + nd + 4) * (cmax + 3.0 * sd)


@nb.njit(parallel=True, **_JIT)
def _residuals(xt, U, idx, val, cnt, todo, R):  # pragma: no cover - compiled
    """``R[i] = xt[i] - sum_a val[i, a] U[idx[i, a]]`` for ``i`` in ``todo``."""
    n = xt.shape[1]
    for t in nb.prange(todo.shape[0]):
        i = todo[t]
        for j in range(n):
            R[i, j] = xt[i, j]
        for a in range(cnt[i]):
            v = val[i, a]
            if v != 0.0:
                d = idx[i, a]
                for j in range(n):
                    R[i, j] -= v * U[d, j]


@nb.njit(parallel=True, **_JIT)
def _exact_max(C32, R, U, todo, gamma, out):  # pragma: no cover - compiled
    """``out[t] = max_d <u_d, R[todo[t]]>`` in float64 from float32 products ``C32[t]`` (rows of ``todo``).

    Every float32 entry is within ``e = gamma ||r||`` of the exact product (``gamma`` bounds the
    rounding of the float32 inputs and of an ``n``-term dot product, Higham Thm 3.5), so
    an atom with ``C32_d < max C32 - 2 e`` cannot attain the maximum: only the others
    are recomputed in float64.
    """
    k = C32.shape[1]
    n = R.shape[1]
    for t in nb.prange(todo.shape[0]):
        i = todo[t]
        rn = 0.0
        for j in range(n):
            rn += R[i, j] * R[i, j]
        e = gamma * math.sqrt(rn)
        M = -np.inf
        for d in range(k):
            if C32[t, d] > M:
                M = C32[t, d]
        thr = np.float64(M) - 2.0 * e
        best = -np.inf
        for d in range(k):
            if np.float64(C32[t, d]) >= thr:
                acc = 0.0
                for j in range(n):
                    acc += U[d, j] * R[i, j]
                if acc > best:
                    best = acc
        out[t] = best


@nb.njit(parallel=True, **_JIT)
def _pad(indptr, indices, data, idx, val, cnt):  # pragma: no cover - compiled
    """CSR rows into the padded working sets ``idx/val/cnt`` (negative codes clipped to 0)."""
    for i in nb.prange(indptr.shape[0] - 1):
        a = 0
        for p in range(indptr[i], indptr[i + 1]):
            idx[i, a] = indices[p]
            val[i, a] = max(data[p], 0.0)
            a += 1
        cnt[i] = a


@nb.njit(parallel=True, **_JIT)
def _unpad(idx, val, cnt):  # pragma: no cover - compiled
    """The positive codes of the padded working sets as CSR ``(data, indices, indptr)`` (columns sorted)."""
    m = idx.shape[0]
    nnz = np.zeros(m, np.int64)
    for i in nb.prange(m):
        c = 0
        for a in range(cnt[i]):
            if val[i, a] > 0.0:
                c += 1
        nnz[i] = c
    indptr = np.zeros(m + 1, np.int64)
    for i in range(m):
        indptr[i + 1] = indptr[i] + nnz[i]
    indices = np.empty(indptr[m], np.int64)
    data = np.empty(indptr[m])
    for i in nb.prange(m):
        p0 = indptr[i]
        p = p0
        for a in range(cnt[i]):
            if val[i, a] > 0.0:
                # insertion into the sorted run indices[p0:p]
                d, v = idx[i, a], val[i, a]
                q = p
                while q > p0 and indices[q - 1] > d:
                    indices[q] = indices[q - 1]
                    data[q] = data[q - 1]
                    q -= 1
                indices[q] = d
                data[q] = v
                p += 1
    return data, indices, indptr


def _certify(xt, U, U32, idx, val, cnt, todo, lam, R):
    """Residuals (into ``R``), correlations ``c = r U^T`` and the certified per-token ``(P, gap, rr, rx)``.

    With ``U32`` the product runs in float32 and the maximum over atoms is made exact by
    :func:`_exact_max`; without, in float64.
    """
    _residuals(xt, U, idx, val, cnt, todo, R)
    Rt = R[todo]
    n = Rt.shape[1]
    if U32 is not None:
        C = matmul(Rt.astype(np.float32), U32.T)
        mx = np.empty(todo.size)
        u = 2.0 ** -24
        gamma = 1.01 * (n + 3) * u  # dot-product error + rounding of both float32 inputs
        _exact_max(C, R, U, todo, gamma, mx)
    else:
        C = matmul(Rt, U.T)
        mx = C.max(1) if C.shape[1] else np.full(todo.size, -np.inf)
    rr = np.einsum("ij,ij->i", Rt, Rt)
    rx = np.einsum("ij,ij->i", Rt, xt[todo])
    l1 = np.where(np.arange(idx.shape[1])[None, :] < cnt[todo, None], val[todo], 0.0).sum(1)
    P, gap = lasso_gap(rr, rx, mx, l1, lam)
    return C, P, gap, rr, rx


class GramCoder:
    """Optimal coding for one fixed dictionary: unit atoms and their Gram, formed once.

    Parameters
    ----------
    U : ndarray (k, n) float64
        Unit atoms (rows).
    lam, tol : float
        Sparsity and the per-token relative gap target ``gap <= tol max(P, gap_floor(lam))``.
    ws_extra : int
        Most atoms a working set gains per round.
    margin : float
        Atoms with ``c_d > (1 - margin) lam`` are candidates for the working set.
    max_rounds, max_sweeps, newton_every : int
        Working-set rounds; coordinate-descent sweeps per restricted solve; sweeps between Newton steps.
    gram_updates : bool, optional
        Certify each round from the Gram (``c <- c - delta G``, :func:`_round` with ``update``) instead
        of a new product ``R U^T``; default: for ``k <= 1024``, where ``G`` stays in cache (for wider
        dictionaries each changed code streams a ``k``-row of ``G`` from memory and the product is faster).
    fast_products : bool
        Without ``gram_updates``: correlations ``R U^T`` in float32, with the maximum over atoms made
        exact in float64 (:func:`_exact_max`); the certificate is the same as with float64 products.
    G : ndarray (k, k), optional
        ``U U^T`` if already formed.
    """

    def __init__(self, U, *, lam, tol=1e-6, ws_extra=128, margin=0.25, max_rounds=20, max_sweeps=400,
                 newton_every=6, gram_updates=None, fast_products=True, G=None):
        self.U = np.ascontiguousarray(U, dtype=np.float64)
        self.gram_updates = bool(self.U.shape[0] <= GRAM_UPDATE_LIMIT if gram_updates is None else gram_updates)
        self.U32 = self.U.astype(np.float32) if fast_products else None
        self.G = np.ascontiguousarray(matmul(self.U, self.U.T) if G is None else G, dtype=np.float64)
        self.lam, self.tol = float(lam), float(tol)
        self.ws_extra, self.margin, self.max_rounds = int(ws_extra), float(margin), int(max_rounds)
        self.max_sweeps, self.newton_every = int(max_sweeps), int(newton_every)

    def solve(self, xt, Y0=None, C0=None, deadline: float | None = None, *, R0=None,
              overwrite_c0=False) -> CodingResult:
        """Certified codes for the rows of ``xt = X - b`` (float64, (m, n)), on the unit atoms ``U``.

        ``Y0``: warm start (CSR (m, k), unit-atom units); ``C0``: ``(xt - Y0 U) U^T`` in
        float64 if already computed (saves one matrix product; used for its maximum, so it
        must be float64); ``R0``: the residuals ``xt - Y0 U`` (float64, C-contiguous) if already
        computed, overwritten with the final ones (the result's ``residuals``); ``overwrite_c0``: the rounds
        may update ``C0`` in place (float64, C-contiguous) instead of a copy. After ``deadline`` (a
        ``time.perf_counter()`` value) no further round starts: the codes reached so far come back, still
        certified.

        Returns a :class:`~widelimit.coding.result.CodingResult` (codes in unit-atom units, ``n_iter`` the
        rounds, :meth:`~widelimit.coding.result.CodingResult.unconverged_rows` the tokens still uncertified)
        with the final ``residuals``; with ``gram_updates`` also ``correlations`` (m, k), the
        ``<u_d, r_i>`` of the final residuals, each within ``correlation_error[i]`` of the exact value.
        """
        lam, tol = self.lam, self.tol
        floor = gap_floor(lam)
        U, G = self.U, self.G
        xt = np.ascontiguousarray(xt, dtype=np.float64)
        m, n = xt.shape
        k = U.shape[0]
        idx, val, cnt = self._working_sets(Y0, m, n)
        cap = idx.shape[1]
        R, C, P, gap, rr, rx, cerr = self._start(xt, Y0, C0, R0, overwrite_c0, idx, val, cnt)
        xx = np.einsum("ij,ij->i", xt, xt)
        update = self.gram_updates
        todo = np.flatnonzero(gap > tol * np.maximum(P, floor))
        crow = todo.copy()  # row of C of each token in todo
        rounds = 0
        while todo.size and rounds < self.max_rounds and (deadline is None or time.perf_counter() < deadline):
            rounds += 1
            if int(cnt[todo].max()) + self.ws_extra > cap:  # working sets may grow: widen the state
                add = self.ws_extra
                idx = np.concatenate([idx, np.zeros((m, add), np.int64)], 1)
                val = np.concatenate([val, np.zeros((m, add))], 1)
                cap += add
            _round(G, U, xt, R, C, crow, cerr, xx, P, rr, rx, gap, todo, idx, val, cnt, lam, 0.1 * tol, floor,
                   self.ws_extra, self.margin, self.max_sweeps, self.newton_every, update)
            if not update:
                C, Pt, gt, rrt, rxt = _certify(xt, U, self.U32, idx, val, cnt, todo, lam, R)
                P[todo], gap[todo], rr[todo], rx[todo] = Pt, gt, rrt, rxt
                crow = np.arange(todo.size)
            bad = gap[todo] > tol * np.maximum(P[todo], floor)
            todo, crow = todo[bad], crow[bad]
        codes = sp.csr_array(_unpad(idx, val, cnt), shape=(m, k))
        extra = dict(correlations=C, correlation_error=cerr) if update else {}
        return CodingResult.from_points(codes, P, gap, penalty_sum=2.0 * lam * float(codes.sum()), n_iter=rounds,
                                        device="cpu", lam=lam, tol=tol, residuals=R, **extra)

    def _working_sets(self, Y0, m, n):
        """The padded working sets ``(idx, val, cnt)`` (m, cap) the rounds start from (``Y0`` or empty)."""
        k = self.U.shape[0]
        cap = int(min(k, max(n + self.ws_extra, 2 * self.ws_extra)))
        cnt = np.zeros(m, np.int64)
        if Y0 is not None:
            Y0 = sp.csr_array(Y0)
            Y0.sum_duplicates()
            nnz = np.diff(Y0.indptr)
            cap = max(cap, int(nnz.max()) if nnz.size else 0)
        idx = np.zeros((m, cap), np.int64)
        val = np.zeros((m, cap))
        if Y0 is not None:
            _pad(Y0.indptr.astype(np.int64), Y0.indices.astype(np.int64), Y0.data.astype(np.float64), idx, val, cnt)
        return idx, val, cnt

    def _start(self, xt, Y0, C0, R0, overwrite_c0, idx, val, cnt):
        """The certificate of the start: ``(R, C, P, gap, rr, rx, cerr)`` (residuals, correlations, per-token
        primal value, gap, ``||r||^2``, ``<r, xt>`` and the bound on the rounding of ``C``)."""
        m, n = xt.shape
        k = self.U.shape[0]
        have_r = R0 is not None and Y0 is not None and C0 is not None
        R = R0 if have_r else np.empty((m, n))
        if C0 is None or Y0 is None:
            C, P, gap, rr, rx = _certify(xt, self.U, None if self.gram_updates else self.U32, idx, val, cnt,
                                         np.arange(m), self.lam, R)
        else:
            C = np.asarray(C0, dtype=np.float64) if overwrite_c0 else np.array(C0, dtype=np.float64)
            if not have_r:
                _residuals(xt, self.U, idx, val, cnt, np.arange(m), R)
            rr = np.einsum("ij,ij->i", R, R)
            rx = np.einsum("ij,ij->i", R, xt)
            P, gap = lasso_gap(rr, rx, C.max(1) if k else np.full(m, -np.inf), val.sum(1), self.lam)
        # rounding of the float64 products C = fl(fl(xt - Y U) U^T) (Higham Thm 3.5, n + k terms)
        cerr = _gamma(n + k + 2) * 1.01 * (np.sqrt(np.einsum("ij,ij->i", xt, xt)) + 1.01 * val.sum(1))
        return R, C, P, gap, rr, rx, cerr


def cd_codes(X, W, b, *, lam, tol: float = 1e-6, Z0=None, return_codes: bool = True, batch_size: int | None = None,
             ws_extra: int = 128, max_iter: int = 20, time_limit: float | None = None, progress=None) -> CodingResult:
    r"""Certified optimal nonnegative codes by working-set coordinate descent (module docstring); CPU.

    Parameters and result as :func:`widelimit.coding.optimal_codes` (``algorithm="cd"``);
    ``max_iter`` caps the working-set rounds; ``time_limit`` (seconds) stops the rounds (and the float64 fallback) when it is spent: every
    gap returned is still certified, ``certified`` says whether all met ``tol``.
    """
    deadline = None if time_limit is None else time.perf_counter() + float(time_limit)
    X, W, b, lam, tol = check_problem(X, W, b, lam, tol)
    N, n = X.shape
    k = W.shape[0]
    if Z0 is not None:
        Z0 = check_codes(Z0, N, k, name="Z0")
    norms, live, U = unit_atoms(W)
    coder = GramCoder(U, lam=lam, tol=tol, ws_extra=ws_extra, max_rounds=max_iter)
    if batch_size is None:
        batch_size = int(max(256, min(4096, (1 << 27) // (8 * max(1, live.size)))))
    batch_size = int(batch_size)
    P_all, gap_all = np.empty(N), np.empty(N)
    blocks = []
    n_iter = 0
    Dn = sp.diags(norms[live])
    Dinv = sp.diags(1.0 / norms[live]) if live.size else sp.diags(np.zeros(0))
    for s in range(0, N, batch_size):
        e = min(N, s + batch_size)
        xt = np.asarray(X[s:e], dtype=np.float64) - b
        Y0 = None
        if Z0 is not None:
            z0 = Z0[s:e]
            z0 = sp.csr_array(z0) if sp.issparse(z0) else sp.csr_array(np.asarray(z0))
            Y0 = sp.csr_array(z0[:, live] @ Dn)
        out = coder.solve(xt, Y0, deadline=deadline)
        n_iter = max(n_iter, out.n_iter)
        P_all[s:e], gap_all[s:e] = out.point_values, out.point_gaps
        Zb = sp.csr_array(out.codes @ Dinv)
        blocks.append(sp.csr_array((Zb.data, live[Zb.indices], Zb.indptr), shape=(e - s, k)) if live.size
                      else sp.csr_array((e - s, k)))
        if progress is not None:
            progress(Progress(stage="optimal codes", pass_index=1, rows_done=e, rows_total=N, done=e == N))
    codes = sp.csr_array(sp.vstack(blocks, format="csr")) if blocks else sp.csr_array((N, k))
    res = CodingResult.from_points(codes, P_all, gap_all, n_iter=n_iter, device="cpu", lam=lam, tol=tol,
                                   penalty_sum=2.0 * lam * float(np.asarray(codes @ norms).sum()))
    if deadline is None or time.perf_counter() < deadline:
        # the full-dictionary solver finishes uncertified tokens, warm-started, float64
        res = finish_rows(X, W, b, res, dtype="float64", max_iter=20000)
    return res if return_codes else dataclasses.replace(res, codes=None)
