r"""Mutually exclusive categories: the optimum is the category directions, with margin.

Data ``x = c + s u_j`` with exactly one category ``j`` active per point (plus
optional inactive points at ``c``), simplex directions and the same magnitudes
in every category (:func:`widelimit.data.datasets.exclusive_categories`). By symmetry
``b* = c``; for ``lam < min s`` the narrowest optimum has width ``K`` with
atoms exactly ``u_j``. At that optimum the residual of an active point is
``lam u_j``, so an inactive feature sees ``<u_d, lam u_j> = -lam/(K-1)``: the
first-order conditions hold with code margin ``lam K/(K-1)`` (``lam`` when
inactive points, residual 0, are present), and the dual matrix
``G_ij = (lam/N)(1 - <r_i, r_j>/lam^2)`` is ``(lam/N) K/(K-1) > 0`` between
categories.
"""

from __future__ import annotations

import numpy as np

from ...data import datasets
from ...exact.solve import solve
from ...exact.stationarity import first_order_conditions
from . import register
from ._common import save_figure, subplots, write_json

__all__ = ["run", "category_report"]


def _match(W, U):
    """Best cosine of each category direction with an atom, and the atom used."""
    C = U @ W.T
    return C.max(axis=1), C.argmax(axis=1)


def category_report(K: int, lam: float, *, dim: int = 8, points_per_category: int = 30, n_inactive: int = 0,
                    magnitude=(1.0, 3.0), seed: int = 0) -> dict:
    """Solve one exclusive-categories instance exactly and measure its optimality margins."""
    X, t = datasets.exclusive_categories(K, dim, points_per_category, magnitude=magnitude, n_inactive=n_inactive,
                                         seed=seed)
    sol = solve(X, lam=lam)
    best, _ = _match(sol.dictionary, t["directions"])
    foc = first_order_conditions(X, sol.dictionary, sol.sparse_codes, sol.bias, lam=lam)
    N = X.shape[0]
    R = X - sol.bias - sol.sparse_codes @ sol.dictionary
    G = (lam / N) * (1.0 - (R @ R.T) / lam**2)
    Q = np.asarray((sol.sparse_codes @ sol.sparse_codes.T).toarray())
    off = Q <= 0
    np.fill_diagonal(off, False)
    predicted_margin = lam if n_inactive else lam * K / (K - 1)
    return {
        "K": K, "lam": lam, "n_points": N, "n_inactive": n_inactive, "width": sol.width,
        "bias_error": float(np.linalg.norm(sol.bias - t["centre"])),
        "max_atom_direction_error": float(np.max(1.0 - best)) if sol.width else None,
        "value": sol.value, "lower_bound": sol.lower_bound, "rel_gap": sol.certificate.rel_gap,
        "certified": bool(sol.certified),
        "stationarity": foc.as_dict(), "foc_hold": foc.holds(1e-9),
        "code_margin": foc.code_margin, "code_margin_predicted": predicted_margin,
        "dual_offsupport_min": float(G[off].min()) if off.any() else None,
        "dual_offsupport_predicted": float((lam / N) * min(predicted_margin / lam, K / (K - 1))),
        "_inner": (X, t, sol, R),
    }


@register("exclusive", "mutually exclusive categories: optimum = category directions, first-order margins")
def run(out_dir=None, quick: bool = False) -> dict:
    """Mutually exclusive categories: the optimum is the category directions; first-order conditions with margin."""
    lam = 0.5
    Ks = [3, 4, 6] if quick else [3, 4, 5, 6, 8, 10, 12]
    ppc = 15 if quick else 40
    rows = []
    for K in Ks:
        for n_inactive in (0, 2 * ppc):
            rows.append(category_report(K, lam, dim=max(12, K), points_per_category=ppc, n_inactive=n_inactive,
                                        seed=K))
    # breaking the symmetry: unequal category counts move b* off every category line
    Xa, ta = datasets.exclusive_categories(4, 12, ppc, seed=4)
    keep = ~((ta["labels"] == 0) & (np.arange(Xa.shape[0]) % 2 == 0))  # drop half of category 0
    sa = solve(Xa[keep], lam=lam)
    asym = {"K": 4, "n_points": int(keep.sum()), "n_category0": int(np.count_nonzero(ta["labels"][keep] == 0)),
            "width": sa.width, "bias_offset": float(np.linalg.norm(sa.bias)),
            "certified": bool(sa.certified),
            "note": ("with half of category 0 removed, b* moves along u_0 (the symmetry of the other categories "
                     "keeps it on that axis) and off the other category lines, each of whose points is then its "
                     "own ray")}
    pic = rows[0]["_inner"]
    hist = rows[[(r["K"], r["n_inactive"] > 0) for r in rows].index((4, True))]["_inner"]
    for r in rows:
        r.pop("_inner")
    result = {"lam": lam, "instances": rows, "asymmetric": asym,
              "all_widths_equal_K": all(r["width"] == r["K"] for r in rows),
              "all_certified": all(r["certified"] for r in rows)}
    _plot(result, pic, hist, lam, out_dir)
    write_json(out_dir, "exclusive", result)
    return result


def _plot(res, pic, hist, lam, out_dir):
    fig, axs = subplots(1, 3, figsize=(15, 4.4))
    X, t, sol, _ = pic
    B = np.linalg.svd(t["directions"], full_matrices=False)[2][:2]  # plane of the 3 categories
    Y = (X - sol.bias) @ B.T
    ax = axs[0]
    lab = t["labels"]
    for j in range(t["directions"].shape[0]):
        ax.scatter(*Y[lab == j].T, s=10, label=f"category {j}")
    A = sol.dictionary @ B.T
    for a in A:
        ax.annotate("", xy=a * 3.3, xytext=(0, 0), arrowprops=dict(arrowstyle="->", lw=1.5))
    th = np.linspace(0, 2 * np.pi, 100)
    ax.plot(lam * np.cos(th), lam * np.sin(th), "k--", lw=1, label="lam ball")
    ax.plot(0, 0, "r*", ms=12, label="b* = centre")
    ax.set_aspect("equal")
    ax.legend(fontsize=7)
    ax.set_title(f"K = 3: optimal atoms = category directions (width {sol.width})", fontsize=9)

    ax = axs[1]
    X, t, sol, R = hist
    C = (R @ sol.dictionary.T) / lam
    on = sol.codes > 0
    bins = np.linspace(-1.2, 1.2, 49)
    ax.hist(C[~on], bins=bins, color="C0", label="inactive (z = 0)")
    ax.hist(C[on], bins=bins, color="C3", label="active (z > 0)")
    ax.axvline(1.0, color="k", ls="--", lw=1)
    ax.set_xlabel("<w_d, r_i> / lam")
    ax.set_ylabel("count of (point, atom) pairs")
    ax.set_title("K = 4: first-order conditions <w, r> <= lam, with margin", fontsize=9)
    ax.legend(fontsize=7)

    ax = axs[2]
    for ni, mk in ((0, "o"), (1, "s")):
        rr = [r for r in res["instances"] if (r["n_inactive"] > 0) == bool(ni)]
        ks = [r["K"] for r in rr]
        ax.plot(ks, [r["code_margin"] / lam for r in rr], mk, ms=7, mfc="none",
                label="measured" + (" (with inactive points)" if ni else ""))
        ax.plot(ks, [r["code_margin_predicted"] / lam for r in rr], "k-" if not ni else "k:", lw=1,
                label="predicted " + ("1" if ni else "K/(K-1)"))
    ax.set_xlabel("number of categories K")
    ax.set_ylabel("code margin / lam")
    ax.set_title("margin of the first-order conditions", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_dir, "exclusive")
