r"""Certified optimal codes by working-set coordinate descent on the Gram matrix (CPU, numba).

Same problem and the same certificate as :func:`widelimit.coding.pdas.optimal_codes` (FISTA)
(theory.md §5): per token, on unit atoms ``u_d`` (rows of ``U``) and ``xt = x - b``,

.. math:: P(y) = \|xt - y U\|^2 + 2\lambda \textstyle\sum_d y_d, \qquad y \ge 0 ,

certified by the dual point ``s r`` (``r = xt - y U``, ``s`` the best feasible
scaling, ``gap = P - D(s r) >= P - P*``). Built for the SAE regime, many atoms
and few active per token (``L0 << k``), and warm starts that are already good
(an SAE's own encoder codes):

1. **Correlations, BLAS-3.** ``c = U r`` for every token of a batch is one
   matrix product ``R U^T``; the Gram ``G = U U^T`` is formed once per dictionary.
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
4. **Certificate, float64.** ``r = xt - y U`` (sparse), ``c = r U^T`` (BLAS),
   per-token ``gap`` from ``||r||^2``, ``<r, xt>``, ``max_d c_d`` and ``sum y``.
   Tokens meeting ``gap <= tol max(P, lam^2)`` are done; the others go back to
   step 2 with the new correlations.

Tokens still uncertified after ``max_rounds`` go to :func:`widelimit.coding.pdas.optimal_codes`
(float64, warm-started), so every returned gap is certified the same way.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
import scipy.sparse as sp
import time
from .pdas import CodingResult, _check_problem
from .pdas import finish_rows
from .._validation import check_codes, row_norms
from ..engine.local import Progress

__all__ = ["cd_codes", "GramCoder"]

_JIT = dict(nogil=True, cache=True)


@nb.njit(**_JIT)
def _cholesky_solve(A, rhs):  # pragma: no cover - compiled
    """Solve ``A z = rhs`` for symmetric ``A`` by Cholesky; returns ``(z, ok)`` (``ok`` False if not PD)."""
    m = A.shape[0]
    L = np.zeros((m, m))
    for j in range(m):
        s = A[j, j]
        for p in range(j):
            s -= L[j, p] * L[j, p]
        if not (s > 1e-12 * A[j, j]) or not (s > 0.0):
            return rhs.copy(), False
        d = math.sqrt(s)
        L[j, j] = d
        for i in range(j + 1, m):
            t = A[i, j]
            for p in range(j):
                t -= L[i, p] * L[j, p]
            L[i, j] = t / d
    z = rhs.copy()
    for i in range(m):
        t = z[i]
        for p in range(i):
            t -= L[i, p] * z[p]
        z[i] = t / L[i, i]
    for i in range(m - 1, -1, -1):
        t = z[i]
        for p in range(i + 1, m):
            t -= L[p, i] * z[p]
        z[i] = t / L[i, i]
    return z, True


@nb.njit(**_JIT)
def _restricted_gap(xx, q, y, c, w, lam):  # pragma: no cover - compiled
    """``(P, gap)`` of the restricted problem on the first ``w`` working atoms, from ``||xt||^2``, the
    products ``q = G_w y``, the codes ``y`` and the correlations ``c``."""
    qy = 0.0
    yc = 0.0
    l1 = 0.0
    mx = -np.inf
    for a in range(w):
        qy += q[a] * y[a]
        yc += y[a] * c[a]
        l1 += y[a]
        if c[a] > mx:
            mx = c[a]
    rr = xx - qy - yc
    if rr < 0.0:
        rr = 0.0
    rx = xx - qy
    P = rr + 2.0 * lam * l1
    s = rx / rr if rr > 0.0 else 0.0
    if s < 0.0:
        s = 0.0
    if mx > 0.0 and s > lam / mx:
        s = lam / mx
    gap = P - (2.0 * s * rx - s * s * rr)
    return P, (gap if gap > 0.0 else 0.0)


@nb.njit(**_JIT)
def _gather_row(G, w_idx, a, Gw):  # pragma: no cover - compiled
    """``Gw[a, :] = G[w_idx[a], w_idx]``."""
    row = w_idx[a]
    for bb in range(w_idx.shape[0]):
        Gw[a, bb] = G[row, w_idx[bb]]


@nb.njit(**_JIT)
def _solve_token(G, c, xx, w_idx, y, lam, tol, floor, max_sweeps, newton_every):  # pragma: no cover - compiled
    """Coordinate descent + Newton on the working set ``w_idx`` (codes ``y`` and ``c`` updated in place).

    ``c = U_W r`` (float64) for the current residual ``r``; returns the sweeps used.
    """
    w = w_idx.shape[0]
    # rows of G_WW are gathered when first needed (an atom that never moves off zero needs only
    # its diagonal entry): the gathers are cache misses in the large Gram
    Gw = np.empty((w, w))
    have = np.zeros(w, np.bool_)
    diag = np.empty(w)
    for a in range(w):
        diag[a] = G[w_idx[a], w_idx[a]]
        if y[a] != 0.0:
            _gather_row(G, w_idx, a, Gw)
            have[a] = True
    q = c.copy()  # q = c + G y
    for a in range(w):
        ya = y[a]
        if ya != 0.0:
            for bb in range(w):
                q[bb] += ya * Gw[a, bb]
    sweeps = 0
    for sweep in range(max_sweeps):
        # restricted certificate
        P, gap = _restricted_gap(xx, q, y, c, w, lam)
        if gap <= tol * max(P, floor):
            break
        if newton_every > 0 and sweep > 0 and sweep % newton_every == 0:
            na = 0
            for a in range(w):
                if y[a] > 0.0:
                    na += 1
            if na > 0:
                act = np.empty(na, np.int64)
                j = 0
                for a in range(w):
                    if y[a] > 0.0:
                        act[j] = a
                        j += 1
                GA = np.empty((na, na))
                rhs = np.empty(na)
                for i in range(na):
                    rhs[i] = q[act[i]] - lam
                    for jj in range(na):
                        GA[i, jj] = Gw[act[i], act[jj]]
                z, ok = _cholesky_solve(GA, rhs)
                if ok:
                    pos = True
                    for i in range(na):
                        if not (z[i] > 0.0):
                            pos = False
                            break
                    if pos:
                        y2 = np.zeros(w)
                        for i in range(na):
                            y2[act[i]] = z[i]
                        c2 = q.copy()
                        for i in range(na):
                            zi = z[i]
                            row = act[i]
                            for bb in range(w):
                                c2[bb] -= zi * Gw[row, bb]
                        P2, gap2 = _restricted_gap(xx, q, y2, c2, w, lam)
                        if gap2 < gap:
                            for a in range(w):
                                y[a] = y2[a]
                                c[a] = c2[a]
                            if gap2 <= tol * max(P2, floor):
                                sweeps = sweep + 1
                                break
        for a in range(w):
            new = y[a] + (c[a] - lam) / diag[a]
            if new < 0.0:
                new = 0.0
            delta = new - y[a]
            if delta != 0.0:
                if not have[a]:
                    _gather_row(G, w_idx, a, Gw)
                    have[a] = True
                y[a] = new
                for bb in range(w):
                    c[bb] -= delta * Gw[a, bb]
        sweeps = sweep + 1
    return sweeps


@nb.njit(parallel=True, **_JIT)
def _round(G, U, R, C, xx, rr, rx, gaps, todo, idx, val, cnt, lam, tol, floor, ws_extra, margin, max_sweeps,
           newton_every):  # pragma: no cover - compiled
    """One working-set round for the tokens ``todo``: grow each working set, solve on it.

    ``idx/val/cnt`` (m, cap): per token the atoms of its working set and their codes.
    ``R`` (m, n): the current residuals (float64); ``C`` (len(todo), k): their correlations (row ``t`` for token ``todo[t]``)
    ``R U^T`` (any precision: they only choose the working set; the solve recomputes
    ``c_W = U_W r`` in float64). ``rr, rx, gaps``: ``||r||^2``, ``<r, xt>`` and the
    certified gap of the current residual (for the gap-safe rule).
    A working set gains at most ``ws_extra`` atoms: those with ``c_d > (1 - margin) lam``
    that survive the gap-safe rule, most correlated first. Returns the sweeps used per token.
    """
    k = C.shape[1]
    n = R.shape[1]
    cap = idx.shape[1]
    used = np.zeros(todo.shape[0], np.int64)
    for t in nb.prange(todo.shape[0]):
        i = todo[t]
        # dual scaling of the current residual, for the gap-safe rule
        mx = -np.inf
        for d in range(k):
            if C[t, d] > mx:
                mx = C[t, d]
        s = rx[i] / rr[i] if rr[i] > 0.0 else 0.0
        if s < 0.0:
            s = 0.0
        if mx > 0.0 and s > lam / mx:
            s = lam / mx
        radius = math.sqrt(gaps[i]) * (1.0 + 1e-6) + 1e-6 * lam  # slack for the precision of C
        thr = (1.0 - margin) * lam
        # keep the support, drop zeros
        inw = np.zeros(k, np.bool_)
        nw = 0
        for a in range(cnt[i]):
            if val[i, a] > 0.0:
                idx[i, nw] = idx[i, a]
                val[i, nw] = val[i, a]
                inw[idx[i, nw]] = True
                nw += 1
        # candidates: atoms near dual feasibility's boundary that survive the gap-safe rule
        nc = 0
        for d in range(k):
            cd = C[t, d]
            if not inw[d] and cd > thr and s * cd + radius >= lam:
                nc += 1
        if nc > 0:
            cand = np.empty(nc, np.int64)
            cv = np.empty(nc)
            j = 0
            for d in range(k):
                cd = C[t, d]
                if not inw[d] and cd > thr and s * cd + radius >= lam:
                    cand[j] = d
                    cv[j] = -cd
                    j += 1
            take = min(nc, ws_extra, cap - nw)
            if take < nc:
                order = np.argsort(cv)
            else:
                order = np.arange(nc)
            for j in range(take):
                idx[i, nw] = cand[order[j]]
                val[i, nw] = 0.0
                nw += 1
        cnt[i] = nw
        if nw == 0:
            continue
        w_idx = idx[i, :nw].copy()
        cw = np.empty(nw)
        for a in range(nw):
            d = w_idx[a]
            acc = 0.0
            for j in range(n):
                acc += U[d, j] * R[i, j]
            cw[a] = acc
        y = val[i, :nw].copy()
        used[t] = _solve_token(G, cw, xx[i], w_idx, y, lam, tol, floor, max_sweeps, newton_every)
        for a in range(nw):
            val[i, a] = y[a]
    return used


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


def _gap_from(rr, rx, mx, l1, lam):
    """Per-token ``(P, gap)`` of the scaled-residual dual point (module docstring), float64."""
    P = rr + 2.0 * lam * l1
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(rr > 0, rx / np.where(rr > 0, rr, 1.0), 0.0)
        s = np.minimum(np.maximum(s, 0.0), np.where(mx > 0, lam / np.where(mx > 0, mx, 1.0), np.inf))
    return P, np.maximum(P - (2.0 * s * rx - s * s * rr), 0.0)


def _certify(xt, U, U32, idx, val, cnt, todo, lam, R):
    """Residuals (into ``R``), correlations ``c = r U^T`` and the certified per-token ``(P, gap, rr, rx)``.

    With ``U32`` the product runs in float32 and the maximum over atoms is made exact by
    :func:`_exact_max`; without, in float64.
    """
    _residuals(xt, U, idx, val, cnt, todo, R)
    Rt = R[todo]
    n = Rt.shape[1]
    if U32 is not None:
        C = Rt.astype(np.float32) @ U32.T
        mx = np.empty(todo.size)
        u = 2.0 ** -24
        gamma = 1.01 * (n + 3) * u  # dot-product error + rounding of both float32 inputs
        _exact_max(C, R, U, todo, gamma, mx)
    else:
        C = Rt @ U.T
        mx = C.max(1) if C.shape[1] else np.full(todo.size, -np.inf)
    rr = np.einsum("ij,ij->i", Rt, Rt)
    rx = np.einsum("ij,ij->i", Rt, xt[todo])
    l1 = np.where(np.arange(idx.shape[1])[None, :] < cnt[todo, None], val[todo], 0.0).sum(1)
    P, gap = _gap_from(rr, rx, mx, l1, lam)
    return C, P, gap, rr, rx


class GramCoder:
    """Optimal coding for one fixed dictionary: unit atoms and their Gram, formed once.

    Parameters
    ----------
    U : ndarray (k, n) float64
        Unit atoms (rows).
    lam, tol : float
        Sparsity and the per-token relative gap target ``gap <= tol max(P, lam^2)``.
    ws_extra : int
        Most atoms a working set gains per round.
    margin : float
        Atoms with ``c_d > (1 - margin) lam`` are candidates for the working set.
    max_rounds, max_sweeps, newton_every : int
        Working-set rounds; coordinate-descent sweeps per restricted solve; sweeps between Newton steps.
    fast_products : bool
        Correlations ``R U^T`` in float32, with the maximum over atoms made exact in float64
        (:func:`_exact_max`); the certificate is the same as with float64 products.
    G : ndarray (k, k), optional
        ``U U^T`` if already formed.
    """

    def __init__(self, U, *, lam, tol=1e-6, ws_extra=128, margin=0.25, max_rounds=20, max_sweeps=400,
                 newton_every=2, fast_products=True, G=None):
        self.U = np.ascontiguousarray(U, dtype=np.float64)
        self.U32 = self.U.astype(np.float32) if fast_products else None
        self.G = np.ascontiguousarray(self.U @ self.U.T if G is None else G, dtype=np.float64)
        self.lam, self.tol = float(lam), float(tol)
        self.ws_extra, self.margin, self.max_rounds = int(ws_extra), float(margin), int(max_rounds)
        self.max_sweeps, self.newton_every = int(max_sweeps), int(newton_every)

    def solve(self, xt, Y0=None, C0=None, deadline: float | None = None):
        """Certified codes for the rows of ``xt = X - b`` (float64, (m, n)).

        ``Y0``: warm start (CSR (m, k), unit-atom units); ``C0``: ``(xt - Y0 U) U^T`` in
        float64 if already computed (saves one matrix product; used for its maximum, so it
        must be float64). Returns a dict with ``codes`` (CSR, unit-atom units), per-token
        ``P``, ``gap``, ``rr`` (``||r||^2``), the final residuals ``R``, ``rounds``, ``sweeps``
        and ``todo`` (tokens still uncertified). After ``deadline`` (a ``time.perf_counter()``
        value) no further round starts: the codes reached so far come back, still certified.
        """

        lam, tol = self.lam, self.tol
        floor = lam * lam
        U, G = self.U, self.G
        xt = np.ascontiguousarray(xt, dtype=np.float64)
        m, n = xt.shape
        k = U.shape[0]
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
            rows = np.repeat(np.arange(m), nnz)
            pos = np.arange(Y0.nnz) - np.repeat(Y0.indptr[:-1], nnz)
            idx[rows, pos] = Y0.indices
            val[rows, pos] = np.maximum(Y0.data, 0.0)
            cnt[:] = nnz
        all_rows = np.arange(m)
        R = np.empty((m, n))
        if C0 is None or Y0 is None:
            C, P, gap, rr, rx = _certify(xt, U, self.U32, idx, val, cnt, all_rows, lam, R)
        else:
            C = np.asarray(C0, dtype=np.float64)
            _residuals(xt, U, idx, val, cnt, all_rows, R)
            rr = np.einsum("ij,ij->i", R, R)
            rx = np.einsum("ij,ij->i", R, xt)
            P, gap = _gap_from(rr, rx, C.max(1) if k else np.full(m, -np.inf), val.sum(1), lam)
        todo = np.flatnonzero(gap > tol * np.maximum(P, floor))
        rounds = 0
        sweeps = 0
        xx = np.einsum("ij,ij->i", xt, xt)
        while todo.size and rounds < self.max_rounds and (deadline is None or time.perf_counter() < deadline):
            rounds += 1
            if int(cnt[todo].max()) + self.ws_extra > cap:  # working sets may grow: widen the state
                add = self.ws_extra
                idx = np.concatenate([idx, np.zeros((m, add), np.int64)], 1)
                val = np.concatenate([val, np.zeros((m, add))], 1)
                cap += add
            if C.shape[0] != todo.size:
                C = C[todo]
            used = _round(G, U, R, C, xx, rr, rx, gap, todo, idx, val, cnt, lam, 0.1 * tol, floor,
                          self.ws_extra, self.margin, self.max_sweeps, self.newton_every)
            sweeps = max(sweeps, int(used.max()) if used.size else 0)
            C, Pt, gt, rrt, rxt = _certify(xt, U, self.U32, idx, val, cnt, todo, lam, R)
            P[todo], gap[todo], rr[todo], rx[todo] = Pt, gt, rrt, rxt
            bad = gt > tol * np.maximum(Pt, floor)
            todo, C = todo[bad], C[bad]
        mask = np.arange(idx.shape[1])[None, :] < cnt[:, None]
        mask &= val > 0
        rows = np.nonzero(mask)[0]
        codes = sp.csr_array((val[mask], (rows, idx[mask])), shape=(m, k))
        return {"codes": codes, "P": P, "gap": gap, "rr": rr, "R": R, "rounds": rounds, "sweeps": sweeps,
                "todo": todo}


def cd_codes(X, W, b, *, lam, tol: float = 1e-6, Z0=None, return_codes: bool = True, batch_size: int | None = None,
             ws_extra: int = 128, max_rounds: int = 20, max_time: float | None = None, progress=None):
    r"""Certified optimal nonnegative codes by working-set coordinate descent (module docstring); CPU.

    Parameters and result as :func:`widelimit.coding.optimal_codes` (``algorithm="cd"``);
    ``max_time`` (seconds) stops the rounds (and the float64 fallback) when it is spent: every
    gap returned is still certified, ``converged`` says whether all met ``tol``.
    """

    deadline = None if max_time is None else time.perf_counter() + float(max_time)

    X, W, b, lam, tol = _check_problem(X, W, b, lam, tol)
    N, n = X.shape
    k = W.shape[0]
    if Z0 is not None:
        Z0 = check_codes(Z0, N, k, name="Z0")
    norms = row_norms(W)
    live = np.flatnonzero(norms > 0)
    coder = GramCoder(W[live] / norms[live, None], lam=lam, tol=tol, ws_extra=ws_extra, max_rounds=max_rounds)
    if batch_size is None:
        batch_size = int(max(256, min(4096, (1 << 27) // (8 * max(1, live.size)))))
    batch_size = int(batch_size)
    floor = lam * lam
    P_all, gap_all = np.empty(N), np.empty(N)
    blocks, leftovers = [], []
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
        n_iter = max(n_iter, out["rounds"])
        P_all[s:e], gap_all[s:e] = out["P"], out["gap"]
        if out["todo"].size:
            leftovers.append(s + out["todo"])
        Zb = sp.csr_array(out["codes"] @ Dinv)
        blocks.append(sp.csr_array((Zb.data, live[Zb.indices], Zb.indptr), shape=(e - s, k)) if live.size
                      else sp.csr_array((e - s, k)))
        if progress is not None:
            progress(Progress(stage="optimal codes", pass_index=1, rows_done=e, rows_total=N, done=e == N))
    codes = sp.csr_array(sp.vstack(blocks, format="csr")) if blocks else sp.csr_array((N, k))
    if leftovers and (deadline is None or time.perf_counter() < deadline):
        # the full-dictionary solver finishes these tokens, warm-started, float64
        codes, res = finish_rows(X, W, b, codes, np.concatenate(leftovers), P_all, gap_all, lam=lam, tol=tol,
                                 dtype="float64", max_iter=20000)
        n_iter += res.n_iter
    n_bad = int(np.sum(gap_all > tol * np.maximum(P_all, floor)))
    value = float(P_all.mean())
    pen = 2.0 * lam * float(np.asarray(codes @ norms).sum()) / N
    return CodingResult(
        codes=codes if return_codes else None, value=value, reconstruction=value - pen, penalty=pen,
        gap=float(gap_all.mean()), max_gap=float(gap_all.max()), point_values=P_all, point_gaps=gap_all,
        n_iter=int(n_iter), converged=n_bad == 0, n_unconverged=n_bad, device="cpu", lam=lam, tol=tol,
    )
