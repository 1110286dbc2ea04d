r"""Feature splitting with width: the loss-vs-width frontier and how the atoms split.

At width ``k`` below the number of rays the optimum must merge rays; the best
objective decreases with ``k`` and meets the wide-limit bound ``min_b H(b)``
exactly at ``k =`` number of rays (theory.md §6), after which extra atoms are
useless. The frontier is computed with :func:`widelimit.learn.frontier` (gradient
solver, restarts, ray-clustering initialisation), the bound and the ray count
with :func:`widelimit.solve`.

- hierarchical data (fixed magnitudes: ``K`` child points ``a u_p + c u_j``,
  parent-only points, inactive points): few rays, so the frontier saturates at
  a small width; at width 1 the single atom is the parent-like mean direction,
  and with growing width it splits into the children (each absorbing the parent,
  see the ``absorption`` experiment) and the parent-only direction;
- scikit-learn's digits (a random subset): every image is its own ray, so the
  bound is reached only at width = number of images; the atoms split from a
  "mean digit" into digit prototypes.
"""

from __future__ import annotations

import numpy as np

from ...data import datasets
from ...learn.crossval import best_fit
from ...exact.solve import solve
from ...learn.frontier import frontier
from . import register
from ._common import colormap, figure, save_figure, write_json

__all__ = ["run", "atom_composition"]


def atom_composition(W, Z, truth) -> list:
    """For each live atom: cosine with the parent, best child and its cosine (hierarchical data)."""
    W = np.asarray(W, dtype=np.float64)
    Zd = Z.toarray() if hasattr(Z, "toarray") else np.asarray(Z)
    out = []
    for d in np.flatnonzero((Zd > 0).any(axis=0)):
        w = W[d] / np.linalg.norm(W[d])
        cc = truth["children"] @ w
        j = int(np.argmax(np.abs(cc)))
        out.append({"parent_cos": float(w @ truth["parent"]), "child": j, "child_cos": float(cc[j]),
                    "usage": float(np.mean(Zd[:, d] > 0))})
    return out


def _hierarchical_part(quick):
    K, ppc = (3, 6) if quick else (4, 15)
    lam = 0.5
    X, t = datasets.hierarchical(K, K + 4, ppc, parent_scale=2.0, child_scale=(1.5, 1.5), n_parent_only=ppc,
                                 n_inactive=2 * (K + 1) * ppc, seed=1)
    ex = solve(X, lam=lam)
    widths = list(range(1, ex.width + 3))
    n_restarts = 2 if quick else 3
    fr = frontier(X, lam=lam, widths=widths, n_restarts=n_restarts, seed=0, exact=ex)
    atoms = {}
    same = True
    for w in widths:
        best, _ = best_fit(X, lam=lam, width=w, n_restarts=n_restarts, seed=0, inits=("rays", "data"))
        same &= abs(best.value - fr.values[fr.widths.index(w)]) <= 1e-9 * abs(best.value)
        atoms[w] = atom_composition(best.dictionary, best.codes, t)
    d = fr.as_dict()
    d.pop("plot", None)
    return {"lam": lam, "K": K, "n_points": X.shape[0], "frontier": d, "atoms": atoms,
            "atoms_from_frontier_fits": bool(same), "exact_certified": bool(ex.certified)}


def _digits_part(quick):
    lam = 5.0
    X, lab = datasets.digits()
    rng = np.random.default_rng(0)
    idx = rng.choice(X.shape[0], 40 if quick else 200, replace=False)
    X = X[idx]
    ex = solve(X, lam=lam)
    widths = [1, 3] if quick else [1, 2, 4, 8, 16, 32]
    inits = ("data",) if quick else ("rays", "data")
    fit_kw = {"max_iter": 100 if quick else 400}
    fr = frontier(X, lam=lam, widths=widths, n_restarts=1, seed=0, exact=ex, inits=inits, **fit_kw)
    shown = [3] if quick else [1, 4, 16]
    atoms = {}
    for w in shown:
        best, _ = best_fit(X, lam=lam, width=w, n_restarts=1, seed=0, inits=inits, **fit_kw)
        Zd = best.codes.toarray()
        order = np.argsort(-(Zd > 0).mean(axis=0))
        atoms[w] = {"atoms": best.dictionary[order], "usage": (Zd > 0).mean(axis=0)[order]}
    d = fr.as_dict()
    d.pop("plot", None)
    return {"lam": lam, "n_points": X.shape[0], "frontier": d, "exact_certified": bool(ex.certified)}, atoms


@register("splitting", "loss vs width (frontier) on hierarchical and digits data, the bound, atoms splitting")
def run(out_dir=None, quick: bool = False) -> dict:
    """The width frontier on hierarchical and digits data: loss vs width, the wide-limit bound, atoms splitting."""
    hier = _hierarchical_part(quick)
    dig, dig_atoms = _digits_part(quick)
    result = {"hierarchical": hier, "digits": dig,
              "digits_atoms_usage": {w: a["usage"] for w, a in dig_atoms.items()}}
    _plot(result, dig_atoms, out_dir)
    write_json(out_dir, "splitting", result)
    return result


def _frontier_panel(ax, fr, title):
    w = np.asarray(fr["widths"])
    ax.plot(w, fr["values"], "o-", label="best gradient solution (frontier)")
    for wi, vs in zip(w, fr["restart_values"]):
        ax.plot([wi] * len(vs), vs, ".", color="0.6", ms=4)
    ax.axhline(fr["lower_bound"], color="C3", ls="--", label=f"wide-limit bound {fr['lower_bound']:.5g}")
    ax.plot([fr["n_rays"]], [fr["exact_value"]], "*", color="C2", ms=13,
            label=f"exact optimum, width = rays = {fr['n_rays']}")
    ax.set_xlabel("width k")
    ax.set_ylabel("objective L")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)


def _plot(res, dig_atoms, out_dir):
    fig = figure(figsize=(17, 8))
    gs = fig.add_gridspec(2, 3)
    h = res["hierarchical"]
    ax = fig.add_subplot(gs[0, 0])
    _frontier_panel(ax, h["frontier"], f"hierarchical data (K = {h['K']}, lam = {h['lam']}): frontier")
    ax = fig.add_subplot(gs[0, 1])
    cmap = colormap("tab10")
    for w, atoms in h["atoms"].items():
        for a in atoms:
            pure_parent = abs(a["child_cos"]) < 0.3
            ax.scatter(int(w), a["parent_cos"], s=30 + 200 * a["usage"],
                       color="0.3" if pure_parent else cmap(a["child"] % 10), alpha=0.8,
                       edgecolor="k", lw=0.5)
    ax.axhline(0, color="0.8", lw=0.8)
    ax.set_xlabel("width k")
    ax.set_ylabel("cos(atom, parent direction)")
    ax.set_title("atoms per width (colour: child it carries, grey: none; size: usage)", fontsize=9)
    d = res["digits"]
    ax = fig.add_subplot(gs[0, 2])
    _frontier_panel(ax, d["frontier"], f"digits ({d['n_points']} images, lam = {d['lam']}): frontier")
    ax.set_xscale("log")
    # digit atoms as images
    sub = gs[1, :].subgridspec(len(dig_atoms), 16)
    for r, (w, a) in enumerate(dig_atoms.items()):
        for j in range(min(16, a["atoms"].shape[0])):
            axi = fig.add_subplot(sub[r, j])
            axi.imshow(a["atoms"][j].reshape(8, 8), cmap="gray_r")
            axi.set_xticks([])
            axi.set_yticks([])
            if j == 0:
                axi.set_ylabel(f"k = {w}", fontsize=9)
    fig.suptitle("feature splitting: loss vs width meets the wide-limit bound at the number of rays; "
                 "digit atoms at widths " + ", ".join(str(w) for w in dig_atoms), fontsize=10)
    fig.tight_layout()
    save_figure(fig, out_dir, "splitting", dpi=75)
