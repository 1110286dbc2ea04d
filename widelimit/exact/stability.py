r"""Per-feature optimality at a fixed width, with witnesses (theory.md §5).

For a triple ``(W, Z, b)`` with residuals ``r_i = x_i - b - z_i W`` and active sets
``A_d = {i : z_id > 0}``, every feature ``d`` is checked against

- the **code** condition (theory.md §5.2): ``<w_d, r_i> = lam`` on ``A_d``, ``<= lam`` off it
  (margin ``lam - max_{i notin A_d} <w_d, r_i>``);
- the **atom** condition (§5.2): ``g_d = sum_i z_id (r_i - <r_i, w_d> w_d) = 0``;
- the **feature-feature** condition (§5.3): the cosine dissimilarities ``t_de = 1 - <w_d, w_e>``
  lie in the cone of the ``d``-inactive points' normalised codes ``q_ie = z_ie / S_e``,
  measured by the ``l_inf`` distance ``delta_d`` to that cone, bracketed by a co-occurrence
  lower bound and the residual of the weights ``nu_id = 1 - <w_d, r_i>/lam`` from above, and
  settled by an LP (HiGHS) where the bracket straddles the tolerance;
- a **second-order** test (§5.4): the curvature of turning ``w_d`` with its codes re-optimised,
  ``(2/N)(sum_{A_d} z(z + lam) - lambda_max(M_d))``; the **joint** test, the least eigenvalue of the
  Hessian of the reduced objective in all atoms and the bias together
  (:func:`widelimit.exact.second_order.joint_curvature`), which finds descent directions that no single
  atom's turn shows; and, with a dead atom available, the longest
  residual (a dead atom re-aimed at ``r_i`` lowers ``N L`` by ``(||r_i|| - lam)^2``) and the
  split test (a live feature whose active residuals are not parallel to its atom).

A feature is reported **unstable** only with a witness (theory.md §5.5): a full ``(W', Z', b)``
whose objective, recomputed from scratch by :func:`widelimit.sae_objective`, is strictly lower.
Everything that certifies is float64; the per-feature pass is batched over rows (one dense
``E W^T`` product per chunk, as an SAE encoder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog, nnls

from .._params import LAM, ArrayLike, InstanceOf, Passed, validate_params
from .._validation import row_norms
from .objective import _check_triple, sae_objective
from .second_order import joint_curvature, joint_witness
from .stationarity import first_order_chunk, tangent_norms
from .witness import candidates, recode

__all__ = ["FeatureStability", "StabilityOptions", "feature_stability", "stability_rows"]

VERDICTS = ("stable", "unstable", "violated", "undecided", "dead")


@dataclass(frozen=True)
class StabilityOptions:
    """Options of :func:`feature_stability`.

    Attributes
    ----------
    tol : float
        Conditions hold when the code errors are ``<= tol * lam``, the relative atom residual
        ``||g_d|| / (lam S_d) <= tol``, ``delta_d <= tol`` and the curvature is ``>= -tol``.
    witnesses : bool
        Search for witnesses at all.
    max_witnesses : int or None
        Most features for which a witness is searched (the most violated first); ``None``: all.
    keep_witnesses : bool
        Keep the witnesses' arrays (``False``: only their verified objective values).
    max_lp : int
        Most features whose feature-feature bracket straddles ``tol`` that are screened (NNLS) and,
        if still undecided, solved exactly (LP).
    nnls_max_size : int
        Largest dense ``(features x inactive points)`` matrix of the NNLS screening (theory.md §5.3).
    lp_max_nnz : int
        Largest LP (nonzeros of its constraint matrix) solved; bigger ones stay bracketed.
    lp_time_limit : float
        Seconds per LP (HiGHS); an LP that runs out keeps its bracket.
    exact_curvature_dim : int
        ``lambda_max(M_d)`` is computed exactly when ``n`` is at most this; else its lower bound.
    coding_tol : float
        Tolerance of the code re-optimisation of a witness (:func:`widelimit.optimal_codes`).
    joint_curvature_dim : int
        Largest Hessian of the joint second-order test (theory.md §5.4): ``K (n - 1) + n`` for ``K``
        covered atoms; with more live atoms those with the least own curvature are covered. 0: no joint test.
    """

    tol: float = 1e-6
    witnesses: bool = True
    max_witnesses: int | None = 64
    keep_witnesses: bool = True
    max_lp: int = 16
    lp_max_nnz: int = 200_000
    lp_time_limit: float = 5.0
    nnls_max_size: int = 4_000_000
    exact_curvature_dim: int = 64
    coding_tol: float = 1e-9
    joint_curvature_dim: int = 400


@dataclass(frozen=True)
class FeatureStability:
    """Per-feature margins of theory.md §5's conditions, verdicts and witnesses.

    Attributes
    ----------
    value : float
        Objective of the input triple.
    lam : float
    n_active : ndarray (k,) int
        ``|A_d|``.
    code_margin : ndarray (k,)
        ``lam - max_{i notin A_d} <w_d, r_i>`` (``>= 0`` needed; ``inf`` when ``d`` is active everywhere).
    code_active_error : ndarray (k,)
        ``max_{i in A_d} |<w_d, r_i> - lam|`` (0 for dead features).
    atom_residual : ndarray (k,)
        ``||g_d|| / (lam S_d)``, the atom condition relative to its scale (0 for dead features).
    ff_lower, ff_upper : ndarray (k,)
        Bracket of the feature-feature distance ``delta_d`` (equal where the LP settled it;
        NaN for dead features).
    ff_exact : ndarray (k,) bool
        ``delta_d`` settled exactly (bracket closed or LP solved).
    ff_partner : ndarray (k,) int
        The feature ``e`` with ``A_e ⊆ A_d`` and the largest ``1 - <w_d, w_e>`` (-1: none).
    curvature : ndarray (k,)
        Upper bound on the least second derivative of turning ``w_d`` with its codes
        re-optimised (exact when ``ff`` dimension allows, see ``curvature_exact``); NaN for dead.
    curvature_exact : bool
    joint_curvature : float
        Least eigenvalue of the Hessian of the reduced objective in the atoms and the bias together
        (theory.md §5.4; NaN when not computed). Negative beyond ``tol lam^2``: a joint descent direction,
        followed by a witness (move ``"joint"``) credited to the atoms that carry it.
    joint_curvature_complete : bool
        Every live atom was covered by the joint test (else only those with the least own curvature).
    orth_residual : ndarray (k,)
        ``max_{i in A_d} ||r_i - <r_i, w_d> w_d||`` (the split test; 0 at the wide-limit optimum).
    max_residual : float
        ``max_i ||r_i||`` (a dead atom helps iff this exceeds ``lam``).
    bias_residual : float
        ``||mean_i r_i||``.
    verdict : tuple of str
        Per feature: ``"stable"`` (every condition holds to ``tol``), ``"unstable"`` (a verified
        witness), ``"violated"`` (a condition fails but no witness was found or searched),
        ``"undecided"`` (every other condition holds, but the feature-feature bracket straddles ``tol``
        and was beyond the screening's and the LP's limits), ``"dead"`` (no active point, no witness).
    witness_values : dict int -> float
        Recomputed objective of each feature's witness (strictly below ``value``).
    witness_moves : dict int -> str
        The move that produced it (``"code"``, ``"atom"``, ``"absorb"``, ``"curvature"``,
        ``"joint"``, ``"reaim"``, ``"split"``).
    witnesses : dict int -> (W, Z, b)
        The witnesses themselves (unit-norm ``W``, sparse ``Z``) when kept.
    tol : float
    """

    value: float
    lam: float
    n_active: np.ndarray
    code_margin: np.ndarray
    code_active_error: np.ndarray
    atom_residual: np.ndarray
    ff_lower: np.ndarray
    ff_upper: np.ndarray
    ff_exact: np.ndarray
    ff_partner: np.ndarray
    curvature: np.ndarray
    curvature_exact: bool
    orth_residual: np.ndarray
    max_residual: float
    bias_residual: float
    verdict: tuple
    witness_values: dict
    witness_moves: dict
    witnesses: dict = field(repr=False)
    tol: float = 1e-6
    joint_curvature: float = math.nan
    joint_curvature_complete: bool = False

    @property
    def unstable(self) -> np.ndarray:
        """Indices of the features with a verified witness."""
        return np.array([d for d, v in enumerate(self.verdict) if v == "unstable"], dtype=np.int64)

    @property
    def violated(self) -> np.ndarray:
        """Indices of the features with a failed condition but no witness."""
        return np.array([d for d, v in enumerate(self.verdict) if v == "violated"], dtype=np.int64)

    def rows(self) -> list[dict]:
        """One dict per feature (the columns of certify's ``features.csv``)."""
        out = []
        for d in range(len(self.verdict)):
            out.append({
                "feature": d, "verdict": self.verdict[d], "n_active": int(self.n_active[d]),
                "code_margin": _f(self.code_margin[d]), "code_active_error": _f(self.code_active_error[d]),
                "atom_residual": _f(self.atom_residual[d]), "ff_lower": _f(self.ff_lower[d]),
                "ff_upper": _f(self.ff_upper[d]), "ff_partner": int(self.ff_partner[d]),
                "curvature": _f(self.curvature[d]), "orth_residual": _f(self.orth_residual[d]),
                "witness_move": self.witness_moves.get(d, ""),
                "witness_decrease": _f(self.value - self.witness_values[d]) if d in self.witness_values else None,
            })
        return out

    def as_dict(self, max_listed: int = 50) -> dict:
        """Summary for JSON: counts per verdict, the global quantities and the first witnesses."""
        counts = {v: int(sum(1 for x in self.verdict if x == v)) for v in VERDICTS}
        wl = sorted(self.witness_values, key=lambda d: self.witness_values[d])[:max_listed]
        return {
            "value": self.value, "lam": self.lam, "tol": self.tol, "counts": counts,
            "unstable": [int(d) for d in self.unstable[:max_listed]],
            "max_residual": self.max_residual, "bias_residual": self.bias_residual,
            "curvature_exact": self.curvature_exact, "joint_curvature": _f(self.joint_curvature),
            "joint_curvature_complete": self.joint_curvature_complete,
            "witnesses": [{"feature": int(d), "move": self.witness_moves[d], "value": self.witness_values[d],
                           "decrease": self.value - self.witness_values[d]} for d in wl],
        }


def _f(x):
    x = float(x)
    return x if math.isfinite(x) else None


# ----------------------------------------------------------------------------------------------
# the per-feature pass


def _normalise(W, Z):
    """Unit atoms and the codes of the unit atoms (norms folded in; zero atoms get code 0)."""
    norms = row_norms(W)
    W64 = np.asarray(W, dtype=np.float64)
    Wu = np.divide(W64, norms[:, None], out=np.zeros_like(W64), where=norms[:, None] > 0)
    Zs = sp.csr_array(Z, dtype=np.float64) if not sp.issparse(Z) else sp.csr_array(Z).astype(np.float64)
    Zs = sp.csr_array(Zs @ sp.diags_array(norms))
    Zs.eliminate_zeros()
    return Wu, Zs


def _pass(X, Wu, Zs, b, lam, exact_curv):
    """One batched pass: code conditions, ``Z^T E``, the (FF) upper-bound matrix, curvature data."""
    N, n = X.shape
    k = Wu.shape[0]
    S = np.asarray(Zs.sum(axis=0)).ravel()
    inact_max = np.full(k, -np.inf)
    act_err = np.zeros(k)
    orth = np.zeros(k)
    zz = np.zeros(k)  # sum_{A_d} z (z + lam)
    lmax_lb = np.zeros(k)
    EtZ = np.zeros((k, n))
    M = np.zeros((k, k))  # M[e, d] = sum_{i notin A_d} z_ie nu_id
    R2 = np.zeros((k, n, n)) if exact_curv else None
    rsum = np.zeros(n)
    rmax = 0.0
    rows = max(1, min(N, (1 << 25) // max(1, 3 * k + n)))
    for s in range(0, N, rows):
        e = min(N, s + rows)
        Zc = Zs[s:e]
        E = np.asarray(X[s:e], dtype=np.float64) - b - Zc @ Wu
        fo = first_order_chunk(E, Zc, Wu, lam)  # the first-order conditions (exact/stationarity.py)
        C, ii, dd = fo["C"], fo["rows"], fo["cols"]
        rsum += fo["rsum"]
        np.maximum(inact_max, fo["inactive_max"], out=inact_max)
        np.maximum(act_err, fo["active_error"], out=act_err)
        EtZ += fo["EtZ"]
        rn2 = np.einsum("ij,ij->i", E, E)
        rmax = max(rmax, float(np.sqrt(rn2.max())))
        Zd = Zc.toarray()
        on = Zd > 0
        if ii.size:
            c_act = C[ii, dd]
            po2 = np.maximum(rn2[ii] - c_act * c_act, 0.0)
            np.maximum.at(orth, dd, np.sqrt(po2))
            np.maximum.at(lmax_lb, dd, po2)
            zv = Zd[ii, dd]
            np.add.at(zz, dd, zv * (zv + lam))
            if exact_curv:
                np.add.at(R2, dd, E[ii, :, None] * E[ii, None, :])
        V = np.maximum(1.0 - C / lam, 0.0)
        V[on] = 0.0
        M += Zc.T @ V
    return dict(S=S, inact_max=inact_max, act_err=act_err, orth=orth, zz=zz, lmax_lb=lmax_lb, EtZ=EtZ, M=M,
                R2=R2, bias=float(np.linalg.norm(rsum / N)), rmax=rmax)


def _ff_lower(Zs, Gm, live):
    """Co-occurrence lower bound ``max_{e: A_e ⊆ A_d} (1 - c_de)`` and its partner, for every ``d``."""
    k = Gm.shape[0]
    B = Zs.copy()
    B.data[:] = 1.0
    cnt = np.asarray(B.sum(axis=0)).ravel()
    Co = sp.coo_array(B.T @ B)
    e, d, c = Co.row, Co.col, Co.data
    sel = (e != d) & (np.abs(c - cnt[e]) < 0.5) & live[e] & live[d]
    e, d = e[sel], d[sel]
    t = 1.0 - Gm[d, e]
    low = np.zeros(k)
    partner = -np.ones(k, dtype=np.int64)
    if e.size:
        order = np.lexsort((-t, d))  # per d, largest t first
        d_s, e_s, t_s = d[order], e[order], t[order]
        first = np.r_[True, d_s[1:] != d_s[:-1]]
        low[d_s[first]] = np.maximum(t_s[first], 0.0)
        partner[d_s[first]] = e_s[first]
    return low, partner


def _ff_problem(Zs, S, Gm, live, d):
    """``t_d`` (live ``e != d``) and the normalised codes ``q_i`` of the ``d``-inactive points (rows)."""
    k = Gm.shape[0]
    cols = np.flatnonzero(live & (np.arange(k) != d))
    t = 1.0 - Gm[d, cols]
    inactive = np.ones(Zs.shape[0], dtype=bool)
    inactive[sp.csc_array(Zs)[:, [d]].nonzero()[0]] = False
    Q = sp.csr_array(Zs[inactive][:, cols] @ sp.diags_array(1.0 / S[cols]))
    Q = Q[np.diff(Q.indptr) > 0]
    return t, Q


def _ff_nnls(Zs, S, Gm, live, d):
    """Certified bracket of ``delta_d`` from the Euclidean projection onto the cone (Lawson-Hanson NNLS).

    With ``mu*`` the NNLS solution and ``a = t - Q^T mu*``: ``||a||_inf`` is an upper bound, and when
    ``<a, q_i> <= 0`` for every point (made exact by a small shift ``a - eps 1``, since ``q_i >= 0``)
    every cone point ``y`` has ``<a, t - y> >= <a, t>``, so ``delta_d >= <a, t> / ||a||_1`` (Hölder).
    """
    t, Q = _ff_problem(Zs, S, Gm, live, d)
    if t.size == 0:
        return 0.0, 0.0
    if Q.shape[0] == 0:
        return float(t.max(initial=0.0)), float(t.max(initial=0.0))
    mu = nnls(Q.T.toarray(), t, maxiter=50 * Q.shape[0])[0]
    a = t - Q.T @ mu
    up = float(np.abs(a).max())
    n1 = float(np.abs(a).sum())
    low = 0.0
    if n1 > 0:
        # NNLS's KKT conditions give <a, q_i> <= 0 up to rounding; shifting a by -eps 1 (q_i >= 0) makes
        # it exact: <a - eps 1, q_i> = <a, q_i> - eps ||q_i||_1 <= 0 for eps = max_i <a, q_i>_+ / ||q_i||_1
        q1 = np.asarray(Q.sum(axis=1)).ravel()
        eps = max(0.0, float(np.max((Q @ a) / q1))) * (1.0 + 1e-9)
        a2 = a - eps
        low = max(0.0, float(a2 @ t) / float(np.abs(a2).sum()))
    return min(low, up), up


def _ff_lp(Zs, S, Gm, live, d, time_limit: float = 10.0):
    """``delta_d`` exactly: ``min s`` s.t. ``|t_e - sum_i mu_i q_ie| <= s``, ``mu >= 0`` (HiGHS)."""
    t, Q = _ff_problem(Zs, S, Gm, live, d)
    if t.size == 0:
        return 0.0
    cols = t
    m = Q.shape[0]
    A = Q.T  # (|cols|, m)
    one = sp.csr_array(np.ones((t.size, 1)))
    A_ub = sp.vstack([sp.hstack([A, -one]), sp.hstack([-A, -one])]).tocsr()
    b_ub = np.concatenate([t, -t])
    c = np.zeros(m + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, bounds=[(0, None)] * (m + 1), method="highs",
                  options={"time_limit": float(time_limit)})
    if res.status != 0:
        return math.nan
    return float(res.x[-1])


def _lp_size(Zs, live, d):
    """Nonzeros of the LP's constraint matrix (an upper estimate)."""
    return 2 * (int(Zs.nnz) + int(np.count_nonzero(live)))


# ----------------------------------------------------------------------------------------------


@validate_params({"X": ArrayLike(), "W": ArrayLike(), "Z": ArrayLike(), "b": ArrayLike(), "lam": LAM,
                  "options": [InstanceOf(StabilityOptions), None], "kw": Passed("widelimit.exact.stability.StabilityOptions")})
def feature_stability(X, W, Z, b, *, lam, options: StabilityOptions | None = None, **kw) -> FeatureStability:
    r"""Check every feature of ``(W, Z, b)`` against theory.md §5's conditions; find witnesses.

    For each feature ``d``: the code margin and active-code error, the relative atom residual
    ``||g_d|| / (lam S_d)``, the feature-feature distance ``delta_d`` (bracketed, exact where
    needed; theory.md §5.3), the curvature of turning ``w_d`` with re-optimised codes and the
    split statistic (theory.md §5.4). Each feature with a failed condition is then followed along
    the move that condition exhibits (theory.md §5.5): code activation, atom turn along ``g_d``,
    turning the partner ``e`` (``A_e ⊆ A_d``) toward ``w_d`` (absorption), turning along the
    negative-curvature direction, re-aiming a dead atom at the longest residual, or splitting ``d``
    into a dead slot; the codes of the touched rows are re-optimised and the result is kept only
    if :func:`widelimit.sae_objective` of the whole new triple is strictly lower.

    Parameters
    ----------
    X : array (N, n)
    W : array (k, n)
        Atoms (any norms; folded into the codes as in :func:`widelimit.sae_objective`).
    Z : array (N, k) or scipy.sparse
        Nonnegative codes (for a trained SAE: its optimal codes, :func:`widelimit.optimal_codes`).
    b : array (n,)
    lam : float
    options : StabilityOptions, optional
        Or its fields as keywords.

    Returns
    -------
    FeatureStability
    """
    if options is None:
        options = StabilityOptions(**kw)
    elif kw:
        raise TypeError("pass either options or keyword options, not both")
    X, W, Z, b, lam = _check_triple(X, W, Z, b, lam)
    N, n = X.shape
    k = W.shape[0]
    tol = float(options.tol)
    Wu, Zs = _normalise(W, Z)
    value = float(sae_objective(X, Wu, Zs, b, lam=lam).value)
    exact_curv = n <= options.exact_curvature_dim and k * n * n <= 50_000_000 and Zs.nnz * n * n <= 20_000_000
    st = _pass(X, Wu, Zs, b, lam, exact_curv)
    S = st["S"]
    live = S > 0
    n_active = np.diff(sp.csc_array(Zs).indptr)
    code_margin = lam - st["inact_max"]
    act_err = np.where(live, st["act_err"], 0.0)
    gnorm = tangent_norms(st["EtZ"], Wu)
    atom_res = np.where(live, gnorm / np.where(live, lam * S, 1.0), 0.0)
    # feature-feature (§5.3)
    Gm = Wu @ Wu.T
    low, up, exact, partner = _ff_bracket(Zs, S, Gm, st["M"], live, n_active, tol, options)
    ff_low = np.where(live, low, np.nan)
    ff_up = np.where(live, up, np.nan)
    # second order (§5.4)
    if exact_curv:
        lmax = np.zeros(k)
        for d in np.flatnonzero(live):
            P = np.eye(n) - np.outer(Wu[d], Wu[d])
            lmax[d] = np.linalg.eigvalsh(P @ st["R2"][d] @ P)[-1]
    else:
        lmax = st["lmax_lb"]
    curvature = np.where(live, (2.0 / N) * (st["zz"] - lmax), np.nan)
    jc = (joint_curvature(X, Wu, Zs, b, lam, own_curvature=curvature, max_dim=options.joint_curvature_dim)
          if options.joint_curvature_dim > 0 and live.any() else None)
    joint_neg = jc is not None and jc.value < -tol * lam * lam
    dead = np.flatnonzero(~live)
    orth = np.where(live, st["orth"], 0.0)
    rmax = st["rmax"]

    sev = _severity(lam, tol, code_margin, act_err, atom_res, ff_low, curvature, live, dead, orth, rmax)
    failed = sev > 0
    undecided_ff = live & (ff_up > tol) & (np.nan_to_num(ff_low) <= tol) & ~exact

    witnesses, wvals, wmoves, n_searched = {}, {}, {}, 0
    if options.witnesses and failed.any():
        n_searched = _search_witnesses(X, Wu, Zs, b, lam, value, sev, failed, options, witnesses, wvals, wmoves, (
            tol, code_margin, act_err, atom_res, ff_low, partner, curvature, live, dead, rmax, orth, st))
    if joint_neg:  # one more search, within the witness budget
        search = options.witnesses and (options.max_witnesses is None or n_searched < options.max_witnesses)
        _joint_witness(X, Wu, Zs, b, lam, jc, options, search, failed, witnesses, wvals, wmoves)
    verdict = tuple("unstable" if d in wvals else "violated" if failed[d] else "dead" if not live[d]
                    else "undecided" if undecided_ff[d] else "stable" for d in range(k))
    return FeatureStability(
        value=value, lam=lam, n_active=n_active, code_margin=code_margin, code_active_error=act_err,
        atom_residual=atom_res, ff_lower=ff_low, ff_upper=ff_up, ff_exact=exact & live, ff_partner=partner,
        curvature=curvature, curvature_exact=bool(exact_curv), orth_residual=orth, max_residual=rmax,
        bias_residual=st["bias"], verdict=verdict, witness_values=wvals, witness_moves=wmoves,
        witnesses=witnesses, tol=tol, joint_curvature=math.nan if jc is None else jc.value,
        joint_curvature_complete=bool(jc is not None and jc.complete))


def _ff_bracket(Zs, S, Gm, M, live, n_active, tol, options):
    """The bracket ``[low, up]`` of every feature's feature-feature distance ``delta_d`` (theory.md §5.3):
    the co-occurrence lower bound and the weights' residual from above, tightened for the features whose
    bracket straddles ``tol`` by the NNLS screening and, if still undecided, the LP. Returns
    ``(low, up, exact, partner)``."""
    k = Gm.shape[0]
    low, partner = _ff_lower(Zs, Gm, live)
    with np.errstate(invalid="ignore", divide="ignore"):
        T = 1.0 - Gm  # T[d, e] = t_de
        Mq = M.T / np.where(live, S, 1.0)[None, :]  # Mq[d, e] = sum_i nu_id z_ie / S_e
        D = np.abs(T - Mq)
    D[:, ~live] = 0.0
    np.fill_diagonal(D, 0.0)
    up = D.max(axis=1) if k else np.zeros(0)
    up = np.maximum(up, low)
    exact = np.isclose(low, up, rtol=0, atol=1e-12 + 1e-9 * up)
    straddle = np.flatnonzero(live & ~exact & (low <= tol) & (up > tol))
    straddle = straddle[np.argsort(-up[straddle])][: options.max_lp]
    for d in straddle:
        size = int(np.count_nonzero(live)) * int(Zs.shape[0] - n_active[d])
        if size <= options.nnls_max_size:  # screening: the Euclidean projection brackets delta_d
            lo2, up2 = _ff_nnls(Zs, S, Gm, live, d)
            low[d], up[d] = max(low[d], lo2), min(up[d], max(up2, low[d]))
            if low[d] > tol or up[d] <= tol:
                continue
        if _lp_size(Zs, live, d) > options.lp_max_nnz:
            continue
        val = _ff_lp(Zs, S, Gm, live, d, options.lp_time_limit)
        if math.isfinite(val):
            low[d] = up[d] = max(val, low[d])
            exact[d] = True
    exact |= np.isclose(low, up, rtol=0, atol=1e-12 + 1e-9 * up)
    return low, up, exact, partner


def _severity(lam, tol, code_margin, act_err, atom_res, ff_low, curvature, live, dead, orth, rmax):
    """What failed for each feature, and how badly (a fraction of ``lam``, or dimensionless); 0: nothing."""
    sev = np.zeros(live.size)
    sev = np.maximum(sev, np.where(code_margin < -tol * lam, -code_margin / lam, 0.0))
    sev = np.maximum(sev, np.where(act_err > tol * lam, act_err / lam, 0.0))
    sev = np.maximum(sev, np.where(atom_res > tol, atom_res, 0.0))
    sev = np.maximum(sev, np.where(np.nan_to_num(ff_low) > tol, ff_low, 0.0))
    sev = np.maximum(sev, np.where(np.nan_to_num(curvature) < -tol * lam * lam, 1e-3, 0.0))
    if dead.size and rmax > lam * (1 + tol):
        sev = np.maximum(sev, np.where(live & (orth > tol * lam), 1e-6, 0.0))
        sev[dead] = np.maximum(sev[dead], (rmax - lam) / lam)
    return sev


def _search_witnesses(X, Wu, Zs, b, lam, value, sev, failed, options, witnesses, wvals, wmoves, margins):
    """Follow each failed feature (most violated first, at most ``options.max_witnesses``) along the moves of
    :func:`widelimit.exact.witness.candidates`; keep the first whose recomputed objective is strictly below
    ``value`` (in ``witnesses``, ``wvals``, ``wmoves``). Returns the number of features searched."""
    tol, code_margin, act_err, atom_res, ff_low, partner, curvature, live, dead, rmax, orth, st = margins
    order = np.flatnonzero(failed)
    order = order[np.argsort(-sev[order], kind="stable")]
    if options.max_witnesses is not None:
        order = order[: options.max_witnesses]
    rnorm_cache = {}
    for d in order:
        for move, cand in candidates(X, Wu, Zs, b, lam, d, tol, code_margin, act_err, atom_res, ff_low,
                                      partner, curvature, live, dead, rmax, orth, st, rnorm_cache):
            if cand is None:
                continue
            W2, Z2, rows = cand
            Z2 = recode(X, W2, Z2, b, lam, rows, options.coding_tol)
            v2 = float(sae_objective(X, W2, Z2, b, lam=lam).value)
            if v2 < value - 1e-13 * max(1.0, abs(value)):
                wvals[int(d)] = v2
                wmoves[int(d)] = move
                if options.keep_witnesses:
                    witnesses[int(d)] = (W2, Z2, b.copy())
                break
    return int(order.size)


def _joint_witness(X, Wu, Zs, b, lam, jc, options, search, failed, witnesses, wvals, wmoves):
    """Follow the joint negative-curvature direction (theory.md §5.4); credit the atoms that carry it.

    The atoms whose block of the direction holds at least a tenth of the largest block are marked failed;
    a verified witness (recomputed objective strictly lower) is recorded for those without one.
    """
    wts = jc.feature_weights()
    if wts.size == 0 or wts.max() <= 0:
        return
    carriers = jc.features[wts >= 0.1 * wts.max()]
    failed[carriers] = True
    if not search:
        return
    found = joint_witness(X, Wu, Zs, b, lam, jc, coding_tol=options.coding_tol)
    if found is None:
        return
    (W2, Z2, b2), v2 = found
    for d in carriers:
        if int(d) not in wvals:
            wvals[int(d)] = v2
            wmoves[int(d)] = "joint"
            if options.keep_witnesses:
                witnesses[int(d)] = (W2, Z2, b2)


def stability_rows(X, W, Z, b, *, lam, max_witnesses: int = 8, tol: float = 1e-6) -> tuple[list[dict], dict]:
    """Hook for SAE certification: per-feature rows (``features.csv`` columns) and a JSON summary.

    ``W`` is the SAE's ``W_dec``, ``b`` its ``b_dec``, ``Z`` the codes (its optimal codes for
    ``W_dec``: the conditions of theory.md §5 are about the objective, not the encoder). Witness
    arrays are not kept (only their recomputed objective values), and at most ``max_witnesses``
    features are followed.
    """
    res = feature_stability(X, W, Z, b, lam=lam, options=StabilityOptions(
        tol=tol, max_witnesses=max_witnesses, keep_witnesses=False, max_lp=8))
    return res.rows(), res.as_dict()
