r"""The wide-limit optimum in a picture: data, b*, the geometric median, the lam-ball and the atoms.

Data: :func:`widelimit.data.datasets.balanced_rays2d` (six unequal rays balanced by
a core inside the ``lam``-ball, so ``b* = c`` at ``lam = 1``). The optimum is
one atom per ray, the core gets code 0, and the Huber median ``b*`` differs
from the geometric median. The second and third panels follow ``b*(lam)``:
it runs from the geometric median (``lam -> 0``) to the mean (once every point
is within ``lam`` of the mean, ``H`` is the mean squared distance), and the
narrowest optimal width, which is 6 only where ``b*`` sits on the rays' common
origin and generically equals the number of points beyond ``lam``.
"""

from __future__ import annotations

import numpy as np

from ...data import datasets
from ...exact.solve import solve
from ...exact.median import geometric_median
from . import register
from ._common import colormap, save_figure, subplots, write_json

__all__ = ["run"]


@register("rays", "2-D picture: data, b*, geometric median, lam-ball, optimal atoms; b*(lam) path")
def run(out_dir=None, quick: bool = False) -> dict:
    """The 2-D talk figure: data, b*, the geometric median, the lam-ball and the optimal atoms; the b*(lam) path."""
    lam = 1.0
    X, t = datasets.balanced_rays2d(lam, seed=0)
    sol = solve(X, lam=lam)
    gm = geometric_median(X)
    mean = X.mean(axis=0)
    r_mean = float(np.max(np.linalg.norm(X - mean, axis=1)))
    lams = np.geomspace(0.01, 2.0 * r_mean, 12 if quick else 60)
    lams = np.unique(np.concatenate([lams, [lam]]))
    path = []
    for lm in lams:
        s = solve(X, lam=lm)
        path.append({"lam": float(lm), "bias": s.bias, "width": s.width, "value": s.value,
                     "rel_gap": s.certificate.rel_gap, "n_within_lam": int(np.count_nonzero(s.rays < 0))})
    best = sol.dictionary @ t["directions"].T
    result = {
        "lam": lam, "n_points": X.shape[0], "width": sol.width, "n_rays_true": int(t["directions"].shape[0]),
        "bias": sol.bias, "centre": t["centre"], "bias_error": float(np.linalg.norm(sol.bias - t["centre"])),
        "geometric_median": gm.point, "geometric_median_gap": gm.gap,
        "huber_vs_geometric_distance": float(np.linalg.norm(sol.bias - gm.point)),
        "atoms_match_rays_max_error": float(np.max(1 - best.max(axis=0))),
        "value": sol.value, "lower_bound": sol.lower_bound, "certified": bool(sol.certified),
        "core_codes_zero": bool(np.all(sol.code_values[t["labels"] < 0] == 0)),
        "mean": mean, "radius_about_mean": r_mean,
        "path": path,
        "path_small_lam_to_geometric_median": float(np.linalg.norm(path[0]["bias"] - gm.point)),
        "path_large_lam_to_mean": float(np.linalg.norm(path[-1]["bias"] - mean)),
        "path_max_rel_gap": float(max(p["rel_gap"] for p in path)),
    }
    _plot(X, t, sol, gm.point, mean, result, out_dir)
    write_json(out_dir, "rays", result)
    return result


def _plot(X, t, sol, gm, mean, res, out_dir):
    fig, axs = subplots(1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [1.25, 1, 1]})
    ax = axs[0]
    b, lam = sol.bias, sol.lam
    within = sol.rays < 0
    cmap = colormap("tab10")
    ax.scatter(*X[within].T, s=12, c="0.55", label=f"within lam of b*: code 0 ({int(within.sum())})")
    ax.scatter(*X[~within].T, s=16, c=cmap(sol.rays[~within] % 10), label=f"{sol.width} rays, one atom each")
    for j, w in enumerate(sol.dictionary):
        reach = sol.code_values[sol.rays == j].max() + lam  # to the farthest point of the ray
        ax.annotate("", xy=b + w * reach, xytext=b, arrowprops=dict(arrowstyle="-|>", color=cmap(j % 10), lw=1.8),
                    annotation_clip=False)
    th = np.linspace(0, 2 * np.pi, 200)
    ax.plot(b[0] + lam * np.cos(th), b[1] + lam * np.sin(th), "k--", lw=1.2, label=f"lam-ball (lam = {lam:g})")
    ax.plot(*b, "r*", ms=16, label="b* (Huber median)", zorder=5)
    ax.plot(*gm, "bP", ms=11, label="geometric median", zorder=5)
    ax.plot(*mean, "gX", ms=10, label="mean", zorder=5)
    ax.set_aspect("equal")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(f"wide-limit optimum: width {sol.width}, value {sol.value:.4f} = bound (certified)", fontsize=10)

    ax = axs[1]
    P = np.array([p["bias"] for p in res["path"]])
    L = np.array([p["lam"] for p in res["path"]])
    sc = ax.scatter(P[:, 0], P[:, 1], c=np.log10(L), cmap="viridis", s=18, zorder=3)
    ax.plot(P[:, 0], P[:, 1], "-", c="0.6", lw=1)
    ax.plot(*gm, "bP", ms=11, label="geometric median")
    ax.plot(*mean, "gX", ms=10, label="mean")
    ax.plot(*b, "r*", ms=14, label="b* at lam = 1")
    fig.colorbar(sc, ax=ax, label="log10 lam")
    ax.legend(fontsize=8)
    ax.set_title("Huber median b*(lam): geometric median -> mean", fontsize=10)

    ax = axs[2]
    ax.semilogx(L, [p["width"] for p in res["path"]], "o-", ms=3, label="narrowest optimal width")
    ax.semilogx(L, [res["n_points"] - p["n_within_lam"] for p in res["path"]], "k:", lw=1,
                label="points beyond lam")
    ax.axvline(sol.lam, color="r", ls="--", lw=1, label="lam = 1: width 6")
    ax.set_xlabel("lam")
    ax.set_ylabel("width")
    ax.legend(fontsize=8)
    ax.set_title("width = number of rays seen from b*(lam)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, out_dir, "rays")
