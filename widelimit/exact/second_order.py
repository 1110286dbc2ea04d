r"""The joint second-order test: the Hessian of the reduced objective in the atoms and the bias (theory.md §5.4).

With every point's code re-optimised on its support ``S_i = {d : z_id > 0}``, the objective is a
function of the atoms and the bias alone,

.. math:: F(W, b) = \frac1N \sum_i \min_{z_{S_i}} \Big( \|x_i - b - z_{S_i} W_{S_i}\|^2 + 2\lambda \sum_{d \in S_i} z_d \Big),

smooth near a triple whose active codes are positive. Each atom ``w_d`` moves on its sphere,
``w_d(t) = (w_d + B_d t_d) / ||w_d + B_d t_d||`` with ``B_d`` an orthonormal basis of ``w_d^⟂`` (a
second-order retraction), and the bias moves freely. Per point, with ``r`` its residual, the Hessian of
``P_i`` in ``(t, b, z)`` is

- ``2 J^T J`` with ``J = [-z_d B_d (d in S_i), -I, -w_d (d in S_i)]`` (the Jacobian of ``r``),
- plus ``2 z_d <r, w_d> I`` on the ``(t_d, t_d)`` block (the sphere's curvature),
- plus ``-2 B_d^T r`` on the ``(t_d, z_d)`` block (the atom's turn times its code),

and the code block is eliminated by its Schur complement (``H_zz = 2 W_S W_S^T``). The sum over the
points, divided by ``N``, is the Hessian of ``F``; a negative eigenvalue is a direction along which the
atoms and the bias move together and ``L`` falls at second order, even where every single atom, turned
alone, has positive curvature. :func:`joint_witness` follows that direction with a line search and
re-optimised codes, and keeps the result only if its recomputed objective is lower (theory.md §5.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..coding.fista import fista_codes as optimal_codes
from .objective import sae_objective

__all__ = ["JointCurvature", "joint_curvature", "joint_witness", "merge_parallel", "tangent_bases"]


@dataclass(frozen=True)
class JointCurvature:
    """Least eigenpair of the reduced objective's Hessian over the atoms and the bias (theory.md §5.4).

    Attributes
    ----------
    value : float
        Least eigenvalue of ``H`` (``nan`` when not computed); the second derivative of ``F`` along the
        unit direction ``direction`` (angles in radians, the bias in data units).
    direction : ndarray (dim,) or None
        The eigenvector: blocks ``t_d`` (``n - 1`` each, in the bases ``bases``) for ``features``, then ``b``.
    features : ndarray (K,) int
        The atoms the Hessian covers (every live atom, or those with the least own curvature when the
        full Hessian is larger than the budget).
    bases : ndarray (K, n, n-1)
    complete : bool
        ``True`` when every live atom is covered (the test is the full joint test).
    hessian : ndarray (dim, dim) or None
        The Hessian itself, in the same coordinates.
    """

    value: float
    direction: np.ndarray | None
    features: np.ndarray
    bases: np.ndarray
    complete: bool
    hessian: np.ndarray | None = None

    def feature_weights(self) -> np.ndarray:
        """Squared norm of each covered atom's block of ``direction`` (the bias takes the rest)."""
        if self.direction is None:
            return np.zeros(0)
        K = self.features.size
        m = self.bases.shape[2] if K else 0
        return np.sum(self.direction[: K * m].reshape(K, m) ** 2, axis=1) if K else np.zeros(0)


def tangent_bases(Wu: np.ndarray) -> np.ndarray:
    """``(k, n, n-1)``: an orthonormal basis of ``w_d^⟂`` for every unit row ``w_d`` (Householder)."""
    k, n = Wu.shape
    out = np.empty((k, n, n - 1))
    for d in range(k):
        Q = np.linalg.qr(np.column_stack([Wu[d], np.eye(n)]), mode="complete")[0]
        out[d] = Q[:, 1:]
    return out


def _point_block(y, r, Wd, zd, Bd, lam):
    """The reduced Hessian of one point in ``(t_d for d in the point's covered support, b)``.

    ``Wd (s, n)``, ``zd (s,)``: the point's active atoms and codes; ``Bd``: the bases of the covered ones
    (``None`` for an atom that is held fixed). Returns the ``(c (n-1) + n)``-square block.
    """
    n = y.size
    s = Wd.shape[0]
    cov = [j for j in range(s) if Bd[j] is not None]
    m = n - 1
    dim = len(cov) * m + n
    Jx = np.zeros((n, dim))
    D = np.zeros(dim)
    C = np.zeros((dim, s))
    for c, j in enumerate(cov):
        sl = slice(c * m, (c + 1) * m)
        Jx[:, sl] = -zd[j] * Bd[j]
        D[sl] = 2.0 * zd[j] * float(r @ Wd[j])
        C[sl, j] = -2.0 * (Bd[j].T @ r)
    Jx[:, len(cov) * m:] = -np.eye(n)
    Jz = -Wd.T
    Hxx = 2.0 * Jx.T @ Jx + np.diag(D)
    Hxz = 2.0 * Jx.T @ Jz + C
    Hzz = 2.0 * Wd @ Wd.T
    return Hxx - Hxz @ np.linalg.solve(Hzz, Hxz.T), cov


def _add_single_atom_rows(H, R, Wu, atom, z, pos, bases, n):
    """The points with one active atom, summed per atom in closed form (the Schur complement of
    :func:`_point_block` with ``s = 1``): ``(t_d, t_d)``: ``2 sum z (z + <r, w_d>) I - 2 B_d^T (sum r r^T) B_d``;
    ``(t_d, b)``: ``2 (sum z) B_d^T + 2 B_d^T (sum r) w_d^T``; ``(b, b)``: ``2 (I - w_d w_d^T)`` per point."""
    m = n - 1
    K = bases.shape[0]
    bb = slice(K * m, K * m + n)
    cnt = np.bincount(atom, minlength=Wu.shape[0]).astype(np.float64)
    H[bb, bb] += 2.0 * (cnt.sum() * np.eye(n) - (Wu.T * cnt) @ Wu)
    covered = pos[atom] >= 0
    if not covered.any():
        return
    R, atom, z = R[covered], atom[covered], z[covered]
    c = pos[atom]
    zz = np.bincount(c, weights=z * (z + np.einsum("ij,ij->i", R, Wu[atom])), minlength=K)
    zs = np.bincount(c, weights=z, minlength=K)
    rs = np.zeros((K, n))
    np.add.at(rs, c, R)
    RR = np.zeros((K, n, n))
    np.add.at(RR, c, R[:, :, None] * R[:, None, :])
    for j in np.unique(c):
        B = bases[j]
        d = np.flatnonzero(pos == j)[0]
        sl = slice(j * m, (j + 1) * m)
        H[sl, sl] += 2.0 * zz[j] * np.eye(m) - 2.0 * B.T @ RR[j] @ B
        tb = 2.0 * zs[j] * B.T + 2.0 * np.outer(B.T @ rs[j], Wu[d])
        H[sl, bb] += tb
        H[bb, sl] += tb.T


def merge_parallel(Wu, Zs, cos_tol: float = 1e-10):
    """Codes with every group of equal unit atoms (``<w_d, w_e> >= 1 - cos_tol``) carried by its first atom.

    The objective is unchanged (same reconstruction, same penalty); the other copies become dead atoms, so a
    duplicated atom is a free slot (theory.md §5.4), not a singular code Gram in the joint test.
    """
    S = np.asarray(Zs.sum(axis=0)).ravel()
    live = np.flatnonzero(S > 0)
    if live.size < 2:
        return Zs
    C = Wu[live] @ Wu[live].T
    target = np.arange(Wu.shape[0])
    for a in range(live.size):
        if target[live[a]] != live[a]:
            continue
        for c in np.flatnonzero(C[a, a + 1:] >= 1.0 - cos_tol) + a + 1:
            target[live[c]] = live[a]
    if np.all(target == np.arange(Wu.shape[0])):
        return Zs
    M = sp.csr_array((np.ones(target.size), (np.arange(target.size), target)), shape=(target.size, target.size))
    out = sp.csr_array(Zs @ M)
    out.eliminate_zeros()
    return out


def joint_curvature(X, Wu, Zs, b, lam, *, own_curvature=None, max_dim: int = 400) -> JointCurvature:
    r"""The least eigenvalue of the Hessian of the reduced objective ``F(W, b)`` (theory.md §5.4).

    Equal atoms sharing points are merged first (:func:`merge_parallel`); if a point's active atoms are
    still nearly dependent (their Gram's condition number above ``1e6``, i.e. two of them within about
    ``2e-3`` rad) the supports are not stable under the moves the test is about and the value is NaN
    (no test).

    Parameters
    ----------
    X : array (N, n)
    Wu : array (k, n)
        Unit atoms.
    Zs : scipy.sparse (N, k)
        Codes of the unit atoms.
    b : array (n,)
    lam : float
    own_curvature : array (k,), optional
        Each atom's curvature turned alone; when the full Hessian would exceed ``max_dim`` the atoms with
        the least of it are covered first (the others are held fixed, their codes still re-optimised).
    max_dim : int
        Largest Hessian formed: ``K (n - 1) + n <= max_dim``.

    Returns
    -------
    JointCurvature
    """
    X = np.asarray(X, dtype=np.float64)
    N, n = X.shape
    Zs = merge_parallel(Wu, sp.csr_array(Zs))
    S = np.asarray(Zs.sum(axis=0)).ravel()
    live = np.flatnonzero(S > 0)
    cap = max(0, (int(max_dim) - n) // max(1, n - 1)) if n > 1 else 0
    feats = live
    if feats.size > cap:
        key = np.zeros(feats.size) if own_curvature is None else np.nan_to_num(np.asarray(own_curvature)[feats])
        feats = np.sort(feats[np.argsort(key, kind="stable")[:cap]])
    complete = feats.size == live.size
    if n < 2 or max_dim < n:
        return JointCurvature(math.nan, None, feats[:0], np.zeros((0, n, max(n - 1, 0))), False)
    bases = tangent_bases(Wu[feats])
    pos = -np.ones(Wu.shape[0], dtype=np.int64)
    pos[feats] = np.arange(feats.size)
    m = n - 1
    dim = feats.size * m + n
    H = np.zeros((dim, dim))
    E = X - b - Zs @ Wu
    bb = slice(feats.size * m, dim)
    nnz = np.diff(Zs.indptr)
    H[bb, bb] += 2.0 * np.sum(nnz == 0) * np.eye(n)
    one = np.flatnonzero(nnz == 1)
    _add_single_atom_rows(H, E[one], Wu, Zs.indices[Zs.indptr[one]], Zs.data[Zs.indptr[one]], pos, bases, n)
    for i in np.flatnonzero(nnz > 1):  # points with several active atoms: the general Schur complement
        lo, hi = Zs.indptr[i], Zs.indptr[i + 1]
        sup = Zs.indices[lo:hi]
        if np.linalg.cond(Wu[sup] @ Wu[sup].T) > 1e6:  # (nearly) dependent active atoms: no smooth F here
            return JointCurvature(math.nan, None, feats, bases, False)
        Bd = [bases[pos[d]] if pos[d] >= 0 else None for d in sup]
        blk, cov = _point_block(X[i] - b, E[i], Wu[sup], Zs.data[lo:hi], Bd, lam)
        idx = np.concatenate([np.arange(pos[sup[j]] * m, pos[sup[j]] * m + m) for j in cov]
                             + [np.arange(feats.size * m, dim)]).astype(np.int64)
        H[np.ix_(idx, idx)] += blk
    H /= N
    w, V = np.linalg.eigh(0.5 * (H + H.T))
    return JointCurvature(float(w[0]), V[:, 0], feats, bases, bool(complete), H)


def move(Wu, b, jc: JointCurvature, tau: float):
    """Atoms and bias moved by ``tau`` along ``jc.direction`` (atoms renormalised onto their spheres)."""
    W2 = Wu.copy()
    n = Wu.shape[1]
    m = n - 1
    v = jc.direction
    for c, d in enumerate(jc.features):
        u = Wu[d] + tau * (jc.bases[c] @ v[c * m:(c + 1) * m])
        W2[d] = u / np.linalg.norm(u)
    return W2, b + tau * v[jc.features.size * m:]


def joint_witness(X, Wu, Zs, b, lam, jc: JointCurvature, *, coding_tol: float = 1e-9, tau_max: float = 0.5,
                  steps: int = 40):
    r"""A ``(W', Z', b')`` along the negative-curvature direction of ``jc`` with a lower objective, or ``None``.

    Steps ``tau = tau_max 0.7^j`` and both signs are tried; at each, every row's code is re-optimised
    (:func:`widelimit.optimal_codes`, warm-started at the old codes, each row keeping the better of the two),
    and the first step whose objective, recomputed by :func:`widelimit.sae_objective`, is below the
    input's is returned with that value.
    """
    if jc.direction is None or not math.isfinite(jc.value) or jc.value >= 0:
        return None
    X = np.asarray(X, dtype=np.float64)
    base = float(sae_objective(X, Wu, Zs, b, lam=lam).value)
    for j in range(steps):
        tau = tau_max * 0.7 ** j
        for sgn in (1.0, -1.0):
            W2, b2 = move(Wu, b, jc, sgn * tau)
            Z2 = _recode_all(X, W2, Zs, b2, lam, coding_tol)
            v2 = float(sae_objective(X, W2, Z2, b2, lam=lam).value)
            if v2 < base - 1e-13 * max(1.0, abs(base)):
                return (W2, Z2, b2), v2
    return None


def _recode_all(X, W2, Zs, b2, lam, tol):
    """Optimal codes of every row for ``(W2, b2)``, each row keeping ``Zs``'s code where that is better."""
    res = optimal_codes(X, W2, b2, lam=lam, tol=tol, Z0=Zs, dtype="float64", device="cpu")
    Znew = sp.csr_array(res.codes)

    def per_row(Zc):
        E = X - b2 - Zc @ W2
        return np.einsum("ij,ij->i", E, E) + 2.0 * lam * np.asarray(Zc.sum(axis=1)).ravel()

    keep_old = per_row(sp.csr_array(Zs)) < per_row(Znew)
    if not keep_old.any():
        return Znew
    rows_new = sp.diags_array((~keep_old).astype(np.float64))
    rows_old = sp.diags_array(keep_old.astype(np.float64))
    out = sp.csr_array(rows_new @ Znew + rows_old @ sp.csr_array(Zs))
    out.eliminate_zeros()
    return out
