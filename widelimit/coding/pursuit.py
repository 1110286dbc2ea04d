r"""Codes at a given sparsity for a fixed decoder and bias: a strong pursuit and its verified witness.

For unit atoms ``U`` (rows, ``k x n``), a bias ``b`` and a per-token budget ``s_i``, the best MSE of
nonnegative codes that fire at most ``s_i`` atoms is (theory.md §10)

.. math:: m_{s}(x_i) = \min_{y \ge 0,\ \|y\|_0 \le s_i} \|x_i - b - y\,U\|^2 .

It is NP-hard in general; :func:`sparse_codes` finds codes that are as good as it can within a
budget of rounds and seconds, and returns them with their MSE **evaluated in float64 from the
codes** (a verified witness: "codes at this L0 exist with this MSE"), and a proven lower bound from
:mod:`widelimit.coding.sparse_bound`. The search, per batch of tokens, all in torch float64:

1. **warm start** from given codes (an SAE's own): their support, refit by nonnegative least squares
   (:func:`widelimit.coding._nnls.nnls_refit`) -- never worse than the codes themselves;
2. **cold starts**: nonnegative orthogonal matching pursuit from the empty support (one product
   ``R U^T`` per added atom, refit on the support each time), and nonnegative gradient pursuit on the
   decoder's own rows (:mod:`._grad_pursuit`, dictionary_learning's ``grad_pursuit``) with its support
   refit by NNLS; the best start per token is kept, so the witness is never worse on any token than the
   SAE's own codes or gradient pursuit's;
3. **rounds**, each with one product ``C = R U^T`` for the residual correlations: tokens below their
   budget add the most correlated atom; tokens at their budget try swaps (the ``n_add`` most
   correlated atoms outside the support against the ``n_drop`` support atoms whose removal costs
   least, ``y_j^2 / (G_S^{-1})_{jj}``) and a ``s``-sparse projected gradient step (keep the ``s``
   largest entries of ``y + C / ||U||_2^2``), each trial refit by NNLS; a token keeps a trial only if
   its MSE drops, and stops when none does.

With ``penalty = c`` (JumpReLU's recorded L0 coefficient) the objective is ``||r||^2 + c ||y||_0`` and the
budget only bounds the start: each round swaps atoms at each token's current count, then drops an atom
whose removal raises the MSE by less than ``c`` or adds one whose addition lowers it by more than ``c``
(start from the codes of a budgeted search, ``cold_start=False``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch

from .._runtime import resolve_device
from .._validation import check_int, check_real
from ..engine.local import Progress
from ..results import ordered_bound
from ._grad_pursuit import grad_pursuit_supports
from ._atoms import Atoms, residuals, spectral_norm_sq
from ._nnls import nnls_refit
from .sparse_bound import METHODS, babel, babel_s_min, sparse_lower_bound

__all__ = ["PursuitOptions", "pursue_batch"]


@dataclass(frozen=True)
class PursuitOptions:
    """Options of the pursuit (checked).

    Attributes
    ----------
    max_iter : int
        Rounds after the starts (each: one correlation product, one batch of NNLS refits).
    n_add, n_drop : int
        Swap trials per token and round: the ``n_add`` best atoms outside the support against the
        ``n_drop`` cheapest support atoms to remove.
    cold_start : bool
        Also run nonnegative OMP from the empty support (step 2 of the module docstring).
    grad_start : bool
        Also run nonnegative gradient pursuit on the decoder's rows from the empty support, its support
        refit by NNLS (step 2 of the module docstring; :mod:`._grad_pursuit`).
    penalty : float or None
        L0 penalty ``c`` of an L0-penalised objective (JumpReLU), or ``None`` for the budget only.
    """

    max_iter: int = 8
    n_add: int = 3
    n_drop: int = 3
    cold_start: bool = True
    grad_start: bool = True
    penalty: float | None = None

    def __post_init__(self):
        check_int(self.max_iter, "max_iter", low=0)
        check_int(self.n_add, "n_add", low=1)
        check_int(self.n_drop, "n_drop", low=1)
        if self.penalty is not None:
            check_real(self.penalty, "penalty", low=0.0)


#: Tokens a pursuit round handles at once: the grain of its deadline (a round over a batch of 2,000 tokens at L0
#: 100 ran ~0.7 s past the L0 bracket's allowance), and of ``x_t U^T``, formed for the tokens a round reaches.
ROUND_ROWS = 256

#: Most entries of the Gram blocks one NNLS refit holds at once (``rows * s * s``; 1 Mi float64 = 8 MiB: also
#: the grain of the refit's deadline, ~50 tokens at the 150-atom supports of a ReLU SAE; 4 Mi overran the L0
#: bracket's allowance by a chunk of 400 tokens at L0 100).
REFIT_ENTRIES = 1 << 20


def _refit(A, xt, S, valid, Cx, q=None, deadline: float = math.inf):
    """NNLS codes on the supports ``S`` (masked by ``valid``), their residuals and per-token squared norms
    (``Cx = x_t U^T``: the correlations the refit's right-hand side gathers), in chunks of rows whose Gram
    blocks hold at most :data:`REFIT_ENTRIES` entries. No chunk starts after ``deadline``: the rows not
    reached keep the zero codes (a feasible point; the callers keep the better of it and their other start)."""
    step = max(1, REFIT_ENTRIES // max(1, S.shape[1] ** 2))
    y = torch.zeros(S.shape, dtype=xt.dtype, device=xt.device)
    done = 0
    for r0 in range(0, S.shape[0], step):
        if time.perf_counter() > deadline:
            break
        Sc, vc = S[r0 : r0 + step], valid[r0 : r0 + step]
        if q is None and Cx is None:  # the right-hand side from the gathered atoms (no x_t U^T product)
            Gc, qc = A.gram(Sc, vc, xt[r0 : r0 + step])
        else:
            Gc, qc = A.gram(Sc, vc), Cx[r0 : r0 + step].gather(1, Sc) if q is None else q[r0 : r0 + step]
        y[r0 : r0 + step] = nnls_refit(Gc, qc * vc, vc, xt[r0 : r0 + step])
        done = min(S.shape[0], r0 + step)
    R = xt.clone()  # (rows not reached: zero codes, residual xt)
    if done:
        R[:done] = residuals(A, xt[:done], S[:done], y[:done], valid[:done])
    return y, R, (R * R).sum(1)


def _compact(S, valid, y):
    """Drop zero codes from the supports and move the atoms to the first slots."""
    keep = valid & (y > 0)
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    S, keep, y = S.gather(1, order), keep.gather(1, order), y.gather(1, order)
    return S * keep, keep, y * keep


def _masked_corr(C, S, valid):
    """``C`` with the support atoms set to ``-inf`` (they cannot be added again)."""
    C = C.clone()
    rows = torch.arange(C.shape[0], device=C.device)[:, None].expand_as(S)
    C[rows[valid], S[valid]] = -math.inf
    return C


def _add(A, xt, Cx, S, valid, y, mse, budget, C):
    """One greedy step: tokens below budget add the atom most correlated with the residual (if > 0)."""
    cnt = valid.sum(1)
    best, j = _masked_corr(C, S, valid).max(1)
    go = (cnt < budget) & (best > 0)
    moved = torch.zeros_like(go)
    if not bool(go.any()):
        return S, valid, y, mse, moved
    if bool((cnt[go] >= S.shape[1]).any()):  # widen the slots by one
        S, valid, y = (torch.cat([a, a.new_zeros((a.shape[0], 1))], 1) for a in (S, valid, y))
    idx = torch.nonzero(go)[:, 0]
    S2, v2 = S[idx].clone(), valid[idx].clone()
    ar = torch.arange(idx.numel(), device=S.device)
    S2[ar, cnt[idx]] = j[idx]
    v2[ar, cnt[idx]] = True
    y2, _, m2 = _refit(A, xt[idx], S2, v2, Cx[idx])
    better = m2 < mse[idx]
    sel = idx[better]
    S, valid, y, mse = S.clone(), valid.clone(), y.clone(), mse.clone()
    S[sel], valid[sel], y[sel], mse[sel] = S2[better], v2[better], y2[better], m2[better]
    moved[sel] = True
    return S, valid, y, mse, moved


def _removal_cost(A, S, valid, y):
    """``y_j^2 / (G_S^{-1})_jj`` per support slot (the least-squares cost of removing atom ``j``); inf off ``valid``."""
    step = max(1, REFIT_ENTRIES // max(1, S.shape[1] ** 2))
    dinv = torch.empty(S.shape, dtype=y.dtype, device=y.device)
    eye = torch.eye(S.shape[1], dtype=y.dtype, device=y.device)
    for r0 in range(0, S.shape[0], step):
        vc = valid[r0 : r0 + step]
        m = vc.to(y.dtype)
        L, _ = torch.linalg.cholesky_ex(A.gram(S[r0 : r0 + step], vc) + eye * (1.0 - m)[:, :, None] + eye * 1e-10)
        dinv[r0 : r0 + step] = torch.cholesky_inverse(L).diagonal(dim1=1, dim2=2).clamp_min(1e-300)
    return torch.where(valid, y * y / dinv, torch.full_like(y, math.inf))


def _trials(A, S, valid, y, C, budget, opts, Lsq):
    """Candidate supports ``(B, T, s)`` for the tokens at their budget: swaps and one projected-gradient step."""
    s = S.shape[1]
    nd = min(opts.n_drop, s)
    drop_slot = (-_removal_cost(A, S, valid, y)).topk(nd, dim=1).indices
    trials, tvalid = [], []
    for d in range(nd):
        # the correlations with the residual once the dropped atom's contribution is put back
        j = S.gather(1, drop_slot[:, d : d + 1])[:, 0]
        Cd = C + y.gather(1, drop_slot[:, d : d + 1]) * A.rows(j)
        add_v, add_j = _masked_corr(Cd, S, valid).topk(min(opts.n_add, C.shape[1]), dim=1)
        for a in range(add_j.shape[1]):
            trials.append(S.clone().scatter_(1, drop_slot[:, d : d + 1], add_j[:, a : a + 1]))
            tvalid.append(valid & (add_v[:, a : a + 1] > 0))
    # s-sparse projected gradient: the `budget` largest entries of y + C / L (dense over the atoms)
    Y = (A.dense(S, valid, y) + C / Lsq).clamp_min(0)
    top_v, top_j = Y.topk(s, dim=1)
    ok = (top_v > 0) & (torch.arange(s, device=S.device)[None, :] < budget[:, None])
    trials.append(top_j * ok)
    tvalid.append(ok)
    return torch.stack(trials, 1), torch.stack(tvalid, 1)


def _swap(A, xt, Cx, S, valid, y, mse, budget, C, opts, Lsq):
    """One round of swap / projected-gradient trials; keeps each token's best trial if it lowers the MSE."""
    full = valid.sum(1) >= budget
    idx = torch.nonzero(full & (budget > 0))[:, 0]
    moved = torch.zeros_like(full)
    if idx.numel() == 0:
        return S, valid, y, mse, moved
    T, Tv = _trials(A, S[idx], valid[idx], y[idx], C[idx], budget[idx], opts, Lsq)
    nb, nt, s = T.shape
    q = Cx[idx].gather(1, T.reshape(nb, nt * s)).reshape(nb * nt, s)  # (not Cx repeated: k columns per trial)
    yT, _, mT = _refit(A, xt[idx].repeat_interleave(nt, 0), T.reshape(nb * nt, s), Tv.reshape(nb * nt, s), None, q)
    best, t = mT.reshape(nb, nt).min(1)
    better = best < mse[idx] * (1.0 - 1e-12)
    sel = idx[better]
    pick = torch.arange(nb, device=S.device)[better] * nt + t[better]
    S, valid, y, mse = S.clone(), valid.clone(), y.clone(), mse.clone()
    S[sel], valid[sel] = T.reshape(nb * nt, s)[pick], Tv.reshape(nb * nt, s)[pick]
    y[sel], mse[sel] = yT[pick], best[better]
    moved[sel] = True
    return S, valid, y, mse, moved


def _penalised(A, xt, Cx, S, valid, y, mse, C, c):
    """L0-penalised moves: drop the cheapest atom where its removal costs less than ``c``, else add the best
    atom where it gains more than ``c`` (one NNLS refit each; kept only if ``mse + c L0`` drops)."""
    if S.shape[1] == 0:  # no token fires an atom (a dead SAE): one empty slot, so that there is nothing to drop
        S, valid, y = (a.new_zeros((a.shape[0], 1)) for a in (S, valid, y))
    cnt = valid.sum(1)
    slot = _removal_cost(A, S, valid, y).argmin(1)
    Tv = valid.clone()
    Tv[torch.arange(S.shape[0], device=S.device), slot] = False
    yd, _, md = _refit(A, xt, S * Tv, Tv, Cx)
    drop = (cnt > 0) & (md + c * (cnt - 1) < (mse + c * cnt) * (1.0 - 1e-12))
    S, valid, y, mse = _pick(drop, (S * Tv, Tv, yd, md), (S, valid, y, mse))
    big = torch.full_like(cnt, A.k)
    S2, v2, y2, m2, added = _add(A, xt, Cx, S, valid, y, mse, torch.where(drop, cnt - 1, big), C)
    keep = added & (m2 + c * v2.sum(1) < mse + c * valid.sum(1))
    if S2.shape[1] > S.shape[1]:
        pad = S2.shape[1] - S.shape[1]
        S, valid, y = (torch.cat([a, a.new_zeros((a.shape[0], pad))], 1) for a in (S, valid, y))
    S, valid, y, mse = _pick(keep, (S2, v2, y2, m2), (S, valid, y, mse))
    return S, valid, y, mse, drop | keep


def _round(A, xt, Cx, S, valid, y, mse, budget, opts, Lsq):
    """One round on a subset of tokens: ``(S, valid, y, mse, moved)``."""
    C = A.corr(residuals(A, xt, S, y, valid))  # the round's one product with the dictionary
    if opts.penalty is None:
        S, valid, y, mse, m1 = _add(A, xt, Cx, S, valid, y, mse, budget, C)
        S, valid, y, mse, m2 = _swap(A, xt, Cx, S, valid, y, mse, budget, C, opts, Lsq)
    else:  # swaps at each token's current count, then the penalised drops and adds
        S, valid, y, mse, m1 = _swap(A, xt, Cx, S, valid, y, mse, valid.sum(1), C, opts, Lsq)
        C = A.corr(residuals(A, xt, S, y, valid))
        S, valid, y, mse, m2 = _penalised(A, xt, Cx, S, valid, y, mse, C, float(opts.penalty))
    return S, valid, y, mse, m1 | m2


def _pick(mask, a, b):
    """Per token, the tuple ``a`` where ``mask`` else ``b`` (tensors with the batch first)."""
    return tuple(torch.where(mask.view(-1, *([1] * (x.dim() - 1))), x, z) for x, z in zip(a, b))


def _omp(A, xt, Cx, budget, deadline):
    """Nonnegative OMP from the empty support up to each token's budget."""
    B = xt.shape[0]
    S = torch.zeros(B, 0, dtype=torch.long, device=xt.device)
    valid = torch.zeros(B, 0, dtype=torch.bool, device=xt.device)
    y = torch.zeros(B, 0, dtype=xt.dtype, device=xt.device)
    R, mse = xt, (xt * xt).sum(1)
    for _ in range(int(budget.max()) if B else 0):
        S, valid, y, mse, moved = _add(A, xt, Cx, S, valid, y, mse, budget, A.corr(R))
        if not bool(moved.any()) or time.perf_counter() > deadline:
            break
        R = residuals(A, xt, S, y, valid)
    return S, valid, y, mse


def _better(best, cand):
    """Per token, the one of two ``(S, valid, y, mse)`` starts with the lower MSE (``best`` may be ``None``)."""
    if best is None:
        return cand
    w = best[0].shape[1] - cand[0].shape[1]
    cand = tuple(torch.cat([a, a.new_zeros((a.shape[0], max(0, w)))], 1) for a in cand[:3]) + (cand[3],)
    best = tuple(torch.cat([a, a.new_zeros((a.shape[0], max(0, -w)))], 1) for a in best[:3]) + (best[3],)
    return _pick(cand[3] < best[3], cand, best)


def pursue_batch(U: torch.Tensor, xt: torch.Tensor, budget: torch.Tensor, start=None, *,
                 opts: PursuitOptions = PursuitOptions(), deadline: float = math.inf, Lsq: float | None = None,
                 atoms: Atoms | None = None, scale: torch.Tensor | None = None) -> dict:
    r"""The pursuit of the module docstring on one batch.

    Parameters
    ----------
    U : tensor (k, n) float64
        Unit atoms.
    xt : tensor (B, n) float64
        Centred tokens ``x_i - b``.
    budget : long tensor (B,)
        Most atoms per token ``s_i``.
    start : CSR array (B, k), optional
        Codes on the unit atoms to start from (an SAE's own); each token must fire at most ``s_i``.
    opts : PursuitOptions
    deadline : float
        ``time.perf_counter()`` after which no further refit chunk or round starts (the start's own codes are
        always kept as a witness).
    Lsq : float, optional
        ``||U||_2^2`` (:func:`spectral_norm_sq`), computed when not given.
    atoms : Atoms, optional
        ``Atoms(U)``, to share its Gram matrix between batches.
    scale : tensor (k,), optional
        The decoder's row norms (``W = diag(scale) U``), which the gradient-pursuit start uses as the
        decoder's own rows weigh its choices; default ones.

    Returns
    -------
    dict
        ``codes`` (CSR (B, k), unit-atom codes), ``mse`` (per token, float64 numpy, evaluated from the
        codes), ``l0`` (per token), ``start_mse`` (per token, the start's own MSE, or its refit where
        lower; ``None`` without a start), ``residuals`` (B, n), ``rounds`` and
        ``stopped`` (``"converged"``: no token improved in the last round, ``"max_iter"`` or ``"time_limit"``).
    """
    A = Atoms(U) if atoms is None else atoms
    Lsq = spectral_norm_sq(U) if Lsq is None else Lsq
    Cx = None  # x_t U^T, float64 (B, k): formed when a step needs it (the start's refit gathers its atoms instead)
    best, m0 = None, None
    R_best = None  # the residuals of best's codes, while only the start and its refit made them
    if start is not None:
        S, valid, y0 = _support_of(start, xt.device, xt.dtype)
        if bool((valid.sum(1) > budget).any()):
            raise ValueError("pursue_batch: the start codes fire more atoms than the budget on some token")
        y, Ry, m = _refit(A, xt, S, valid, None, deadline=deadline)  # (rows past the deadline: the start's codes)
        # (from the start codes, as the witness's MSE is evaluated from its codes: equal codes give an equal MSE, the
        # encoder's own residual norms differ from it by rounding, and an unchanged SAE would show a gain of 4e-15)
        R0 = residuals(A, xt, S, y0, valid)
        m0 = (R0 * R0).sum(1)
        keep0 = m0 <= m  # the refit is a least-squares optimum on the support: worse only by rounding
        best = (S, valid, torch.where(keep0[:, None], y0, y), torch.minimum(m, m0))
        R_best = torch.where(keep0[:, None], R0, Ry)
    have_cx = torch.zeros(xt.shape[0], dtype=torch.bool, device=xt.device)  # the rows of Cx formed
    if (opts.cold_start or best is None) and time.perf_counter() <= deadline:
        Cx = xt @ U.T
        have_cx[:] = True
        best, R_best = _better(best, _omp(A, xt, Cx, budget, deadline)), None
    if opts.grad_start and time.perf_counter() <= deadline:
        w = torch.ones(A.k, dtype=xt.dtype, device=xt.device) if scale is None else scale
        S, valid = grad_pursuit_supports(A.U, w, xt, budget, lambda: time.perf_counter() <= deadline)
        best, R_best = _better(best, (S, valid) + _refit(A, xt, S, valid, None, deadline=deadline)[::2]), None
    S, valid, y = _compact(*best[:3])
    mse = best[3]
    rounds, stopped = 0, "converged"
    active = torch.ones(xt.shape[0], dtype=torch.bool, device=xt.device)
    while bool(active.any()):
        if rounds >= opts.max_iter or time.perf_counter() > deadline:
            stopped = "max_iter" if rounds >= opts.max_iter else "time_limit"
            break
        rounds += 1
        # only the tokens that moved in the last round: the others' trials are the same and fail again
        todo = torch.nonzero(active)[:, 0]
        active = torch.zeros_like(active)
        for c0 in range(0, todo.numel(), ROUND_ROWS):  # (no chunk starts after the deadline: they keep their codes)
            if c0 and time.perf_counter() > deadline:
                stopped = "time_limit"
                break
            idx = todo[c0 : c0 + ROUND_ROWS]
            if Cx is None:
                Cx = torch.empty((xt.shape[0], A.k), dtype=xt.dtype, device=xt.device)
            new = idx[~have_cx[idx]]  # x_t U^T for the tokens a round reaches, when it first does
            if new.numel():
                Cx[new], have_cx[new] = xt[new] @ U.T, True
            sub = _round(A, xt[idx], Cx[idx], S[idx], valid[idx], y[idx], mse[idx], budget[idx], opts, Lsq)
            w = sub[0].shape[1] - S.shape[1]
            if w > 0:
                S, valid, y = (torch.cat([a, a.new_zeros((a.shape[0], w))], 1) for a in (S, valid, y))
            S, valid, y, mse = S.clone(), valid.clone(), y.clone(), mse.clone()
            for full, part in zip((S, valid, y), sub[:3]):
                full[idx] = torch.cat([part, part.new_zeros((part.shape[0], full.shape[1] - part.shape[1]))], 1)
            mse[idx] = sub[3]
            active[idx] = sub[4]
        S, valid, y = _compact(S, valid, y)
        if stopped == "time_limit":
            break
    if R_best is None:
        R = residuals(A, xt, S, y, valid)
    else:  # the witness's residuals: the start's or its refit's, recomputed where a round reached the token
        R = R_best
        moved = torch.nonzero(have_cx).flatten()
        if moved.numel():
            R[moved] = residuals(A, xt[moved], S[moved], y[moved], valid[moved])
    codes = _to_csr(S, valid, y, A.k)
    return {"codes": codes, "mse": (R * R).sum(1).cpu().numpy(), "l0": np.diff(codes.indptr),  # the witness
            "start_mse": None if m0 is None else m0.cpu().numpy(), "residuals": R, "rounds": rounds,
            "stopped": stopped}


def _support_of(Z, device, dtype):
    """``(S, valid, y)`` slot tensors of CSR codes ``Z`` (B, k), zeros dropped."""
    Z = sp.csr_array(Z)
    Z.eliminate_zeros()
    cnt = np.diff(Z.indptr)
    s = int(cnt.max()) if cnt.size else 0
    B = Z.shape[0]
    S = np.zeros((B, s), dtype=np.int64)
    y = np.zeros((B, s))
    pos = np.arange(Z.nnz) - np.repeat(Z.indptr[:-1], cnt)
    rows = np.repeat(np.arange(B), cnt)
    S[rows, pos] = Z.indices
    y[rows, pos] = Z.data
    valid = np.arange(s)[None, :] < cnt[:, None]
    return (torch.as_tensor(S, device=device), torch.as_tensor(valid, device=device),
            torch.as_tensor(y, dtype=dtype, device=device))


def _to_csr(S, valid, y, k: int) -> sp.csr_array:
    v = (valid & (y > 0)).cpu().numpy()
    rows, slots = np.nonzero(v)
    Sn, yn = S.cpu().numpy(), y.cpu().numpy()
    return sp.csr_array((yn[rows, slots], (rows, Sn[rows, slots])), shape=(S.shape[0], k))


__all__ += ["PursuitResult"]


@dataclass(frozen=True)
class PursuitResult:
    """Codes at a sparsity budget, as a bracket on the best MSE at that budget (theory.md §10).

    ``value``: mean MSE of ``codes`` (the verified witness); ``lower_bound``: a proven lower bound on the
    mean of the per-token optima ``m_s(x_i)`` (:mod:`widelimit.coding.sparse_bound`); ``gap = value -
    lower_bound``; ``status`` names the bound's method or why none is better than the trivial one.
    """

    value: float
    lower_bound: float
    gap: float
    rel_gap: float
    certified: bool
    tol: float
    status: str
    n_iter: int
    time_s: float
    n_points: int
    start_value: float | None = None
    l0: float = 0.0
    codes: sp.csr_array | None = field(default=None, repr=False)
    point_values: np.ndarray | None = field(default=None, repr=False)
    point_bounds: np.ndarray | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("value", "lower_bound", "gap", "rel_gap", "certified", "tol",
                                              "status", "n_iter", "time_s", "n_points", "start_value", "l0")}


def sparse_codes(X, W, b, *, budget, Z0=None, opts: PursuitOptions = PursuitOptions(), tol: float = 1e-6,
                 time_limit: float | None = None, batch_size: int = 2048, device="auto", max_subsets: int = 2000,
                 progress=None) -> PursuitResult:
    r"""Codes at a sparsity budget for a fixed decoder and bias, bracketed (theory.md §10).

    Parameters
    ----------
    X : array (N, n)
        Tokens.
    W : array (k, n)
        Decoder (rows = atoms, any norms; codes are returned in its units: ``x ~ b + z W``).
    b : array (n,)
        Bias.
    budget : int or int array (N,)
        Most atoms per token.
    Z0 : array or sparse (N, k), optional
        Codes to start from (in ``W``'s units), firing at most ``budget`` atoms per token.
    opts : PursuitOptions
    tol : float
        ``certified`` iff ``gap <= tol * value``.
    time_limit : float, optional
        Seconds; the start's own codes are always a witness, their refit and later rounds run within the limit.
    batch_size : int
        Tokens per batch.
    device : {"auto", "cpu", "cuda"}
    max_subsets : int
        Enumeration limit of :func:`widelimit.coding.sparse_bound.sparse_lower_bound`.
    progress : callable(Progress), optional
        ``stage="pursuit"`` events per batch.

    Returns
    -------
    PursuitResult
    """
    t0 = time.perf_counter()
    dev = resolve_device(device)
    X = np.asarray(X, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    N, k = X.shape[0], W.shape[0]
    norms = np.linalg.norm(W, axis=1)
    norms_safe = np.where(norms > 0, norms, 1.0)
    U = torch.as_tensor(W / norms_safe[:, None], device=dev)
    bud = np.broadcast_to(np.asarray(budget, dtype=np.int64), (N,))
    if (bud < 0).any():
        raise ValueError("budget must be >= 0 on every token")
    Zs = None if Z0 is None else sp.csr_array(Z0) @ sp.diags_array(norms)
    A, Lsq = Atoms(U), spectral_norm_sq(U)
    scale = torch.as_tensor(norms_safe, device=dev)
    mu = babel(U, int(bud.max()) if N else 0, s_min=babel_s_min(bud, k, max_subsets), cap=1.0)
    deadline = math.inf if time_limit is None else t0 + float(time_limit)
    vals, lbs, meth, starts, codes, rounds, energy = [], [], [], [], [], 0, []
    for s0 in range(0, N, batch_size):
        xt = torch.as_tensor(X[s0 : s0 + batch_size] - np.asarray(b, dtype=np.float64), device=dev)
        bt = torch.as_tensor(bud[s0 : s0 + batch_size].copy(), device=dev)
        out = pursue_batch(U, xt, bt, None if Zs is None else Zs[s0 : s0 + batch_size], opts=opts,
                           deadline=deadline, Lsq=Lsq, atoms=A, scale=scale)
        lb, m = sparse_lower_bound(U, xt, bt, out["residuals"], mu=mu, max_subsets=max_subsets)
        vals.append(out["mse"]), lbs.append(lb), meth.append(m), codes.append(out["codes"])
        energy.append((xt * xt).sum(1).cpu().numpy())
        if out["start_mse"] is not None:
            starts.append(out["start_mse"])
        rounds = max(rounds, out["rounds"])
        if progress is not None:
            progress(Progress(stage="pursuit", pass_index=1, rows_done=min(N, s0 + batch_size), rows_total=N))
    v = np.concatenate(vals)
    # a token's bound above its witness MSE: within the rounding of either (a small multiple of float64's epsilon
    # times ||x - b||^2, what both are computed from) it is lowered to it; beyond, InconsistentBound naming the token
    lb = ordered_bound(v, np.concatenate(lbs), rounding=2.0**-40 * np.concatenate(energy),
                       what="witness MSE of that token", bound="sparse lower bound")
    value, lower = float(v.mean()), float(lb.mean())

    m = np.concatenate(meth)
    status = "; ".join(f"{METHODS[j]}: {int((m == j).sum())} tokens" for j in sorted(set(m.tolist())))
    Y = sp.vstack(codes).tocsr() if codes else sp.csr_array((0, k))
    gap = value - lower  # certified / rel_gap: the rule of exact/gap.py (coding imports nothing of exact)
    rel = 0.0 if gap == 0.0 else (gap / abs(value) if value != 0.0 else math.inf)
    return PursuitResult(value=value, lower_bound=lower, gap=gap, rel_gap=rel,
                         certified=gap <= tol * max(abs(value), 2.0 ** -1022), tol=tol, status=status,
                         n_iter=rounds, time_s=time.perf_counter() - t0, n_points=N,
                         start_value=float(np.concatenate(starts).mean()) if starts else None,
                         l0=float(Y.nnz) / max(1, N), codes=sp.csr_array(Y @ sp.diags_array(1.0 / norms_safe)),
                         point_values=v, point_bounds=lb)


__all__ += ["sparse_codes"]
