r"""The plain nonconvex formulation at width ``k`` solved by SCIP (optional extra ``scip``: pyscipopt).

.. math:: \min\ \frac1N\sum_{i,d} e_{id}^2 + \frac{2\lambda}{N}\sum_{ij} z_{ij}\quad
          e_{id} = \sum_j z_{ij} w_{jd} + b_d - x_{id},\quad \|w_j\|^2 = 1,\quad z \ge 0,

with bilinear ``z_ij w_jd``. SCIP needs finite bounds on every variable that enters a
nonlinear term; the ones used here cut off no optimum (docs/theory.md §7.5):
with ``V`` the value at ``Z = 0, b = mean(x)`` (the variance), every optimum has
``sum_j z_ij <= N V / (2 lam)``, ``||e_i|| <= sqrt(N V)`` and so
``||b - x_1|| <= sqrt(N V) + N V / (2 lam)``. The atoms' symmetry is broken by
``w_{1,1} <= w_{2,1} <= ...``. Used to cross-check the branch and bound in the tests and
as the peer of ``benchmarks/finite_width.py``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from ..exact.gap import relative_gap
from ..exact.objective import sae_objective

__all__ = ["ScipResult", "solve_scip"]


@dataclass(frozen=True)
class ScipResult:
    """SCIP's answer: best value (re-evaluated), its dual bound, status and time."""

    value: float
    lower_bound: float
    rel_gap: float
    status: str
    dictionary: np.ndarray
    codes: np.ndarray
    bias: np.ndarray
    time_s: float


def solve_scip(X, lam, width, *, time_limit: float = 1800.0, tol: float = 1e-6, threads: int = 1,
               max_iter: int | None = None) -> ScipResult:
    """Solve the plain formulation with SCIP to relative gap ``tol`` (or until ``time_limit`` seconds, or
    ``max_iter`` branch-and-bound nodes: a budget whose result does not depend on the machine's speed)."""
    try:
        from pyscipopt import Model, quicksum
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("SCIP needs the optional extra: pip install 'widelimit[scip]' (pyscipopt)") from e

    X = np.asarray(X, dtype=np.float64)
    N, n = X.shape
    k = int(width)
    lam = float(lam)
    V = float(np.mean(np.sum((X - X.mean(axis=0)) ** 2, axis=1)))
    zmax = N * V / (2 * lam)
    emax = math.sqrt(N * V)
    bmax = emax + zmax
    m = Model()
    m.hideOutput()
    m.setParam("limits/time", min(float(time_limit), 1e20))  # SCIP caps its limit at 1e20 s (math.inf: none)
    m.setParam("limits/gap", float(tol))
    m.setParam("limits/absgap", 0.0)
    if max_iter is not None:
        if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        m.setParam("limits/nodes", int(max_iter))
    w = [[m.addVar(f"w{j}_{d}", lb=-1.0, ub=1.0) for d in range(n)] for j in range(k)]
    z = [[m.addVar(f"z{i}_{j}", lb=0.0, ub=zmax) for j in range(k)] for i in range(N)]
    b = [m.addVar(f"b{d}", lb=X[0, d] - bmax, ub=X[0, d] + bmax) for d in range(n)]
    e = [[m.addVar(f"e{i}_{d}", lb=-emax, ub=emax) for d in range(n)] for i in range(N)]
    for j in range(k):
        m.addCons(quicksum(w[j][d] * w[j][d] for d in range(n)) == 1.0)
    for j in range(k - 1):
        m.addCons(w[j][0] <= w[j + 1][0])
    for i in range(N):
        for d in range(n):
            m.addCons(e[i][d] == quicksum(z[i][j] * w[j][d] for j in range(k)) + b[d] - float(X[i, d]))
    obj = m.addVar("obj", lb=0.0, ub=None)
    m.addCons(obj >= quicksum(e[i][d] * e[i][d] for i in range(N) for d in range(n)) * (1.0 / N)
              + quicksum(z[i][j] for i in range(N) for j in range(k)) * (2.0 * lam / N))
    m.setObjective(obj, "minimize")
    t0 = time.perf_counter()
    m.optimize()
    time_s = time.perf_counter() - t0
    status = m.getStatus()
    if m.getNSols() == 0:
        return ScipResult(math.inf, float(m.getDualbound()), math.inf, status, np.zeros((k, n)), np.zeros((N, k)),
                          np.zeros(n), time_s)
    s = m.getBestSol()
    W = np.array([[s[w[j][d]] for d in range(n)] for j in range(k)])
    W /= np.maximum(np.linalg.norm(W, axis=1, keepdims=True), 1e-300)
    Z = np.maximum(np.array([[s[z[i][j]] for j in range(k)] for i in range(N)]), 0.0)
    bb = np.array([s[b[d]] for d in range(n)])
    val = float(sae_objective(X, W, Z, bb, lam=lam).value)
    lb = float(m.getDualbound())
    return ScipResult(val, lb, relative_gap(val - lb, val), status, W, Z, bb, time_s)
