r"""Working-set acceleration of certified optimal coding for wide dictionaries.

Same problem and the same certificate as :func:`widelimit.coding.pdas.optimal_codes`
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
   point of :func:`widelimit.coding.pdas.optimal_codes`): a token whose gap meets the tolerance is
   done; the others get the violating atoms added and go back to step 2 (the
   working set doubles when a support fills it).

A token still uncertified after ``max_rounds`` rounds is handed to
:func:`widelimit.coding.pdas.optimal_codes` (full-dictionary FISTA), warm-started,
so the result is always certified the same way. Dictionaries wider than
``gram_limit`` atoms go to :func:`~widelimit.coding.pdas.optimal_codes` directly
(the ``k x k`` Gram would not fit).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from .._runtime import resolve_device
from .._validation import check_codes, row_norms
from .pdas import CodingResult, _check_problem, finish_rows, optimal_codes

__all__ = ["optimal_codes_working_set"]


def _gap(rr, rx, mx, l1, lam):
    """Primal value ``P = ||r||^2 + 2 lam ||y||_1`` and the certified gap ``P - D(s r)`` (as in
    :func:`widelimit.coding.pdas._evaluate`) from ``||r||^2``, ``<r, x - b>``, ``max_d <u_d, r>`` and ``||y||_1``."""
    import torch

    P = rr + 2.0 * lam * l1
    smax = torch.where(mx > 0, lam / torch.where(mx > 0, mx, torch.ones_like(mx)), torch.full_like(mx, math.inf))
    s = torch.where(rr > 0, rx / torch.where(rr > 0, rr, torch.ones_like(rr)), torch.zeros_like(rr))
    s = torch.minimum(s.clamp(min=0.0), smax)
    D = 2.0 * s * rx - s * s * rr
    return P, (P - D).clamp(min=0.0)


def _restricted_gap(xx, q, G, y, lam):
    """Primal value and duality gap of the lasso restricted to the working set (all from q, G)."""
    Gy = (G @ y.unsqueeze(-1)).squeeze(-1)
    qy = (q * y).sum(-1)
    rr = (xx - 2.0 * qy + (y * Gy).sum(-1)).clamp(min=0.0)
    return _gap(rr, xx - qy, (q - Gy).amax(-1), y.sum(-1), lam)


def _pdas(q, G, y, lam, iters):
    """Primal-dual active-set (semismooth Newton) steps for ``min_{y>=0} y^T G y - 2 (q - lam).y``.

    Each step predicts the support ``A = {y - grad/2 > 0}`` and solves
    ``G_AA y_A = (q - lam)_A`` for all tokens at once (masked batched solve);
    the result is clipped at 0. It usually lands on the exact solution in a
    few steps; the certified iteration that follows (:func:`_inner`) takes over
    from wherever it ends, so a step that does not converge costs nothing in
    correctness.
    """
    import torch

    c = q - lam
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    idx = torch.arange(y.shape[0], device=y.device)
    y = y.clone()
    for _ in range(iters):
        Gi, yi, ci = G[idx], y[idx], c[idx]
        mu = (Gi @ yi.unsqueeze(-1)).squeeze(-1) - ci
        A = ((yi - mu) > 0).to(G.dtype)
        M = Gi * (A.unsqueeze(-1) * A.unsqueeze(-2)) + eye * (1.0 - A).unsqueeze(-1)
        try:
            y_new = torch.linalg.solve(M, (ci * A).unsqueeze(-1)).squeeze(-1).clamp(min=0.0)
        except RuntimeError:  # a singular block (duplicate atoms): leave it to the gradient iteration
            break
        same = ((y_new > 0) == (yi > 0)).all(1)
        y[idx] = y_new
        idx = idx[~same]  # rows whose support stopped changing are solved exactly on it
        if not idx.numel():
            break
    return y


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
                              batch_size: int | None = None, ws_size: int = 32, max_rounds: int = 12,
                              inner_iter: int = 2000, gram_limit: int = 8192) -> CodingResult:
    r"""Certified optimal nonnegative codes, computed on per-token working sets (module docstring).

    Parameters and result as :func:`widelimit.coding.pdas.optimal_codes` (``tol`` is the
    per-token relative gap ``gap_i <= tol * max(P_i, lam^2)``); in addition:

    ws_size : int
        Initial working-set size per token (doubled while supports fill it, at most ``n``).
    max_rounds : int
        Working-set rounds before the remaining tokens go to the full solver.
    inner_iter : int
        Iteration cap of one restricted solve.
    gram_limit : int
        Widest dictionary handled here (the ``k x k`` Gram is formed once).
    """
    import torch

    X, W, b, lam, tol = _check_problem(X, W, b, lam, tol)
    N, n = X.shape
    k = W.shape[0]
    if k > gram_limit or k <= ws_size:
        return optimal_codes(X, W, b, lam=lam, tol=tol, device=device, Z0=Z0, return_codes=return_codes, batch_size=batch_size)
    dev = resolve_device(device)
    if Z0 is not None:
        Z0 = check_codes(Z0, N, k, name="Z0")
    norms = row_norms(W)  # float64 even for float32 atoms
    live = np.flatnonzero(norms > 0)
    kl = live.size
    U8 = torch.as_tensor(W[live] / norms[live, None], dtype=torch.float64, device=dev)
    Gfull = U8 @ U8.T
    floor = lam * lam
    if batch_size is None:
        batch_size = int(max(1, min(N, (1 << 27) // (8 * max(kl, 4 * ws_size * ws_size // 8 + n)))))
    P_all, gap_all = np.empty(N), np.empty(N)
    rows_out, cols_out, vals_out = [], [], []
    rounds_max = 0
    leftovers = []
    U64 = U8.cpu().numpy()
    with torch.no_grad():
        for s0 in range(0, N, batch_size):
            e0 = min(N, s0 + batch_size)
            m = e0 - s0
            xn = np.asarray(X[s0:e0], dtype=np.float64) - b
            x = torch.as_tensor(xn, device=dev)
            xx = (x * x).sum(1)
            q_full = x @ U8.T
            S = min(ws_size, kl, n)  # a lasso solution needs at most n atoms; larger blocks are singular
            # state: per token, S atom indices and their (unit-atom) codes; code 0 = not in the support
            if Z0 is not None:
                z0 = Z0[s0:e0]
                z0 = sp.csr_array(z0) if hasattr(z0, "toarray") else sp.csr_array(np.asarray(z0))
                y0 = z0[:, live] @ sp.diags(norms[live])
                r0 = x - torch.as_tensor(np.asarray(y0 @ U64), device=dev)
                corr = r0 @ U8.T
                rmax = max(float(xx.max()), float((r0 * r0).sum(1).max())) ** 0.5
                val, idx = torch.topk(torch.as_tensor(y0.toarray(), device=dev), S, dim=1)
            else:
                corr = q_full
                rmax = float(xx.max()) ** 0.5
                idx = torch.zeros((m, S), dtype=torch.long, device=dev)
                val = torch.zeros((m, S), dtype=torch.float64, device=dev)
            todo = torch.arange(m, device=dev)
            P = torch.empty(m, dtype=torch.float64, device=dev)
            gap = torch.empty(m, dtype=torch.float64, device=dev)
            for rnd in range(max_rounds):
                rounds_max = max(rounds_max, rnd + 1)
                it_, vt = idx[todo], val[todo]
                score = corr.clone() if corr is q_full else corr
                # support first (largest codes first), then correlations; |<u_d, r>| <= ||r|| <= rmax
                big = 4.0 * rmax + 1.0
                cur = score.gather(1, it_)
                score.scatter_(1, it_, torch.where(vt > 0, big + vt, cur))
                ws = torch.topk(score, S, dim=1).indices
                y_init = ((ws.unsqueeze(2) == it_.unsqueeze(1)) * vt.unsqueeze(1)).sum(2)
                G = Gfull[ws.unsqueeze(-1), ws.unsqueeze(-2)]
                q = q_full[todo].gather(1, ws)
                ys = _inner(xx[todo], q, G, y_init, lam, tol * 0.1, floor, inner_iter)
                xt = x[todo]
                r = xt.clone()
                for c0 in range(0, r.shape[0], 256):  # r = x - y U from the working sets only
                    sl = slice(c0, c0 + 256)
                    r[sl] -= (ys[sl].unsqueeze(1) @ U8[ws[sl]]).squeeze(1)
                c = r @ U8.T
                Pt, gt = _gap((r * r).sum(1), (r * xt).sum(1), c.amax(1), ys.sum(1), lam)
                ok = gt <= tol * Pt.clamp(min=floor)
                P[todo], gap[todo] = Pt, gt
                if idx.shape[1] < S:  # the working sets grew: widen the state
                    pad = S - idx.shape[1]
                    idx = torch.cat([idx, torch.zeros((m, pad), dtype=idx.dtype, device=dev)], 1)
                    val = torch.cat([val, torch.zeros((m, pad), dtype=val.dtype, device=dev)], 1)
                idx[todo], val[todo] = ws, ys
                bad = ~ok
                if not bool(bad.any()):
                    todo = todo[bad]
                    break
                if bool(((ys > 0).sum(1) >= S)[bad].any()):
                    S = min(kl, n, 2 * S)
                todo, corr = todo[bad], c[bad]
            if todo.numel():
                leftovers.append(s0 + todo.cpu().numpy())
            P_all[s0:e0] = P.cpu().numpy()
            gap_all[s0:e0] = gap.cpu().numpy()
            iv, vv = idx.cpu().numpy(), val.cpu().numpy()
            nz = vv > 0
            rows_out.append(s0 + np.nonzero(nz)[0])
            cols_out.append(live[iv[nz]])
            vals_out.append(vv[nz] / norms[live[iv[nz]]])
    codes = sp.csr_array((np.concatenate(vals_out), (np.concatenate(rows_out), np.concatenate(cols_out))),
                         shape=(N, k))
    n_iter = rounds_max
    if leftovers:  # the full solver finishes these tokens, warm-started
        codes, res = finish_rows(X, W, b, codes, np.concatenate(leftovers), P_all, gap_all, lam=lam, tol=tol,
                                 device=dev)
        n_iter += res.n_iter
    n_bad = int(np.sum(gap_all > tol * np.maximum(P_all, floor)))
    value = float(P_all.mean())
    rec = value - 2.0 * lam * float(np.asarray(codes @ norms).sum()) / N
    return CodingResult(
        codes=codes if return_codes else None, value=value, reconstruction=rec, penalty=value - rec,
        gap=float(gap_all.mean()), max_gap=float(gap_all.max()), point_values=P_all, point_gaps=gap_all,
        n_iter=int(n_iter), converged=n_bad == 0, n_unconverged=int(n_bad), device=str(dev), lam=lam, tol=tol,
    )
