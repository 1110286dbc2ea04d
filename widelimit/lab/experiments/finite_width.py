r"""Seed 002's questions at a finite width, answered with certified global optima.

1. **Absorption or splitting below the wide limit?** Hierarchical data (:func:`widelimit.data.datasets.hierarchical`,
   two children in 3-D, three points per child ``a u_p + c u_j`` with ``a = 2`` and ``c = 1.5`` or
   ``c`` uniform on ``[1, 2]``, two parent-only points ``a u_p`` and six inactive points ``0``): the certified optimum at widths ``k = 2, 3``
   (:func:`widelimit.solve` with ``width=k``), classified by :func:`.absorption.classify`
   (absorbed / hierarchical / parent in bias), next to the best of a few gradient runs.
2. **Where does the antipodal pair appear at width 1 and 2?** 1-D data, a fraction ``p`` of the
   points ``s u`` (``s`` uniform on ``[1, 3]``), the rest at 0. The wide limit needs ``-u`` iff
   ``p > p*(lam)`` (:func:`.antipodal.antipodal_threshold`). At width 1 the certified optimum
   picks ``+u`` or ``-u``; at width 2 it may use both. The experiment scans ``p``.

Every optimum here is certified by the branch and bound (docs/theory.md §7) to a
relative gap of 1e-6, or reported with its certified gap when the time cap was reached.
"""

from __future__ import annotations

import math

import numpy as np

from ...data import datasets
from ...exact.solve import solve
from ...learn.crossval import best_fit
from . import register
from .absorption import classify
from .antipodal import antipodal_threshold
from ._common import save_figure, subplots, write_json

__all__ = ["run", "hierarchical_cells", "antipodal_cells"]

#: Nodes the quick mode allows each search (its cells certify within about 100).
QUICK_NODES = 20_000


def _solve(X, lam, k, cap):
    """``cap`` is seconds, or ``None``: the quick mode's node budget instead, so its result (certified at
    a few hundred nodes) does not depend on the machine's load."""
    if cap is None:
        return solve(X, lam=lam, width=k, time_limit=math.inf, max_iter=QUICK_NODES)
    return solve(X, lam=lam, width=k, time_limit=cap)


def hierarchical_cells(lams, configs, *, cap, quick, ppc=3):
    """Certified optima at widths 2 and 3 on small hierarchical instances, classified.

    ``configs``: ``(child_scale, n_parent_only, n_inactive)`` triples (two children in 3-D, parent magnitude 2).
    """
    cells = []
    for lam in lams:
        for cs, npo, nin in configs:
            X, t = datasets.hierarchical(2, 3, ppc, parent_scale=2.0, child_scale=cs, n_parent_only=npo,
                                         n_inactive=nin, seed=0)
            for k in (2, 3):
                sol = _solve(X, lam, k, cap)
                cl = classify(sol.dictionary, sol.codes, sol.bias, t)
                best, _ = best_fit(X, lam=lam, width=k, n_restarts=1 if quick else 3, seed=0,
                                   inits=("data", "random", "rays"), device="cpu")
                cg = classify(best.dictionary, best.codes, best.bias, t)
                cells.append({
                    "lam": float(lam), "child_scale": list(cs), "n_parent_only": npo, "n_inactive": nin, "N": int(X.shape[0]), "k": k,
                    "value": sol.value, "lower_bound": sol.lower_bound, "rel_gap": sol.rel_gap,
                    "certified": sol.certified, "n_rays": sol.n_rays, "kind": cl["kind"],
                    "parent_firing": cl["parent_firing"], "atoms_parent_cos": (sol.dictionary @ t["parent"]).tolist(),
                    "atoms_children_cos": (sol.dictionary @ t["children"].T).tolist(),
                    "bias_parent": cl["bias_parent"], "gradient_value": float(best.value),
                    "gradient_kind": cg["kind"], "gradient_rel_excess": float(best.value / sol.value - 1),
                })
    return cells


def antipodal_cells(ps, lam, *, n_points, cap):
    """Width 1 and 2 certified optima on 1-D data with activity ``p``: which atoms (+u / -u) are used."""
    rng = np.random.default_rng(0)
    s_all = rng.uniform(1.0, 3.0, n_points)
    cells = []
    for p in ps:
        m = int(round(p * n_points))
        s = s_all[:m]
        X = np.concatenate([s, np.zeros(n_points - m)])[:, None]
        row = {"p": m / n_points, "n_active": m, "p_star": antipodal_threshold(s, lam) if m else None}
        for k in (1, 2):
            sol = _solve(X, lam, k, cap)
            live = (sol.codes > 0).any(axis=0)
            signs = np.sign(sol.dictionary[live, 0])
            row[f"k{k}"] = {"value": sol.value, "certified": sol.certified, "rel_gap": sol.rel_gap,
                            "bias": float(sol.bias[0]), "uses_plus": bool(np.any(signs > 0)),
                            "uses_minus": bool(np.any(signs < 0)), "n_rays": sol.n_rays}
        cells.append(row)
    return cells


def _plot(hier, anti, out_dir):
    fig, (ax1, ax2) = subplots(1, 2, figsize=(11, 4))
    kinds = sorted({c["kind"] for c in hier})
    for k, mk in ((2, "o"), (3, "s")):
        for i, kind in enumerate(kinds):
            cs = [c for c in hier if c["k"] == k and c["kind"] == kind]
            if cs:
                ax1.plot([c["lam"] for c in cs], [c["child_scale"][1] - c["child_scale"][0] + 0.05 * (k - 2)
                                                  for c in cs], mk, ms=9, color=f"C{i}", label=f"k = {k}: {kind}")
    ax1.set_xlabel("lam")
    ax1.set_ylabel("spread of child magnitudes")
    ax1.set_title("hierarchical data: what the certified optimum does")
    ax1.legend(fontsize=7)
    p = [c["p"] for c in anti]
    ax2.plot(p, [c["k1"]["uses_minus"] for c in anti], "o-", label="width 1 uses -u")
    ax2.plot(p, [c["k2"]["uses_minus"] + 0.03 for c in anti], "s--", label="width 2 uses -u")
    ps = [c["p_star"] for c in anti if c["p_star"] is not None and np.isfinite(c["p_star"])]
    if ps:
        ax2.axvline(np.median(ps), color="k", ls=":", label="wide-limit threshold p*")
    ax2.set_xlabel("activity p")
    ax2.set_ylabel("antipodal atom used")
    ax2.set_title("1-D sparse variable: the antipodal atom")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out_dir, "finite_width")


@register("finite-width", "seed 002 at finite width: absorption vs splitting and the antipodal atom, certified optima")
def run(out_dir=None, quick: bool = False) -> dict:
    """Absorption vs splitting (k = 2, 3) and the antipodal atom (k = 1, 2) from certified optima."""
    cap = None if quick else 60.0  # quick: a node budget (QUICK_NODES), not seconds
    lams = (1.0,) if quick else (0.5, 1.0, 1.5)
    configs = [((1.5, 1.5), 2, 6)] if quick else [((1.5, 1.5), 2, 6), ((1.0, 2.0), 2, 6)]
    hier = hierarchical_cells(lams, configs, cap=cap, quick=quick)
    ps = (0.2, 0.5, 0.8) if quick else tuple(np.round(np.linspace(0.1, 0.9, 9), 2))
    anti = antipodal_cells(ps, 0.5, n_points=20, cap=cap)
    res = {"hierarchical": hier, "antipodal": anti, "quick": quick}
    write_json(out_dir, "finite_width", res)
    png = _plot(hier, anti, out_dir)
    res["plot"] = None if png is None else str(png)
    return res
