r"""Working-set acceleration of certified optimal coding for wide dictionaries.

Same problem and the same certificate as :func:`widelimit.coding.fista.fista_codes`
(one nonnegative lasso per token, ``min_{y >= 0} ||y U - (x - b)||^2 + 2 lam ||y||_1``
on unit atoms, per-token duality gap from the scaled residual), solved faster
when the optimal codes are sparse (``L0 << d_sae``, the SAE regime):

1. per token, a working set of ``S`` atoms: the current support plus the atoms
   most correlated with the current residual;
2. the lasso restricted to the working set, in ``S`` dimensions using the
   ``S x S`` block of the Gram matrix ``U U^T`` (gathered from one precomputed
   ``k x k`` Gram) and ``q = U (x - b)``: a few primal-dual active-set (Newton)
   steps, then projected accelerated gradient with restarts until the
   restricted duality gap is certified; an iteration costs ``O(S^2)`` per
   token instead of ``O(k n)``;
3. the full certificate (one pass over all ``k`` atoms, float64, the dual
   point of :func:`widelimit.coding.fista.fista_codes`): a token whose gap meets the tolerance is
   done; the others get the violating atoms added and go back to step 2 (the
   working set doubles when a support fills it).

A token still uncertified after ``max_iter`` rounds is handed to
:func:`widelimit.coding.fista.fista_codes` (full-dictionary FISTA), warm-started,
so the result is always certified the same way. Dictionaries wider than
``gram_limit`` atoms go to :func:`~widelimit.coding.fista.fista_codes` directly
(the ``k x k`` Gram would not fit).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

from .._runtime import resolve_device
from .._validation import check_codes
from .fista import finish_rows, fista_codes
from .lasso import check_problem, gap_floor, lasso_gap, unit_atoms
from .result import CodingResult

__all__ = ["optimal_codes_working_set"]


def _restricted_gap(xx, q, G, y, lam):
    """Primal value and duality gap of the lasso restricted to the working set (all from q, G)."""
    Gy = (G @ y.unsqueeze(-1)).squeeze(-1)
    qy = (q * y).sum(-1)
    rr = (xx - 2.0 * qy + (y * Gy).sum(-1)).clamp(min=0.0)
    return lasso_gap(rr, xx - qy, (q - Gy).amax(-1), y.sum(-1), lam)


def _pdas(q, G, y, lam, iters):
    r"""Primal-dual active-set (semismooth Newton) steps for ``f(y) = y^T G y - 2 (q - lam).y`` over ``y >= 0``,
    each kept only where it lowers ``f``.

    Each step predicts the support ``A = {y - grad/2 > 0}`` and solves ``G_AA y_A = (q - lam)_A`` for all
    tokens at once (batched LU, :func:`torch.linalg.solve_ex`); the result is clipped at 0. It usually lands
    on the exact solution in a few steps, but on an ill-conditioned block the predicted supports can cycle,
    and a singular block (duplicate atoms) has no solution. So a token keeps its Newton point only where
    the solve succeeded (finite, pivots valid) and ``f`` decreased; the others take a projected gradient
    step ``y <- (y - (G y - c) / L)_+`` with ``L = max_i sum_j |G_ij| >= lambda_max(G)`` (Gershgorin),
    which cannot increase ``f`` (docs/theory.md §8.6). A token leaves when its accepted Newton point has
    the support of the point before. The certified iteration that follows (:func:`_inner`) takes over
    from wherever this ends.
    """
    import torch

    if iters <= 0:  # (the Gershgorin bound below reads every block: nothing to do without steps)
        return y.clone()
    c = q - lam
    idx = torch.arange(y.shape[0], device=y.device)
    y = y.clone()
    Gi, yi, ci = G, y.clone(), c
    L = G.abs().sum(-1).amax(-1).clamp(min=1e-300).unsqueeze(-1)  # >= lambda_max(G) (Gershgorin)
    for _ in range(iters):
        Gy = (Gi @ yi.unsqueeze(-1)).squeeze(-1)
        grad = Gy - ci
        y_new, ok = _active_solve(Gi, ci, (yi - grad) > 0)
        y_new = torch.where(ok.unsqueeze(-1), y_new.clamp(min=0.0), yi)
        f_old = (yi * (Gy - 2.0 * ci)).sum(-1)
        slack = 1e-12 * ((yi * Gy).sum(-1) + 2.0 * (ci.abs() * yi).sum(-1))  # the rounding of f
        ok &= (y_new * ((Gi @ y_new.unsqueeze(-1)).squeeze(-1) - 2.0 * ci)).sum(-1) <= f_old + slack
        y_new = torch.where(ok.unsqueeze(-1), y_new, (yi - grad / L).clamp(min=0.0))
        same = ok & ((y_new > 0) == (yi > 0)).all(1)
        y[idx] = y_new
        if bool(same.all()):
            break
        if bool(same.any()):  # rows whose support stopped changing are solved exactly on it
            go = ~same
            idx, Gi, ci, L, y_new = idx[go], Gi[go], ci[go], L[go], y_new[go]
        yi = y_new
    return y


def gather_rows(U, idx, numpy=None):
    """``U[idx]`` (``idx.shape + (n,)``) for a tensor ``U`` (k, n): on the CPU by numpy's fancy indexing, which
    copies the rows ~3x faster than torch's (measured: 10,240 rows of 768 float64, 9 ms against 31 ms; one
    thread), elsewhere (or ``numpy=False``) by torch."""
    import torch

    if (U.device.type == "cpu" if numpy is None else numpy) and not U.requires_grad:
        return torch.from_numpy(U.numpy()[idx.numpy()])
    return U[idx]


def gather_block(G, q, P):
    """``(order, G_c, q_c, P_c)``: per row, the slots of ``P`` (B, s) moved first and the blocks cut to the largest
    ``|P|`` of the batch, ``a``: ``order`` (B, a) the slots taken, ``G_c`` (B, a, a), ``q_c`` and ``P_c`` (B, a)
    (``P_c`` false on the padding). A factorisation of ``G_c`` costs ``a^3``, not ``s^3`` (used by the Lawson-Hanson
    solves of :mod:`widelimit.coding._nnls` too)."""
    import torch

    B, s = P.shape
    a = max(1, int(P.sum(1).max()))
    order = torch.argsort((~P).to(torch.int8), dim=1, stable=True)[:, :a]  # the slots of P first
    Gc = G.gather(1, order[:, :, None].expand(B, a, s)).gather(2, order[:, None, :].expand(B, a, a))
    return order, Gc, q.gather(1, order), P.gather(1, order)


def _active_solve(G, c, A):
    """Per row, ``y_A = G_AA^{-1} c_A`` (0 off ``A``) and whether the solve succeeded (valid pivots, finite).

    The active entries are gathered first into blocks of the largest ``|A|`` in the batch (padded with the
    identity, :func:`gather_block`), so the factorisation costs ``|A|^3``, not ``S^3``."""
    import torch

    B = A.shape[0]
    if not B or not bool(A.any()):
        return torch.zeros_like(c), torch.ones(B, dtype=torch.bool, device=c.device)
    P, M, cA, v = gather_block(G, c, A)  # the active slots first, blocks of the largest |A|
    v = v.to(G.dtype)
    eye = torch.eye(M.shape[1], dtype=G.dtype, device=G.device)
    M = M * (v[:, :, None] * v[:, None, :]) + eye * (1.0 - v)[:, :, None]
    rhs = (cA * v).unsqueeze(-1)
    # Cholesky, not LU: G_AA is a Gram block (positive semidefinite). MKL's batched LU refused some blocks
    # ("Parameter 6 was incorrect on entry to DLASWP", invalid pivots) and twice hung after that; a
    # factorisation without pivoting has no such step, and a block that is not positive definite (duplicate
    # atoms) reports it in ``info``: its rows take the gradient step
    try:
        L, info = torch.linalg.cholesky_ex(M)
        sol = torch.cholesky_solve(rhs, L)
    except RuntimeError:  # a factorisation the library refused: the rows take the gradient step
        sol, info = torch.zeros_like(rhs), torch.ones(B, dtype=torch.int32, device=c.device)
    sol = sol.squeeze(-1)
    ok = (info == 0) & torch.isfinite(sol).all(-1)
    return torch.zeros_like(c).scatter_(1, P, torch.where(ok[:, None], sol * v, 0.0)), ok


def _inner(xx, q, G, y, lam, tol, floor, max_iter, check_every=10, newton_steps=6):
    """Active-set warm start, then projected FISTA with adaptive restart on ``y^T G y - 2 q.y + 2 lam sum y``;
    rows leave as soon as their restricted gap is certified."""
    import torch

    y = _pdas(q, G, y, lam, newton_steps)
    out = y.clone()
    idx = torch.arange(y.shape[0], device=y.device)
    P, gap = _restricted_gap(xx, q, G, y, lam)
    keep = gap > tol * P.clamp(min=floor)
    if not bool(keep.any()):
        return out
    idx, xx, q, G, y = idx[keep], xx[keep], q[keep], G[keep], y[keep]
    L = torch.linalg.eigvalsh(G)[:, -1].clamp(min=1e-12) * (1.0 + 1e-9)
    inv_L = (1.0 / L).unsqueeze(-1)
    v = y.clone()
    t = torch.ones_like(xx)
    for it in range(max_iter + 1):
        if it % check_every == 0 or it == max_iter:
            P, gap = _restricted_gap(xx, q, G, y, lam)
            done = (gap <= tol * P.clamp(min=floor)) | (it == max_iter)
            if bool(done.any()):
                out[idx[done]] = y[done]
                keep = ~done
                idx, xx, q, G, y, v, t, inv_L = idx[keep], xx[keep], q[keep], G[keep], y[keep], v[keep], t[keep], inv_L[keep]
                if not idx.numel():
                    break
        g = (G @ v.unsqueeze(-1)).squeeze(-1) - q + lam
        y_new = (v - g * inv_L).clamp(min=0.0)
        restart = ((v - y_new) * (y_new - y)).sum(-1) > 0
        t_new = 0.5 * (1.0 + torch.sqrt(1.0 + 4.0 * t * t))
        beta = torch.where(restart, torch.zeros_like(t), (t - 1.0) / t_new)
        t = torch.where(restart, torch.ones_like(t), t_new)
        v = y_new + beta.unsqueeze(-1) * (y_new - y)
        y = y_new
    return out


def optimal_codes_working_set(X, W, b, *, lam, tol: float = 1e-6, device="auto", Z0=None, return_codes: bool = True,
                              batch_size: int | None = None, ws_size: int = 32, max_iter: int = 12,
                              inner_iter: int = 2000, gram_limit: int = 8192) -> CodingResult:
    r"""Certified optimal nonnegative codes, computed on per-token working sets (module docstring).

    Parameters and result as :func:`widelimit.coding.fista.fista_codes` (``tol`` is the
    per-token relative gap ``gap_i <= tol * max(P_i, gap_floor(lam))``); in addition:

    ws_size : int
        Initial working-set size per token (doubled while supports fill it, at most ``n``).
    max_iter : int
        Working-set rounds before the remaining tokens go to the full solver.
    inner_iter : int
        Iteration cap of one restricted solve.
    gram_limit : int
        Widest dictionary handled here (the ``k x k`` Gram is formed once).
    """
    import torch

    X, W, b, lam, tol = check_problem(X, W, b, lam, tol)
    N, n = X.shape
    k = W.shape[0]
    if k > gram_limit or k <= ws_size:
        return fista_codes(X, W, b, lam=lam, tol=tol, device=device, Z0=Z0, return_codes=return_codes,
                           batch_size=batch_size)
    dev = resolve_device(device)
    if Z0 is not None:
        Z0 = check_codes(Z0, N, k, name="Z0")
    norms, live, U64 = unit_atoms(W)
    kl = live.size
    U8 = torch.as_tensor(U64, dtype=torch.float64, device=dev)
    U64 = U8.cpu().numpy()
    atoms = dict(U8=U8, U64=U64, G=U8 @ U8.T, live=live, norms=norms)
    rounds = dict(lam=lam, tol=tol, ws_size=ws_size, max_rounds=max_iter, inner_iter=inner_iter)
    if batch_size is None:
        batch_size = int(max(1, min(N, (1 << 27) // (8 * max(kl, 4 * ws_size * ws_size // 8 + n)))))
    P_all, gap_all = np.empty(N), np.empty(N)
    rows_out, cols_out, vals_out = [], [], []
    rounds_max = 0
    with torch.no_grad():
        for s0 in range(0, N, batch_size):
            e0 = min(N, s0 + batch_size)
            x = torch.as_tensor(np.asarray(X[s0:e0], dtype=np.float64) - b, device=dev)
            P, gap, idx, val, todo, used = _solve_batch(x, None if Z0 is None else Z0[s0:e0], **atoms, **rounds)
            rounds_max = max(rounds_max, used)
            P_all[s0:e0], gap_all[s0:e0] = P.cpu().numpy(), gap.cpu().numpy()
            iv, vv = idx.cpu().numpy(), val.cpu().numpy()
            nz = vv > 0
            rows_out.append(s0 + np.nonzero(nz)[0])
            cols_out.append(live[iv[nz]])
            vals_out.append(vv[nz] / norms[live[iv[nz]]])
    codes = sp.csr_array((np.concatenate(vals_out), (np.concatenate(rows_out), np.concatenate(cols_out))),
                         shape=(N, k))
    res = CodingResult.from_points(codes, P_all, gap_all, n_iter=rounds_max, device=dev, lam=lam, tol=tol,
                                   penalty_sum=2.0 * lam * float(np.asarray(codes @ norms).sum()))
    res = finish_rows(X, W, b, res, device=dev)  # the full solver finishes uncertified tokens, warm-started
    return res if return_codes else dataclasses.replace(res, codes=None)


def _warm_start(x, xx, z0, U8, U64, live, norms, S):
    """The state a batch starts from: per token ``S`` atom indices and their unit-atom codes (the ``S``
    largest of ``z0``, or none), the correlations ``<u_d, r>`` of the start's residual and a bound
    ``rmax >= ||r||``."""
    import torch

    m, dev = x.shape[0], x.device
    if z0 is None:
        return (torch.zeros((m, S), dtype=torch.long, device=dev), torch.zeros((m, S), dtype=torch.float64, device=dev),
                None, float(xx.max()) ** 0.5)
    z0 = sp.csr_array(z0) if hasattr(z0, "toarray") else sp.csr_array(np.asarray(z0))
    y0 = z0[:, live] @ sp.diags(norms[live])
    r0 = x - torch.as_tensor(np.asarray(y0 @ U64), device=dev)
    rmax = max(float(xx.max()), float((r0 * r0).sum(1).max())) ** 0.5
    val, idx = torch.topk(torch.as_tensor(y0.toarray(), device=dev), S, dim=1)
    return idx, val, r0 @ U8.T, rmax


def _solve_batch(x, z0, *, U8, U64, G, live, norms, lam, tol, ws_size, max_rounds, inner_iter):
    """The working-set rounds on one batch of ``x = X - b`` (module docstring, steps 1-3).

    Returns ``(P, gap, idx, val, todo, rounds)``: per token the primal value and certified gap, the atoms of
    its last working set and their unit-atom codes, the tokens still uncertified and the rounds used.
    """
    import torch

    m, n = x.shape
    dev = x.device
    floor = gap_floor(lam)
    xx = (x * x).sum(1)
    q_full = x @ U8.T
    S = min(ws_size, live.size, n)  # a lasso solution needs at most n atoms; larger blocks are singular
    # state: per token, S atom indices and their (unit-atom) codes; code 0 = not in the support
    idx, val, corr, rmax = _warm_start(x, xx, z0, U8, U64, live, norms, S)
    if corr is None:
        corr = q_full
    todo = torch.arange(m, device=dev)
    P = torch.empty(m, dtype=torch.float64, device=dev)
    gap = torch.empty(m, dtype=torch.float64, device=dev)
    rounds = 0
    for rnd in range(max_rounds):
        rounds = rnd + 1
        it_, vt = idx[todo], val[todo]
        score = corr.clone() if corr is q_full else corr
        # support first (largest codes first), then correlations; |<u_d, r>| <= ||r|| <= rmax
        big = 4.0 * rmax + 1.0
        cur = score.gather(1, it_)
        score.scatter_(1, it_, torch.where(vt > 0, big + vt, cur))
        ws = torch.topk(score, S, dim=1).indices
        y_init = ((ws.unsqueeze(2) == it_.unsqueeze(1)) * vt.unsqueeze(1)).sum(2)
        ys = _inner(xx[todo], q_full[todo].gather(1, ws), G[ws.unsqueeze(-1), ws.unsqueeze(-2)], y_init, lam,
                    tol * 0.1, floor, inner_iter)
        Pt, gt, c = _certify_round(x[todo], ws, ys, U8, lam)
        P[todo], gap[todo] = Pt, gt
        if idx.shape[1] < S:  # the working sets grew: widen the state
            pad = S - idx.shape[1]
            idx = torch.cat([idx, torch.zeros((m, pad), dtype=idx.dtype, device=dev)], 1)
            val = torch.cat([val, torch.zeros((m, pad), dtype=val.dtype, device=dev)], 1)
        idx[todo], val[todo] = ws, ys
        bad = gt > tol * Pt.clamp(min=floor)
        if not bool(bad.any()):
            todo = todo[bad]
            break
        if bool(((ys > 0).sum(1) >= S)[bad].any()):
            S = min(live.size, n, 2 * S)
        todo, corr = todo[bad], c[bad]
    return P, gap, idx, val, todo, rounds


def _certify_round(xt, ws, ys, U8, lam):
    """The full float64 certificate of the codes ``ys`` on the working sets ``ws``: ``(P, gap, c)`` with
    ``c = r U^T`` the correlations of the residual ``r = xt - y U`` (:func:`widelimit.coding.lasso.lasso_gap`)."""
    r = xt.clone()
    for c0 in range(0, r.shape[0], 256):  # r = x - y U from the working sets only
        sl = slice(c0, c0 + 256)
        r[sl] -= (ys[sl].unsqueeze(1) @ U8[ws[sl]]).squeeze(1)
    c = r @ U8.T
    P, gap = lasso_gap((r * r).sum(1), (r * xt).sum(1), c.amax(1), ys.sum(1), lam)
    return P, gap, c
