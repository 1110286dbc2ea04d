r"""Proven lower bounds on the best MSE of nonnegative codes at a sparsity budget (theory.md §10.3).

For unit atoms ``U`` (``k x n``), a centred token ``x_t = x - b`` and a budget ``s``,
``m_s = min_{y >= 0, ||y||_0 <= s} ||x_t - y U||^2``. Every bound here comes from one inequality
(theory.md §10.3, Lemma 1): for any vector ``r`` and any ``B`` with ``||y*||_1 <= B`` for an optimal
``y*``,

.. math:: m_s \ \ge\ \frac{\big((\langle r, x_t\rangle - c\,B)_+\big)^2}{\|r\|^2},
          \qquad c = \max\big(0, \max_{d \in \mathcal{D}} \langle u_d, r\rangle\big),

where ``D`` holds the atoms ``y*`` may use. Three choices of ``D`` and ``B``:

* **exact** (``s = 0``, or ``s = 1``): ``m_0 = ||x_t||^2`` and ``m_1 = ||x_t||^2 - (max_d <u_d, x_t>)_+^2``;
* **enumeration** (when ``C(k, s)`` is at most ``max_subsets``): for every support ``S`` of size
  ``min(s, k)``, ``D = S`` and ``B = sqrt(s) ||x_t|| / sqrt(lambda_min(G_SS))`` with ``r`` the NNLS
  residual on ``S``; the minimum over supports is a lower bound on ``m_s``, equal to it up to rounding;
* **restricted eigenvalue** (Babel function ``mu_1(s-1) = max_d`` sum of the ``s - 1`` largest
  ``|<u_d, u_j>|``, ``j != d``): when ``mu_1(s-1) < 1``, every ``s``-atom Gram block has
  ``lambda_min >= 1 - mu_1(s-1)`` (Gershgorin), so ``B = sqrt(s / (1 - mu_1)) ||x_t||``, ``D`` = all atoms,
  ``r`` the witness's residual.

Otherwise only ``m_s >= 0`` is proven, and :func:`sparse_lower_bound` says why. Every bound is
shrunk by a relative ``64 n eps`` for the rounding of its float64 sums.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from ._nnls import gram_batch, nnls_batch

__all__ = ["babel", "sparse_lower_bound", "lagrangian_bound", "BABEL_BLOCK_BYTES", "babel_s_min"]


#: Most bytes of one block of the products ``U_block U^T`` (float64) in :func:`babel`.
BABEL_BLOCK_BYTES = 1 << 26  # 64 MiB


def _top_sums(U: torch.Tensor, rows: torch.Tensor, m: int) -> torch.Tensor:
    """Per atom ``d`` of ``rows``: cumulative sums of the ``m`` largest ``|<u_d, u_j>|``, ``j != d`` (``(rows, m)``)."""
    A = (U[rows] @ U.T).abs()
    A[torch.arange(rows.numel(), device=A.device), rows] = 0.0
    return A.topk(m, dim=1).values.cumsum(1)


def babel(U: torch.Tensor, s_max: int, chunk: int | None = None, *, s_min: int = 2, cap: float | None = None,
          sample: int = 32) -> np.ndarray:
    r"""``mu[s] = mu_1(s - 1)`` for ``s = 0 .. s_max`` (``mu[0] = mu[1] = 0``), plus the rounding of ``G``.

    ``mu_1(m) = max_d`` (sum of the ``m`` largest ``|<u_d, u_j>|`` over ``j != d``) (Tropp 2004): the
    product ``U U^T`` in blocks of ``chunk`` rows (default :data:`BABEL_BLOCK_BYTES` of float64), never
    the whole ``k x k`` matrix; ``k^2 n`` multiply-adds.

    With ``cap`` (the caller uses ``mu[s]`` only where ``mu[s] < cap``; the restricted-eigenvalue bound of
    :func:`sparse_lower_bound` has ``cap = 1``), a lower estimate first: the same sums on ``sample``
    rows, less their rounding (``mu_1`` is a maximum over all rows, so any rows give a lower bound,
    theory.md §10.3). Where it already reaches ``cap`` the entry holds it (a value ``>= cap``: the
    bound cannot use it either way), and the exact sums are computed only for the ``s`` below. When
    the estimate reaches ``cap`` at ``s_min`` (the smallest budget the caller asks about), the whole
    ``k^2 n`` product is skipped and the entries below ``s_min`` are NaN (not computed: NaN compares
    false with ``cap``, so no bound uses them); all are NaN when ``s_min > s_max``.
    """
    k, n = U.shape
    m = max(0, min(int(s_max) - 1, k - 1))
    out = np.zeros(int(s_max) + 1)
    if m == 0:
        return out
    if cap is not None and int(s_min) > s_max:  # no budget to bound: nothing computed
        out[2:] = np.nan
        return out
    err = 4 * n * np.finfo(np.float64).eps
    rows = int(chunk or max(1, BABEL_BLOCK_BYTES // (8 * k)))
    stop = m  # exact sums for mu_1(1 .. stop)
    if cap is not None:
        pick = torch.unique(torch.linspace(0, k - 1, min(k, int(sample)), device=U.device).round().long())
        est = _top_sums(U, pick, m).amax(0).cpu().numpy() - err * np.arange(1, m + 1)  # est[j] <= mu_1(j + 1)
        void = np.nonzero(est >= cap)[0]
        if void.size:
            stop = int(void[0])  # est[stop] >= cap: mu[s] >= cap for s >= stop + 2
            out[stop + 2 : m + 2] = np.maximum.accumulate(est[stop:])
            if stop + 2 <= max(2, int(s_min)):
                out[2 : stop + 2] = np.nan
                stop = 0
    if stop:
        best = torch.zeros(stop, dtype=torch.float64)
        for c0 in range(0, k, rows):
            block = torch.arange(c0, min(k, c0 + rows), device=U.device)
            best = torch.maximum(best, _top_sums(U, block, stop).amax(0).cpu())
        out[2 : stop + 2] = best.numpy() + err * np.arange(1, stop + 1)
    if s_max + 1 > m + 2:
        out[m + 2 :] = out[m + 1] + err  # s > k: a support is at most all k atoms
    return out


def lagrangian_bound(xt: torch.Tensor, r: torch.Tensor, c: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``((<r, x_t> - c B)_+)^2 / ||r||^2`` per token (Lemma 1 of theory.md §10.3); ``||x_t||^2`` where ``r = 0``
    is not usable (0 then)."""
    p = (r * xt).sum(1) - torch.where(c > 0, c * B, torch.zeros_like(c))
    rr = (r * r).sum(1)
    ok = (rr > 0) & (p > 0) & torch.isfinite(p)
    return torch.where(ok, p.clamp_min(0) ** 2 / rr.clamp_min(1e-300), torch.zeros_like(rr))


def _enumerate(U, xt, s: int, subsets: torch.Tensor) -> torch.Tensor:
    """Per token, the minimum over the supports ``subsets`` (T, s) of the Lemma-1 bound of NNLS on each."""
    B, T = xt.shape[0], subsets.shape[0]
    best = torch.full((B,), math.inf, dtype=xt.dtype, device=xt.device)
    lam_min = torch.linalg.eigvalsh(U[subsets] @ U[subsets].transpose(1, 2))[:, 0]  # (T,)
    per = max(1, 200_000 // max(1, T))
    for b0 in range(0, B, per):
        x = xt[b0 : b0 + per]
        nb = x.shape[0]
        S = subsets.repeat(nb, 1)
        xr = x.repeat_interleave(T, 0)
        valid = torch.ones_like(S, dtype=torch.bool)
        G, q = gram_batch(U[S], xr, valid)
        y = nnls_batch(G, q, valid)
        r = xr - torch.einsum("bs,bsn->bn", y, U[S])
        c = (torch.einsum("bsn,bn->bs", U[S], r)).amax(1).clamp_min(0)
        lm = lam_min.repeat(nb)
        Bnd = math.sqrt(s) * torch.linalg.norm(xr, dim=1) / lm.clamp_min(0).sqrt()
        Bnd = torch.where(lm > 0, Bnd, torch.full_like(Bnd, math.inf))
        lb = lagrangian_bound(xr, r, c, Bnd).reshape(nb, T)
        best[b0 : b0 + nb] = lb.min(1).values
    return best


def babel_s_min(budget, k: int, max_subsets: int) -> int:
    """The smallest budget ``s >= 2`` whose tokens :func:`sparse_lower_bound` bounds by the Babel function
    (not by enumeration), ``s_max + 1`` if none: the ``s_min`` of :func:`babel`."""
    b = np.asarray(budget.cpu()) if hasattr(budget, "cpu") else np.asarray(budget)
    use = [int(s) for s in np.unique(b) if s >= 2 and math.comb(k, min(int(s), k)) > max_subsets]
    return min(use) if use else int(b.max(initial=1)) + 1


def sparse_lower_bound(U: torch.Tensor, xt: torch.Tensor, budget: torch.Tensor, R: torch.Tensor, *,
                       mu: np.ndarray | None = None, max_subsets: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    r"""Per-token lower bounds on ``m_s`` and the method that proved each (module docstring).

    Parameters
    ----------
    U : tensor (k, n) float64
        Unit atoms.
    xt : tensor (B, n) float64
        Centred tokens.
    budget : long tensor (B,)
        ``s_i``.
    R : tensor (B, n) float64
        Residuals of the witness codes (the ``r`` of the restricted-eigenvalue bound).
    mu : array, optional
        :func:`babel` up to ``max(budget)`` (computed when not given, with ``cap = 1``: skipped where a row
        sample already proves the bound void).
    max_subsets : int
        Enumerate supports when ``C(k, s) <= max_subsets``.

    Returns
    -------
    (bounds, method)
        ``bounds`` float64 (B,), ``method`` int (B,): 0 none (only ``>= 0``), 1 exact (``s <= 1``),
        2 enumeration, 3 restricted eigenvalue.
    """
    k, n = U.shape
    Bt = xt.shape[0]
    xx = (xt * xt).sum(1)
    lb = torch.zeros(Bt, dtype=xt.dtype, device=xt.device)
    method = torch.zeros(Bt, dtype=torch.long, device=xt.device)
    s_max = int(budget.max()) if Bt else 0
    mu = babel(U, s_max, s_min=babel_s_min(budget, k, max_subsets), cap=1.0) if mu is None else mu
    z = budget == 0
    lb[z], method[z] = xx[z], 1
    one = budget == 1
    if bool(one.any()):
        cmax = (xt[one] @ U.T).amax(1).clamp_min(0)
        lb[one], method[one] = (xx[one] - cmax * cmax).clamp_min(0), 1
    for s in torch.unique(budget[budget >= 2]).tolist():
        idx = torch.nonzero(budget == s)[:, 0]
        ss = min(s, k)
        if math.comb(k, ss) <= max_subsets:
            subsets = torch.as_tensor(list(itertools.combinations(range(k), ss)), dtype=torch.long, device=xt.device)
            lb[idx], method[idx] = _enumerate(U, xt[idx], ss, subsets), 2
        elif mu[min(s, len(mu) - 1)] < 1.0:
            Bnd = math.sqrt(s / (1.0 - mu[s])) * torch.sqrt(xx[idx])
            c = (R[idx] @ U.T).amax(1).clamp_min(0)
            lb[idx], method[idx] = lagrangian_bound(xt[idx], R[idx], c, Bnd), 3
    slack = 1.0 - 64 * n * np.finfo(np.float64).eps
    return (lb * slack).cpu().numpy(), method.cpu().numpy()


METHODS = {0: "none (only MSE >= 0 is proven)", 1: "exact (budget <= 1)", 2: "enumeration of supports",
           3: "restricted eigenvalue (Babel function)"}
__all__ += ["METHODS"]
