r"""The width frontier: best objective found at each width, against the wide-limit bound.

For a width ``k`` the optimum ``L*(k)`` is nonincreasing in ``k`` and bounded below
by the certified wide-limit bound ``min_b H(b)`` (theory.md §3), which it reaches at
``k = number of rays`` (theory.md §6, "splitting with width"). :func:`frontier`
estimates ``L*(k)`` by the best of several gradient runs per width (ray-clustering
initialisation first), checks every value against the bound, reports the
*saturation width* (smallest width within ``sat_tol`` of the bound) next to the
number of rays, and draws loss vs width with the bound line.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path


from .._params import (LAM, POSITIVE, POSITIVE_INT, PROGRESS, SEED, TIME_LIMIT, TOL, Boolean, Data, InstanceOf, Passed,
                       PathLike, validate_params)
from .._validation import check_int
from .crossval import best_fit
from .gradient import check_fit_memory
from ..engine.local import Progress
from ..exact.solve import WideLimitSolution, solve
from ..plot import save_figure, subplots

__all__ = ["Frontier", "frontier", "plot_frontier"]


@dataclass(frozen=True)
class Frontier:
    """Loss vs width.

    Attributes
    ----------
    widths : list of int
    values : list of float
        Best objective found per width (over restarts), float64.
    restart_values : list of list of float
    lower_bound : float
        Certified wide-limit bound (no width does better).
    exact_value : float
        Objective of the exact narrowest optimum (width ``n_rays``).
    n_rays : int
        Number of rays: the narrowest optimal width.
    saturation_width : int or None
        Smallest width in ``widths`` whose best value is within ``sat_tol`` (relative) of the bound.
    respects_bound : bool
        Every run's value is ``>= lower_bound`` (up to ``1e-9`` relative).
    monotone : bool
        Best values are nonincreasing in width (up to ``sat_tol``); a failure means
        the restarts missed the optimum at some width.
    sat_tol : float
    lam : float
    plot : str or None
        PNG written, if any.
    exact_values, exact_lower_bounds : list of float or None
        With ``exact_widths=True``: the certified optimum ``L*(k)`` per width (best found and
        its certified lower bound; equal up to the relative gap when certified).
    exact_certified : list of bool or None
    status : str
        ``"done"`` (every width fitted) or ``"time_limit"`` (the budget ran out: ``skipped_widths`` were not).
    skipped_widths : list of int
        Widths asked for but not fitted within ``time_limit``.
    """

    widths: list
    values: list
    restart_values: list
    lower_bound: float
    exact_value: float
    n_rays: int
    saturation_width: int | None
    respects_bound: bool
    monotone: bool
    sat_tol: float
    lam: float
    plot: str | None = None
    exact: WideLimitSolution | None = field(default=None, repr=False)
    exact_values: list | None = None
    exact_lower_bounds: list | None = None
    exact_certified: list | None = None
    status: str = "done"
    skipped_widths: list = field(default_factory=list)

    def as_dict(self) -> dict:
        """Plain-Python summary (JSON-serialisable)."""
        return {
            "widths": self.widths, "values": self.values, "restart_values": self.restart_values,
            "rel_gaps": [(v - self.lower_bound) / max(abs(v), 1e-300) for v in self.values],
            "lower_bound": self.lower_bound, "exact_value": self.exact_value, "n_rays": self.n_rays,
            "saturation_width": self.saturation_width, "respects_bound": self.respects_bound,
            "monotone": self.monotone, "sat_tol": self.sat_tol, "lam": self.lam, "plot": self.plot,
            "exact_values": self.exact_values, "exact_lower_bounds": self.exact_lower_bounds,
            "exact_certified": self.exact_certified, "status": self.status, "skipped_widths": self.skipped_widths,
        }


@validate_params({"X": Data(), "lam": LAM, "widths": Passed("frontier: each width an integer >= 1, checked in the body"),
                  "n_restarts": POSITIVE_INT, "seed": SEED, "inits": InstanceOf(list, tuple, allowed="a list of inits"),
                  "sat_tol": TOL, "out": [PathLike(), None], "exact": [InstanceOf(WideLimitSolution), None], "progress": PROGRESS,
                  "exact_widths": Boolean(), "exact_time_limit": TIME_LIMIT, "time_limit": [POSITIVE, None],
                  "fit_kwargs": Passed("widelimit.fit_dictionary")})
def frontier(X, *, lam, widths, n_restarts: int = 3, seed: int = 0, inits=("rays", "data"),
             sat_tol: float = 1e-4, out=None, exact: WideLimitSolution | None = None, progress=None,
             exact_widths: bool = False, exact_time_limit: float = 600.0, time_limit: float | None = None,
             **fit_kwargs) -> Frontier:
    """Best objective per width (restarts), the wide-limit bound, the saturation width and a plot.

    Parameters
    ----------
    X : array (N, n)
    lam : float
    widths : sequence of int
        Widths to fit (each >= 1).
    n_restarts : int
        Gradient runs per width, cycling through ``inits`` with seeds ``seed, seed+1, ...``.
    inits : sequence of str
        Initialisations (the default starts with the ray clustering).
    sat_tol : float
        Relative gap under which a width counts as saturated.
    out : path, optional
        Write the loss-vs-width PNG here.
    exact : WideLimitSolution, optional
        Precomputed :func:`widelimit.solve` result.
    progress : callable(Progress), optional
        Receives a :class:`widelimit.Progress` event after each width (``stage="width k"``,
        ``value`` = the best objective found at that width); with ``exact_widths``, then the branch
        and bound's events of each width (``stage="exact width k"``, ``value`` and certified ``lower_bound``).
    exact_widths : bool
        Also compute the certified optimum at each width (``widelimit.solve(X, lam=, width=k)``,
        branch and bound; small data only), each capped at ``exact_time_limit`` seconds; each reuses
        the wide-limit solve's median.
    time_limit : float, optional
        Seconds for the gradient fits of all widths together (smallest width first). Each run's
        ``time_limit`` is capped by what is left; once nothing is left, the remaining widths are skipped
        (``status="time_limit"``, ``skipped_widths``); the first width is always fitted.
    **fit_kwargs
        Passed to :func:`widelimit.fit_dictionary`.

    Returns
    -------
    Frontier
    """
    if isinstance(widths, (str, bytes)) or not hasattr(widths, "__iter__"):
        raise ValueError(f"widths must be a list of integers >= 1, got {type(widths).__name__} {widths!r}"[:200])
    ws = [check_int(w, "every width", low=1) for w in widths]
    if not ws:
        raise ValueError("widths is empty")
    ws = sorted(set(ws))
    # the largest width's fit is refused now, not after the smaller ones ran
    check_fit_memory(X.shape[0], X.shape[1], ws[-1], encoder=fit_kwargs.get("encoder", "none"),
                     batch_size=fit_kwargs.get("batch_size"), device=fit_kwargs.get("device", "auto"))
    t0 = time.perf_counter()
    ex = solve(X, lam=lam) if exact is None else exact
    lb = float(ex.lower_bound)
    values, restarts, skipped = [], [], []
    for i, w in enumerate(ws):
        kw = dict(fit_kwargs)
        if time_limit is not None:
            left = float(time_limit) - (time.perf_counter() - t0)
            if left <= 0 and i > 0:
                skipped = ws[i:]
                break
            per_run = max(left, 1e-3) / int(n_restarts)
            kw["time_limit"] = per_run if kw.get("time_limit") is None else min(float(kw["time_limit"]), per_run)
        best, fits = best_fit(X, lam=lam, width=w, n_restarts=n_restarts, seed=seed, inits=inits, **kw)
        values.append(best.value)
        restarts.append([f.value for f in fits])
        if progress is not None:
            progress(Progress(stage=f"width {w}", pass_index=i + 1, rows_done=i + 1, rows_total=len(ws),
                              value=best.value, done=i + 1 == len(ws)))
    ws = ws[:len(values)]
    slack = 1e-9 * max(abs(lb), 1e-300)
    respects = all(v >= lb - slack for vs in restarts for v in vs)
    sat = next((w for w, v in zip(ws, values) if v - lb <= sat_tol * abs(v)), None)
    mono = all(values[i + 1] <= values[i] * (1 + sat_tol) for i in range(len(values) - 1))
    ev = el = ec = None
    if exact_widths:
        sols = [solve(X, lam=lam, width=w, time_limit=exact_time_limit, median=ex.median,
                      progress=None if progress is None else _relabel(progress, f"exact width {w}"))
                for w in ws]
        ev, el, ec = [s.value for s in sols], [s.lower_bound for s in sols], [bool(s.certified) for s in sols]
    res = Frontier(widths=ws, values=values, restart_values=restarts, lower_bound=lb, exact_value=ex.value,
                   n_rays=ex.width, saturation_width=sat, respects_bound=respects, monotone=mono,
                   sat_tol=sat_tol, lam=lam, exact=ex, exact_values=ev, exact_lower_bounds=el, exact_certified=ec,
                   status="time_limit" if skipped else "done", skipped_widths=list(skipped))
    if out is not None:
        path = plot_frontier(res, out)
        res = Frontier(**{**res.__dict__, "plot": str(path)})
    return res


def _relabel(progress, stage):
    """Forward the branch and bound's events (value and certified bound) under ``stage``."""

    def cb(ev):
        if ev.stage == "branch and bound":
            progress(dataclasses.replace(ev, stage=stage))

    return cb


def plot_frontier(fr: Frontier, path, title: str | None = None) -> Path:
    """Loss vs width (best and every restart), the wide-limit bound and the number of rays, as a PNG."""
    fig, ax = subplots(figsize=(7, 4.5))
    for w, vs in zip(fr.widths, fr.restart_values):
        ax.plot([w] * len(vs), vs, "o", color="0.7", ms=4, zorder=1)
    ax.plot(fr.widths, fr.values, "o-", color="C0", label="best gradient solution", zorder=2)
    if fr.exact_values is not None:
        every = all(fr.exact_certified)
        ax.plot(fr.widths, fr.exact_values, "s--", color="C1", mfc="none", ms=8, zorder=3,
                label="certified optimum at width k" if every else
                "exact search at width k (filled: certified; bar: down to its certified bound)")
        done = [(w, v) for w, v, c in zip(fr.widths, fr.exact_values, fr.exact_certified) if c]
        ax.plot([w for w, _ in done], [v for _, v in done], "s", color="C1", ms=8, zorder=3)
        ax.vlines(fr.widths, fr.exact_lower_bounds, fr.exact_values, color="C1", lw=3, zorder=3)
    ax.axhline(fr.lower_bound, color="C3", ls="--", label=f"wide-limit bound {fr.lower_bound:.6g}")
    ax.axvline(fr.n_rays, color="k", ls=":", lw=1, label=f"number of rays = {fr.n_rays}")
    if fr.saturation_width is not None:
        ax.plot([fr.saturation_width], [fr.values[fr.widths.index(fr.saturation_width)]], "*", ms=14,
                color="C2", label=f"saturation width = {fr.saturation_width}", zorder=3)
    ax.set_xlabel("width k (atoms)")
    ax.set_ylabel("objective L (mean per point)")
    ax.set_title(title or f"loss vs width, lam = {fr.lam:g}")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
