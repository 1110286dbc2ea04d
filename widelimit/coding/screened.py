r"""Certified optimal codes for wide dictionaries (16k-1M atoms) without a Gram matrix: torch, CPU or CUDA.

The problem and the certificate of :mod:`widelimit.coding` (theory.md §8.6): per token, on unit
atoms ``u_d`` and ``xt = x - b``, ``P(y) = ||xt - y U||^2 + 2 lam sum_d y_d`` over ``y >= 0``,
certified by the dual point ``s r`` (``gap = P - D(s r) >= P - min P``). Built for the SAE
regime -- many atoms, few active per token. (Measured, one thread, the same tokens to the same objective:
:class:`widelimit.sae.parts.CodingPart` starts it from zero codes, not the SAE's: a SAELens ReLU SAE of
16,384 features on MiniLM has L0 150 where the optimum has 8, and the restricted solves on its support cost
4-12x more than growing the working sets from zero; on the synthetic cells of
``benchmarks/certify_scale.py`` the zero start is as fast or faster; docs/sae_certification.md.)

1. **Working set per token**: the support of the current codes plus the ``ws_extra`` atoms most
   correlated with the residual among those with ``c_d > (1 - margin) lam`` (the candidates of
   dual infeasibility), from the correlations ``C = R U^T`` of the last certificate (for the first
   round the caller's, e.g. those the SAE's residuals already needed).
2. **Restricted solve**: the lasso on the working set ``W`` (``|W| = S``), its Gram block
   ``G_WW = U_W U_W^T`` in float64 from the gathered atoms (batched matrix products; the block of the atoms
   kept from the last round's support is reused, only the new atoms' columns are formed: ``S (S - s) n``
   multiply-adds instead of ``S^2 n``) and ``q_W = U_W xt``. On the CPU (``restricted="coordinate_descent"``,
   the default there) each token's lasso is solved in numba by coordinate descent with Newton steps on its
   support (:func:`widelimit.coding._restricted.solve_blocks`: the coder 1.7-1.8x faster than with the batched steps
   below at optimal L0 108, their padding and per-step overhead gone); tokens it leaves unsettled, and every
   token on CUDA, take the batched torch steps: ``newton_steps`` active-set Newton
   (primal-dual active-set) steps, each an exact solve on the predicted support, kept only where it
   lowers the restricted objective (else a projected gradient step: on ill-conditioned blocks the
   predicted supports can cycle, singular blocks have no solution) (:func:`widelimit.coding.working_set._pdas`);
   where they have not reached the restricted gap ``tol / 10``, Lawson and Hanson's active set
   (``restricted="lawson_hanson"``, :func:`widelimit.coding._nnls.nnls_batch` on ``min y^T G y - 2 (q -
   lam) y``, from the support the round started from; finite, exact to the Cholesky's rounding, each
   factorisation the size of the passive set); then projected accelerated gradient, only where the gap is
   still not met (:func:`widelimit.coding.working_set._inner`; ``restricted="newton"``: directly after the
   Newton steps, the former coder). On the coherent decoders of trained SAEs (cosines up to 0.997) the
   Newton steps from zero predict nearly the whole working set active and cycle, and the gradient
   iteration took ~1,700 steps per chunk; the active set solves those blocks in as many steps as atoms
   enter. A token whose support has not settled goes on in the next round from where it is (the
   certificate below decides, not this solve).
   No ``k x k`` matrix: memory ``O(m k + chunk S n)``.
3. **Certificate, float64**: residuals ``r = xt - y_W U_W`` in float64; correlations for the whole
   batch as one matrix product ``R U^T`` in float32 (the one ``O(n k)`` cost per token and round);
   its maximum made exact: every entry within ``2 e_i`` of the float32 maximum is recomputed in
   float64, where ``e_i = 1.01 gamma_{n+3} ||r_i||`` (``gamma_m = m u / (1 - m u)``, ``u = 2^-24``)
   bounds the float32 error of every entry (inputs rounded to float32 and any summation order,
   ``||u_d|| = 1``), so no entry outside that window can be the maximum. The gap then uses the
   exact ``max_d <u_d, r_i>`` (to float64 rounding), as the other coders do.

Tokens meeting ``gap_i <= tol * max(P_i, gap_floor(lam))`` (the token's own objective,
:func:`widelimit.coding.lasso.gap_floor`) are done; the others go back to step 1. Flops per token
and round: ``2 n k`` (the product) ``+ S (S - s) n`` (the Gram block's new columns, multiply-adds) ``+ O(s^3)``
(the Newton factorisations), against ``2 n k`` for the SAE's encoder.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from .._params import StrOptions, check_value
from .lasso import gap_floor, lasso_gap
from .result import CodingResult
from ._nnls import nnls_batch
from .cd import _exact_max as _exact_max_cpu
from ._restricted import solve_blocks
from .working_set import _inner, _pdas, _restricted_gap, gather_rows

__all__ = ["ScreenedCoder", "exact_max", "product_error"]

_U32 = 2.0 ** -24  # float32 unit roundoff
#: The restricted solvers (:meth:`ScreenedCoder._restricted`).
RESTRICTED = ("auto", "coordinate_descent", "lawson_hanson", "newton")


def product_error(R):
    """Per row, a bound on the error of every float32 correlation ``<u_d, r_i>`` (``||u_d|| = 1``): ``e_i = 1.01
    gamma_{n+3} ||r_i||``, ``gamma_m = m u / (1 - m u)``, ``u = 2^-24`` (inputs rounded to float32, any summation
    order; docs/theory.md §8.6)."""
    import torch

    n = R.shape[1]
    return 1.01 * (n + 3) * _U32 / (1.0 - (n + 3) * _U32) * torch.linalg.norm(R, dim=1)


def exact_max(R, U64, U32, numba=None):
    """``(max_d <u_d, r_i>`` exact to float64 rounding, float32 correlations ``C32``) for residuals ``R`` (m, n) f64.

    With ``numba`` (default: ``R`` on the CPU; ``False`` runs the torch code a GPU runs) the window's entries are
    recomputed by :func:`widelimit.coding.cd._exact_max` (numba, a loop per entry): at the optimum every active
    atom of a token ties at the maximum ``lam``, so the window holds the whole support (55,000 entries for 512
    tokens at L0 108), whose gathered ``(entries, n)`` copies took 5x the float32 product itself."""
    import torch

    C32 = R.to(torch.float32) @ U32.T
    if R.device.type == "cpu" if numba is None else numba:
        n = R.shape[1]
        out = np.empty(R.shape[0])
        _exact_max_cpu(C32.numpy(), np.ascontiguousarray(R.numpy()), U64.numpy(), np.arange(R.shape[0]),
                       1.01 * (n + 3) * _U32 / (1.0 - (n + 3) * _U32), out)
        return torch.from_numpy(out), C32
    e = product_error(R)
    m32 = C32.amax(1).to(torch.float64)
    # the window's lower end rounded down to float32, so the comparison runs on C32 itself (a float64 copy of the
    # (m, k) correlations cost a third of the product): fl32(t) <= t keeps every entry the float64 test keeps
    t64 = m32 - 2.0 * e
    t32 = t64.to(torch.float32)
    t32 = torch.where(t32.to(torch.float64) > t64, torch.nextafter(t32, torch.tensor(-math.inf)), t32)
    ri, di = torch.nonzero(C32 >= t32[:, None], as_tuple=True)
    exact = (R[ri] * U64[di]).sum(1)
    mx = torch.full((R.shape[0],), -math.inf, dtype=torch.float64, device=R.device)
    return mx.scatter_reduce(0, ri, exact, reduce="amax"), C32


def _scale(P, lam):
    return P.clamp(min=gap_floor(lam))


class ScreenedCoder:
    """Working-set coding with per-token Gram blocks and a float32 certificate product (module docstring).

    Parameters
    ----------
    U : ndarray (k, n)
        Unit atoms.
    lam, tol : float
        Sparsity; per-token relative gap target.
    device : torch.device
    ws_extra : int
        Most atoms a working set gains per round.
    margin : float
        Candidates: ``c_d > (1 - margin) lam``.
    max_rounds : int
        Working-set rounds.
    newton_steps, inner_iter : int
        Active-set (Newton) steps, then most projected accelerated gradient steps, of one restricted solve.
    restricted : {"auto", "coordinate_descent", "lawson_hanson", "newton"}
        The restricted solves: ``"coordinate_descent"``, per token in numba (coordinate descent with Newton
        steps on the support, :func:`widelimit.coding._restricted.solve_blocks`; the CPU default of
        ``"auto"``); ``"lawson_hanson"``, batched torch Newton steps finished by Lawson and Hanson's active set
        (the CUDA default); ``"newton"``, the Newton steps finished by the gradient iteration alone. Tokens
        a solve leaves above the restricted gap go on to the Lawson-Hanson active set and then the gradient
        iteration, whichever is chosen (except ``"newton"``: the gradient iteration).
    chunk : int
        Tokens whose atoms are gathered at once (memory ``chunk * S * n`` float64).
    block_rows : int
        Tokens coded at once (memory about ``20 * block_rows * k`` float64 at the peak of a round).
    U32 : tensor (k, n) float32, optional
        ``U`` in float32 on ``device`` when the caller holds it already (shared; default: a copy made here).
    max_sweeps : int
        Coordinate-descent sweeps of one restricted solve (``"coordinate_descent"``).
    numba : bool, optional
        The CPU kernels (numba restricted solves and exact maxima, numpy row gathers); default: on the CPU.
        ``False`` runs the torch code a GPU runs, on any device (``certify_sae(backend="torch")``).
    """

    def __init__(self, U, *, lam, tol=1e-6, device="cpu", ws_extra=48, margin=0.25, max_rounds=30, newton_steps=8,
                 inner_iter=2000, chunk=64, restricted="auto", U32=None, block_rows=512, max_sweeps=400, numba=None):
        import torch

        self.dev = torch.device(device)
        self.U64 = torch.as_tensor(np.ascontiguousarray(U, dtype=np.float64), device=self.dev)
        self.U32 = self.U64.to(torch.float32) if U32 is None else U32  # (given: a float32 copy shared with others)
        self.lam, self.tol = float(lam), float(tol)
        self.ws_extra, self.margin = int(ws_extra), float(margin)
        self.max_rounds, self.inner_iter, self.chunk = int(max_rounds), int(inner_iter), int(chunk)
        self.newton_steps = int(newton_steps)
        check_value(restricted, StrOptions(RESTRICTED), "restricted")
        self.numba = self.dev.type == "cpu" if numba is None else bool(numba)
        if self.numba and self.dev.type != "cpu":
            raise ValueError(f"numba=True runs on the CPU only, not on {self.dev}")
        if restricted == "auto":  # measured: docs/sae_certification.md (the screened coder's restricted solves)
            restricted = "coordinate_descent" if self.numba else "lawson_hanson"
        if restricted == "coordinate_descent" and self.dev.type != "cpu":
            raise ValueError(f"restricted='coordinate_descent' runs on the CPU only, not on {self.dev}")
        self.restricted, self.block_rows = restricted, max(1, int(block_rows))
        self.max_sweeps = int(max_sweeps)

    # ---------------------------------------------------------------------------------
    def _working_sets(self, idx, val, C):
        """New working sets: the support of ``val`` (at ``idx``) plus the best candidates of ``C`` (torch)."""
        import torch

        m = C.shape[0]
        live = val > 0
        ns = int(live.sum(1).max()) if live.numel() else 0
        order = torch.argsort(live.to(torch.int8), dim=1, descending=True, stable=True)[:, :ns]
        s_idx, s_val, s_ok = idx.gather(1, order), val.gather(1, order), live.gather(1, order)
        Cm = C  # (masked in place: the caller's C is a copy it does not read again)
        rows = torch.arange(m, device=C.device)[:, None].expand_as(s_idx)
        Cm[rows[s_ok], s_idx[s_ok]] = -math.inf
        E = min(self.ws_extra, C.shape[1])
        cv, ci = torch.topk(Cm, E, dim=1)
        c_ok = cv > (1.0 - self.margin) * self.lam
        W = torch.cat([s_idx, ci], 1)
        ok = torch.cat([s_ok, c_ok], 1)
        y = torch.cat([torch.where(s_ok, s_val, 0.0), torch.zeros_like(cv)], 1)
        src = torch.cat([torch.where(s_ok, order, -1), torch.full_like(ci, -1)], 1)  # the support's former slots
        # the valid slots first, the width cut to the most valid slots of a token: the Gram blocks are formed
        # on the padded width, and after the first round few candidates pass the threshold
        order = torch.argsort((~ok).to(torch.int8), dim=1, stable=True)[:, : max(1, int(ok.sum(1).max()))]
        W, y, ok, src = W.gather(1, order), y.gather(1, order), ok.gather(1, order), src.gather(1, order)
        return torch.where(ok, W, 0), y, ok, src

    def _restricted(self, xt, W, y, ok, src=None, Gprev=None, gpos=None):
        """Solve the lasso on each token's working set (chunks of tokens); returns the new codes on ``W`` and their
        float64 residuals.

        The Gram block ``G_WW`` and ``q_W = U_W xt`` in float64 (so a Newton point is the exact solution on
        its support, to float64 rounding), then :func:`widelimit.coding.working_set._inner`: ``newton_steps``
        active-set steps, each kept only where it lowers the restricted objective (else a projected
        gradient step: ill-conditioned blocks whose supports cycle, singular blocks), then projected
        accelerated gradient until the restricted gap is ``tol / 10`` (at most ``inner_iter`` steps). With
        ``restricted="coordinate_descent"`` each token is first solved in numba (module docstring, step 2); only the
        tokens it leaves unsettled take those steps, on their blocks with the padding masked.

        ``Gprev`` (t', w', w'): the Gram blocks of the last round, token ``i``'s at row ``gpos[i]`` (NaN on its first
        entry where none), and
        ``src`` (t, w): the former slot of each slot of ``W`` (-1: a new atom). The working sets are the last
        round's supports plus new atoms, so the support's block is taken from ``Gprev`` and only the new atoms'
        columns are formed: ``w (w - s) n`` multiply-adds instead of ``w^2 n`` (the rounds re-formed the whole block
        each time). Returns the codes, their residuals, this round's blocks (in the order the chunks ran: each chunk's
        blocks one contiguous copy, not a scatter) and each token's row among them.
        """
        import torch

        out, R = torch.zeros_like(y), torch.empty_like(xt)
        Gout = torch.empty((W.shape[0], W.shape[1], W.shape[1]), dtype=torch.float64, device=xt.device)
        pos = torch.empty(W.shape[0], dtype=torch.int64, device=xt.device)
        eye = torch.eye(W.shape[1], dtype=torch.float64, device=xt.device)
        floor = gap_floor(self.lam)
        cnt = ok.sum(1)
        # tokens in the order of their working-set sizes: a chunk's blocks are padded to its widest token (the
        # Gram blocks cost w^2 n each), and working sets of one round range over 2x in size
        perm = torch.argsort(cnt, stable=True)
        for s in range(0, W.shape[0], self.chunk):
            rows = perm[s : s + self.chunk]
            w = max(1, int(cnt[rows].max()))  # (valid slots first: the chunk's width)
            Wc, xc, okc = W[rows, :w], xt[rows], ok[rows, :w]
            mask = okc.to(torch.float64)
            Uw = gather_rows(self.U64, Wc, numpy=self.numba)  # (c, w, n) float64
            # p: the leading slots that are former support slots with a cached block on every token of the chunk
            p = 0
            if Gprev is not None:
                sc = src[rows, :w]
                gr = gpos[rows]
                known = (sc >= 0) & ~torch.isnan(Gprev[gr, 0, 0])[:, None]
                p = int(known.to(torch.int8).cumprod(1).sum(1).min())
            if p:
                ix = sc[:, :p]
                G = torch.empty((len(rows), w, w), dtype=torch.float64, device=xt.device)
                G[:, :p, :p] = Gprev[gr[:, None, None], ix[:, :, None], ix[:, None, :]]  # (one gather, (c, p, p))
                Xn = Uw @ Uw[:, p:].transpose(1, 2)  # (c, w, w - p): the new atoms' columns
                G[:, :, p:] = Xn
                G[:, p:, :p] = Xn[:, :p].transpose(1, 2)
            else:
                G = Uw @ Uw.transpose(1, 2)
            Gout[s : s + len(rows), :w, :w] = G  # (padding slots hold anything: only former support slots are read)
            pos[rows] = torch.arange(s, s + len(rows), device=xt.device)
            q = (Uw @ xc[:, :, None]).squeeze(-1)
            y0, xx = y[rows, :w] * mask, (xc * xc).sum(1)
            if self.restricted == "coordinate_descent":  # per token, numba: reads the first cnt slots only
                y1 = y0.clone()
                used = solve_blocks(G.numpy(), q.numpy(), xx.numpy(), y1.numpy(), cnt[rows].numpy(), self.lam,
                                    0.1 * self.tol, floor, self.max_sweeps, 6)
                sub = torch.nonzero(torch.from_numpy(used) >= self.max_sweeps).flatten()  # not settled
            else:
                sub = torch.arange(len(rows), device=xt.device)
            if sub.numel():  # the batched torch solves, on the blocks with their padding masked
                ms, Gs = mask[sub], G[sub]
                Gs = Gs * (ms[:, :, None] * ms[:, None, :]) + eye[:w, :w] * (1.0 - ms)[:, :, None]
                qs, ys, xs = q[sub] * ms, y0[sub], xx[sub]
                y1s = y1[sub] if self.restricted == "coordinate_descent" else _pdas(qs, Gs, ys, self.lam,
                                                                                     self.newton_steps)
                if self.restricted != "newton":  # where the solve did not settle: exact active set
                    Pr, gap_r = _restricted_gap(xs, qs, Gs, y1s, self.lam)
                    bad = torch.nonzero(gap_r > 0.1 * self.tol * Pr.clamp(min=floor)).flatten()
                    if bad.numel():
                        y1s[bad] = nnls_batch(Gs[bad], qs[bad] - self.lam, okc[sub][bad], start=ys[bad] > 0)
                ys = _inner(xs, qs, Gs, y1s, self.lam, 0.1 * self.tol, floor, self.inner_iter, newton_steps=0)
                if self.restricted == "coordinate_descent":
                    y1[sub] = ys
                else:
                    y1 = ys
            yc = y1 * mask
            out[rows, :w] = yc
            R[rows] = xc - (yc[:, None, :] @ Uw).squeeze(1)  # float64 residuals, from the gathered atoms
            del Uw
        return out, R, Gout, pos

    def _certify(self, xt, W, y, R=None):
        """float64 residuals (``R`` when given), ``P``, certified gaps and float32 correlations of the codes ``y``
        on ``W``."""
        if R is None:
            R = xt.clone()
            for s in range(0, W.shape[0], self.chunk):
                e = min(W.shape[0], s + self.chunk)
                R[s:e] -= (y[s:e, None, :] @ self.U64[W[s:e]]).squeeze(1)
        mx, C32 = exact_max(R, self.U64, self.U32, numba=self.numba)
        rr = (R * R).sum(1)
        rx = (R * xt).sum(1)
        P, gap = lasso_gap(rr, rx, mx, y.sum(1), self.lam)
        return R, P, gap, C32

    def solve(self, xt, Y0=None, C0=None):
        """Certified codes for ``xt`` (m, n) float64 tensor; warm start ``Y0`` (CSR, unit atoms), ``C0`` its correlations.

        Returns a :class:`~widelimit.coding.result.CodingResult` in unit-atom units with ``residuals`` (float64).
        The tokens are coded ``block_rows`` at a time: the rounds hold about twenty ``(rows, k)`` matrices at
        their peak (correlations, their float64 check, working-set selection): 5-6.7 GB for 2,000 tokens at
        ``k = 16,384`` and optimal L0 190.
        """
        m = xt.shape[0]
        if m <= self.block_rows:
            return self._solve(xt, Y0, C0)
        parts = []
        for r0 in range(0, m, self.block_rows):
            r1 = min(m, r0 + self.block_rows)
            parts.append(self._solve(xt[r0:r1], None if Y0 is None else sp.csr_array(Y0)[r0:r1],
                                     None if C0 is None else C0[r0:r1]))
        codes = sp.vstack([p.codes for p in parts], format="csr")
        return CodingResult.from_points(codes, np.concatenate([p.point_values for p in parts]),
                                        np.concatenate([p.point_gaps for p in parts]),
                                        penalty_sum=2.0 * self.lam * float(codes.sum()),
                                        n_iter=max(p.n_iter for p in parts), device=self.dev, lam=self.lam,
                                        tol=self.tol, residuals=np.concatenate([p.residuals for p in parts]))

    def _solve(self, xt, Y0=None, C0=None):
        """:meth:`solve` on one block of rows."""
        import torch

        m, n = xt.shape
        k = self.U64.shape[0]
        dev = self.dev
        if Y0 is not None and sp.csr_array(Y0).nnz:
            Y0 = sp.csr_array(Y0)
            cnt = np.diff(Y0.indptr)
            w = max(1, int(cnt.max()))
            pos = np.arange(Y0.nnz) - np.repeat(Y0.indptr[:-1], cnt)
            rows = np.repeat(np.arange(m), cnt)
            idx = torch.zeros((m, w), dtype=torch.int64, device=dev)
            val = torch.zeros((m, w), dtype=torch.float64, device=dev)
            idx[rows, pos] = torch.as_tensor(Y0.indices.astype(np.int64), device=dev)
            val[rows, pos] = torch.as_tensor(Y0.data.astype(np.float64), device=dev)
        else:
            idx = torch.zeros((m, 1), dtype=torch.int64, device=dev)
            val = torch.zeros((m, 1), dtype=torch.float64, device=dev)
        R, P, gap, C = self._certify(xt, idx, val)
        if C0 is not None:
            C = C0
        todo = torch.nonzero(gap > self.tol * _scale(P, self.lam)).flatten()
        C = C[todo]  # row t: token todo[t]
        rounds = 0
        Gprev = gpos = None  # token todo[i]'s Gram block of its state's slots: Gprev[gpos[i]] (NaN at [0, 0]: none)
        while todo.numel() and rounds < self.max_rounds:
            rounds += 1
            W, y, ok, src = self._working_sets(idx[todo], val[todo], C)
            y, Rt, Gprev, gpos = self._restricted(xt[todo], W, y, ok, src, Gprev, gpos)
            Rt, Pt, gt, Ct = self._certify(xt[todo], W, y, Rt)
            # a token moves on to codes with a lower objective (or, equal to rounding, a lower gap): the working
            # sets then grow from the latest solution. (Keeping the lowest gap instead stalled: codes of a
            # lower P with a larger gap were dropped, the next round rebuilt the same working set)
            Po = P[todo]
            better = (Pt < Po) | ((Pt <= Po * (1.0 + 1e-15)) & (gt < gap[todo]))
            keep = todo[better]
            if idx.shape[1] < W.shape[1]:
                pad = W.shape[1] - idx.shape[1]
                idx = torch.cat([idx, torch.zeros((m, pad), dtype=torch.int64, device=dev)], 1)
                val = torch.cat([val, torch.zeros((m, pad), dtype=torch.float64, device=dev)], 1)
            idx[keep] = 0
            val[keep] = 0.0
            idx[keep, : W.shape[1]] = W[better]
            val[keep, : W.shape[1]] = y[better]
            R[keep], P[keep], gap[keep] = Rt[better], Pt[better], gt[better]
            bad = gap[todo] > self.tol * _scale(P[todo], self.lam)
            Gprev[gpos[~better], 0, 0] = math.nan  # (these tokens keep their former state: not these blocks)
            gpos = gpos[bad]
            C = Ct[bad]
            todo = todo[bad]
        nz = val > 0
        r_, c_ = torch.nonzero(nz, as_tuple=True)
        codes = sp.csr_array((val[nz].cpu().numpy(), (r_.cpu().numpy(), idx[nz].cpu().numpy())), shape=(m, k))
        codes.sum_duplicates()
        return CodingResult.from_points(codes, P.cpu().numpy(), gap.cpu().numpy(),
                                        penalty_sum=2.0 * self.lam * float(codes.sum()), n_iter=rounds,
                                        device=self.dev, lam=self.lam, tol=self.tol, residuals=R.cpu().numpy())
