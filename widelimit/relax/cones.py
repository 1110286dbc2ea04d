r"""The convex Q-problem over approximations of the completely positive cone.

Eliminating the dictionary (theory.md §2) turns dictionary learning of any
width into the convex problem

.. math::

    \min_{Q \in \mathcal{CP}_N,\ b}\ f(Q, b) = \frac{\lambda}{N}\Big(
        \operatorname{tr}\big(\tilde X^\top (Q + \lambda I)^{-1} \tilde X\big)
        + \mathbf 1^\top Q \mathbf 1\Big), \qquad \tilde X = X - \mathbf 1 b^\top ,

whose only hard part is the cone. Replacing ``CP_N`` by a larger cone gives a
lower bound (an *outer* approximation), by a smaller one an upper bound
(*inner*):

.. math::

    \text{diagonal} \subset \text{nndd} \subset \text{sdd} \subset \mathcal{CP}_N
    \subset \text{dnn\_horn} \subset \text{dnn} \subset \text{nonneg}.

* ``nonneg``: symmetric, entrywise ``>= 0`` (``Q + lam I`` positive definite is
  enforced by the objective's domain).
* ``dnn``: doubly nonnegative, ``Q >= 0`` entrywise and ``Q`` positive semidefinite.
* ``dnn_horn``: DNN plus Horn cuts ``<H_pi, Q_S> >= 0`` on 5x5 principal
  submatrices (``H`` the Horn matrix, copositive but not ``PSD + NN``; ``pi``
  one of the 12 cyclic orders of a 5-subset ``S``), added by exact separation
  in rounds (cutting planes); ``N >= 5``.
* ``sdd``: nonnegative scaled diagonally dominant (factor width 2): sums of
  entrywise-nonnegative PSD matrices supported on a 2x2 principal block; an
  SOCP cone, inside CP because nonnegative PSD 2x2 matrices are CP.
* ``nndd``: nonnegative diagonally dominant, ``Q_ii >= sum_{j != i} Q_ij``,
  ``Q >= 0``; linear constraints, inside CP (a sum of ``e_i e_i^T`` and
  ``(e_i + e_j)(e_i + e_j)^T`` terms).
* ``diagonal``: ``Q = diag(q)``, ``q >= 0`` (one atom per point).

The objective is modelled with cvxpy's ``matrix_frac`` (an LMI of size
``N + n``) and solved by SCS (first order) or Clarabel (interior point).
For this problem every one of these bounds equals the closed-form optimum
``widelimit.solve(X, lam).value`` (theory.md §4: the gradient at the optimal
diagonal ``Q*`` is entrywise nonnegative, so it certifies optimality over every
cone between CP and ``nonneg``, and a diagonal ``Q`` is optimal), which makes
the family a benchmark for conic solvers with a *known* optimum:
:func:`widelimit.relax.sandwich.sandwich` checks ``outer <= exact <= inner`` and reports each error.

A solver that stops with an inaccurate or infeasible status is reported with
that status and ``value = nan``: it is never returned as a bound.
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .._memory import check_memory, gib, memory_budget
from .._runtime import stdout_to_stderr
from .._params import (LAM, NONNEG_INT, POSITIVE, POSITIVE_INT, ArrayLike, Boolean, Data, InstanceOf, StrOptions,
                       String, validate_params)
from .._validation import check_vector
from ..results import CertifiedResult, shared_dict
from .dnn import dnn_bytes

__all__ = [
    "CONES",
    "OUTER_CONES",
    "INNER_CONES",
    "SOLVERS",
    "RelaxationResult",
    "relax",
    "horn_matrix",
    "horn_separation",
    "estimate_memory",
    "problem_entries",
    "check_relax_memory",
    "solver_memory",
]

#: Outer approximations of CP (their optimal values are lower bounds).
OUTER_CONES = ("nonneg", "dnn", "dnn_horn")
#: Inner approximations of CP (every feasible Q is CP; values are upper bounds).
INNER_CONES = ("sdd", "nndd", "diagonal")
#: Every cone :func:`relax` accepts, from the largest to the smallest.
CONES = OUTER_CONES + INNER_CONES
#: Conic solvers accepted by name.
SOLVERS = ("SCS", "CLARABEL")

#: ``(base MiB, c, p)`` of the measured peak memory ``base + c * m^p`` bytes per (solver, cone), ``m`` =
#: :func:`problem_entries`: fitted by ``benchmarks/memory_models.py`` to solves at N = 20..400 (results in
#: ``benchmarks/results/memory_models.{json,md}``). SCS: about 1.1 KB per entry (N = 1,000, n = 8: 2.5 GB);
#: Clarabel: a dense block per PSD cone, quadratic in the entries.
_MEMORY_FITS = {
    ("SCS", "nonneg"): (8.3, 1069, 1), ("SCS", "dnn"): (0.0, 1247, 1), ("SCS", "sdd"): (8.3, 1615, 1),
    ("SCS", "nndd"): (8.9, 1229, 1), ("SCS", "diagonal"): (8.7, 707.6, 1),
    ("CLARABEL", "nonneg"): (11.8, 8.535, 2), ("CLARABEL", "dnn"): (15.0, 8.877, 2),
    ("CLARABEL", "sdd"): (16.2, 2.991, 2), ("CLARABEL", "nndd"): (12.3, 10.09, 2),
    ("CLARABEL", "diagonal"): (9.0, 0.5127, 2),
}
#: Margin on the fitted models: the largest measured point was 1.21x its fit.
_SAFETY = 1.25

_OK = "optimal"


def horn_matrix() -> np.ndarray:
    r"""The 5x5 Horn matrix: copositive, but not a sum of a PSD and a nonnegative matrix.

    .. math:: H_{ii} = 1,\quad H_{i,i\pm1} = -1,\quad H_{i,i\pm2} = 1 \pmod 5 .

    ``<H, A> >= 0`` for every completely positive ``A``; a doubly nonnegative
    ``A`` with ``<H, A> < 0`` is therefore not CP.
    """
    H = np.ones((5, 5))
    for i in range(5):
        H[i, (i + 1) % 5] = H[(i + 1) % 5, i] = -1.0
    return H


# The 12 distinct 5-cycles on positions 0..4 (cyclic orders up to rotation and reflection).
def _five_cycles() -> np.ndarray:
    seen, out = set(), []
    for p in itertools.permutations(range(1, 5)):
        cyc = (0,) + p
        edges = frozenset(frozenset((cyc[i], cyc[(i + 1) % 5])) for i in range(5))
        if edges not in seen:
            seen.add(edges)
            out.append(cyc)
    return np.array(out)


_CYCLES = _five_cycles()


def horn_separation(Q, *, max_cuts: int = 50, max_subsets: int = 300_000, tol: float = 0.0,
                    seed: int = 0) -> list[tuple[tuple[int, ...], float]]:
    r"""Most violated Horn cuts of a symmetric matrix ``Q``.

    For a 5-subset ``S`` and a cyclic order ``c`` of it,

    .. math:: \langle H_c, Q_S\rangle = \operatorname{tr} Q_S + 2\sum_{\{i,j\}\subset S} Q_{ij}
              - 4 \sum_{\text{edges } \{i,j\} \text{ of } c} Q_{ij},

    so the most violated order of ``S`` is its heaviest 5-cycle. All
    ``C(N, 5)`` subsets are searched when there are at most ``max_subsets`` of
    them, else ``max_subsets`` random ones (seeded).

    Returns
    -------
    list of (cycle, value)
        Up to ``max_cuts`` cycles (point indices in cyclic order) with
        ``<H_c, Q_S> < -tol``, most violated first.
    """
    Q = np.asarray(Q, dtype=np.float64)
    N = Q.shape[0]
    if N < 5:
        return []
    total = math.comb(N, 5)
    rng = np.random.default_rng(seed)
    best: list[tuple[float, tuple[int, ...]]] = []

    def subsets():
        if total <= max_subsets:
            it = itertools.combinations(range(N), 5)
            while True:
                chunk = np.fromiter(itertools.chain.from_iterable(itertools.islice(it, 50_000)), dtype=np.int64)
                if chunk.size == 0:
                    return
                yield chunk.reshape(-1, 5)
        else:
            left = max_subsets
            while left > 0:
                m = min(left, 50_000)
                left -= m
                yield np.sort(np.argsort(rng.random((m, N)), axis=1)[:, :5], axis=1)

    for S in subsets():
        sub = Q[S[:, :, None], S[:, None, :]]  # (m, 5, 5)
        tr = np.einsum("mii->m", sub)
        off = (sub.sum(axis=(1, 2)) - tr) / 2.0
        C = S[:, _CYCLES]  # (m, 12, 5) point indices in cyclic order
        edge = Q[C, np.roll(C, -1, axis=2)].sum(axis=2)  # (m, 12)
        j = np.argmax(edge, axis=1)
        val = tr + 2.0 * off - 4.0 * edge[np.arange(len(S)), j]
        bad = np.flatnonzero(val < -tol)
        if bad.size:
            order = bad[np.argsort(val[bad])][:max_cuts]
            best.extend((float(val[i]), tuple(int(v) for v in C[i, j[i]])) for i in order)
            best.sort(key=lambda t: t[0])
            del best[max_cuts:]
    return [(c, v) for v, c in best]


def _horn_constraint(Q, cycle):
    """``<H_c, Q_S> >= 0`` as a cvxpy constraint."""
    S = sorted(cycle)
    pos = {p: i for i, p in enumerate(S)}
    H = np.ones((5, 5))
    for a in range(5):
        i, j = pos[cycle[a]], pos[cycle[(a + 1) % 5]]
        H[i, j] = H[j, i] = -1.0
    import cvxpy as cp

    return cp.sum(cp.multiply(H, Q[S][:, S])) >= 0


def problem_entries(N: int, n: int, cone: str) -> int:
    """Scalar entries of the conic constraints of the Q-problem on ``N x n`` data over ``cone``.

    The objective's LMI has side ``d = N + n`` (``d(d+1)/2`` entries); the cone adds ``N^2``
    entries for ``Q >= 0``, ``N(N+1)/2`` for ``Q`` PSD (``dnn``), ``3 N(N-1)/2`` for the 2x2
    blocks of ``sdd``, ``N`` for the diagonal dominance of ``nndd``, ``N`` for a diagonal ``Q``.
    The size that :func:`estimate_memory`'s measured models are fitted in.
    """
    d = N + n
    m = d * (d + 1) // 2
    extra = {"diagonal": N, "nonneg": N * N, "dnn": N * N + N * (N + 1) // 2,
             "dnn_horn": N * N + N * (N + 1) // 2, "nndd": N * N + N, "sdd": N * N + 3 * N * (N - 1) // 2}
    return m + extra.get(cone, N * N)


def estimate_memory(N: int, n: int, cone: str, solver: str) -> int:
    """Peak memory (bytes) a solve of the ``N x n`` Q-problem over ``cone`` adds, from measurements.

    ``SAFETY * (base + c * m^p)`` with ``m`` = :func:`problem_entries` and ``(base, c, p)`` fitted per
    solver and cone to the peak resident memory of solves at several ``N`` (``benchmarks/memory_models.py``;
    the fits are recorded in ``benchmarks/results/memory_models.json``; theory.md §9). SCS grows linearly
    in ``m`` (a sparse factorisation, about 1.1 KB per entry); Clarabel factors a dense block for each
    PSD cone (``m^2``). Model building in cvxpy is included. ``dnn_horn`` is estimated as ``dnn``
    (its cuts add a few scalar constraints).
    """
    base, c, p = _MEMORY_FITS[(solver.upper(), "dnn" if cone == "dnn_horn" else cone)]
    return int(_SAFETY * (base * 2**20 + c * float(problem_entries(N, n, cone)) ** p))


def solver_memory(N: int, n: int, cone: str) -> dict[str, int]:
    """Estimated peak memory (bytes) of every solver that solves the ``N x n`` Q-problem over ``cone``.

    ``SCS`` and ``CLARABEL`` (:func:`estimate_memory`), and ``TORCH`` (widelimit's own first-order DNN
    solver, :func:`widelimit.solve_dnn`, on the CPU: :func:`widelimit.relax.dnn.dnn_bytes`) for ``dnn`` only.
    """
    cone = str(cone).lower()
    out = {s: estimate_memory(N, n, cone, s) for s in SOLVERS}
    if cone == "dnn":
        out["TORCH"] = dnn_bytes(N)
    return out


#: How a refusal names each solver to a library caller (the command line names them ``--solver NAME``).
_LIBRARY_NAMES = {"SCS": "solver='SCS'", "CLARABEL": "solver='CLARABEL'",
                  "TORCH": "widelimit.solve_dnn (relax --solver TORCH)"}


def check_relax_memory(N: int, n: int, cone: str, solver: str, budget=None, *, names=None) -> None:
    """Refuse (one :class:`widelimit._memory.MemoryBudgetError` line) a :func:`relax` solve whose
    estimated memory (:func:`solver_memory`) is above the memory budget; called before anything is built.

    The refusal names only the other solvers whose estimate fits the budget, each with its estimate
    (``solver='SCS' (about 11 MiB)``; ``names`` maps a solver to how it is named, the command line's
    ``--solver SCS``); where none fits it says to use a smaller N.
    """
    solver, cone = str(solver).upper(), str(cone).lower()
    names = _LIBRARY_NAMES if names is None else names
    est = solver_memory(N, n, cone)
    cap = memory_budget(budget)
    fit = [f"{names[s]} (about {gib(b)})" for s, b in sorted(est.items(), key=lambda t: t[1])
           if s != solver and b <= cap]
    hint = (f"use {' or '.join(fit)}, which fit{'s' if len(fit) == 1 else ''} within it, or a smaller N" if fit
            else "no solver fits within it: use a smaller N")
    what = f"{solver} on cone {cone!r} with N = {N}, n = {n}" if solver != "TORCH" else \
        f"the TORCH solver on N = {N} points"
    check_memory(est[solver], what, hint=hint, budget=budget)


@dataclass(frozen=True)
class RelaxationResult(CertifiedResult):
    """Solution of the Q-problem over one cone.

    Attributes
    ----------
    cone : str
    kind : str
        ``"outer"`` (value is a lower bound on the CP optimum) or ``"inner"`` (upper bound).
    solver : str
    status : str
        cvxpy's status (``"optimal"``, ``"optimal_inaccurate"``, ``"infeasible"``,
        ...) or ``"solver_error"``.
    value : float
        Optimal value when ``status == "optimal"``, else ``nan`` (never a bound).
    solver_value : float
        The solver's objective whatever the status (``nan`` when it has none).
    Q : ndarray (N, N) or None
        The solver's ``Q`` (None when the solver returned nothing).
    b : ndarray (n,) or None
        The bias (the fixed one when ``b`` was given).
    time_s : float
        Wall time of the solve calls (model building included).
    solve_time_s : float
        Time the solver itself reported.
    tol : float
        Tolerance passed to the solver.
    n_points, dim : int
        ``N`` and ``n`` of the data.
    n_cuts, n_iter : int
        Horn cuts added and solves performed (``dnn_horn``; 0 and 1 otherwise).
    message : str
        Why the result is not a bound, when it is not.
    lower_bound, gap, rel_gap, certified
        A relaxation is solved to the solver's tolerance, not certified: ``lower_bound`` is ``value`` for an
        outer cone that reached ``optimal`` (else ``nan``), ``gap`` and ``rel_gap`` are ``nan`` and
        ``certified`` is ``False`` (:func:`widelimit.sandwich` checks the values against the closed form;
        :func:`widelimit.solve_dnn` certifies the DNN bound).
    """

    cone: str
    kind: str
    solver: str
    status: str
    value: float
    solver_value: float
    Q: np.ndarray | None
    b: np.ndarray | None
    time_s: float
    solve_time_s: float
    tol: float
    n_points: int
    dim: int
    lam: float
    n_cuts: int = 0
    n_iter: int = 1
    message: str = ""
    info: dict = field(default_factory=dict)

    @property
    def lower_bound(self) -> float:
        return self.value if self.kind == "outer" and self.ok else float("nan")

    gap = rel_gap = float("nan")  #: not certified (the class docstring)
    certified = False

    @property
    def ok(self) -> bool:
        """True when the solver reported ``optimal`` (the value may be used as a bound)."""
        return self.status == _OK

    @property
    def bound(self) -> float:
        """The value as a bound; raises :class:`RuntimeError` if the solve did not reach ``optimal``."""
        if not self.ok:
            raise RuntimeError(
                f"{self.solver} stopped with status {self.status!r} on cone {self.cone!r}: no bound "
                f"({self.message or 'solver did not reach its tolerance'})"
            )
        return self.value

    def as_dict(self) -> dict:
        """Plain-Python summary (JSON-serialisable); ``Q`` is left out."""
        return {
            **shared_dict(self), "cone": self.cone, "kind": self.kind, "solver": self.solver,
            "solver_value": self.solver_value, "solve_time_s": self.solve_time_s, "n_points": self.n_points,
            "dim": self.dim, "lam": self.lam, "n_cuts": self.n_cuts, "message": self.message,
            "b": None if self.b is None else [float(v) for v in self.b], **self.info,
        }


def _solver_kwargs(solver: str, tol: float, max_iter: int | None, solver_opts: dict | None) -> dict:
    if solver == "SCS":
        kw = {"eps_abs": tol, "eps_rel": tol, "max_iters": 100_000 if max_iter is None else int(max_iter)}
    else:
        kw = {"tol_gap_abs": tol, "tol_gap_rel": tol, "tol_feas": tol, "tol_ktratio": min(1e-6, tol)}
        if max_iter is not None:
            kw["max_iter"] = int(max_iter)
    kw.update(solver_opts or {})
    return kw


def _cone_constraints(cone: str, Q, N: int):
    import cvxpy as cp

    if cone == "nonneg":
        return [Q >= 0]
    if cone in ("dnn", "dnn_horn"):
        return [Q >> 0, Q >= 0]
    if cone == "nndd":
        return [Q >= 0, 2 * cp.diag(Q) >= cp.sum(Q, axis=1)]
    if cone == "sdd":
        iu, ju = np.triu_indices(N, 1)
        P = iu.size
        if P == 0:
            return [Q >= 0]
        a = cp.Variable(P, nonneg=True)
        d = cp.Variable(P, nonneg=True)
        c = cp.vec(Q, order="F")[iu + ju * N]  # Q[i, j] for i < j
        Ai = sp.csr_matrix((np.ones(P), (iu, np.arange(P))), shape=(N, P))
        Aj = sp.csr_matrix((np.ones(P), (ju, np.arange(P))), shape=(N, P))
        # each 2x2 block [[a, c], [c, d]] is PSD: a d >= c^2 (rotated second-order cone)
        return [Q >= 0, cp.diag(Q) == Ai @ a + Aj @ d, cp.SOC(a + d, cp.vstack([2 * c, a - d]), axis=0)]
    raise ValueError(f"unknown cone {cone!r}")


@validate_params({
    "X": Data(), "lam": LAM, "cone": StrOptions(CONES, fold="lower"), "solver": StrOptions(SOLVERS, fold="upper"),
    "b": [ArrayLike(), None], "tol": POSITIVE, "max_iter": [POSITIVE_INT, None], "solver_opts": [InstanceOf(dict), None],
    "max_memory": [POSITIVE, String(allowed="a size such as '512M'"), None], "horn_rounds": NONNEG_INT,
    "horn_cuts": POSITIVE_INT, "horn_subsets": POSITIVE_INT,
    "verbose": Boolean(),
})
def relax(X, *, lam, cone: str = "dnn", solver: str = "SCS", b=None, tol: float = 1e-6,
          max_iter: int | None = None, solver_opts: dict | None = None,
          max_memory: float | None = None, horn_rounds: int = 5, horn_cuts: int = 50,
          horn_subsets: int = 300_000, verbose: bool = False) -> RelaxationResult:
    r"""Minimise the Q-form ``f(Q, b)`` over an approximation of the CP cone.

    .. math:: \min_{Q\in K,\ b}\ \frac{\lambda}{N}\Big(\operatorname{tr}\big(\tilde X^\top(Q+\lambda I)^{-1}\tilde X\big)
              + \mathbf 1^\top Q\mathbf 1\Big)

    Parameters
    ----------
    X : array (N, n)
        Data (float32 accepted; the model is built in float64).
    lam : float
        Sparsity parameter ``lam > 0``.
    cone : str
        One of :data:`CONES`: outer ``nonneg``, ``dnn``, ``dnn_horn`` (N >= 5);
        inner ``sdd``, ``nndd``, ``diagonal``.
    solver : {"SCS", "CLARABEL"}
    b : array (n,), optional
        Fixed bias; by default ``b`` is a free variable.
    tol : float
        Solver tolerance (SCS ``eps_abs = eps_rel``; Clarabel gap and feasibility tolerances).
    max_iter : int, optional
        Iteration cap passed to the solver.
    solver_opts : dict, optional
        Extra keyword arguments for the solver (override the tolerance mapping).
    max_memory : float or str, optional
        Memory budget in bytes (or ``"4G"``); default :func:`widelimit._memory.memory_budget` (half of
        the machine's memory, or ``$WIDELIMIT_MEMORY_BUDGET``). A solve whose measured-model estimate
        (:func:`estimate_memory`) is above it is refused before anything is built.
    horn_rounds, horn_cuts, horn_subsets : int
        ``dnn_horn`` only: cutting-plane rounds, cuts added per round, and
        5-subsets searched per separation (all of them when ``C(N,5)`` is smaller).
    verbose : bool
        Solver output (to the solver's own stdout).

    Returns
    -------
    RelaxationResult
        ``value`` is ``nan`` unless the solver's status is ``optimal``.

    Raises
    ------
    ValueError
        Unknown cone or solver, bad data, ``lam <= 0``, ``dnn_horn`` with ``N < 5``.
    MemoryError
        (:class:`widelimit._memory.MemoryBudgetError`) the solve's estimated memory is above the budget
        (Clarabel's dense PSD blocks grow like ``N^4``, SCS's work space like ``N^2``).
    """
    X = np.asarray(X, dtype=np.float64)
    N, n = X.shape
    if cone == "dnn_horn" and N < 5:
        raise ValueError(f"cone 'dnn_horn' needs N >= 5 points (Horn cuts are 5x5), got N = {N}")
    check_relax_memory(N, n, cone, solver, max_memory)
    b_fixed = None if b is None else check_vector(b, n, "b")
    kind = "outer" if cone in OUTER_CONES else "inner"

    Q, q, bv, obj, cons = _model(X, lam, cone, b_fixed)
    solver_opts = dict(solver_opts or {})
    verbose = bool(solver_opts.pop("verbose", verbose))
    if "solver" in solver_opts:
        raise ValueError("choose the solver with solver=..., not inside solver_opts")
    kw = _solver_kwargs(solver, float(tol), max_iter, solver_opts)
    t0 = time.perf_counter()
    status, sval, message, solve_time, cuts, rounds = _solve_with_cuts(
        obj, cons, Q, cone, solver, verbose, kw, tol, horn_rounds, horn_cuts, horn_subsets)
    elapsed = time.perf_counter() - t0
    Qval = None
    if cone == "diagonal":
        if q.value is not None:
            Qval = np.diag(np.asarray(q.value, dtype=np.float64))
    elif Q.value is not None:
        Qval = np.asarray(Q.value, dtype=np.float64)
        Qval = 0.5 * (Qval + Qval.T)
    bval = b_fixed if b_fixed is not None else None if bv.value is None else np.asarray(bv.value, dtype=np.float64)
    info = {}
    if cone == "dnn_horn":
        info["horn_exhaustive"] = math.comb(N, 5) <= horn_subsets
    return RelaxationResult(
        cone=cone, kind=kind, solver=solver, status=status,
        value=sval if status == _OK else float("nan"), solver_value=sval, Q=Qval, b=bval,
        time_s=elapsed, solve_time_s=solve_time, tol=float(tol), n_points=N, dim=n, lam=lam,
        n_cuts=len(cuts), n_iter=rounds, message=message, info=info,
    )


def _model(X, lam, cone, b_fixed):
    """The cvxpy problem: ``Q`` over ``cone`` (``q`` its diagonal for the diagonal cone), the bias variable
    ``bv`` (``None`` when fixed), the objective ``(lam/N)(tr(Xt^T (Q + lam I)^{-1} Xt) + sum Q)`` and the
    cone's constraints."""
    import cvxpy as cp

    N, n = X.shape
    q = None
    if cone == "diagonal":
        q = cp.Variable(N, nonneg=True)
        Q = cp.diag(q)
        cons = []
    else:
        Q = cp.Variable((N, N), symmetric=True)
        cons = _cone_constraints(cone, Q, N)
    if b_fixed is None:
        bv = cp.Variable(n)
        Xt = X - np.ones((N, 1)) @ cp.reshape(bv, (1, n), order="C")
    else:
        bv = None
        Xt = X - b_fixed[None, :]
    obj = (lam / N) * (cp.matrix_frac(Xt, Q + lam * np.eye(N)) + cp.sum(Q))
    return Q, q, bv, obj, cons


def _solve_with_cuts(obj, cons, Q, cone, solver, verbose, kw, tol, horn_rounds, horn_cuts, horn_subsets):
    """Solve, and for ``"dnn_horn"`` add the violated Horn cuts and solve again (at most ``horn_rounds`` times).
    Returns ``(status, solver value, message, solve time, cuts, rounds)``."""
    import cvxpy as cp

    solve_time = 0.0
    cuts: list = []
    rounds = 0
    status, sval, message = "solver_error", float("nan"), ""
    while True:
        rounds += 1
        prob = cp.Problem(cp.Minimize(obj), cons + [_horn_constraint(Q, c) for c in cuts])
        try:
            # the status is reported instead of cvxpy's warning; the C solvers' own lines (SCS:
            # "ERROR: work memory allocation failure") go to stderr, never into a --json stdout
            with warnings.catch_warnings(), stdout_to_stderr():
                warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                prob.solve(solver=solver, verbose=verbose, **kw)
            status = str(prob.status)
            sval = float(prob.value) if prob.value is not None and np.isfinite(prob.value) else float("nan")
            st = getattr(prob.solver_stats, "solve_time", None)
            solve_time += float(st) if st is not None else 0.0
            message = "" if status == _OK else f"solver status {status}"
        except cp.error.SolverError as e:
            status, sval = "solver_error", float("nan")
            message = str(e).splitlines()[0] if str(e) else "solver failed"
        if cone != "dnn_horn" or status != _OK or rounds > horn_rounds:
            break
        Qv = np.asarray(Q.value, dtype=np.float64)
        new = horn_separation(Qv, max_cuts=horn_cuts, max_subsets=horn_subsets,
                              tol=max(10 * tol, 1e-9) * max(1.0, float(np.abs(np.diag(Qv)).max())))
        new = [c for c, _ in new if c not in cuts]
        if not new:
            break
        cuts.extend(new)
    return status, sval, message, solve_time, cuts, rounds
