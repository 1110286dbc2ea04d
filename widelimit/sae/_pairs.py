r"""Decoder pairs for the antipodal and absorption flags, by a blocked search (no ``d_sae x d_sae`` matrix).

A pair ``(a, b)``, ``a != b``, is a candidate when the cosine of its unit atoms is extreme:
``<u_a, u_b> <= lo`` (antipodal, theory.md §6) or ``>= hi`` (absorption). The search forms
``G = U U^T`` one block of rows at a time, upper triangle only (``G`` is symmetric: the block of
rows ``[s, s + rows)`` is multiplied by the atoms ``s, s + 1, ...`` alone, a matrix product
``U_block U_{s:}^T`` in float32 on the device, at most ``block x d_sae`` entries:
:data:`PAIR_BLOCK_BYTES`), keeps in each block only the entries beyond the thresholds, both orders
``(a, b)`` and ``(b, a)`` of each, at most ``max_pairs`` of them (the most extreme), and merges
them into the running selection of the ``max_pairs`` most extreme pairs (ties by row-major
position). The candidates' cosines are then recomputed exactly in float64 and filtered again, so a
float32 rounding near a threshold can only add a candidate that the float64 test then drops; the float32 screen uses
thresholds widened by a bound on its rounding (``2 n eps32``, ``|<u_a, u_b>| <= 1``), so no pair
beyond a threshold in float64 is missed. Memory: ``O(block * d_sae + max_pairs)``;
``d_sae^2 d_in / 2`` multiply-adds (the upper triangle: the one quadratic cost of the certification,
a property of the decoder, computed once per SAE; docs/sae_certification.md gives its share).

At the widths SAEs are trained at the full search can cost more than the rest of a certification on a few
thousand tokens (131,072 x 768: 6.6e12 multiply-adds, ~30 forward passes over 2,000 tokens). Given a budget
of multiply-adds, :func:`pair_rows` picks a seeded random subset of ``m`` atoms whose rows ``U_R U^T``
(``m d_sae d_in`` multiply-adds) fit it; :func:`decoder_pairs` with ``rows`` then finds every extreme pair
with at least one atom in that subset (each pair once, both orders), so the flags are complete for those
atoms and a uniform sample of the rest.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["decoder_pairs", "pair_rows", "PAIR_BLOCK_BYTES", "PAIR_FULL_MADDS"]

#: Most bytes of one block of cosines (float32) in the blocked search.
PAIR_BLOCK_BYTES = 1 << 26  # 64 MiB

#: Multiply-adds the full search may always take, whatever the budget (6.9e10: 16,384 x 512, ~1-2 s on one core).
PAIR_FULL_MADDS = 1 << 36


def pair_rows(k: int, n: int, budget: float | None, seed: int = 0):
    """The atoms whose pairs a search within ``budget`` multiply-adds covers: ``None`` (all) or sorted indices.

    Parameters
    ----------
    k, n : int
        Atoms and their dimension.
    budget : float or None
        Most multiply-adds; ``None``: no bound. The full search (``k^2 n / 2``) runs when it fits the
        budget or :data:`PAIR_FULL_MADDS`; else ``m = budget / (k n)`` atoms (at least 1), drawn with ``seed``.

    Returns
    -------
    None or int64 array
    """
    full = 0.5 * k * k * n
    if budget is None or full <= max(float(budget), float(PAIR_FULL_MADDS)):
        return None
    m = max(1, min(k, int(float(budget) // (k * n))))
    return np.sort(np.random.default_rng(seed).choice(k, m, replace=False)).astype(np.int64)


def _top(a, b, c, max_pairs, k):
    """The ``max_pairs`` entries of largest ``|c|`` (ties: the first in row-major order of ``(a, b)``), row-major."""
    pos = a * k + b
    if a.size > max_pairs:
        keep = np.lexsort((pos, -np.abs(c)))[:max_pairs]
        a, b, c, pos = a[keep], b[keep], c[keep], pos[keep]
    order = np.argsort(pos, kind="stable")
    return a[order], b[order], c[order]


def decoder_pairs(U, lo: float, hi: float, max_pairs: int, device="cpu", *, block_rows: int | None = None,
                  rows=None):
    """Pairs ``(a, b)``, ``a != b``, with ``cos(u_a, u_b) >= hi`` or ``<= lo`` (both orders), most extreme first kept.

    Parameters
    ----------
    U : ndarray (k, n) float64
        Unit atoms.
    lo, hi : float
        Antipodal and absorption thresholds.
    max_pairs : int
        Most pairs returned (those with the largest ``|cos|``).
    device : torch device or str
        Where the block products run.
    block_rows : int, optional
        Rows per block (default: :data:`PAIR_BLOCK_BYTES` of float32 cosines).
    rows : int array, optional
        Search only the pairs with at least one atom among these (sorted, distinct; :func:`pair_rows`):
        ``len(rows) d_sae d_in`` multiply-adds. Default: all pairs.

    Returns
    -------
    a, b : int arrays, c : float64 array
        The pairs and their exact cosines, in row-major order of ``(a, b)``.
    """
    import torch

    k, n = U.shape
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    if max_pairs <= 0 or k < 2:
        return empty
    step = int(block_rows or max(1, PAIR_BLOCK_BYTES // (4 * k)))
    slack = 2.0 * n * float(np.finfo(np.float32).eps) + 1e-6  # float32 rounding of a unit-vector dot product
    Ut = torch.as_tensor(U, dtype=torch.float32, device=device)
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        chosen = torch.zeros(k, dtype=torch.bool, device=device)
        chosen[torch.as_tensor(rows, device=device)] = True
    sa, sb, sc = empty
    pend = []  # blocks' pairs not yet merged into the selection
    for s in range(0, k if rows is None else rows.size, step):
        if rows is None:
            Gb = Ut[s : s + step] @ Ut[s:].T  # rows s.., columns s..: the upper triangle (and the diagonal block)
            m = (Gb >= hi - slack) | (Gb <= lo + slack)
            m = torch.triu(m, diagonal=1)  # b > a only: not (a, a), and each pair once
        else:  # rows R[s:s+step] against every atom; a pair inside R once (from its smaller atom), not (a, a)
            r = torch.as_tensor(rows[s : s + step], device=device)
            Gb = Ut[r] @ Ut.T
            m = (Gb >= hi - slack) | (Gb <= lo + slack)
            m &= ~(chosen[None, :] & (torch.arange(k, device=device)[None, :] <= r[:, None]))
        i, j = torch.nonzero(m, as_tuple=True)
        if not i.numel():
            continue
        # only candidates that can still enter the selection get the exact float64 cosine: the float32 |cos| is
        # within slack of it, so a pair below the running selection's smallest |cos| minus slack, or (when a block
        # holds more) below the block's (max_pairs / 2)-th largest float32 |cos| minus 2 slack, cannot be among
        # the max_pairs most extreme (a coherent ReLU decoder at 16,384 x 384 had millions of pairs at cos >= 0.5:
        # their float64 recompute and merges took 2 s of a 3.3 s search)
        v = Gb[i, j].abs()
        cut = -math.inf
        if sc.size >= max_pairs:
            cut = float(np.abs(sc).min()) - slack
        half = (max_pairs + 1) // 2  # (each pair enters in both orders)
        if v.numel() > half:
            cut = max(cut, float(torch.topk(v, half, sorted=False).values.min()) - 2.0 * slack)
        if cut > -math.inf:
            keep = v >= cut
            i, j = i[keep], j[keep]
            if not i.numel():
                continue
        if rows is None:
            a, b = (i + s).cpu().numpy().astype(np.int64), (j + s).cpu().numpy().astype(np.int64)
        else:
            a, b = rows[s : s + step][i.cpu().numpy()], j.cpu().numpy().astype(np.int64)
        c = np.concatenate([np.einsum("ij,ij->i", U[a[q : q + 8192]], U[b[q : q + 8192]])  # exact, float64
                            for q in range(0, a.size, 8192)])
        ok = (c >= hi) | (c <= lo)
        pend.append((np.concatenate([a[ok], b[ok]]), np.concatenate([b[ok], a[ok]]), np.concatenate([c[ok], c[ok]])))
        if sum(p[0].size for p in pend) > 3 * max_pairs:  # merged when they outgrow the selection (a sort each)
            sa, sb, sc = _merge(sa, sb, sc, pend, max_pairs, k)
    return _merge(sa, sb, sc, pend, max_pairs, k)


def _merge(sa, sb, sc, pend, max_pairs, k):
    """The selection ``(sa, sb, sc)`` and the pending blocks' pairs (``pend``, emptied), reduced to the ``max_pairs``
    most extreme."""
    a, b, c = (np.concatenate([x] + [p[i] for p in pend]) for i, x in enumerate((sa, sb, sc)))
    pend.clear()
    return _top(a, b, c, max_pairs, k)
