r"""Nonnegative gradient pursuit on a decoder's own rows: one of the starts of :mod:`.pursuit` (theory.md §10.2).

The batched gradient pursuit of Blumensath & Davies (2008), in the nonnegative form that SAE practice uses for
inference-time optimisation (dictionary_learning's ``grad_pursuit``): for the decoder rows ``W = diag(w) U``
(``w`` the row norms, ``U`` unit atoms) and a centred token ``x_t``, start from ``z = 0`` and the empty
selected set ``T`` and repeat ``s`` times

1. add ``argmax_j <r, W_j>`` to ``T`` (the raw rows, so the norms ``w`` weigh the choice; an atom already in
   ``T`` may be chosen again, and the set then does not grow);
2. the gradient restricted to ``T``, ``g = 1_T \odot (r W^T)``, its image ``c = g W`` and the exact
   line-search step ``\alpha = <c, r> / ||c||^2``;
3. ``z <- max(0, z + \alpha g)``, ``r = x_t - z W``.

Its codes fire at most ``s`` atoms (``|T| <= s``). :mod:`.pursuit` keeps only their **support** and refits
it by nonnegative least squares, whose MSE is at most that of the gradient-pursuit codes (the NNLS optimum
on a support is below any nonnegative codes on it): a witness of widelimit's never loses a token to this
peer when it starts from here and only keeps improvements.
"""

from __future__ import annotations

import torch

__all__ = ["grad_pursuit_supports"]


def grad_pursuit_supports(U: torch.Tensor, w: torch.Tensor, xt: torch.Tensor, budget: torch.Tensor, deadline_ok):
    """Supports ``(S, valid)`` of nonnegative gradient pursuit (module docstring) on ``W = diag(w) U``.

    Parameters
    ----------
    U : tensor (k, n) float64
        Unit atoms.
    w : tensor (k,) float64
        The decoder's row norms (``W = diag(w) U``).
    xt : tensor (B, n) float64
        Centred tokens.
    budget : long tensor (B,)
        Steps per token (``s_i``; a token stops after its own).
    deadline_ok : callable () -> bool
        False once the time budget is spent (the steps stop; the supports so far are returned).

    Returns
    -------
    (S, valid)
        Long (B, s) atom indices and bool (B, s) slots, ``s = max_i |T_i|``.
    """
    B, k = xt.shape[0], U.shape[0]
    W = U * w[:, None]
    Y = torch.zeros(B, k, dtype=xt.dtype, device=xt.device)  # codes on the rows of W
    sel = torch.zeros(B, k, dtype=torch.bool, device=xt.device)
    R = xt.clone()
    rows = torch.arange(B, device=xt.device)
    for t in range(int(budget.max()) if B else 0):
        act = budget > t
        C = R @ W.T
        j = C.argmax(1)
        sel[rows[act], j[act]] = True
        g = torch.where(sel, C, torch.zeros_like(C))
        c = g @ W
        cc = (c * c).sum(1)
        step = torch.where(cc > 0, (c * R).sum(1) / torch.where(cc > 0, cc, torch.ones_like(cc)), torch.zeros_like(cc))
        Y = torch.where(act[:, None], (Y + step[:, None] * g).clamp_min(0), Y)
        R = xt - Y @ W
        if not deadline_ok():
            break
    keep = Y > 0
    s = int(keep.sum(1).max()) if B else 0
    v, S = keep.to(xt.dtype).topk(s, dim=1) if s else (keep[:, :0].to(xt.dtype), keep[:, :0].long())
    return S * (v > 0), v > 0
