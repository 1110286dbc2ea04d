r"""Batched nonnegative least squares on small supports (torch, float64): the refit of :mod:`.pursuit`.

For a batch of tokens, each with its own support of at most ``s`` unit atoms (gathered as
``Us`` ``(B, s, n)``, slots beyond a token's support masked out by ``valid``), solve

.. math:: \min_{y \ge 0} \|x_t - y\,U_S\|^2 \quad (\text{per token})

by the Lawson--Hanson active-set method run on every token of the batch at once
(theory.md §10.2): a batched Cholesky solve on the passive set per step, the passive set of a
token whose unconstrained step leaves the orthant shrunk by the interpolation step.
The start is the least-squares fit on the whole support with the negative entries dropped
until none is left (a point of the Lawson--Hanson invariant: least squares on its passive set,
positive there), so a support whose least-squares fit is already nonnegative (the usual case
for an SAE's own support) costs one solve.
"""

from __future__ import annotations

import numpy as np
import torch

from ._restricted import solve_blocks
from .working_set import gather_block

__all__ = ["nnls_batch", "gram_batch", "nnls_refit"]

#: Ridge added to the diagonal of a Gram block before its Cholesky factorisation (unit atoms: diagonal 1).
RIDGE = 1e-12


def gram_batch(Us: torch.Tensor, xt: torch.Tensor, valid: torch.Tensor):
    """``(G, q)`` with ``G = Us Us^T`` ``(B, s, s)`` and ``q = Us x_t`` ``(B, s)``, zero outside ``valid``."""
    Us = Us * valid[..., None]
    return Us @ Us.transpose(1, 2), (Us @ xt[..., None])[..., 0]


def _solve(G, q, P):
    """Least squares on the passive sets ``P`` (B, s): ``G_PP z_P = q_P``, ``z = 0`` off ``P``.

    The passive slots are gathered first into blocks of the largest ``|P|`` of the batch (the rest padded
    with the identity), so a factorisation costs ``|P|^3``, not ``s^3``: the working sets of
    :class:`widelimit.coding.screened.ScreenedCoder` hold a few hundred slots where the solution uses tens."""
    if not P.shape[0] or not bool(P.any()):
        return torch.zeros_like(q)
    if bool(P.all()):
        return _solve_block(G, q, P)
    order, Gc, qc, Pc = gather_block(G, q, P)
    return torch.zeros_like(q).scatter_(1, order, _solve_block(Gc, qc, Pc))


def _solve_block(G, q, P):
    """:func:`_solve` on blocks as given (``P`` may fill them)."""
    m = P.to(G.dtype)
    A = G * (m[:, :, None] * m[:, None, :])
    eye = torch.eye(G.shape[1], dtype=G.dtype, device=G.device)
    A = A + eye * (1.0 - m)[:, :, None] + eye * RIDGE
    L, info = torch.linalg.cholesky_ex(A)
    bad = info != 0
    if bool(bad.any()):  # (near-)duplicate atoms on a support: a larger ridge for those tokens
        L2, _ = torch.linalg.cholesky_ex(A[bad] + eye * 1e-8)
        L = L.clone()
        L[bad] = L2
    z = torch.cholesky_solve((q * m)[..., None], L)[..., 0]
    return z * m


def nnls_batch(G: torch.Tensor, q: torch.Tensor, valid: torch.Tensor, max_iter: int | None = None,
               start: torch.Tensor | None = None) -> torch.Tensor:
    r"""Nonnegative least squares ``min_{y >= 0} y^T G y - 2 q^T y`` per token on the ``valid`` slots.

    Parameters
    ----------
    G : tensor (B, s, s)
        Gram blocks of each token's support (:func:`gram_batch`).
    q : tensor (B, s)
        Correlations ``U_S x_t``.
    valid : bool tensor (B, s)
        Slots that hold an atom.
    max_iter : int, optional
        Outer (add-a-variable) steps; default ``2 s + 2``. The result is nonnegative and zero off
        ``valid`` however early it stops (the witness is evaluated from it, never trusted).
    start : bool tensor (B, s), optional
        The first passive set (within ``valid``); default all of ``valid``. The start is the least-squares
        fit on it with the negative entries dropped until none is left; an empty start is Lawson and
        Hanson's own (from ``y = 0``, one variable added per outer step).

    Returns
    -------
    tensor (B, s)
        The codes ``y`` (0 off ``valid``).
    """
    B, s = q.shape
    if s == 0 or B == 0:
        return torch.zeros_like(q)
    P = valid.clone() if start is None else (valid & start)
    y = torch.zeros_like(q)
    todo = torch.arange(B, device=q.device)
    # every factorisation is of the tokens still at work only (a batch's few hard tokens used to
    # re-factor every token's Gram block at each of their steps: O(B s^3) per step)
    for _ in range(s + 1):  # start: least squares on the support, negatives dropped
        Pt = P[todo]
        z = _solve(G[todo], q[todo], Pt)
        neg = Pt & (z <= 0)
        done = ~neg.any(1)
        y[todo[done]] = z[done]
        P[todo] = Pt & ~neg
        todo = todo[~done]
        if todo.numel() == 0:
            break
    else:
        Pt = P[todo]
        y[todo] = _solve(G[todo], q[todo], Pt).clamp_min(0) * Pt
    scale = torch.linalg.norm(q, dim=1, keepdim=True) * 1e-13 + 1e-300
    for _ in range(max_iter if max_iter is not None else 2 * s + 2):
        w = q - (G @ y[..., None])[..., 0]  # half the negative gradient
        cand = valid & ~P & (w > scale)
        act = cand.any(1)
        if not bool(act.any()):
            break
        j = torch.where(cand, w, torch.full_like(w, -torch.inf)).argmax(1)
        P[act, j[act]] = True
        _inner(G, q, P, y, act)
    return y.clamp_min(0) * valid


def _inner(G, q, P, y, act) -> None:
    """Lawson--Hanson's inner loop, in place on ``y`` and ``P`` for the tokens ``act``."""
    s = q.shape[1]
    todo = torch.nonzero(act)[:, 0]
    for _ in range(s + 1):  # the tokens still in the loop only (their rows gathered, written back)
        Pt = P[todo]
        z = _solve(G[todo], q[todo], Pt)
        bad = Pt & (z <= 0)
        ok = ~bad.any(1)
        y[todo[ok]] = z[ok]
        keep = ~ok
        todo, z, bad, Pt = todo[keep], z[keep], bad[keep], Pt[keep]
        if todo.numel() == 0:
            return
        yt = y[todo]
        ratio = torch.where(bad, yt / (yt - z).clamp_min(1e-300), torch.full_like(yt, torch.inf))
        alpha = ratio.min(1).values.clamp(0.0, 1.0)
        yt = yt + alpha[:, None] * (z - yt)
        Pt = Pt & ~(yt <= 0)
        P[todo] = Pt
        y[todo] = yt * Pt


#: Sweeps of the numba NNLS (:func:`nnls_refit`) before a token goes to the batched active set.
NNLS_SWEEPS = 200


def nnls_refit(G, q, valid, xt):
    """:func:`nnls_batch` of ``(G, q, valid)`` (``xt``: the tokens, for the stopping test), the pursuit's refit.

    On the CPU per token in numba first (coordinate descent with Newton steps on the support,
    :func:`widelimit.coding._restricted.solve_blocks` at ``lam = 0``: the batched Lawson-Hanson steps took half the
    L0 bracket's refit), the batched active set where it did not settle; elsewhere :func:`nnls_batch`."""
    if G.device.type != "cpu" or not G.shape[0] or not G.shape[1]:
        return nnls_batch(G, q, valid)
    m = valid.to(G.dtype)
    Gm = G * (m[:, :, None] * m[:, None, :]) + torch.eye(G.shape[1], dtype=G.dtype) * (1.0 - m)[:, :, None]
    y = torch.zeros_like(q)
    used = solve_blocks(Gm.numpy(), (q * m).numpy(), (xt * xt).sum(1).numpy(), y.numpy(),
                        np.full(G.shape[0], G.shape[1], dtype=np.int64), 0.0, 1e-13, 1e-300, NNLS_SWEEPS, 6)
    bad = torch.from_numpy(used >= NNLS_SWEEPS)
    if bool(bad.any()):
        y[bad] = nnls_batch(G[bad], q[bad], valid[bad])
    return y.clamp_min(0.0) * m
