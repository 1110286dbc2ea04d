r"""The sparse dictionary-learning objective and its Q-form.

Conventions (SAELens layout): data ``X`` is ``(N, n)`` with one point per row,
codes ``Z`` are ``(N, k)`` and nonnegative, the dictionary ``W`` is ``(k, n)``
with one atom per row, the bias ``b`` is ``(n,)``. The objective is the mean

.. math::

    L(W, Z, b) = \frac1N \sum_i \|z_i W + b - x_i\|^2 + 2\lambda \|z_i\|_1 ,
    \qquad Z \ge 0,\ \|w_d\| = 1 .

Eliminating ``W`` (scale symmetry, then ridge regression) gives the Q-form

.. math::

    f(Q, b) = \frac{\lambda}{N}\Big(\operatorname{tr}\big(\tilde X^\top (Q+\lambda I)^{-1}\tilde X\big)
              + \mathbf 1^\top Q \mathbf 1\Big), \qquad \tilde X = X - \mathbf 1 b^\top,\ Q = Z Z^\top .
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from .._params import LAM, ArrayLike, Boolean, validate_params
from .._validation import (
    check_code_block,
    check_codes,
    check_data,
    check_dictionary,
    check_lam,
    check_vector,
    row_norms,
    to_numpy,
)
from ..engine import engine_for
from ..engine.local import is_dask_array, raise_nonfinite

__all__ = [
    "ObjectiveValue",
    "huber_h",
    "sae_objective",
    "unconstrained_objective",
    "balance",
    "q_objective",
    "optimal_dictionary",
]


def huber_h(r, *, lam: float):
    r"""Twice the Huber loss with threshold ``lam``, applied to distances ``r >= 0``.

    .. math:: h_\lambda(r) = r^2 \ (r \le \lambda), \qquad 2\lambda r - \lambda^2 \ (r > \lambda).

    It is the smallest value of ``||z W - v||^2 + 2 lam ||z||_1`` over unit-norm
    dictionaries and ``z >= 0`` for a vector ``v`` of norm ``r`` (theory.md §3).
    """
    r = np.asarray(r, dtype=np.float64)
    return np.where(r <= lam, r * r, 2.0 * lam * r - lam * lam)


@dataclass(frozen=True)
class ObjectiveValue:
    """Value of the SAE objective and its two parts (both means over points).

    Attributes
    ----------
    value : float
        ``reconstruction + penalty``.
    reconstruction : float
        ``mean_i ||z_i W + b - x_i||^2``.
    penalty : float
        ``2 lam mean_i sum_d z_id ||w_d||`` (the l1 penalty with atom norms folded in).
    """

    value: float
    reconstruction: float
    penalty: float

    def __float__(self) -> float:
        return float(self.value)


def _matmul_rows(Z, s: int, e: int, W: np.ndarray) -> np.ndarray:
    """``Z[s:e] @ W`` for dense or scipy-sparse ``Z``, as a dense float64 array.

    Sparse codes gather only the atoms they use (O(nnz n)), so a float32 ``W``
    is never copied whole.
    """
    if isinstance(Z, np.ndarray):
        return Z[s:e] @ np.asarray(W, dtype=np.float64)
    c = Z[s:e].tocoo()
    cols, inv = np.unique(c.col, return_inverse=True)
    S = sp.csr_array((c.data, (c.row, inv)), shape=(e - s, cols.size))
    return np.asarray(S @ np.asarray(W[cols], dtype=np.float64))


def _check_triple(X, W, Z, b, lam, nonneg=True):
    X = check_data(X)
    N, n = X.shape
    W = check_dictionary(W, n)
    Z = check_codes(Z, N, W.shape[0], nonneg=nonneg)
    b = check_vector(b, n, "b")
    lam = check_lam(lam)
    return X, W, Z, b, lam


def residual_block(Xc, b, Zc, W, out=None) -> np.ndarray:
    """``E = Xc - b - Zc W`` in float64 for one block of rows (``Zc`` dense or scipy.sparse).

    ``out``: an optional float64 array of ``Xc``'s shape to write ``E`` into.
    """
    E = np.subtract(Xc, b, out=out, dtype=np.float64)
    if W.shape[0]:
        E -= _matmul_rows(Zc, 0, Zc.shape[0], W)
    return E


def residual_pass(X, W, Z, b, fn, merge, *args, stage: str = "residuals", nonneg: bool = False):
    """One pass over the data on its engine: ``merge`` of ``fn(E, start, Zc, *args)`` over row blocks.

    ``E = X[s:e] - b - Z[s:e] W`` is the float64 residual of the block and ``Zc`` its
    codes (dense or scipy.sparse). The pass runs on :func:`widelimit.engine.engine_for`'s
    engine, so it is threaded for arrays, streamed for sources and a Dask reduction for
    ``dask.array`` data; a NaN or Inf row is reported with its shard and row, and a NaN or Inf code (a
    negative one with ``nonneg``) with its row and column of ``Z`` (:func:`widelimit._validation.check_code_block`:
    Dask blocks arrive unchecked).
    """

    def chunk(c, s, Zc):
        if W.shape[0]:
            check_code_block(Zc, s, nonneg=nonneg)  # dask blocks arrive unchecked
        E = residual_block(c, b, Zc, W)
        if not np.isfinite(E).all():
            raise_nonfinite(c, s)
        return fn(E, s, Zc, *args)

    return engine_for(X).reduce(chunk, merge, extras=(Z,), stage=stage)


def _add(a, b):
    return a + b


def _sq_norm(E, s, Zc):
    return float(np.einsum("ij,ij->", E, E))


@validate_params({"X": ArrayLike(), "W": ArrayLike(), "Z": ArrayLike(), "b": ArrayLike(), "lam": LAM, "signed": Boolean()})
def sae_objective(X, W, Z, b, *, lam, signed: bool = False) -> ObjectiveValue:
    r"""Evaluate the sparse dictionary-learning objective (theory.md §1).

    .. math:: L = \frac1N\sum_i \|z_i W + b - x_i\|^2 + \frac{2\lambda}{N}\sum_{i,d} |z_{id}|\,\|w_d\| .

    Rows of ``W`` need not have unit norm: an atom of norm ``s`` is read as the
    unit atom ``w_d / s`` with codes ``s z_d``, which leaves the reconstruction
    unchanged and makes the penalty ``2 lam z_id ||w_d||`` (SAELens'
    ``f * ||W_dec row||``). For unit rows this is exactly the objective above.

    Parameters
    ----------
    X : array (N, n)
        Data, one point per row (float32 accepted; evaluated in float64).
    W : array (k, n)
        Dictionary, one atom per row.
    Z : array (N, k) or scipy.sparse matrix
        Nonnegative codes.
    b : array (n,)
        Bias.
    lam : float
        Sparsity parameter ``lam > 0`` (SAELens ``l1_coefficient = 2 lam``).
    signed : bool, default False
        Allow codes of either sign (penalty ``|z|``); the nonnegative problem rejects negative codes.

    Returns
    -------
    ObjectiveValue
        ``value``, ``reconstruction`` and ``penalty`` (means over the N points).
    """
    X, W, Z, b, lam = _check_triple(X, W, Z, b, lam, nonneg=not signed)
    N = X.shape[0]
    norms = row_norms(W)
    rec = residual_pass(X, W, Z, b, _sq_norm, _add, nonneg=not signed)
    pen = 2.0 * lam * float(code_mass(abs(Z) if signed else Z, norms).sum())
    return ObjectiveValue(value=(rec + pen) / N, reconstruction=rec / N, penalty=pen / N)


def code_mass(Z, norms: np.ndarray) -> np.ndarray:
    """``||Z_d||_1 ||w_d||`` per atom ``d`` (the penalty's mass for unit atoms), ``Z`` nonnegative, dense, sparse
    or dask. Huge codes on tiny atoms (codes 1e308 on an atom of norm 1e-300) overflow the plain column sums:
    those are then taken of the scaled codes."""
    col = np.asarray(Z.sum(axis=0), dtype=np.float64).ravel() * norms
    if np.isfinite(col).all() or is_dask_array(Z):
        return col
    scaled = Z.multiply(norms[None, :]) if hasattr(Z, "tocoo") else Z * norms
    return np.asarray(scaled.sum(axis=0), dtype=np.float64).ravel()


def unconstrained_objective(X, W, Z, b, *, lam) -> float:
    r"""The scale-free form of the objective (theory.md §2), divided by N.

    .. math:: \frac1N\Big(\|Z W + \mathbf 1 b^\top - X\|_F^2 + \lambda\big(\|W\|_F^2 + \sum_d \|Z_d\|_1^2\big)\Big)

    It is ``>= sae_objective(X, W, Z, b, lam)`` (AM-GM on each atom) with
    equality iff every atom is balanced, ``||w_d|| = ||Z_d||_1`` (see :func:`balance`).
    """
    X, W, Z, b, lam = _check_triple(X, W, Z, b, lam)
    N = X.shape[0]
    rec = residual_pass(X, W, Z, b, _sq_norm, _add)
    col = np.asarray(Z.sum(axis=0), dtype=np.float64).ravel()
    wn = row_norms(W)
    return (rec + lam * (float(wn @ wn) + float(col @ col))) / N


def balance(W, Z):
    r"""Rescale each atom/code pair so that ``||w_d|| = ||Z_d||_1`` (reconstruction unchanged).

    With ``s_d = sqrt(||Z_d||_1 / ||w_d||)``, returns ``(W_d s_d, Z_d / s_d)``.
    Pairs with a zero atom or a zero code column are set to zero (they only
    add to the penalty). At a balanced pair :func:`unconstrained_objective`
    equals :func:`sae_objective`.
    """
    W = np.array(to_numpy(W, "W"), dtype=np.float64)
    Zarr = to_numpy(Z, "Z")
    sparse = hasattr(Zarr, "tocsc") and not isinstance(Zarr, np.ndarray)
    Z = Zarr.tocsc().astype(np.float64) if sparse else np.array(Zarr, dtype=np.float64)
    wn = np.linalg.norm(W, axis=1)
    zn = np.asarray(abs(Z).sum(axis=0), dtype=np.float64).ravel()
    live = (wn > 0) & (zn > 0)
    s = np.zeros_like(wn)
    s[live] = np.sqrt(zn[live] / wn[live])
    W = W * s[:, None]
    inv = np.zeros_like(s)
    inv[live] = 1.0 / s[live]
    if sparse:
        import scipy.sparse as sp

        Z = (Z @ sp.diags(inv)).tocsr()
    else:
        Z = Z * inv[None, :]
    return W, Z


def _check_Q(Q, N: int) -> np.ndarray:
    Q = np.asarray(to_numpy(Q, "Q"), dtype=np.float64)
    if Q.ndim != 2 or Q.shape[0] != Q.shape[1]:
        raise ValueError(f"Q must be a square (N, N) matrix, got shape {Q.shape}")
    if Q.shape[0] != N:
        raise ValueError(f"Q is {Q.shape[0]}x{Q.shape[0]} but X has N = {N} points")
    if not np.isfinite(Q).all():
        raise ValueError("Q has non-finite entries")
    scale = max(1.0, float(np.abs(Q).max()))
    if np.abs(Q - Q.T).max() > 1e-9 * scale:
        raise ValueError("Q must be symmetric")
    return 0.5 * (Q + Q.T)


@validate_params({"X": ArrayLike(), "Q": ArrayLike(), "b": [ArrayLike(), None], "lam": LAM})
def q_objective(X, Q, b, *, lam) -> float:
    r"""The Q-form of the objective with the dictionary eliminated (theory.md §2).

    .. math:: f(Q, b) = \frac{\lambda}{N}\Big(\operatorname{tr}\big(\tilde X^\top (Q+\lambda I)^{-1}\tilde X\big) + \mathbf 1^\top Q \mathbf 1\Big)

    For ``Q = Z Z^T`` with ``Z >= 0`` this is ``min_W`` of
    :func:`unconstrained_objective`, attained at :func:`optimal_dictionary`.
    It is defined (and convex) for every symmetric ``Q`` with ``Q + lam I``
    positive definite, which is what the cone relaxations use.

    Parameters
    ----------
    X : array (N, n)
    Q : array (N, N), symmetric
    b : array (n,)
    lam : float

    Returns
    -------
    float
    """
    X = check_data(X)
    N, n = X.shape
    Q = _check_Q(Q, N)
    b = check_vector(b, n, "b")
    lam = check_lam(lam)
    Xt = np.asarray(X, dtype=np.float64) - b
    C = Q + lam * np.eye(N)
    try:
        cf = scipy.linalg.cho_factor(C, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise ValueError("Q + lam*I is not positive definite (Q is not positive semidefinite)") from None
    tr = float(np.sum(Xt * scipy.linalg.cho_solve(cf, Xt, check_finite=False)))
    return lam / N * (tr + float(Q.sum()))


@validate_params({"X": ArrayLike(), "Z": ArrayLike(), "b": ArrayLike(), "lam": LAM})
def optimal_dictionary(X, Z, b, *, lam) -> np.ndarray:
    r"""The dictionary that minimises :func:`unconstrained_objective` for fixed codes and bias.

    Ridge regression (theory.md §2):

    .. math:: W^\star = (Z^\top Z + \lambda I)^{-1} Z^\top \tilde X = Z^\top (Z Z^\top + \lambda I)^{-1}\tilde X ,

    using whichever of the ``k x k`` or ``N x N`` systems is smaller. Rows are
    not unit norm; :func:`balance` and :func:`sae_objective` handle that.

    Returns
    -------
    W : array (k, n)
    """
    X = check_data(X)
    N, n = X.shape
    Zarr = to_numpy(Z, "Z")
    k = Zarr.shape[1] if getattr(Zarr, "ndim", 0) == 2 else -1
    if k < 0:
        raise ValueError(f"Z must be a 2-D array of shape (N, k), got shape {getattr(Zarr, 'shape', None)}")
    Z = check_codes(Zarr, N, k)
    if hasattr(Z, "toarray"):
        Z = Z.toarray()
    b = check_vector(b, n, "b")
    lam = check_lam(lam)
    Xt = np.asarray(X, dtype=np.float64) - b
    if k <= N:
        A = Z.T @ Z + lam * np.eye(k)
        return scipy.linalg.solve(A, Z.T @ Xt, assume_a="pos")
    A = Z @ Z.T + lam * np.eye(N)
    return Z.T @ scipy.linalg.solve(A, Xt, assume_a="pos")
