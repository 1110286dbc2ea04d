r"""Spurious stationary points as the width grows (issue 30, open question 3; theory.md §5.4, §5.6).

On every family of ``relax/families.py`` (data with a known, certified optimum), the gradient solver
:func:`widelimit.fit_dictionary` (free codes, random initialisation) is run at widths ``k`` from the
narrowest optimal width ``r`` (the number of rays of the wide-limit optimum, where the certified optimum
is first reachable, theory.md §7) up to ``N``, several seeds each. For each run: how far it stops above
the certified optimum, whether :func:`widelimit.feature_stability` finds a witness, and in particular
whether the joint second-order test (theory.md §5.4) finds a direction of negative curvature there and
turns it into a verified descent. Widths below ``r`` need the finite-width branch and bound for their
certified optimum and are left out (its cost at these sizes is minutes per instance).
"""

from __future__ import annotations

import numpy as np

from ...exact.solve import solve
from ...relax.families import FAMILIES, make_bench_instance
from . import register
from ._common import save_figure, subplots, write_json
from .stability import _spurious_run

__all__ = ["run", "widths_for"]


def widths_for(r: int, N: int, fractions) -> list[int]:
    """Widths ``k = ceil(f N)`` for the fractions ``f``, kept where ``r <= k <= N``, with ``r`` itself first."""
    ks = {int(r)} | {int(np.ceil(f * N)) for f in fractions}
    return sorted(k for k in ks if r <= k <= N)


def _summary(runs, optimum, lam):
    tol = 1e-6 * optimum
    sp = [r for r in runs if r["above_optimum"] > tol]
    neg = [r for r in sp if r["joint_curvature"] is not None and np.isfinite(r["joint_curvature"])
           and r["joint_curvature"] < -1e-5 * lam * lam]
    return {"n_runs": len(runs), "n_spurious": len(sp),
            "n_spurious_joint_negative": len(neg),
            "n_spurious_joint_witness": sum("joint" in r["witness_moves"] and (r["best_witness_decrease"] or 0) > tol
                                            for r in sp),
            "n_spurious_any_witness": sum((r["best_witness_decrease"] or 0) > tol for r in sp),
            "n_spurious_dead_atom": sum(r["dead_atoms"] > 0 for r in sp),
            "n_spurious_joint_untested": sum(r["joint_curvature"] is None or not np.isfinite(r["joint_curvature"])
                                             for r in sp),
            "max_above_optimum": max((r["above_optimum"] for r in runs), default=0.0)}


@register("spurious-width", "gradient solver vs certified optimum on every benchmark family as k/N grows; joint second-order test")
def run(out_dir=None, quick: bool = False) -> dict:
    """How often the gradient solver stops above the certified optimum as ``k/N`` grows, per family."""
    N, dim = (8, 3) if quick else (16, 3)
    families = ("rays", "random") if quick else FAMILIES
    fractions = (0.5,) if quick else (0.25, 0.5, 0.75, 1.0)
    seeds = range(1 if quick else 4)
    rows = []
    for fam in families:
        inst = make_bench_instance(fam, N, seed=0, dim=dim)
        sol = solve(inst.X, lam=inst.lam)
        for k in widths_for(sol.width, N, fractions):
            runs = [_spurious_run(inst.X, inst.lam, k, s, sol.value) for s in seeds]
            rows.append({"family": fam, "lam": inst.lam, "N": N, "optimum": sol.value, "optimum_width": sol.width,
                         "width": k, "k_over_N": k / N, **_summary(runs, sol.value, inst.lam), "runs": runs})
    tot = {key: int(sum(r[key] for r in rows)) for key in ("n_runs", "n_spurious", "n_spurious_joint_negative",
                                                           "n_spurious_joint_witness", "n_spurious_any_witness",
                                                           "n_spurious_dead_atom", "n_spurious_joint_untested")}
    by_ratio = {}
    for r in rows:
        b = by_ratio.setdefault(f"{r['k_over_N']:.2f}", {"n_runs": 0, "n_spurious": 0, "n_spurious_joint_negative": 0})
        for key in b:
            b[key] += r[key]
    result = {"N": N, "dim": dim, "families": list(families), "fractions": list(fractions), "seeds": len(seeds),
              "rows": rows, "totals": tot, "by_k_over_N": by_ratio}
    _plot(rows, families, out_dir)
    write_json(out_dir, "spurious-width", result)
    return result


def _plot(rows, families, out_dir):
    fig, axs = subplots(1, 2, figsize=(11, 4))
    for j, fam in enumerate(families):
        rs = [r for r in rows if r["family"] == fam]
        x = [r["k_over_N"] for r in rs]
        axs[0].plot(x, [r["n_spurious"] / r["n_runs"] for r in rs], "o-", color=f"C{j}", label=fam)
        axs[0].plot(x, [r["n_spurious_joint_negative"] / r["n_runs"] for r in rs], "x:", color=f"C{j}")
        for r in rs:
            for run in r["runs"]:
                axs[1].scatter(r["k_over_N"] * (1 + 0.01 * j), max(run["above_optimum"], 1e-13), s=12, color=f"C{j}",
                               marker="o" if run["dead_atoms"] else "^")
    axs[0].set_xlabel("k / N (from the optimal width r)")
    axs[0].set_ylabel("fraction of runs")
    axs[0].set_title("o-: stops above the certified optimum; x: joint test finds negative curvature", fontsize=8)
    axs[0].legend(fontsize=7)
    axs[1].set_yscale("log")
    axs[1].set_xlabel("k / N")
    axs[1].set_ylabel("L(run) - certified optimum")
    axs[1].set_title("each run (o: has a dead atom, ^: none)", fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_dir, "spurious-width")
