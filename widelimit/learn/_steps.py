"""Free-code steps of :func:`widelimit.fit_dictionary` (torch): initialisation, working-set coordinate
descent on the codes, block-coordinate atom sweeps, extrapolation, minibatch (online) steps.

The algorithm and its monotonicity are described in :mod:`widelimit.learn.gradient`'s docstring
(theory.md §1). Everything here runs under ``torch.no_grad()`` on float32 tensors.
"""

from __future__ import annotations

import math

import numpy as np

from ..coding.fista import code_steps

#: Full-batch code updates stop sweeping once the restricted optimality conditions are violated
#: by at most ``CD_TOL * lam`` per point on average (summed over each point's working set).
CD_TOL = 1e-3
#: Extrapolation of full-batch steps: initial factor, growth on success, largest and smallest factor
#: (halved on failure). An initial factor of 0 turns extrapolation off.
EXTRAPOLATE = (0.5, 1.5, 4.0, 0.05)


# --------------------------------------------------------------------------------------
# small torch helpers
# --------------------------------------------------------------------------------------


def _rownorm(W, old=None):
    """Rows of ``W`` scaled to unit norm; zero rows keep ``old`` (or stay zero)."""
    import torch

    nr = W.norm(dim=1, keepdim=True)
    out = W / torch.where(nr > 0, nr, torch.ones_like(nr))
    if old is not None:
        out = torch.where(nr > 0, out, old)
    return out


def _lmax(M):
    """Largest eigenvalue of the symmetric PSD matrix ``M`` (float64 eigvalsh), at least tiny."""
    import torch

    if M.shape[0] == 0:
        return 1.0
    return max(float(torch.linalg.eigvalsh(M.double())[-1]), 1e-30)


def _code_lipschitz(W):
    """``lambda_max(W W^T)`` from the smaller Gram matrix."""
    k, n = W.shape
    return _lmax(W @ W.T if k <= n else W.T @ W)


def _draw(p, gen):
    """One index drawn with probability proportional to ``p >= 0`` (inverse CDF; ``None`` if ``p`` sums to 0)."""
    import torch

    cdf = torch.cumsum(p.double().cpu(), 0)
    total = float(cdf[-1])
    if not total > 0:
        return None
    u = torch.rand(1, generator=gen, dtype=torch.float64) * total
    return min(int(torch.searchsorted(cdf, u, right=True)), p.shape[0] - 1)


def _kmeanspp_directions(D, weights, k, gen):
    """k-means++ seeding on unit directions ``D`` (m, n) with ``weights``: indices of ``k`` seeds."""
    import torch

    m = D.shape[0]
    first = _draw(weights, gen) if m else None
    if first is None:
        return torch.zeros(0, dtype=torch.long, device=D.device)
    chosen = [first]
    dist = torch.clamp(2.0 - 2.0 * (D @ D[first]), min=0.0)
    for _ in range(1, min(k, m)):
        j = _draw(weights * dist, gen)
        if j is None:
            break
        chosen.append(j)
        dist = torch.minimum(dist, torch.clamp(2.0 - 2.0 * (D @ D[j]), min=0.0))
    return torch.as_tensor(chosen, dtype=torch.long, device=D.device)


def _directions(Xd, b, lam):
    D = Xd - b
    r = D.norm(dim=1)
    far = r > lam
    return D, r, far


def _init_dictionary(Xd, b, lam, width, init, gen, n_lloyd=30, learn_bias=True):
    """Initial ``(W, b)`` (torch, device) for ``init`` in :data:`INITS`."""
    import torch

    N, n = Xd.shape
    if init == "random":
        W = torch.randn(width, n, generator=gen, dtype=torch.float64).to(Xd)
        return _rownorm(W), b
    D, r, far = _directions(Xd, b, lam)
    idx = torch.nonzero(far).ravel()
    if idx.numel() == 0:  # every point within lam of the bias: any atoms are optimal (all codes 0)
        idx = torch.arange(N, device=Xd.device)
    U = D[idx] / torch.clamp(r[idx], min=1e-30)[:, None]
    seeds = _kmeanspp_directions(U, torch.clamp(r[idx] - lam, min=1e-12), width, gen)
    W = U[seeds]
    if W.shape[0] < width:  # fewer distinct far points than atoms: pad with random directions
        extra = torch.randn(width - W.shape[0], n, generator=gen, dtype=torch.float64).to(Xd)
        W = torch.cat([W, _rownorm(extra)])
    W = _rownorm(W)
    if init == "data":
        return W, b
    # ray clustering: Lloyd iterations with 1-sparse codes on the best atom
    prev = math.inf
    for _ in range(n_lloyd):
        D = Xd - b
        S = D @ W.T
        best, a = S.max(dim=1)
        z = torch.clamp(best - lam, min=0.0)
        cost = float(((D * D).sum(1) - z * z).double().sum())
        M = torch.zeros_like(W).index_add_(0, a, z[:, None] * D)
        used = M.norm(dim=1) > 0
        W = torch.where(used[:, None], _rownorm(M), W)
        if (~used).any():  # empty clusters: move to the points worst served
            res = (D * D).sum(1) - z * z
            worst = torch.argsort(res, descending=True)[: int((~used).sum())]
            W[~used] = _rownorm(D[worst])
        if learn_bias:
            b = (Xd - z[:, None] * W[a]).mean(0)
        if cost >= prev * (1 - 1e-12):
            break
        prev = cost
    return W, b


# --------------------------------------------------------------------------------------
# free codes
# --------------------------------------------------------------------------------------


def _point_values(R, Z, lam):
    return (R * R).sum(1) + 2.0 * lam * Z.sum(1)


def _dict_steps(W, A, B, n_sweeps):
    """Block-coordinate sweeps over the atoms on the unit sphere (monotone), in float64.

    Atom ``d`` minimises ``tr(W^T A W) - 2 tr(W^T B)`` with the others fixed: on the
    sphere the minimiser is ``w_d = c / ||c||``, ``c = B_d - sum_{j != d} A_dj w_j``
    (the projection of the block gradient step of length ``1 / A_dd``); unused atoms
    (``A_dd = 0``) and ``c = 0`` keep their atom. A sweep costs ``O(k^2 n)``; the small
    ``k x k`` and ``k x n`` matrices are swept on the host in float64.
    """
    import torch

    Wn = W.detach().cpu().double().numpy().copy()
    An = A.detach().cpu().double().numpy()
    Bn = B.detach().cpu().double().numpy()
    diag = np.diagonal(An)
    live = [d for d in range(Wn.shape[0]) if diag[d] > 0]
    for _ in range(n_sweeps):
        for d in live:
            c = Bn[d] - An[d] @ Wn + diag[d] * Wn[d]
            nc = math.sqrt(float(c @ c))
            if nc > 0:
                Wn[d] = c / nc
    return torch.as_tensor(Wn, dtype=W.dtype, device=W.device)


def _resample_dead(W, Z, R, P):
    """Point unused atoms at the residuals of the worst-served points (objective unchanged)."""
    import torch

    dead = torch.nonzero(Z.sum(0) <= 0).ravel()
    if dead.numel() == 0:
        return W, 0
    worst = torch.argsort(P, descending=True)[: dead.numel()]
    nr = R[worst].norm(dim=1)
    ok = nr > 0
    if not bool(ok.any()):
        return W, 0
    W = W.clone()
    W[dead[ok]] = R[worst][ok] / nr[ok][:, None]
    return W, int(ok.sum())


def _working_sets(S, Z, lam, cap, sup_max):
    """Per point, the atoms its code update may touch: its support plus the atoms violating optimality.

    ``S = (X - b - Z W) W^T`` holds the residual correlations; atom ``d`` violates the
    optimality of point ``i``'s code when ``z_id = 0`` and ``S_id > lam``. A point with more
    than ``cap`` candidates keeps its whole support and its largest violations (``cap`` is
    raised to twice ``sup_max``, the largest support, so a full support leaves room).
    Returns ``(rows, ws, counts)``: the points sorted by decreasing number of candidates,
    their candidates ``ws (N, m)`` (slots past a point's count point at atom 0 and are never
    used) and the counts, so that slot ``j`` is used by a prefix of the sorted points.
    """
    import torch

    N, k = S.shape
    sup = Z > 0
    mask = (S > lam).logical_or_(sup)
    cnt = mask.sum(1, dtype=torch.int32)
    cap = max(int(cap), 2 * int(sup_max))  # room for violations next to the largest support
    if N and int(cnt.max()) > cap:
        over = torch.nonzero(cnt > cap).ravel()
        score = torch.where(sup[over], torch.full_like(S[over], math.inf), S[over])
        top = torch.topk(score, cap, dim=1).indices
        mask[over] = torch.zeros((over.numel(), k), dtype=torch.bool, device=S.device).scatter_(1, top, True)
        cnt[over] = cap
    m = max(int(cnt.max()) if N else 0, 1)
    r, c = torch.nonzero(mask, as_tuple=True)  # row-major: each point's candidates in order
    cnt = cnt.long()
    pos = torch.arange(r.numel(), device=S.device) - (torch.cumsum(cnt, 0) - cnt)[r]
    ws = torch.zeros((N, m), dtype=torch.long, device=S.device)
    ws[r, pos] = c
    rows = torch.argsort(cnt, descending=True, stable=True)
    return rows, ws[rows], cnt[rows]


def _cd_codes(S, Z, G, rows, ws, cnt, lam, sweeps, tol, budget=1 << 24):
    r"""Exact coordinate descent on every point's lasso restricted to its working set, from the codes ``Z``.

    For point ``i`` with working set ``s = ws_i`` the restricted problem is
    ``min_{y >= 0} y^T G_ss y - 2 q^T y + 2 lam 1^T y`` (``G = W W^T`` with unit diagonal,
    ``q = U (x_i - b)``). With ``h = q - lam - G_ss y`` the step ``y_j <- max(y_j + h_j, 0)``
    is the exact minimiser along ``y_j`` (``G_jj = 1``; float32 rounding keeps the step far
    below the ``2 / G_jj`` that would break descent), so every step is monotone. ``h`` starts
    from the residual correlations ``S[i, s] - lam`` and follows by rank-one corrections.
    Points come sorted by working-set size (:func:`_working_sets`), so slot ``j`` updates a
    prefix of them and a sweep costs ``O(m nnz)`` for ``nnz`` candidates in all. Sweeps stop
    after ``sweeps`` or once the violations of the restricted optimality conditions
    (``|h_j|`` on the support, ``(h_j)_+`` off it) sum to at most ``tol`` per point.
    Points are processed in blocks of at most ``budget / m^2`` (``m`` the block's largest
    working set), which bounds the memory of the gathered Gram entries.

    Returns the new codes (a new array; ``Z`` is left as it is) and the largest support size.
    """
    import torch

    N = Z.shape[0]
    Zn = torch.zeros_like(Z)
    sup_max, s = 0, 0
    while s < N:
        m = max(int(cnt[s]), 1)  # points are sorted by decreasing working-set size
        e = min(N, s + max(1, budget // (m * m)))
        sup_max = max(sup_max, _cd_block(S, Z, Zn, G, rows[s:e], ws[s:e, :m], cnt[s:e], lam, sweeps, tol))
        s = e
    return Zn, sup_max


def _cd_block(S, Z, Zn, G, rows, ws, cnt, lam, sweeps, tol):
    """:func:`_cd_codes` on one block of sorted points: their codes go into ``Zn``; returns their largest support."""
    import torch

    n_pts, k = rows.shape[0], Z.shape[1]
    m = ws.shape[1]
    wsT = ws.T.contiguous()  # slot-major (m, n_pts): every update below touches contiguous memory
    flat = rows.unsqueeze(0) * k + wsT
    used = torch.arange(m, device=Z.device).unsqueeze(1) < cnt.unsqueeze(0)
    u = Z.reshape(-1)[flat].mul_(used).neg_()  # u = -y: the step is then one maximum
    h = S.reshape(-1)[flat].sub_(lam)
    nj = [v for v in (cnt.unsqueeze(0) > torch.arange(m, device=Z.device).unsqueeze(1)).sum(1).tolist() if v > 0]
    # per slot j: views on the points that use it, and G between their atom j and all their slots
    us = [u[j, :n] for j, n in enumerate(nj)]
    hs = [h[j, :n] for j, n in enumerate(nj)]
    hp = [h[:, :n] for n in nj]
    cols = [G[wsT[j, :n].unsqueeze(0), wsT[:, :n]] for j, n in enumerate(nj)]
    for sweep in range(int(sweeps)):
        for j in range(len(nj)):
            delta = torch.maximum(hs[j], us[j])  # y_j + delta = max(y_j + h_j, 0)
            us[j].sub_(delta)
            hp[j].addcmul_(cols[j], delta, value=-1.0)
        if sweep % 2 == 1:
            viol = torch.where(u < 0, h.abs(), h.clamp(min=0.0)).mul_(used)
            if float(viol.sum()) <= tol * n_pts:
                break
    Zn.reshape(-1)[flat[used]] = u[used].neg_()
    return int((u < 0).sum(0).max()) if n_pts else 0


def _fit_free(Xd, W, b, lam, opts, report):
    """Full-batch alternating minimisation with extrapolation (module docstring); every step is monotone."""
    import torch

    N = Xd.shape[0]
    sweeps, Tw, cap = opts["cd_sweeps"], opts["dict_steps"], opts["ws_size"]
    ctol = CD_TOL * lam
    Z = torch.zeros((N, W.shape[0]), dtype=Xd.dtype, device=Xd.device)
    Xt = Xd - b
    S = Xt @ W.T
    Z, sup_max = _cd_codes(S, Z, W @ W.T, *_working_sets(S, Z, lam, cap, 0), lam, sweeps, ctol)
    R = torch.addmm(Xt, Z, W, alpha=-1.0)
    P = _point_values(R, Z, lam)
    f = float(P.double().mean())
    step = 0
    report(step, f)
    reason = "max_iter"
    beta, prev = EXTRAPOLATE[0], None
    while step < opts["max_iter"]:
        step += 1
        if step > 1:
            S = R @ W.T
            Z, sup_max = _cd_codes(S, Z, W @ W.T, *_working_sets(S, Z, lam, cap, sup_max), lam, sweeps, ctol)
        W = _dict_steps(W, Z.T @ Z, Z.T @ Xt, Tw)
        if opts["learn_bias"]:
            b = Xd.mean(0) - (Z.sum(0) / N) @ W
            Xt = Xd - b
        R = torch.addmm(Xt, Z, W, alpha=-1.0)
        P = _point_values(R, Z, lam)
        f = float(P.double().mean())
        if beta > 0:
            cur = (W, Z, b)  # no step below writes into W or Z in place
            if prev is not None:  # extrapolate along the last step; kept only if it lowers the objective
                We = _rownorm(W + beta * (W - prev[0]), old=W)
                Ze = Z.mul(1.0 + beta).sub_(prev[1], alpha=beta).clamp_(min=0.0)
                be = Xd.mean(0) - (Ze.sum(0) / N) @ We if opts["learn_bias"] else b
                Re = torch.addmm(Xd - be, Ze, We, alpha=-1.0)
                Pe = _point_values(Re, Ze, lam)
                fe = float(Pe.double().mean())
                if fe < f:
                    W, Z, b, R, P, f = We, Ze, be, Re, Pe, fe
                    Xt = Xd - b
                    beta = min(beta * EXTRAPOLATE[1], EXTRAPOLATE[2])
                else:
                    beta = max(beta * 0.5, EXTRAPOLATE[3])
            prev = cur
        if opts["resample_every"] and step % opts["resample_every"] == 0:
            W, moved = _resample_dead(W, Z, R, P)
        if report(step, f):
            reason = report.reason
            break
    return W, b, Z, step, reason


def _fit_free_minibatch(X, W, b, lam, opts, report, dev, cdt):
    import torch

    N, n = X.shape
    k = W.shape[0]
    bs = min(int(opts["batch_size"]), N)
    A = torch.zeros((k, k), dtype=cdt, device=dev)
    Bm = torch.zeros((k, n), dtype=cdt, device=dev)
    rng = np.random.default_rng(opts["seed"])
    step = 0
    reason = "max_iter"
    batches = _minibatches(N, bs, rng)
    while step < opts["max_iter"]:
        step += 1
        idx = next(batches)
        xb = torch.as_tensor(np.asarray(X[idx], dtype=np.float64), dtype=cdt, device=dev)
        xt = xb - b
        invL = 1.0 / (_code_lipschitz(W) * (1 + 1e-5))
        z = code_steps(xt, W, lam, invL, torch.zeros((bs, k), dtype=cdt, device=dev), opts["batch_code_steps"])
        beta = (1.0 - 1.0 / (step + 1.0)) ** 1.0 if step < 20 else 1.0 - 1.0 / 20.0 * (20.0 / step) ** 0.5
        A = beta * A + (z.T @ z) / bs
        Bm = beta * Bm + (z.T @ xt) / bs
        W = _dict_steps(W, A, Bm, opts["dict_steps"])
        r = xt - z @ W
        if opts["learn_bias"]:
            b = b + r.mean(0) * min(1.0, 2.0 / (step + 1.0) ** 0.5)
        if report(step, float(_point_values(r, z, lam).double().mean())):
            reason = report.reason
            break
    return W, b, None, step, reason


def _minibatches(N: int, bs: int, rng):
    """Endless sorted index batches of size ``bs``: each epoch is a fresh random order of the N points."""
    perm, pos = rng.permutation(N), 0
    while True:
        if pos + bs > N:
            perm, pos = rng.permutation(N), 0
        yield np.sort(perm[pos : pos + bs])
        pos += bs
