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
"""

from __future__ import annotations

import numpy as np

__all__ = ["decoder_pairs", "PAIR_BLOCK_BYTES"]

#: Most bytes of one block of cosines (float32) in the blocked search.
PAIR_BLOCK_BYTES = 1 << 26  # 64 MiB


def _top(a, b, c, max_pairs, k):
    """The ``max_pairs`` entries of largest ``|c|`` (ties: the first in row-major order of ``(a, b)``), row-major."""
    pos = a * k + b
    if a.size > max_pairs:
        keep = np.lexsort((pos, -np.abs(c)))[:max_pairs]
        a, b, c, pos = a[keep], b[keep], c[keep], pos[keep]
    order = np.argsort(pos, kind="stable")
    return a[order], b[order], c[order]


def decoder_pairs(U, lo: float, hi: float, max_pairs: int, device="cpu", *, block_rows: int | None = None):
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
    rows = int(block_rows or max(1, PAIR_BLOCK_BYTES // (4 * k)))
    slack = 2.0 * n * float(np.finfo(np.float32).eps) + 1e-6  # float32 rounding of a unit-vector dot product
    Ut = torch.as_tensor(U, dtype=torch.float32, device=device)
    sa, sb, sc = empty
    for s in range(0, k, rows):
        Gb = Ut[s : s + rows] @ Ut[s:].T  # rows s.., columns s..: the upper triangle (and the diagonal block)
        m = (Gb >= hi - slack) | (Gb <= lo + slack)
        m = torch.triu(m, diagonal=1)  # b > a only: not (a, a), and each pair once
        i, j = torch.nonzero(m, as_tuple=True)
        if not i.numel():
            continue
        a, b = (i + s).cpu().numpy().astype(np.int64), (j + s).cpu().numpy().astype(np.int64)
        c = np.concatenate([np.einsum("ij,ij->i", U[a[q : q + 8192]], U[b[q : q + 8192]])  # exact, float64
                            for q in range(0, a.size, 8192)])
        ok = (c >= hi) | (c <= lo)
        a, b, c = np.concatenate([a[ok], b[ok]]), np.concatenate([b[ok], a[ok]]), np.concatenate([c[ok], c[ok]])
        a, b, c = _top(a, b, c, max_pairs, k)
        sa, sb, sc = _top(np.concatenate([sa, a]), np.concatenate([sb, b]), np.concatenate([sc, c]), max_pairs, k)
    return sa, sb, sc
