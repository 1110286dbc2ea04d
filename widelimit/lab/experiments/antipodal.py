r"""Dense antipodal features: when a sparse 1-D variable needs the atom ``-u``.

Data ``x = s u`` with ``s = 0`` for a fraction ``1 - p`` of the points and
``s > 0`` (distribution ``F``) otherwise. The optimal bias is the Huber median
``b* = beta u``; it solves the 1-D problem

.. math:: \min_\beta\; (1-p)\,h_\lambda(|\beta|) + p\,\mathbb E_F\,h_\lambda(|s-\beta|).

With ``H'(beta) = -2[(1-p)\,\mathrm{clip}(-\beta) + p\,\mathbb E\,\mathrm{clip}(s-\beta)]``
(``clip`` to ``[-lam, lam]``) and convexity, the zeros lie beyond ``lam`` from
``b*`` (and need the antipodal atom ``-u``) iff ``H'(lam) < 0``, i.e.

.. math:: p > p^*(\lambda) = \frac{1}{1 + g(\lambda)},\qquad
          g(\lambda) = \mathbb E_F\big[\mathrm{clip}(s/\lambda - 1, -1, 1)\big].

If every active value is ``>= 2 lam`` then ``g = 1`` and ``p* = 1/2``; if every
active value is ``<= 2 lam`` then ``p* = lam / E[s]``. ``beta* = p lam / (1 - p)`` holds
exactly when ``p <= 1/2`` and every active ``s >= lam / (1 - p)`` (= ``beta* + lam``); for
``1/2 < p < p*`` (possible only when some active values are below ``2 lam``) it does not. See
``docs/experiments/antipodal.md`` for the derivation.
"""

from __future__ import annotations

import matplotlib.colors
import matplotlib.patches
import numpy as np

from ...data import datasets
from ...exact.solve import solve
from . import register
from ._common import save_figure, subplots, write_json

__all__ = ["threshold_g", "antipodal_threshold", "uniform_threshold", "bias_below_threshold", "run"]


def threshold_g(values, lam: float) -> float:
    r"""``g(lam) = mean(clip(s / lam - 1, -1, 1))`` over the active values ``s`` (empirical distribution)."""
    s = np.asarray(values, dtype=np.float64)
    return float(np.mean(np.clip(s / lam - 1.0, -1.0, 1.0)))


def antipodal_threshold(values, lam: float) -> float:
    r"""Exact activity threshold ``p* = 1 / (1 + g(lam))`` for the empirical active values.

    The optimum of ``{0 (fraction 1-p)} ∪ {s u}`` contains the antipodal atom
    ``-u`` iff ``p > p*``. Returns ``inf`` when ``g <= 0`` (no activity < 1 suffices).
    """
    g = threshold_g(values, lam)
    return 1.0 / (1.0 + g) if g > 0 else float("inf")


def uniform_threshold(lam, low: float, high: float):
    r"""Closed-form ``p*(lam)`` for active values uniform on ``[low, high]`` (vectorised in ``lam``).

    With ``Phi(s) = s^2/2 - lam s`` for ``s <= 2 lam`` and ``lam (s - 2 lam)`` beyond
    (an antiderivative of ``clip(s - lam, -lam, lam)`` on ``s >= 0``),
    ``g = (Phi(high) - Phi(low)) / ((high - low) lam)``; ``low == high`` gives ``g = clip(low/lam - 1, -1, 1)``.
    """
    lam = np.asarray(lam, dtype=np.float64)

    def Phi(s):
        return np.where(s <= 2 * lam, 0.5 * s * s - lam * s, lam * (s - 2 * lam))

    if high > low:
        g = (Phi(high) - Phi(low)) / ((high - low) * lam)
    else:
        g = np.clip(low / lam - 1.0, -1.0, 1.0)
    with np.errstate(divide="ignore"):
        return np.where(g > 0, 1.0 / (1.0 + np.maximum(g, 1e-300)), np.inf)


def bias_below_threshold(p, lam):
    """``beta* = p lam / (1 - p)``: the optimal bias along ``u`` where :func:`bias_formula_holds` (theory.md §6.1)."""
    p = np.asarray(p, dtype=np.float64)
    return p * lam / (1.0 - p)


def bias_formula_holds(p, lam, s_min):
    r"""Whether ``beta* = p lam / (1 - p)``: iff ``p <= 1/2`` and the smallest active value ``s_min >= lam / (1 - p)``.

    At ``beta = p lam/(1-p)`` the zeros are within ``lam`` iff ``p <= 1/2``; then
    ``H'(beta) = -2[-(1-p) beta + p E clip(s - beta, -lam, lam)]`` vanishes iff every active ``s >= beta + lam
    = lam/(1-p)`` (otherwise ``E clip < lam`` and ``H'(beta) > 0``, so ``beta* < p lam/(1-p)``); ``H`` is convex.
    Being below ``p*`` is not enough: for ``1/2 < p < p*`` the formula exceeds ``lam`` (theory.md §6.1).
    """
    p = np.asarray(p, dtype=np.float64)
    return (p <= 0.5) & (np.asarray(s_min, dtype=np.float64) >= lam / (1.0 - p))


def _atoms_along(sol, u):
    """Cosines of the solution's atoms with ``u`` (collinear data: each is +1 or -1)."""
    return sol.dictionary @ u


def _has_antipodal(sol, u) -> bool:
    return bool(np.any(_atoms_along(sol, u) < 0))


def _numeric_threshold(values, dim, lam, seed, zmax_factor=50):
    """Bisection on the number of zeros added to fixed active values: the activity at which ``-u`` appears.

    Returns ``(p_lo, p_hi, n_solves)``: with ``z`` zeros the optimum has ``-u`` for
    ``p = m/(m+z) >= p_hi`` and not for ``p <= p_lo`` (adjacent integers ``z``).
    """
    m = values.size
    u = datasets.sparse_variable(1, dim, seed=seed)[1]["direction"]

    def anti(z):
        X = np.vstack([values[:, None] * u, np.zeros((z, dim))])
        return _has_antipodal(solve(X, lam=lam), u)

    lo, hi = 1, zmax_factor * m  # anti(lo) expected True, anti(hi) expected False
    n = 2
    if not anti(lo):
        return None, None, n  # even a single zero gets no antipodal atom
    if anti(hi):
        return 0.0, m / (m + hi), n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        n += 1
        if anti(mid):
            lo = mid
        else:
            hi = mid
    return m / (m + hi), m / (m + lo), n


@register("antipodal", "dense antipodal features: width vs activity p, threshold p*(lam), signed codes")
def run(out_dir=None, quick: bool = False) -> dict:
    """Dense antipodal features: width vs activity p, the threshold p*(lam) numerically and analytically, signed codes."""
    low, high, dim = 1.0, 3.0, 8
    N = 200 if quick else 1000
    m = 200 if quick else 2000
    ps = np.round(np.linspace(0.05, 0.95, 10 if quick else 19), 4)
    lams = np.round(np.linspace(0.1, 1.5, 5 if quick else 15), 4)
    lam_thr = [0.3, 1.0] if quick else [0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3]

    # 1. width / antipodal atom / signed width over the (lam, p) grid, checked point by point
    grid = _grid(lams, ps, N, dim, low, high)

    # 2. the threshold: bisection on the number of zeros vs the analytic value (same sample) and the population formula
    thr = _thresholds(np.random.default_rng(7).uniform(low, high, m), lam_thr, dim, low, high)

    # 3. the bias below the threshold: Huber median along u vs p lam / (1 - p)
    lam_b = 0.3
    beta, beta_pred = [], []
    for p in ps:
        X, t = datasets.sparse_variable(N, dim, n_active=int(round(p * N)), low=low, high=high, seed=1)
        beta.append(float(solve(X, lam=lam_b).bias @ t["direction"]))
        beta_pred.append(float(bias_below_threshold(t["p"], lam_b)))
    beta, beta_pred = np.array(beta), np.array(beta_pred)
    below = beta_pred <= lam_b  # and every active s >= 1 >= beta* + lam_b: the formula's conditions

    # 4. a dense symmetric variable: antipodal pair with nonnegative codes, one line with signed codes
    Xd, td = datasets.dense_symmetric(200 if quick else 1000, dim, seed=2)
    sd = solve(Xd, lam=0.1)
    ss = solve(Xd, lam=0.1, signed=True)
    dense = {"lam": 0.1, "width": sd.width, "signed_width": ss.width,
             "pair_cosine": float(sd.dictionary[0] @ sd.dictionary[1]) if sd.width == 2 else None,
             "value": sd.value, "signed_value": ss.value, "lower_bound": sd.lower_bound,
             "certified": bool(sd.certified and ss.certified)}

    result = {
        "setting": {"low": low, "high": high, "dim": dim, "distribution": "uniform"},
        "grid": grid,
        "threshold": thr,
        "bias": {"lam": lam_b, "ps": ps, "beta": beta, "beta_predicted": beta_pred,
                 "max_abs_err_below_threshold": float(np.max(np.abs(beta - beta_pred)[below])) if below.any() else None},
        "dense_symmetric": dense,
    }
    _plot(result, out_dir, low, high)
    write_json(out_dir, "antipodal", result)
    return result


def _grid(lams, ps, N, dim, low, high) -> dict:
    """Width, antipodal atom and signed width over the ``(lam, p)`` grid, each checked against the prediction."""
    width = np.zeros((lams.size, ps.size), dtype=int)
    anti = np.zeros_like(width, dtype=bool)
    width_signed = np.zeros_like(width)
    predicted = np.zeros_like(anti)
    min_cos = np.ones_like(width, dtype=float)
    max_gap = 0.0
    for a, lam in enumerate(lams):
        for j, p in enumerate(ps):
            X, t = datasets.sparse_variable(N, dim, n_active=int(round(p * N)), low=low, high=high, seed=1)
            u = t["direction"]
            sol = solve(X, lam=lam)
            sgn = solve(X, lam=lam, signed=True)
            width[a, j] = sol.width
            anti[a, j] = _has_antipodal(sol, u)
            width_signed[a, j] = sgn.width
            predicted[a, j] = t["p"] > antipodal_threshold(t["values"][t["active"]], lam)
            c = _atoms_along(sol, u)
            if c.size == 2:
                min_cos[a, j] = float(sol.dictionary[0] @ sol.dictionary[1])
            max_gap = max(max_gap, sol.certificate.rel_gap, sgn.certificate.rel_gap,
                          abs(sol.value - sgn.value) / sol.value)
    pair = width == 2
    grid = {
        "lams": lams, "ps": ps, "n_points": N, "width": width, "antipodal": anti, "signed_width": width_signed,
        "predicted_antipodal": predicted, "n_mismatch": int(np.count_nonzero(anti != predicted)),
        "pair_cosine_max_dev": float(np.max(np.abs(min_cos[pair] + 1.0))) if pair.any() else None,
        "max_rel_gap_or_signed_value_diff": max_gap,
        # signed codes: one line carries both sides (0 only when no point is beyond lam)
        "signed_width_equals_lines": bool(np.all(width_signed == (width > 0))),
    }
    return grid


def _thresholds(values, lam_thr, dim, low, high) -> list:
    """The threshold ``p*(lam)``: bisection on the number of zeros against the analytic value on the same sample
    and the population formula."""
    thr = []
    for lam in lam_thr:
        p_lo, p_hi, n_solves = _numeric_threshold(values, dim, lam, seed=3)
        exact = antipodal_threshold(values, lam)
        pop = float(uniform_threshold(lam, low, high))
        thr.append({"lam": lam, "numeric_bracket": [p_lo, p_hi], "analytic_sample": exact, "analytic_population": pop,
                    "analytic_in_bracket": bool(p_lo is not None and p_lo <= exact <= p_hi), "n_solves": n_solves})
    return thr


def _plot(res, out_dir, low, high):
    g = res["grid"]
    lams, ps = g["lams"], g["ps"]
    fig, axs = subplots(1, 3, figsize=(15, 4.4))
    ax = axs[0]
    code = g["width"] + 2 * g["antipodal"]  # 1: +u only, 2: -u only, 4: both
    cmap = matplotlib.colors.ListedColormap(["#eeeeee", "#9ecae1", "#fdae6b", "#a1d99b", "#e6550d"])
    dp, dl = (ps[1] - ps[0]) / 2, (lams[1] - lams[0]) / 2
    ax.imshow(code, origin="lower", aspect="auto", cmap=cmap, vmin=-0.5, vmax=4.5,
              extent=[ps[0] - dp, ps[-1] + dp, lams[0] - dl, lams[-1] + dl])
    lf = np.linspace(lams[0] - dl, lams[-1] + dl, 300)
    ax.plot(np.minimum(uniform_threshold(lf, low, high), 2), lf, "k-", lw=2, label="analytic p*(lam)")
    ax.set_xlim(ps[0] - dp, ps[-1] + dp)
    handles = [matplotlib.patches.Patch(color=cmap(i), label=l) for i, l in
               [(1, "width 1: +u"), (3, "width 1: -u only"), (4, "width 2: +u, -u (cos -1)")]]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=7, loc="upper left")
    ax.set_xlabel("activity p")
    ax.set_ylabel("lam")
    ax.set_title(f"narrowest optimum (signed codes: width {int(g['signed_width'].max())} everywhere)", fontsize=9)

    ax = axs[1]
    lf = np.linspace(0.02, 1.6, 300)
    ax.plot(lf, np.minimum(uniform_threshold(lf, low, high), 1.05), "k-", label=f"analytic p*, s ~ U[{low:g},{high:g}]")
    for d in res["threshold"]:
        if d["numeric_bracket"][0] is not None:
            ax.errorbar(d["lam"], np.mean(d["numeric_bracket"]), yerr=np.diff(d["numeric_bracket"]) / 2, fmt="o",
                        color="C3", ms=5)
        ax.plot(d["lam"], d["analytic_sample"], "x", color="C0", ms=8)
    ax.plot([], [], "o", color="C3", label="numeric (bisection, exact solver)")
    ax.plot([], [], "x", color="C0", label="analytic, same sample")
    ax.axhline(0.5, color="0.6", ls=":", lw=1)
    ax.set_ylim(0.4, 1.05)
    ax.set_xlabel("lam")
    ax.set_ylabel("threshold p*")
    ax.set_title("activity above which -u appears", fontsize=9)
    ax.legend(fontsize=7)

    ax = axs[2]
    b = res["bias"]
    ax.plot(b["ps"], b["beta"], "o-", ms=4, label="b* . u (Huber median)")
    ax.plot(b["ps"], np.where(b["beta_predicted"] <= b["lam"], b["beta_predicted"], np.nan), "k--",
            label="p lam / (1 - p)")
    ax.axhline(b["lam"], color="C3", ls=":", label="lam: zeros leave the lam-ball")
    ax.set_xlabel("activity p")
    ax.set_ylabel("b* along u")
    ax.set_title(f"optimal bias, lam = {b['lam']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_dir, "antipodal")
