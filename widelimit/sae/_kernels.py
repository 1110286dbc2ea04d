r"""CPU kernels of :func:`widelimit.sae.certify.certify_sae`: the products with the sparse codes (numba).

An SAE's codes are sparse (``L0`` of a few dozen among hundreds or thousands of features), so
the two products with them cost ``O(L0 n)`` per token instead of the ``O(k n)`` of a dense
matrix product:

* :func:`residuals`: ``r_i = x_i - b - sum_d z_id u_d`` and, in the same pass, the per-token
  sums the metrics and the coding certificate need (``||x||^2``, ``||x_hat||^2``,
  ``<x, x_hat>``, ``||r||^2``, ``<r, x - b>`` with ``x_hat = x - r``);
* :func:`entry_dots`: the entries ``<r_i, u_d>`` of ``R U^T`` at given positions (the active codes'
  correlations and the candidates of a float32 product's column maxima), without gathering rows;
* :func:`add_codes_t_residuals`: ``out += Z^T R`` (per feature ``sum_i z_id r_i``, the
  atom gradient of theory.md §5.2), the tokens split between threads with private accumulators.

Every sum is a plain float64 loop; the codes are a CSR matrix (``indptr, indices, data``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp

__all__ = ["residuals", "add_codes_t_residuals", "token_sums", "entry_dots"]

_JIT = dict(nogil=True, cache=True)


@nb.njit(parallel=True, **_JIT)
def _residuals(x, b, U, indptr, indices, data, R, sums):  # pragma: no cover - compiled
    m, n = x.shape
    for i in nb.prange(m):
        for j in range(n):
            R[i, j] = x[i, j] - b[j]
        for p in range(indptr[i], indptr[i + 1]):
            z = data[p]
            d = indices[p]
            for j in range(n):
                R[i, j] -= z * U[d, j]
        xx = hh = xh = rr = rt = 0.0
        for j in range(n):
            r = R[i, j]
            xj = x[i, j]
            h = xj - r
            xx += xj * xj
            hh += h * h
            xh += xj * h
            rr += r * r
            rt += r * (xj - b[j])
        sums[i, 0], sums[i, 1], sums[i, 2], sums[i, 3], sums[i, 4] = xx, hh, xh, rr, rt


def residuals(x, b, U, Z):
    r"""Residuals ``R = x - b - Z U`` of CSR codes ``Z`` (m, k) on unit atoms ``U`` (k, n), float64.

    Returns ``(R, sums)`` with ``sums[:, 0..4] = ||x_i||^2, ||x_hat_i||^2, <x_i, x_hat_i>,
    ||r_i||^2, <r_i, x_i - b>`` (``x_hat = x - r``, the reconstruction ``b + z_i U``).
    """
    Z = sp.csr_array(Z)
    x = np.ascontiguousarray(x, dtype=np.float64)
    m, n = x.shape
    R = np.empty((m, n))
    sums = np.empty((m, 5))
    _residuals(x, np.ascontiguousarray(b, dtype=np.float64), np.ascontiguousarray(U, dtype=np.float64),
               Z.indptr.astype(np.int64), Z.indices.astype(np.int64), Z.data.astype(np.float64), R, sums)
    return R, sums


@nb.njit(parallel=True, **_JIT)
def _add_t(indptr, indices, data, R, out, n_parts):  # pragma: no cover - compiled
    m, n = R.shape
    k = out.shape[0]
    extra = np.zeros((n_parts - 1, k, n))  # private accumulators of parts 1.. (part 0 adds into out)
    chunk = (m + n_parts - 1) // n_parts
    for t in nb.prange(n_parts):
        acc = out if t == 0 else extra[t - 1]
        for i in range(t * chunk, min(m, (t + 1) * chunk)):
            ri = R[i]
            for p in range(indptr[i], indptr[i + 1]):
                z = data[p]
                row = acc[indices[p]]
                for j in range(n):
                    row[j] += z * ri[j]
    for t in range(n_parts - 1):
        out += extra[t]


#: Memory the private accumulators of :func:`add_codes_t_residuals` may take (bytes).
ACCUMULATOR_BYTES = 1 << 28


def add_codes_t_residuals(Z, R, out) -> None:
    """``out += Z^T R`` in place for CSR codes ``Z`` (m, k) and residuals ``R`` (m, n); ``out`` (k, n) float64.

    The tokens are split between threads, each adding into its own (k, n) accumulator (summed at
    the end; 4x faster on 2 cores than splitting the columns of ``out``, whose inner loops do not
    vectorise), as many as :data:`ACCUMULATOR_BYTES` allows.
    """
    Z = sp.csr_array(Z)
    k, n = out.shape
    parts = max(1, min(nb.get_num_threads(), 1 + ACCUMULATOR_BYTES // max(1, 8 * k * n), Z.shape[0]))
    _add_t(Z.indptr.astype(np.int64), Z.indices.astype(np.int64), Z.data.astype(np.float64),
           np.ascontiguousarray(R, dtype=np.float64), out, parts)


def token_sums(x, xt, R):
    """The per-token sums of :func:`residuals` from torch tensors ``x``, ``xt = x - b`` and ``R`` (any device)."""
    import torch

    xh = x - R
    return torch.stack([(x * x).sum(1), (xh * xh).sum(1), (x * xh).sum(1), (R * R).sum(1), (R * xt).sum(1)], 1)


@nb.njit(parallel=True, **_JIT)
def _entry_dots(R, U, rows, cols, out):  # pragma: no cover - compiled
    n = R.shape[1]
    for j in nb.prange(rows.shape[0]):
        r, d = rows[j], cols[j]
        acc = 0.0
        for p in range(n):
            acc += R[r, p] * U[d, p]
        out[j] = acc


def entry_dots(R, U, rows, cols):
    """``<R[rows[j]], U[cols[j]]>`` for every ``j``: the entries of ``R U^T`` at ``(rows, cols)`` (float64 numpy).

    A plain float64 loop per entry (``O(n)``), no gathered ``(len(rows), n)`` copies: for the active entries of
    1,000 tokens at L0 100 and d_in 768 those were 2 x 614 MB, and the exact part of the float32 KKT product
    (:func:`widelimit.sae.parts.code_conditions_f32`) took 5x the product itself."""
    out = np.empty(len(rows))
    _entry_dots(np.ascontiguousarray(R, dtype=np.float64), np.ascontiguousarray(U, dtype=np.float64),
                np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), out)
    return out
