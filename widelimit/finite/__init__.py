"""Global optimum at a finite width: certified branch and bound (:mod:`.bnb`), SCIP cross-check (:mod:`.scip`).

Entry point: :func:`widelimit.solve` with ``width=k`` (theory: docs/theory.md §7).
"""

from .bnb import FiniteLimits, FiniteSolution, node_lower_bound, solve_finite

__all__ = ["FiniteLimits", "FiniteSolution", "node_lower_bound", "solve_finite"]
