r"""The sandwich check: every outer and inner bound of the Q-problem next to the closed-form optimum.

Outer cones (``nonneg``, ``dnn``, ``dnn_horn``) give lower bounds and inner
cones (``sdd``, ``nndd``, ``diagonal``) upper bounds on the CP optimum, which
equals ``widelimit.solve(X, lam).value`` (theory.md §4). :func:`sandwich` solves
each with :func:`widelimit.relax.cones.relax` and checks
``outer <= exact + slack`` and ``inner >= exact - slack``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._params import LAM, NONNEG, POSITIVE, ArrayLike, Data, InstanceOf, Passed, StrOptions, validate_params
from ..exact.median import huber_value
from ..exact.solve import solve
from .cones import CONES, SOLVERS, RelaxationResult, relax

__all__ = ["SandwichEntry", "SandwichReport", "sandwich"]


@dataclass(frozen=True)
class SandwichEntry:
    """One bound of a :class:`SandwichReport`."""

    cone: str
    kind: str
    status: str
    value: float
    error: float
    rel_error: float
    consistent: bool | None
    time_s: float
    result: RelaxationResult | None = None

    def as_dict(self) -> dict:
        return {"cone": self.cone, "kind": self.kind, "status": self.status, "value": self.value,
                "error": self.error, "rel_error": self.rel_error, "consistent": self.consistent,
                "time_s": self.time_s}


@dataclass(frozen=True)
class SandwichReport:
    r"""Outer and inner bounds of one instance next to the closed-form optimum.

    Attributes
    ----------
    exact : float
        ``widelimit.solve(X, lam).value`` (or ``H(b)`` for a fixed bias).
    entries : list of SandwichEntry
        ``error = value - exact``; ``consistent`` is ``value <= exact + slack``
        for outer cones and ``value >= exact - slack`` for inner ones, ``None``
        when the solver did not return a bound.
    slack : float
        ``rtol * max(1, |exact|)``.
    ok : bool
        Every returned bound is consistent (entries without a bound do not count).
    all_solved : bool
        Every requested cone returned a bound.
    """

    exact: float
    lam: float
    n_points: int
    dim: int
    solver: str
    tol: float
    rtol: float
    slack: float
    entries: list

    @property
    def ok(self) -> bool:
        return all(e.consistent is not False for e in self.entries)

    @property
    def all_solved(self) -> bool:
        return all(e.consistent is not None for e in self.entries)

    @property
    def lower(self) -> float:
        """Best (largest) outer bound returned, ``nan`` if none."""
        v = [e.value for e in self.entries if e.kind == "outer" and e.consistent is not None]
        return max(v) if v else float("nan")

    @property
    def upper(self) -> float:
        """Best (smallest) inner bound returned, ``nan`` if none."""
        v = [e.value for e in self.entries if e.kind == "inner" and e.consistent is not None]
        return min(v) if v else float("nan")

    def entry(self, cone: str) -> SandwichEntry:
        for e in self.entries:
            if e.cone == cone:
                return e
        raise KeyError(cone)

    def as_dict(self) -> dict:
        return {"exact": self.exact, "lam": self.lam, "n_points": self.n_points, "dim": self.dim, "solver": self.solver,
                "tol": self.tol, "rtol": self.rtol, "slack": self.slack, "ok": self.ok,
                "all_solved": self.all_solved, "lower": self.lower, "upper": self.upper,
                "entries": [e.as_dict() for e in self.entries]}


@validate_params({
    "X": Data(), "lam": LAM, "cones": [StrOptions(CONES), InstanceOf(list, tuple, allowed="a list of cone names"), None],
    "solver": StrOptions(SOLVERS, fold="upper"), "b": [ArrayLike(), None], "tol": POSITIVE, "rtol": [NONNEG, None],
    "relax_kwargs": Passed("widelimit.relax.cones.relax"),
})
def sandwich(X, *, lam, cones=None, solver: str = "SCS", b=None, tol: float = 1e-6, rtol: float | None = None,
             **relax_kwargs) -> SandwichReport:
    r"""Every requested outer and inner bound next to the closed-form optimum.

    For each cone ``K`` the Q-problem is solved (:func:`relax`) and compared with
    the exact optimum ``widelimit.solve(X, lam).value`` (with a fixed ``b``:
    ``H(b) = mean_i h_lam(||x_i - b||)``, the optimum over all widths at that bias).
    The check is ``outer <= exact + slack`` and ``inner >= exact - slack`` with
    ``slack = rtol * max(1, |exact|)``.

    Parameters
    ----------
    X, lam : data and sparsity.
    cones : sequence of str, optional
        Default: every cone of :data:`CONES` that applies (``dnn_horn`` needs N >= 5).
    solver : {"SCS", "CLARABEL"}
    b : array (n,), optional
        Fixed bias.
    tol : float
        Solver tolerance.
    rtol : float, optional
        Relative slack of the check; default ``max(1e-5, 100 * tol)``.
    **relax_kwargs
        Passed to :func:`relax`.

    Returns
    -------
    SandwichReport
    """
    N, n = X.shape
    if cones is None:
        cones = [c for c in CONES if not (c == "dnn_horn" and N < 5)]
    elif isinstance(cones, str):
        cones = [cones]
    exact = float(solve(X, lam=lam).value) if b is None else float(huber_value(X, b, lam=lam))
    rtol = max(1e-5, 100.0 * tol) if rtol is None else float(rtol)
    slack = rtol * max(1.0, abs(exact))
    entries = []
    for cone in cones:
        r = relax(X, lam=lam, cone=cone, solver=solver, b=b, tol=tol, **relax_kwargs)
        if r.ok:
            err = r.value - exact
            cons = bool(err <= slack) if r.kind == "outer" else bool(err >= -slack)
        else:
            err, cons = float("nan"), None
        entries.append(SandwichEntry(cone=r.cone, kind=r.kind, status=r.status, value=r.value, error=err,
                                     rel_error=abs(err) / max(abs(exact), 1e-300), consistent=cons,
                                     time_s=r.time_s, result=r))
    return SandwichReport(exact=exact, lam=lam, n_points=N, dim=n, solver=str(solver).upper(), tol=float(tol),
                          rtol=rtol, slack=slack, entries=entries)
