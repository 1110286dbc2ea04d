r"""Witnesses for :func:`widelimit.feature_stability` (theory.md §5.5).

Each failed condition of theory.md §5.2-§5.4 names a move; the functions here build it as a full
``(W', Z', touched rows)`` — a code moved to its 1-D optimum, an atom turned (line search on the
angle, the codes of its rows 1-D optimal on the turned atom), a child turned toward its parent
(absorption), a dead atom re-aimed at the longest residual, a feature split into a dead slot — and
re-optimise the touched rows' codes (:func:`widelimit.optimal_codes`, keeping each row's code where
that is better). The caller keeps a move only if the recomputed objective is strictly lower.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from ..coding.fista import fista_codes as optimal_codes

__all__ = ["candidates", "recode"]



def _point_values(X, Wu, Zs, b, lam, rows):
    """float64 ``P_i`` for the given rows."""
    Zc = Zs[rows]
    E = np.asarray(X[rows], dtype=np.float64) - b - Zc @ Wu
    return np.einsum("ij,ij->i", E, E) + 2.0 * lam * np.asarray(Zc.sum(axis=1)).ravel()


def _set_column(Zs, d, rows, vals):
    """``Zs`` with column ``d`` set to ``vals`` on ``rows`` and to 0 elsewhere (a new CSR array)."""
    Zl = Zs.tolil(copy=True)
    Zl[:, [d]] = 0.0
    if len(rows):
        Zl[rows, [d]] = vals[:, None] if vals.ndim == 1 else vals
    out = sp.csr_array(Zl)
    out.eliminate_zeros()
    return out


def _best_angle(rho, zold, w, v, lam, theta_max):
    """Line search for ``u(theta) = cos w + sin v`` serving rows with residual-without-``d`` ``rho``.

    Every row moves to the 1-D optimal code on ``u`` (the old atom is gone); returns the angle with
    the largest decrease and that change of ``sum P_i`` (``(0, 0)`` when no angle helps).
    """
    old = -2.0 * zold * (rho @ w) + zold * zold + 2.0 * lam * zold
    best = (0.0, 0.0)
    for j in range(40):
        th = theta_max * 0.7 ** j
        u = math.cos(th) * w + math.sin(th) * v
        new = -np.maximum(rho @ u - lam, 0.0) ** 2
        ch = float(np.sum(new - old))
        if ch < best[1]:
            best = (th, ch)
    return best


def _turn(Wu, d, v, theta):
    W2 = Wu.copy()
    u = math.cos(theta) * Wu[d] + math.sin(theta) * v
    W2[d] = u / np.linalg.norm(u)
    return W2


def recode(X, W2, Zs2, b, lam, rows, tol):
    """Re-optimise the codes of ``rows`` for ``W2``; keep each row's given code where that is better."""
    if len(rows) == 0:
        return Zs2
    rows = np.asarray(rows)
    old = _point_values(X, W2, Zs2, b, lam, rows)
    res = optimal_codes(np.asarray(X[rows], dtype=np.float64), W2, b, lam=lam, tol=tol, Z0=Zs2[rows], dtype="float64",
                        device="cpu")
    Znew = sp.csr_array(res.codes)
    new = np.einsum("ij,ij->i", *(2 * [np.asarray(X[rows], dtype=np.float64) - b - Znew @ W2])) \
        + 2.0 * lam * np.asarray(Znew.sum(axis=1)).ravel()
    better = new < old
    if not better.any():
        return Zs2
    Zl = Zs2.tolil(copy=True)
    for j in np.flatnonzero(better):
        Zl[[rows[j]], :] = Znew[[j]].toarray()
    out = sp.csr_array(Zl)
    out.eliminate_zeros()
    return out


def _rotation_witness(X, Wu, Zs, b, lam, d, v, theta_max, extra_rows=()):
    """Turn atom ``d`` toward unit ``v ⟂ w_d``; its active rows (and ``extra_rows``) re-coded 1-D."""
    col = Zs[:, [d]].tocsc()
    rows = np.union1d(col.nonzero()[0], np.asarray(extra_rows, dtype=np.int64)).astype(np.int64)
    if rows.size == 0:
        return None
    zold = np.asarray(col[rows].toarray()).ravel()
    Zr = Zs[rows]
    rho = np.asarray(X[rows], dtype=np.float64) - b - Zr @ Wu + zold[:, None] * Wu[d]
    th, ch = _best_angle(rho, zold, Wu[d], v, lam, theta_max)
    if th == 0.0:
        return None
    W2 = _turn(Wu, d, v, th)
    u = W2[d]
    znew = np.maximum(rho @ u - lam, 0.0)  # 1-D optimal code of each row on the turned atom
    Z2 = _set_column(Zs, d, rows, znew)
    return W2, Z2, rows


def _new_atom_witness(X, Wu, Zs, b, lam, f, u, rows, donor=None):
    """Put unit ``u`` into dead slot ``f`` and let ``rows`` use it (moving ``donor``'s code there)."""
    W2 = Wu.copy()
    W2[f] = u
    Zl = Zs.tolil(copy=True)
    rows = np.asarray(rows, dtype=np.int64)
    Xr = np.asarray(X[rows], dtype=np.float64)
    R = Xr - b - Zs[rows] @ Wu
    zd = np.asarray(Zs[rows][:, [donor]].toarray()).ravel() if donor is not None else np.zeros(rows.size)
    rho = R + zd[:, None] * Wu[donor] if donor is not None else R
    znew = np.maximum(rho @ u - lam, 0.0)
    old = -2.0 * zd * (rho @ Wu[donor]) + zd * zd + 2.0 * lam * zd if donor is not None else np.zeros(rows.size)
    take = -znew ** 2 < old
    for j in np.flatnonzero(take):
        if donor is not None:
            Zl[rows[j], donor] = 0.0
        Zl[rows[j], f] = znew[j]
    Z2 = sp.csr_array(Zl)
    Z2.eliminate_zeros()
    return W2, Z2, rows[take]


def _tangent(w, v):
    v = v - (v @ w) * w
    nv = np.linalg.norm(v)
    return v / nv if nv > 0 else None


def _top_direction(X, Wu, Zs, b, d):
    """Top eigenvector of ``M_d = P (sum_{A_d} r r^T) P`` (the negative-curvature direction)."""
    rows = Zs[:, [d]].tocsc().nonzero()[0]
    R = np.asarray(X[rows], dtype=np.float64) - b - Zs[rows] @ Wu
    P = R - np.outer(R @ Wu[d], Wu[d])
    if not P.size:
        return None
    v = np.linalg.svd(P, full_matrices=False)[2][0]
    return _tangent(Wu[d], v)


def candidates(X, Wu, Zs, b, lam, d, tol, code_margin, act_err, atom_res, ff_low, partner, curvature, live,
                dead, rmax, orth, st, cache):
    """Yield ``(move, (W', Z', touched rows) or None)`` for feature ``d``, most specific first."""
    N = X.shape[0]
    colcsc = sp.csc_array(Zs)
    if code_margin[d] < -tol * lam or act_err[d] > tol * lam:
        # the worst point of d: move its code to the 1-D optimum
        R = np.asarray(X, dtype=np.float64) - b - Zs @ Wu if N * Wu.shape[1] <= 50_000_000 else None
        if R is not None:
            zc = np.asarray(colcsc[:, [d]].toarray()).ravel()
            rho = R + zc[:, None] * Wu[d]
            znew = np.maximum(rho @ Wu[d] - lam, 0.0)
            gain = (znew - zc) ** 2
            i = int(np.argmax(gain))
            if gain[i] > 0:
                vals = zc.copy()
                vals[i] = znew[i]
                nzr = np.flatnonzero(vals > 0)
                yield "code", (Wu, _set_column(Zs, d, nzr, vals[nzr]), np.array([i]))
    if live[d] and np.nan_to_num(ff_low[d]) > tol and partner[d] >= 0:
        e = int(partner[d])
        v = _tangent(Wu[e], Wu[d])
        if v is not None:
            theta = math.acos(max(-1.0, min(1.0, float(Wu[e] @ Wu[d]))))
            cand = _rotation_witness(X, Wu, Zs, b, lam, e, v, theta)
            yield "absorb", cand
    if live[d] and atom_res[d] > tol:
        g = st["EtZ"][d] - (st["EtZ"][d] @ Wu[d]) * Wu[d]
        v = _tangent(Wu[d], g)
        if v is not None:
            yield "atom", _rotation_witness(X, Wu, Zs, b, lam, d, v, math.pi / 2)
    if live[d] and np.nan_to_num(curvature[d]) < -tol * lam * lam:
        v = _top_direction(X, Wu, Zs, b, d)
        if v is not None:
            for sgn in (1.0, -1.0):
                yield "curvature", _rotation_witness(X, Wu, Zs, b, lam, d, sgn * v, math.pi / 2)
    if dead.size and rmax > lam * (1 + tol):
        f = int(dead[0])
        if not live[d]:
            # re-aim this dead atom at the longest residual not yet taken
            if "R" not in cache:
                R = np.asarray(X, dtype=np.float64) - b - Zs @ Wu
                cache["R"] = R
                cache["rn"] = np.linalg.norm(R, axis=1)
                cache["taken"] = set()
            rn = cache["rn"].copy()
            rn[list(cache["taken"])] = -np.inf
            i = int(np.argmax(rn))
            if rn[i] > lam:
                cache["taken"].add(i)
                u = cache["R"][i] / rn[i]
                yield "reaim", _new_atom_witness(X, Wu, Zs, b, lam, d, u, np.array([i]))
        elif orth[d] > tol * lam:
            # split d into the first dead slot along its worst orthogonal residual
            rows = colcsc[:, [d]].nonzero()[0]
            R = np.asarray(X[rows], dtype=np.float64) - b - Zs[rows] @ Wu
            P = R - np.outer(R @ Wu[d], Wu[d])
            j = int(np.argmax(np.linalg.norm(P, axis=1)))
            u0 = Wu[d]
            v = _tangent(u0, P[j])
            if v is not None:
                best = None
                for th in [0.5 ** j2 * math.pi / 2 for j2 in range(30)]:
                    u = math.cos(th) * u0 + math.sin(th) * v
                    cand = _new_atom_witness(X, Wu, Zs, b, lam, f, u, rows, donor=d)
                    if len(cand[2]):
                        best = cand
                        break
                yield "split", best
