r"""Completely positive factorisation, and the (W, Z, b) behind a relaxation's optimal Q.

A symmetric ``A`` (N x N) is *completely positive* when ``A = Z Z^T`` for some
entrywise nonnegative ``Z`` (N x r); the smallest such ``r`` is its cp-rank
(``>= rank(A)``). In the Q-form (theory.md §2) ``Q = Zb Zb^T`` with ``Zb`` the
balanced codes, so a nonnegative factor of a solver's ``Q`` is a code matrix,
the dictionary follows by ridge regression (:func:`widelimit.optimal_dictionary`),
and the original objective can be evaluated: an upper bound that matches the
optimum when ``Q`` is optimal.

**Method** (Groetzner & Dür, "A factorization method for completely positive
matrices", Linear Algebra Appl. 591, 2020). From any ``B`` with
``B B^T = A`` (here the PSD square root truncated to ``rank(A)`` columns and
padded with zero columns to width ``r``), every ``Z = B R`` with ``R``
orthogonal also satisfies ``Z Z^T = A``. The method looks for an ``R`` with
``B R >= 0`` by alternating projections between the polyhedral cone
``{Z >= 0}`` and the set ``{B R : R orthogonal}``:

.. math::

    P_k = \max(B R_k, 0), \qquad R_{k+1} = \operatorname{polar}(B^\top P_k) = U V^\top
    \quad (B^\top P_k = U \Sigma V^\top),

(the second step is the orthogonal Procrustes solution). It stops when
``Z = max(B R_k, 0)`` satisfies ``||Z Z^T - A||_F <= tol ||A||_F``, and is
restarted from random orthogonal ``R_0`` a few times.

**Width reduction.** ``factorize_cp(A)`` without a width searches for the
narrowest factor it can find: ``rank(A)`` first (a success there is provably
narrowest), then growing widths until one succeeds, then bisection between the
last failure and that width.

:func:`refine` turns a relaxation's ``Q`` into ``(W, Z, b)``: factor, ridge
dictionary, balance, merge atoms that point the same way (their codes add up,
which leaves the objective unchanged), re-centre ``b``; it evaluates the true
objective with :func:`widelimit.sae_objective` and certifies it with
:func:`widelimit.verify`.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from .._params import LAM, NONNEG, POSITIVE, POSITIVE_INT, SEED, TOL, ArrayLike, Passed, validate_params
from .._validation import check_data, check_lam, check_vector, to_numpy
from ..exact.certificate import verify
from ..exact.objective import balance, optimal_dictionary, q_objective, sae_objective

__all__ = ["CPFactorization", "RefinedSolution", "factorize_cp", "refine", "random_cp_matrix"]


@dataclass(frozen=True)
class CPFactorization:
    """Result of :func:`factorize_cp`.

    Attributes
    ----------
    Z : ndarray (N, width)
        Entrywise nonnegative factor (the best one reached when ``success`` is False).
    success : bool
        ``residual <= tol``.
    residual : float
        ``||Z Z^T - A||_F / ||A||_F`` of the returned ``Z``.
    width : int
        Columns of ``Z``.
    rank : int
        Numerical rank of ``A`` (a lower bound on the cp-rank).
    provably_narrowest : bool
        ``success`` with ``width == rank``.
    widths_tried : dict
        ``{width: best residual}`` of every width attempted.
    n_iter : int
        Alternating-projection iterations over all widths and restarts.
    time_s : float
    message : str
    """

    Z: np.ndarray
    success: bool
    residual: float
    width: int
    rank: int
    provably_narrowest: bool
    widths_tried: dict
    n_iter: int
    time_s: float
    tol: float
    message: str = ""

    def as_dict(self) -> dict:
        return {"success": self.success, "residual": self.residual, "width": self.width, "rank": self.rank,
                "provably_narrowest": self.provably_narrowest,
                "widths_tried": {int(k): float(v) for k, v in self.widths_tried.items()},
                "n_iter": self.n_iter, "time_s": self.time_s, "tol": self.tol, "message": self.message}


def _check_cp_input(A, neg_tol: float) -> np.ndarray:
    A = to_numpy(A, "Q")
    if hasattr(A, "toarray") and not isinstance(A, np.ndarray):
        A = A.toarray()
    A = np.asarray(A)
    if A.dtype.kind not in "fiub":
        raise ValueError(f"Q must be a real numeric matrix, got dtype {A.dtype}")
    A = A.astype(np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"Q must be a square (N, N) matrix, got shape {A.shape}")
    if A.shape[0] == 0:
        raise ValueError("Q is empty")
    if not np.isfinite(A).all():
        i, j = np.argwhere(~np.isfinite(A))[0]
        raise ValueError(f"Q has a non-finite entry at [{i}, {j}]")
    scale = max(float(np.abs(A).max()), 1e-300)
    asym = np.abs(A - A.T)
    if asym.max() > 1e-9 * scale:
        i, j = np.unravel_index(int(np.argmax(asym)), A.shape)
        raise ValueError(f"Q must be symmetric; Q[{i}, {j}] = {A[i, j]:.6g} but Q[{j}, {i}] = {A[j, i]:.6g}")
    if A.min() < -neg_tol * scale:
        i, j = np.unravel_index(int(np.argmin(A)), A.shape)
        raise ValueError(
            f"Q has a negative entry Q[{i}, {j}] = {A[i, j]:.3g}; a completely positive matrix is entrywise >= 0"
        )
    A = 0.5 * (A + A.T)
    return np.maximum(A, 0.0)


def _psd_root(A: np.ndarray, rank_tol: float):
    """``B`` (N x rank) with ``B B^T`` the PSD part of ``A``, the rank, and the smallest eigenvalue."""
    w, V = np.linalg.eigh(A)
    top = max(float(w[-1]), 0.0)
    keep = w > rank_tol * max(top, 1e-300)
    B = V[:, keep] * np.sqrt(w[keep])[None, :]
    return B[:, ::-1], int(keep.sum()), float(w[0]), top


def _blas_threads(size: int):
    """One BLAS thread for small products: thread start-up dominates them (badly so on a busy machine)."""
    if size > 400_000:
        return nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _ap_width(B: np.ndarray, A: np.ndarray, normA: float, r: int, tol: float, max_iter: int, restarts: int,
              rng, check_every: int = 10):
    """Groetzner-Dür alternating projections at width ``r``; returns (best Z, best residual, iterations)."""
    N, p = B.shape
    Bp = np.zeros((N, r))
    Bp[:, :p] = B
    best_Z, best_res, iters = None, math.inf, 0
    for _ in range(max(1, restarts)):
        R = np.linalg.qr(rng.standard_normal((r, r)))[0]
        prev = math.inf
        stall = 0
        for k in range(max_iter):
            Y = Bp @ R
            P = np.maximum(Y, 0.0)
            iters += 1
            if k % check_every == 0 or k == max_iter - 1:
                res = float(np.linalg.norm(P @ P.T - A)) / normA
                if res < best_res:
                    best_Z, best_res = P, res
                if res <= tol:
                    return best_Z, best_res, iters
                # give up on this start when the residual stops improving
                if res > prev * (1 - 1e-4):
                    stall += 1
                    if stall >= 20:
                        break
                else:
                    stall = 0
                prev = min(prev, res)
            U, _, Vt = np.linalg.svd(Bp.T @ P)
            R = U @ Vt
    return best_Z, best_res, iters


@validate_params({"Q": ArrayLike(), "width": [POSITIVE_INT, None], "tol": POSITIVE, "max_iter": POSITIVE_INT,
                  "restarts": POSITIVE_INT, "max_width": [POSITIVE_INT, None], "neg_tol": NONNEG, "rank_tol": NONNEG, "seed": SEED})
def factorize_cp(Q, *, width: int | None = None, tol: float = 1e-8, max_iter: int = 5000, restarts: int = 5,
                 max_width: int | None = None, neg_tol: float = 1e-9, rank_tol: float = 1e-10,
                 seed: int = 0) -> CPFactorization:
    r"""Nonnegative factor ``Z >= 0`` with ``||Z Z^T - Q||_F <= tol ||Q||_F``, narrowest found.

    Parameters
    ----------
    Q : array (N, N)
        Symmetric, entrywise nonnegative (entries down to ``-neg_tol * max|Q|``
        are rounding and set to 0). Torch tensors accepted.
    width : int, optional
        Number of columns of ``Z``. Default: search for the narrowest factor
        (``rank(Q)`` first, then growing widths, then bisection).
    tol : float
        Relative Frobenius residual that counts as a factorisation.
    max_iter, restarts : int
        Alternating-projection iterations per start, and random starts per width.
    max_width : int, optional
        Largest width of the search (default ``max(2 N, rank + 2)``; the
        cp-rank of an N x N matrix can reach about ``N^2 / 2``).
    neg_tol : float
        Relative size of negative entries treated as rounding.
    rank_tol : float
        Eigenvalues below ``rank_tol * lambda_max`` count as 0.
    seed : int
        Seed of the random orthogonal starts.

    Returns
    -------
    CPFactorization
        ``success`` False (with the best ``Z`` and residual reached) when no
        factor was found: ``Q`` may not be CP (e.g. it is not PSD, or a Horn
        cut separates it) or needs more width or iterations.

    Raises
    ------
    ValueError
        ``Q`` not square, not symmetric, with non-finite or negative entries; bad ``width``.
    """
    t0 = time.perf_counter()
    A = _check_cp_input(Q, neg_tol)
    N = A.shape[0]
    normA = float(np.linalg.norm(A))
    if normA == 0.0:
        return CPFactorization(Z=np.zeros((N, 0 if width is None else int(width))), success=True, residual=0.0,
                               width=0 if width is None else int(width), rank=0, provably_narrowest=True,
                               widths_tried={}, n_iter=0, time_s=time.perf_counter() - t0, tol=tol,
                               message="Q = 0")
    B, rank, wmin, wmax = _psd_root(A, rank_tol)
    rng = np.random.default_rng(seed)
    if width is not None:
        if int(width) != width or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        width = int(width)
    if wmin < -max(tol, 1e-12) * wmax:
        Z = np.maximum(B, 0.0)
        res = float(np.linalg.norm(Z @ Z.T - A)) / normA
        return CPFactorization(Z=Z, success=False, residual=res, width=Z.shape[1], rank=rank,
                               provably_narrowest=False, widths_tried={}, n_iter=0,
                               time_s=time.perf_counter() - t0, tol=tol,
                               message=f"Q is not positive semidefinite (smallest eigenvalue {wmin:.3g}), so not CP")
    tried: dict[int, float] = {}
    found: dict[int, np.ndarray] = {}
    best = (None, math.inf)
    total = 0

    def attempt(r):
        nonlocal total, best
        if r < rank:
            tried[r] = math.inf
            return False
        with _blas_threads(N * r):
            Z, res, it = _ap_width(B, A, normA, r, tol, max_iter, restarts, rng)
        total += it
        tried[r] = res
        if res < best[1] or (res <= tol and Z.shape[1] < best[0].shape[1]):
            best = (Z, res)
        if res <= tol:
            found[r] = Z
            return True
        return False

    if width is not None:
        attempt(width)
    else:
        hi_cap = max_width if max_width is not None else max(2 * N, rank + 2)
        if not attempt(rank):
            lo, hi, r = rank, None, rank
            while r < hi_cap:
                r = min(hi_cap, max(r + 1, int(math.ceil(1.5 * r))))
                if attempt(r):
                    hi = r
                    break
                lo = r
            if hi is not None:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if attempt(mid):
                        hi = mid
                    else:
                        lo = mid
    if found:
        w = min(found)
        Z = found[w]
        res = float(np.linalg.norm(Z @ Z.T - A)) / normA
        msg = f"factor of width {w}" + (" (= rank, provably narrowest)" if w == rank else "")
        return CPFactorization(Z=Z, success=True, residual=res, width=w, rank=rank, provably_narrowest=w == rank,
                               widths_tried=tried, n_iter=total, time_s=time.perf_counter() - t0, tol=tol,
                               message=msg)
    Z, res = best
    return CPFactorization(
        Z=Z, success=False, residual=res, width=Z.shape[1], rank=rank, provably_narrowest=False,
        widths_tried=tried, n_iter=total, time_s=time.perf_counter() - t0, tol=tol,
        message=(f"no nonnegative factor found (best relative residual {res:.3g} > tol {tol:g} at width "
                 f"{Z.shape[1]}); Q may not be completely positive"),
    )


def random_cp_matrix(n: int, r: int | None = None, *, seed: int = 0):
    """The literature's random CP test matrix ``A = C C^T`` with ``C = |randn(n, r)|`` (default ``r = 2n``).

    Returns ``(A, C)``.
    """
    rng = np.random.default_rng(seed)
    C = np.abs(rng.standard_normal((n, 2 * n if r is None else int(r))))
    return C @ C.T, C


@dataclass(frozen=True)
class RefinedSolution:
    """``(W, Z, b)`` built from a relaxation's ``Q``, with its true objective and certificate.

    Attributes
    ----------
    W : ndarray (k, n)
        Unit-norm atoms (after merging atoms that point the same way).
    Z : ndarray (N, k)
        Nonnegative codes.
    b : ndarray (n,)
    value : float
        ``sae_objective(X, W, Z, b, lam).value`` (an upper bound on the optimum).
    width : int
        ``k``.
    factor_width : int
        Width of the CP factor of ``Q`` before merging.
    q_value : float
        ``f(Q, b)`` of the input ``Q`` (``q_objective``).
    factorization : CPFactorization
    certificate : Certificate
        :func:`widelimit.verify` of ``(W, Z, b)``.
    """

    W: np.ndarray
    Z: np.ndarray
    b: np.ndarray
    value: float
    width: int
    factor_width: int
    q_value: float
    factorization: CPFactorization
    certificate: object

    def as_dict(self) -> dict:
        return {"value": self.value, "width": self.width, "factor_width": self.factor_width, "q_value": self.q_value,
                "factorization": self.factorization.as_dict(), "certificate": self.certificate.as_dict()}


def _merge_parallel(W: np.ndarray, Z: np.ndarray, cos_tol: float):
    """Unit atoms, codes scaled by the atom norms, and atoms with cosine >= 1 - cos_tol merged."""
    norms = np.linalg.norm(W, axis=1)
    colsum = Z.sum(axis=0)
    live = (norms > 0) & (colsum > 0)
    U = W[live] / norms[live, None]
    C = Z[:, live] * norms[None, live]
    order = np.argsort(-C.sum(axis=0))  # heaviest atoms lead their group
    atoms, codes = [], []
    for d in order:
        for g, a in enumerate(atoms):
            if float(U[d] @ a) >= 1.0 - cos_tol:
                codes[g] = codes[g] + C[:, d]
                break
        else:
            atoms.append(U[d])
            codes.append(C[:, d].copy())
    if not atoms:
        return np.zeros((0, W.shape[1])), np.zeros((Z.shape[0], 0))
    return np.array(atoms), np.column_stack(codes)


def _lasso_codes(X, W, b, lam, Z0, iters: int = 500):
    r"""Nonnegative-lasso codes for a fixed unit dictionary: ``min_{z>=0} ||z W - (x - b)||^2 + 2 lam ||z||_1``.

    Accelerated projected gradient (FISTA) for all points at once, warm-started at ``Z0``.
    """
    if W.shape[0] == 0:
        return Z0
    Xt = X - b
    Gm = W @ W.T
    L = 2.0 * max(float(np.linalg.eigvalsh(Gm)[-1]), 1e-12)
    XW = Xt @ W.T
    Z = np.maximum(Z0, 0.0)
    Y, t = Z.copy(), 1.0
    for _ in range(iters):
        grad = 2.0 * (Y @ Gm - XW) + 2.0 * lam
        Zn = np.maximum(Y - grad / L, 0.0)
        tn = 0.5 * (1 + math.sqrt(1 + 4 * t * t))
        Y = Zn + ((t - 1) / tn) * (Zn - Z)
        Z, t = Zn, tn
    return Z


@validate_params({"X": ArrayLike(), "Q": ArrayLike(), "b": [ArrayLike(), None], "lam": LAM, "tol": TOL,
                  "accept": [NONNEG, None], "merge_tol": NONNEG, "clean": NONNEG, "factor_kwargs": Passed("widelimit.factorize_cp")})
def refine(X, Q, b, *, lam, tol: float = 1e-6, accept: float | None = None, merge_tol: float = 1e-6, clean: float = 0.0,
           **factor_kwargs) -> RefinedSolution:
    r"""Build ``(W, Z, b)`` from a Q-form solution and evaluate the original objective.

    Steps: rounding of solver noise (``clean``); ``Zb = factorize_cp(Q)`` (narrowest factor found, relative residual
    ``<= tol``); ``W = optimal_dictionary(X, Zb, b, lam)``; :func:`widelimit.balance`;
    atoms normalised (codes take their norms); atoms whose directions agree to
    ``cos >= 1 - t`` merged for ``t`` in ``{merge_tol, 1e-4, 1e-2, 1e-1}`` (codes
    added: same reconstruction and penalty when exactly parallel), each merged
    dictionary also with its codes re-fitted by a nonnegative lasso; atoms that no
    point uses after the re-fit dropped (the objective does not depend on them); ``b``
    re-centred to the mean residual (the optimal bias for fixed ``W, Z``).
    The candidate with the smallest true objective is kept (the narrower one on ties).

    Parameters
    ----------
    X : array (N, n)
    lam : float
    Q : array (N, N)
        E.g. ``relax(X, lam, "dnn").Q`` (tiny negative entries and eigenvalues from
        the solver are rounded away).
    b : array (n,)
        The bias that goes with ``Q``.
    tol : float
        Residual tolerance of the factorisation (solver output is only as accurate as the solver).
    accept : float, optional
        When no factor reaches ``tol`` (a solver's ``Q`` is CP only up to its
        accuracy, and the residual this leaves is 1e-4 to 2e-3 at N = 40 to 80 for
        SCS at ``eps = 1e-8`` on ray data), the best
        factor is still used. The returned ``value`` is the exact objective of the
        returned triple either way, so it stays a valid upper bound, and
        ``certificate`` says how far from optimal it is. Pass ``accept`` to raise
        instead when the best residual exceeds it.
    merge_tol : float
        Atoms with cosine ``>= 1 - merge_tol`` are merged.
    clean : float
        Entries of ``Q`` below ``clean * max(diag Q)`` (solver noise) are set to 0, and
        rows with such a diagonal removed, before factoring.
    **factor_kwargs
        Passed to :func:`factorize_cp` (default search budget here: 2000 iterations,
        3 starts, widths up to ``1.5 rank``).

    Returns
    -------
    RefinedSolution
        ``factorization.success`` / ``factorization.residual`` report the factor used. Raises
        ``ValueError`` when ``accept`` is given and no factor within it is found (the message gives the
        best residual).
    """
    X = check_data(X)
    lam = check_lam(lam)
    N, n = X.shape
    b = check_vector(b, n, "b")
    Qa = _check_cp_input(Q, neg_tol=factor_kwargs.pop("neg_tol", 1e-6))
    if Qa.shape[0] != N:
        raise ValueError(f"Q is {Qa.shape[0]}x{Qa.shape[0]} but X has N = {N} points")
    # the solver's Q carries noise at its tolerance: round entries below clean * max(diag) to 0
    # (points within lam have a zero row at the optimum), then use the PSD part
    thr = clean * max(float(np.diag(Qa).max()), 1e-300) if clean > 0 else -1.0
    dead = np.diag(Qa) <= thr
    Qa = np.where(Qa <= thr, 0.0, Qa)
    Qa[dead, :] = 0.0
    Qa[:, dead] = 0.0
    w, V = np.linalg.eigh(Qa)
    Qp = np.maximum((V * np.maximum(w, 0.0)) @ V.T, 0.0)
    Qp = 0.5 * (Qp + Qp.T)
    rank_tol = factor_kwargs.pop("rank_tol", 1e-7)
    r0 = int(np.count_nonzero(w > rank_tol * max(float(w[-1]), 1e-300)))
    opts = {"max_iter": 2000, "restarts": 3, "max_width": max(r0 + 2, int(1.5 * r0))}
    opts.update(factor_kwargs)
    fac = factorize_cp(Qp, tol=tol, rank_tol=rank_tol, **opts)
    if not fac.success and accept is not None and not fac.residual <= accept:
        raise ValueError(f"refine: {fac.message}")
    Zb = fac.Z
    W = optimal_dictionary(X, Zb, b, lam=lam)
    W, Zc = balance(W, Zb)
    Xf = np.asarray(X, dtype=np.float64)

    def finish(Wu, Zu):
        # an atom that no point uses contributes nothing to the objective: drop it (the re-fitted
        # lasso codes of a redundant atom on an already covered ray are exactly 0)
        used = Zu.max(axis=0) > 0 if Zu.shape[1] else np.zeros(0, dtype=bool)
        Wu, Zu = Wu[used], Zu[:, used]
        bb = (Xf - Zu @ Wu).mean(axis=0) if Wu.shape[0] else Xf.mean(axis=0)
        return Wu, Zu, bb, sae_objective(X, Wu, Zu, bb, lam=lam).value

    U0, C0 = _merge_parallel(W, Zc, 0.0)
    best = finish(U0, C0)
    # merge atoms at growing angular tolerances; codes and bias are re-fitted for each merged
    # dictionary (nonnegative lasso per point), and the candidate with the smallest objective is kept
    for mt in sorted({merge_tol, 1e-4, 1e-2, 1e-1}):
        Um, Cm = _merge_parallel(W, Zc, mt)
        for cand in (finish(Um, Cm), finish(Um, _lasso_codes(Xf, Um, best[2], lam, Cm))):
            if cand[3] < best[3] * (1 - 1e-13) or (cand[3] <= best[3] * (1 + 1e-12) and cand[0].shape[0] < best[0].shape[0]):
                best = cand
    Wf, Zf, bf, val = best
    cert = verify(X, Wf, Zf, bf, lam=lam)
    return RefinedSolution(W=Wf, Z=Zf, b=bf, value=float(val), width=int(Wf.shape[0]), factor_width=fac.width,
                           q_value=float(q_objective(X, Qp, b, lam=lam)), factorization=fac, certificate=cert)
