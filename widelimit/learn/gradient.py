r"""Gradient dictionary learning on the original nonconvex objective, in torch (CPU or CUDA).

Minimises theory.md §1's objective directly over a finite width ``k``:

.. math::

    L(W, Z, b) = \frac1N\sum_i \|z_i W + b - x_i\|^2 + 2\lambda\|z_i\|_1,
    \qquad Z \ge 0,\ \|w_d\| = 1 .

**Free codes** (``encoder="none"``, true dictionary learning), one outer step =

1. codes: exact coordinate descent on each point's nonnegative lasso restricted to a
   small *working set* of atoms: its current support plus the atoms that violate the
   optimality conditions (``<w_d, r_i> > lam`` for the residual ``r_i`` with
   ``z_id = 0``), at most ``ws_size`` of them (more when a support is larger). The
   coordinate step ``z_d <- (z_d + <w_d, r> - lam)_+`` is the exact minimiser along
   ``z_d``, so the step never increases ``L``; sweeps stop once the restricted
   optimality conditions hold to ``1e-3 lam`` per point on average or after
   ``code_steps`` sweeps. With ``L0 << k`` a sweep costs ``O(N L0 m)`` instead of the
   ``O(N k n)`` of a full-dictionary gradient step, and since every outer step
   re-admits the violating atoms, a fixed point is an exact alternating minimiser;
2. atoms: block-coordinate sweeps on the sphere with ``A = Z^T Z``, ``B = Z^T (X - b)``:
   atom ``d`` becomes ``c / ||c||`` with ``c = B_d - sum_{j != d} A_dj w_j``, the exact
   minimiser over the unit sphere with the other atoms fixed (the projected block
   gradient step of length ``1 / A_dd``), so the step never increases the objective;
3. bias: the exact minimiser ``b = mean_i (x_i - z_i W)``;
4. extrapolation: the iterate moves on along its last step,
   ``W <- normalise(W + beta (W - W_prev))``, ``Z <- (Z + beta (Z - Z_prev))_+`` (bias re-fit),
   and keeps the move only if the objective goes down; ``beta`` grows by 1.5 (at most 4)
   after a success and halves (at least 0.05) after a failure. This is the extrapolation
   that accelerates alternating schemes for nonnegative factorisations (Ang and Gillis,
   Neural Computation 2019); it costs one evaluation of the objective per step and cuts
   the slow tail of alternating minimisation.

Every step is monotone, so the recorded objective decreases. In minibatch mode
(``batch_size`` given) step 1 codes a random batch, ``A`` and ``B`` are running
sums with forgetting (online dictionary learning, Mairal et al. 2010) and the bias
follows the batch residual mean, and step 1 is ``code_steps`` accelerated proximal
steps ``z <- (v + ((x - b - vW)W^T - lam)/L)_+`` from zero (``L = lambda_max(W W^T)``,
per-point Nesterov momentum with adaptive restart; :func:`widelimit.coding.pdas.code_steps`).
Atoms no point uses are moved to the direction of the worst-reconstructed points
(this cannot increase the objective).

**Amortised codes** (``encoder="relu" | "jumprelu" | "topk"``) train an SAE in the
SAELens layout: ``f = sigma((x - b_dec) W_enc + b_enc)`` with ``W_enc (n, k)``,
``b_enc (k,)``, a JumpReLU ``threshold (k,)`` (straight-through estimator with a
rectangle kernel, Rajamanoharan et al. 2024) or TopK's ``k``; decoder
``W_dec = W`` (atoms projected back on the unit sphere after every Adam step) and
``b_dec = b``, on the same objective. The result reports the objective of the
encoder's own codes and of the optimal codes for its decoder
(:func:`widelimit.optimal_codes`), whose difference is the encoder gap.

Compute is float32 on the device; the returned value is a float64 evaluation of
the returned ``(dictionary, codes, bias)``, the codes being the certified optimal
codes of the final dictionary and bias.

**Initialisation**: ``"rays"`` (ray clustering: 1-sparse codes
``z = (<w, x - b> - lam)_+`` on the best atom, each atom re-fit to its cluster as
``w ∝ sum_i z_i (x_i - b)``, bias re-fit, from k-means++ seeds on the directions
around the Huber median), ``"data"`` (k-means++ seeded data directions around the
Huber median), ``"random"`` (Gaussian atoms), or an array ``(k, n)``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.sparse as sp

from .._runtime import resolve_device
from .._validation import check_data, check_dictionary, check_lam, check_vector
from ..coding.pdas import code_steps, optimal_codes

__all__ = ["FitResult", "fit_dictionary", "ENCODERS", "INITS"]

ENCODERS = ("none", "relu", "jumprelu", "topk")
#: Full-batch code updates stop sweeping once the restricted optimality conditions are violated
#: by at most ``_CD_TOL * lam`` per point on average (summed over each point's working set).
_CD_TOL = 1e-3
#: Extrapolation of full-batch steps: initial factor, growth on success, largest and smallest factor
#: (halved on failure).
_EXTRAPOLATE = (0.5, 1.5, 4.0, 0.05)
INITS = ("rays", "data", "random")


@dataclass(frozen=True)
class FitResult:
    """A dictionary learned by :func:`fit_dictionary`.

    Attributes
    ----------
    dictionary : ndarray (k, n)
        Unit-norm atoms (SAELens ``W_dec``).
    codes : scipy.sparse.csr_array (N, k)
        Certified optimal nonnegative codes for ``dictionary`` and ``bias``.
    bias : ndarray (n,)
        ``b`` (SAELens ``b_dec``).
    value : float
        float64 objective of ``(dictionary, codes, bias)``.
    reconstruction, penalty : float
        Its two parts.
    coding_gap : float
        Certified duality gap of ``codes`` for this dictionary and bias (mean per point).
    history : list of dict
        ``{"step", "time_s", "value"}`` per step: the float32 objective (full batch), or the
        mean batch loss over the last ``window`` steps (minibatch and encoder training).
    n_steps : int
    stop_reason : str
        ``"rtol"`` (relative improvement below ``rtol``), ``"max_steps"`` or ``"max_time"``.
    encoder : str
    encoder_params : dict
        SAELens-layout parameters for amortised encoders: ``W_enc (n, k)``, ``b_enc (k,)``,
        ``threshold (k,)`` (jumprelu), ``k`` (topk). Empty for ``"none"``.
    encoder_value : float or None
        float64 objective of the encoder's own codes (amortised encoders).
    lam : float
    width : int
    init : str
    seed : int
    device : str
    time_s : float
        Wall-clock time of the whole fit.
    """

    dictionary: np.ndarray
    codes: sp.csr_array = field(repr=False)
    bias: np.ndarray
    value: float
    reconstruction: float
    penalty: float
    coding_gap: float
    history: list = field(repr=False)
    n_steps: int
    stop_reason: str
    encoder: str
    encoder_params: dict = field(repr=False)
    encoder_value: float | None
    lam: float
    width: int
    init: str
    seed: int
    device: str
    time_s: float

    @property
    def encoder_gap(self) -> float | None:
        """``encoder_value - value``: loss due to the encoder (amortised encoders only)."""
        return None if self.encoder_value is None else self.encoder_value - self.value

    @property
    def live_atoms(self) -> int:
        """Atoms with at least one nonzero code."""
        return int(np.count_nonzero(np.asarray(self.codes.sum(axis=0)).ravel() > 0))

    def as_dict(self) -> dict:
        """Summary as plain Python (JSON-serialisable); arrays are left out."""
        return {
            "value": self.value, "reconstruction": self.reconstruction, "penalty": self.penalty,
            "coding_gap": self.coding_gap, "n_steps": self.n_steps, "stop_reason": self.stop_reason,
            "encoder": self.encoder, "encoder_value": self.encoder_value, "encoder_gap": self.encoder_gap,
            "lam": self.lam, "width": self.width, "live_atoms": self.live_atoms, "init": self.init,
            "seed": self.seed, "device": self.device, "time_s": self.time_s,
            "encoder_k": self.encoder_params.get("k"),
        }


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
    ctol = opts["cd_tol"] * lam
    Z = torch.zeros((N, W.shape[0]), dtype=Xd.dtype, device=Xd.device)
    Xt = Xd - b
    S = Xt @ W.T
    Z, sup_max = _cd_codes(S, Z, W @ W.T, *_working_sets(S, Z, lam, cap, 0), lam, sweeps, ctol)
    R = torch.addmm(Xt, Z, W, alpha=-1.0)
    P = _point_values(R, Z, lam)
    f = float(P.double().mean())
    step = 0
    report(step, f)
    reason = "max_steps"
    beta, prev = opts["extrapolate"], None
    while step < opts["max_steps"]:
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
                    beta = min(beta * _EXTRAPOLATE[1], _EXTRAPOLATE[2])
                else:
                    beta = max(beta * 0.5, _EXTRAPOLATE[3])
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
    reason = "max_steps"
    batches = _minibatches(N, bs, rng)
    while step < opts["max_steps"]:
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


# --------------------------------------------------------------------------------------
# amortised encoders (SAELens layout)
# --------------------------------------------------------------------------------------


def _jumprelu_fn():
    import torch

    class JumpReLU(torch.autograd.Function):
        """``pre * 1[pre > theta]`` with a rectangle-kernel straight-through gradient for ``theta``."""

        @staticmethod
        def forward(ctx, pre, theta, bandwidth):
            ctx.save_for_backward(pre, theta)
            ctx.bandwidth = bandwidth
            return pre * (pre > theta)

        @staticmethod
        def backward(ctx, grad):
            pre, theta = ctx.saved_tensors
            bw = ctx.bandwidth
            g_pre = grad * (pre > theta)
            kern = ((pre - theta).abs() < 0.5 * bw).to(grad.dtype) / bw
            g_theta = -(theta * kern * grad).sum(0)
            return g_pre, g_theta, None

    return JumpReLU.apply


def _encode(x, params, encoder, topk, jump):
    import torch

    pre = (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
    if encoder == "relu":
        return torch.relu(pre)
    if encoder == "jumprelu":
        return jump(pre, torch.exp(params["log_threshold"]), params["bandwidth"])
    f = torch.relu(pre)
    if topk < f.shape[1]:
        vals, idx = torch.topk(f, topk, dim=1)
        f = torch.zeros_like(f).scatter_(1, idx, vals)
    return f


def _fit_amortised(X, Xd, W, b, lam, encoder, opts, report, dev, cdt):
    import torch

    N, n = X.shape
    k = W.shape[0]
    topk = int(opts["topk"]) if opts["topk"] is not None else max(1, min(k, 32))
    params = {
        "W_enc": W.T.clone().requires_grad_(True),
        "b_enc": torch.full((k,), -lam, dtype=cdt, device=dev).requires_grad_(True),
        "W_dec": W.clone().requires_grad_(True),
        "b_dec": b.clone().requires_grad_(opts["learn_bias"]),
    }
    train = [p for p in params.values() if p.requires_grad]
    if encoder == "jumprelu":
        params["log_threshold"] = torch.full((k,), math.log(0.1 * lam), dtype=cdt, device=dev).requires_grad_(True)
        params["bandwidth"] = opts["bandwidth"] if opts["bandwidth"] is not None else 0.1 * lam
        train.append(params["log_threshold"])
    jump = _jumprelu_fn()
    optim = torch.optim.Adam(train, lr=opts["lr"])
    bs = min(int(opts["batch_size"] or 4096), N)
    rng = np.random.default_rng(opts["seed"])
    step = 0
    reason = "max_steps"
    batches = _minibatches(N, bs, rng)
    while step < opts["max_steps"]:
        step += 1
        idx = next(batches)
        xb = Xd[torch.as_tensor(idx, device=dev)] if Xd is not None else torch.as_tensor(
            np.asarray(X[idx], dtype=np.float64), dtype=cdt, device=dev)
        f = _encode(xb, params, encoder, topk, jump)
        rec = f @ params["W_dec"] + params["b_dec"] - xb
        loss = ((rec * rec).sum(1) + 2.0 * lam * (f * params["W_dec"].norm(dim=1)).sum(1)).mean()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        with torch.no_grad():
            params["W_dec"].copy_(_rownorm(params["W_dec"], old=params["W_dec"]))
        if report(step, float(loss.detach().double())):
            reason = report.reason
            break
    with torch.no_grad():
        Wd = params["W_dec"].detach()
        out = {"W_enc": params["W_enc"].detach().cpu().double().numpy(),
               "b_enc": params["b_enc"].detach().cpu().double().numpy()}
        if encoder == "jumprelu":
            out["threshold"] = torch.exp(params["log_threshold"]).detach().cpu().double().numpy()
        if encoder == "topk":
            out["k"] = topk
    return Wd, params["b_dec"].detach(), step, reason, out


def encoder_codes(X, encoder: str, encoder_params: dict, bias, *, batch_size: int = 8192) -> sp.csr_array:
    """Codes of an SAELens-layout encoder on ``X`` (float64, sparse): ``f = sigma((x - b_dec) W_enc + b_enc)``.

    ``encoder`` is ``"relu"``, ``"jumprelu"`` (needs ``threshold``) or ``"topk"`` (needs ``k``).
    """
    X = check_data(X)
    N, n = X.shape
    b = check_vector(bias, n, "bias")
    We = np.asarray(encoder_params["W_enc"], dtype=np.float64)
    be = np.asarray(encoder_params["b_enc"], dtype=np.float64)
    blocks = []
    for s in range(0, N, batch_size):
        pre = (np.asarray(X[s : s + batch_size], dtype=np.float64) - b) @ We + be
        if encoder == "relu":
            f = np.maximum(pre, 0.0)
        elif encoder == "jumprelu":
            f = np.where(pre > encoder_params["threshold"], pre, 0.0)
        elif encoder == "topk":
            f = np.maximum(pre, 0.0)
            kk = int(encoder_params["k"])
            if kk < f.shape[1]:
                cut = np.argpartition(-f, kk - 1, axis=1)[:, kk:]
                np.put_along_axis(f, cut, 0.0, axis=1)
        else:
            raise ValueError(f"encoder must be one of relu, jumprelu, topk, got {encoder!r}")
        blocks.append(sp.csr_array(f))
    return sp.csr_array(sp.vstack(blocks, format="csr"))


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


class _Reporter:
    """History, stopping rule (relative improvement / step or time budget) and the user callback.

    Deterministic (full-batch) objectives: stop when ``v[-1-window] - v[-1] <= rtol * window * |v[-1]|``.
    Stochastic ones (``stochastic=True``: minibatch losses): the same test on the means of the
    last two blocks of ``window`` steps, so batch noise does not stop or prolong the run.
    """

    def __init__(self, rtol, window, max_time, callback, t0, stochastic=False):
        self.rtol, self.window, self.max_time, self.callback, self.t0 = rtol, window, max_time, callback, t0
        self.stochastic = stochastic
        self.history: list[dict] = []
        self.raw: list[float] = []
        self.reason = "max_steps"

    def __call__(self, step, value) -> bool:
        t = time.perf_counter() - self.t0
        if not math.isfinite(value):
            raise FloatingPointError(f"the objective became {value} at step {step}; lower the learning rate")
        self.raw.append(float(value))
        w = self.window
        shown = float(np.mean(self.raw[-w:])) if self.stochastic else float(value)
        self.history.append({"step": int(step), "time_s": t, "value": shown})
        if self.callback is not None:
            self.callback(dict(self.history[-1]))
        if self.max_time is not None and t >= self.max_time:
            self.reason = "max_time"
            return True
        if self.rtol <= 0:
            return False
        if self.stochastic:
            if len(self.raw) >= 2 * w and len(self.raw) % w == 0:
                old, new = np.mean(self.raw[-2 * w : -w]), np.mean(self.raw[-w:])
                if old - new <= self.rtol * w * abs(new):
                    self.reason = "rtol"
                    return True
        elif len(self.raw) > w:
            old, new = self.raw[-1 - w], self.raw[-1]
            if old - new <= self.rtol * w * abs(new):
                self.reason = "rtol"
                return True
        return False


def fit_dictionary(X, *, lam, width, encoder: str = "none", init="rays", device="auto", seed: int = 0,
                   max_steps: int | None = None, rtol: float = 1e-8, window: int = 10,
                   max_time: float | None = None, batch_size: int | None = None, code_steps: int | None = None,
                   dict_steps: int = 2, ws_size: int = 16, resample_every: int = 25, bias=None,
                   learn_bias: bool = True, lr: float = 1e-3,
                   topk: int | None = None, bandwidth: float | None = None, coding_tol: float = 1e-7,
                   callback: Callable[[dict], None] | None = None) -> FitResult:
    r"""Learn a width-``k`` dictionary, codes and bias by minimising the SAE objective (theory.md §1).

    .. math:: \min_{W, Z\ge 0, b}\ \frac1N\sum_i \|z_i W + b - x_i\|^2 + 2\lambda\|z_i\|_1,\quad \|w_d\| = 1.

    A local method on a nonconvex problem: compare with the global optimum via
    :func:`widelimit.crossvalidate` or :func:`widelimit.verify`.

    Parameters
    ----------
    X : array (N, n)
        Data (float32 kept; torch tensors accepted).
    lam : float
        Sparsity ``lam > 0`` (SAELens ``l1_coefficient = 2 lam``).
    width : int
        Number of atoms ``k >= 1``.
    encoder : {"none", "relu", "jumprelu", "topk"}
        ``"none"``: free codes (dictionary learning). Otherwise an amortised SAE encoder.
    init : {"rays", "data", "random"} or array (k, n)
        Initial atoms (see the module docstring); the bias starts at the Huber
        median unless ``bias`` is given.
    device : {"auto", "cpu", "cuda", "cuda:N"}
    seed : int
        Seeds the initialisation and minibatch order; CPU runs are deterministic given it.
    max_steps : int, optional
        Step budget (outer steps for free codes, Adam steps for encoders). Default
        2000 full-batch, 5000 minibatch / encoders.
    rtol : float
        Stop when the objective improved by less than ``rtol`` per step (relative) over
        the last ``window`` recorded steps.
    window : int
        Steps over which the improvement is measured (at least 200 for minibatch and
        encoder training, whose recorded objective is a moving average of batch losses).
    max_time : float, optional
        Stop after this many seconds.
    batch_size : int, optional
        Minibatch size; ``None`` = full batch (free codes) or 4096 (encoders).
    code_steps : int, optional
        Code iterations per outer step (free codes): at most this many coordinate-descent
        sweeps over the working sets (full batch, default 30; fewer are run once the codes
        are optimal on the working sets), or this many accelerated proximal steps on a
        minibatch (default 60).
    dict_steps : int
        Block-coordinate sweeps over the atoms per outer step (free codes).
    ws_size : int
        Working-set size per point for the full-batch code step: the support plus the
        largest optimality violations, at most ``max(ws_size, 2 * largest support)`` atoms.
    resample_every : int
        Every so many steps, unused atoms move to the worst-served residuals (0 = never).
    bias : array (n,), optional
        Initial bias (default: the Huber median of ``X``).
    learn_bias : bool
        Optimise the bias (default). ``False`` keeps it fixed at ``bias`` (e.g. ``0``,
        scikit-learn's bias-free objective); the ray clustering then leaves it alone too.
    lr : float
        Adam learning rate (amortised encoders).
    topk : int, optional
        Active features per point for ``encoder="topk"`` (SAELens ``k``; default ``min(width, 32)``).
    bandwidth : float, optional
        JumpReLU straight-through bandwidth (default ``0.1 lam``).
    coding_tol : float
        Tolerance of the final optimal (re-)coding (:func:`widelimit.optimal_codes`).
    callback : callable(dict), optional
        Called with ``{"step", "time_s", "value"}`` after each recorded step (the CLI
        draws its progress bar with it). A solver never prints.

    Returns
    -------
    FitResult
    """
    import torch

    t0 = time.perf_counter()
    X = check_data(X)
    N, n = X.shape
    lam = check_lam(lam)
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"width must be an integer >= 1, got {width!r}")
    width = int(width)
    if encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {', '.join(ENCODERS)}, got {encoder!r}")
    init_arr = None
    if isinstance(init, str):
        if init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)} or an array (width, n), got {init!r}")
    else:
        init_arr = check_dictionary(init, n, "init")
        if init_arr.shape[0] != width:
            raise ValueError(f"init has {init_arr.shape[0]} atoms but width = {width}")
    for name, v, lo in (("code_steps", 1 if code_steps is None else code_steps, 1), ("dict_steps", dict_steps, 1),
                        ("ws_size", ws_size, 1), ("window", window, 1), ("resample_every", resample_every, 0)):
        if int(v) < lo:
            raise ValueError(f"{name} must be >= {lo}, got {v!r}")
    if batch_size is not None and int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if topk is not None and not (1 <= int(topk) <= width):
        raise ValueError(f"topk must be between 1 and width = {width}, got {topk!r}")
    if encoder != "topk" and topk is not None:
        raise ValueError("topk is only used with encoder='topk'")
    dev = resolve_device(device)
    cdt = torch.float32
    amortised = encoder != "none"
    minibatch = batch_size is not None and not amortised
    if max_steps is None:
        max_steps = 5000 if (amortised or minibatch) else 2000
    if int(max_steps) < 0:
        raise ValueError(f"max_steps must be >= 0, got {max_steps!r}")
    gen = torch.Generator().manual_seed(int(seed))

    from ..exact.median import huber_median

    if bias is None:
        b0 = huber_median(X, lam=lam).point
    else:
        b0 = check_vector(bias, n, "bias")
    # the data on the device (float32), unless a minibatch / encoder run on data too large for
    # that reads its batches from X (then the initialisation sees a subsample)
    fits = N * n * 4 <= (1 << 34 if dev.type == "cuda" else 1 << 32)
    stream = (minibatch or amortised) and not fits
    with torch.no_grad():
        if stream:
            sub = np.sort(np.random.default_rng(seed).choice(N, size=min(N, 200_000), replace=False))
            Xd, src = None, torch.as_tensor(np.asarray(X[sub], dtype=np.float32), device=dev)
        else:
            Xd = torch.as_tensor(np.asarray(X, dtype=np.float32), device=dev)
            src = Xd
        b = torch.as_tensor(b0, dtype=cdt, device=dev)
        if init_arr is not None:
            W = _rownorm(torch.as_tensor(init_arr, dtype=cdt, device=dev))
        else:
            W, b = _init_dictionary(src, b, lam, width, init, gen, learn_bias=bool(learn_bias))
        del src
    # stochastic objectives (minibatches, Adam) are judged over a longer window
    stochastic = amortised or minibatch
    report = _Reporter(float(rtol), max(int(window), 200) if stochastic else int(window), max_time, callback, t0,
                       stochastic=stochastic)
    opts = {"max_steps": int(max_steps), "cd_sweeps": 30 if code_steps is None else int(code_steps),
            "cd_tol": _CD_TOL, "extrapolate": _EXTRAPOLATE[0], "dict_steps": int(dict_steps),
            "ws_size": int(ws_size), "resample_every": int(resample_every), "batch_size": batch_size,
            "seed": int(seed), "batch_code_steps": 60 if code_steps is None else max(30, 3 * int(code_steps)),
            "lr": float(lr), "topk": topk,
            "bandwidth": bandwidth, "learn_bias": bool(learn_bias)}
    enc_params: dict = {}
    enc_value = None
    if amortised:
        Wt, bt, steps, reason, enc_params = _fit_amortised(X, Xd, W, b, lam, encoder, opts, report, dev, cdt)
        Z_warm = None
    elif minibatch:
        with torch.no_grad():
            Wt, bt, _, steps, reason = _fit_free_minibatch(X, W, b, lam, opts, report, dev, cdt)
        Z_warm = None
    else:
        with torch.no_grad():
            Wt, bt, Zt, steps, reason = _fit_free(Xd, W, b, lam, opts, report)
        rows = max(1, (1 << 26) // max(1, width))
        Z_warm = sp.csr_array(sp.vstack([sp.csr_array(Zt[s:s + rows].cpu().double().numpy())
                                         for s in range(0, N, rows)], format="csr"))
        del Zt
    Wf = Wt.detach().cpu().double().numpy()
    Wf /= np.where(np.linalg.norm(Wf, axis=1) > 0, np.linalg.norm(Wf, axis=1), 1.0)[:, None]
    bf = bt.detach().cpu().double().numpy()
    if amortised:
        from ..exact.objective import sae_objective

        enc_codes = encoder_codes(X, encoder, enc_params, bf)
        enc_value = sae_objective(X, Wf, enc_codes, bf, lam=lam).value
        Z_warm = enc_codes
    # near-duplicate atoms make some lassos degenerate (sublinear convergence): a generous budget,
    # spent only on the points that need it
    coded = optimal_codes(X, Wf, bf, lam=lam, tol=coding_tol, device=dev, Z0=Z_warm, max_iter=20000)
    return FitResult(
        dictionary=Wf, codes=coded.codes, bias=bf, value=coded.value, reconstruction=coded.reconstruction,
        penalty=coded.penalty, coding_gap=coded.gap, history=report.history, n_steps=int(steps),
        stop_reason=reason, encoder=encoder, encoder_params=enc_params, encoder_value=enc_value, lam=lam,
        width=width, init=init if isinstance(init, str) else "array", seed=int(seed), device=str(dev),
        time_s=time.perf_counter() - t0,
    )


def _minibatches(N: int, bs: int, rng):
    """Endless sorted index batches of size ``bs``: each epoch is a fresh random order of the N points."""
    perm, pos = rng.permutation(N), 0
    while True:
        if pos + bs > N:
            perm, pos = rng.permutation(N), 0
        yield np.sort(perm[pos : pos + bs])
        pos += bs
