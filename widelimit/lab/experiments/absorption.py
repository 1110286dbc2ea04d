r"""Feature absorption: the L1 penalty prefers one atom along parent + child.

Data (:func:`widelimit.data.datasets.hierarchical`): child points ``a u_p + c u_j``,
parent-only points ``a u_p`` and inactive points ``0``; ``u_p, u_j`` orthonormal.
Two dictionaries of the same width ``K + 1``:

- hierarchical: ``[u_p; u_1 .. u_K]``;
- absorbed: ``[u_p; w_1 .. w_K]`` with ``w_j`` the best direction through the
  child-``j`` points (``∝ a u_p + c u_j`` for a fixed child magnitude ``c``).

With the bias at 0 (the inactive point) the optimal codes are separable per
point. A child point costs ``h(a) + h(c)`` with the orthonormal hierarchical
atoms and ``h(sqrt(a^2 + c^2))`` with its absorbed atom (the point lies on it, so
the per-point lower bound ``h(||x||)`` is attained); parent-only and inactive
points cost the same in both. Hence (exactly, for fixed ``c``)

.. math:: L_{hier} - L_{abs} = f_{child}\,\big(h(a) + h(c) - h(\sqrt{a^2+c^2})\big),

where ``f_child`` is the fraction of child points. The gain is never negative:
the absorbed atom attains the per-point lower bound ``h(||x - b||)`` of
theory.md §3, which no dictionary beats; it is strictly positive iff ``a, c > 0``
and ``sqrt(a^2 + c^2) > lam`` (for ``a, c > lam`` it is ``2 lam (a + c - sqrt(a^2+c^2)) - lam^2``
and ``a + c - sqrt(a^2 + c^2) >= (2 - sqrt 2) lam > lam / 2``). So at bias 0 absorption
always wins, by an amount proportional to ``f_child``; with the bias optimised for
each dictionary the winner depends on ``lam`` and ``f_child``. The experiment computes both
objectives with certified optimal codes (:func:`widelimit.coding.fista.fista_codes`),
also with the bias optimised for each dictionary, and classifies what the
gradient solver (:func:`widelimit.fit_dictionary`, width ``K + 1``, free bias)
learns.
"""

from __future__ import annotations

import numpy as np

from ...coding.fixed_dictionary import fixed_dictionary_objective
from ...data import datasets
from ...exact.objective import huber_h
from ...exact.solve import solve
from ...learn.crossval import best_fit
from . import register
from ._common import save_figure, subplots, write_json

__all__ = ["hierarchical_dictionary", "absorbed_dictionary", "absorption_gain",
           "classify", "run"]


def hierarchical_dictionary(truth) -> np.ndarray:
    """``[u_parent; u_children]`` (K + 1, n)."""
    return np.vstack([truth["parent"], truth["children"]])


def absorbed_dictionary(X, truth) -> np.ndarray:
    """``[u_parent; w_1 .. w_K]``: ``w_j`` is the top right singular vector of the child-``j`` points (sign: towards them)."""
    atoms = [truth["parent"]]
    for j in range(truth["children"].shape[0]):
        P = np.asarray(X, dtype=np.float64)[truth["labels"] == j]
        w = np.linalg.svd(P, full_matrices=False)[2][0]
        atoms.append(w if w @ P.sum(axis=0) >= 0 else -w)
    return np.vstack(atoms)


def absorption_gain(a, c, lam):
    r"""Per child point, ``h(a) + h(c) - h(sqrt(a^2 + c^2))`` (bias 0, fixed magnitudes): ``>= 0``, ``> 0`` iff
    ``a, c > 0`` and ``sqrt(a^2 + c^2) > lam``."""
    a, c = np.asarray(a, dtype=np.float64), np.asarray(c, dtype=np.float64)
    return huber_h(a, lam=lam) + huber_h(c, lam=lam) - huber_h(np.hypot(a, c), lam=lam)


def classify(W, Z, b, truth, *, mixed: float = 0.2, parent_min: float = 0.9) -> dict:
    """Classify a dictionary, codes and bias learned on hierarchical data.

    Only live atoms (some code > 0) count. For each child ``j`` its atom is the one most aligned with ``u_j``; the
    parent feature is the atom most aligned with ``u_p`` if that cosine is at
    least ``parent_min``. Kinds:

    - ``"absorbed"``: every child atom carries the parent (``<w, u_p> >= mixed``);
    - ``"hierarchical"``: child atoms are pure (``<w, u_p> < mixed``) and the parent
      feature fires on at least half of the child points;
    - ``"parent in bias"``: child atoms are pure and the bias carries at least half of
      the parent magnitude (``<b, u_p> >= a/2``): the parent is no feature at all;
    - ``"no features"`` for an empty dictionary, ``"other"`` otherwise.

    Returns a dict with ``kind``, ``parent_firing`` (fraction of child points on which the
    parent feature's code is > 0; 0 without a parent feature), the cosines and ``bias_parent``.
    """
    W = np.asarray(W, dtype=np.float64)
    a = float(np.max(truth["parent_mag"]))
    bias_parent = float(np.asarray(b, dtype=np.float64) @ truth["parent"])
    Zd = Z.toarray() if hasattr(Z, "toarray") else np.asarray(Z)
    live = np.flatnonzero((Zd > 0).any(axis=0))  # atoms no point uses are no features
    W, Z = W[live], Zd[:, live]
    if W.shape[0] == 0:
        return {"kind": "no features", "parent_firing": 0.0, "has_parent_feature": False, "parent_atom_cos": None,
                "child_parent_cos": None, "child_cos": None, "bias_parent": bias_parent}
    W = W / np.maximum(np.linalg.norm(W, axis=1, keepdims=True), 1e-300)
    cp = W @ truth["parent"]
    cc = W @ truth["children"].T
    child_atom = cc.argmax(axis=0)
    child_parent = cp[child_atom]
    parent_atom = int(cp.argmax())
    has_parent = bool(cp.max() >= parent_min)
    firing = _parent_firing(Z, parent_atom, truth) if has_parent else 0.0
    pure = bool(np.all(child_parent < mixed))
    if np.all(child_parent >= mixed):
        kind = "absorbed"
    elif pure and has_parent and firing >= 0.5:
        kind = "hierarchical"
    elif pure and bias_parent >= a / 2:
        kind = "parent in bias"
    else:
        kind = "other"
    return {"kind": kind, "parent_firing": firing, "has_parent_feature": has_parent,
            "parent_atom_cos": float(cp.max()), "child_parent_cos": child_parent, "child_cos": cc.max(axis=0),
            "bias_parent": bias_parent}


def _parent_firing(Z, parent_atom, truth) -> float:
    """Fraction of child points on which the parent atom's code is > 0."""
    Z = Z.toarray() if hasattr(Z, "toarray") else np.asarray(Z)
    child = truth["labels"] >= 0
    return float(np.mean(Z[child, parent_atom] > 1e-9))


def _instance(f, *, K=3, ppc=20, a=2.0, c=1.5, inactive_ratio=2.0, seed=0):
    """Hierarchical data with child frequency ``f`` among parent points (fixed magnitudes) and
    ``inactive_ratio`` times as many inactive points as parent points (sparse features)."""
    n_child = K * ppc
    n_po = int(round(n_child * (1 - f) / f))
    n_inactive = int(round(inactive_ratio * (n_child + n_po)))
    return datasets.hierarchical(K, K + 3, ppc, parent_scale=a, child_scale=(c, c), n_parent_only=n_po,
                                 n_inactive=n_inactive, seed=seed)


def compare(X, t, lam, *, optimise_bias: bool = True) -> dict:
    """Exact objectives of the hierarchical and absorbed dictionaries (bias 0, and optimal bias)."""
    out = {}
    for name, W in (("hierarchical", hierarchical_dictionary(t)), ("absorbed", absorbed_dictionary(X, t))):
        r0 = fixed_dictionary_objective(X, W, np.zeros(X.shape[1]), lam=lam)
        d = {"value_b0": r0["value"], "gap_b0": r0["gap"],
             "parent_firing_b0": _parent_firing(r0["codes"], 0, t)}
        if optimise_bias:
            rb = fixed_dictionary_objective(X, W, lam=lam)
            d.update(value_opt_bias=rb["value"], gap_opt_bias=rb["gap"], rounds=rb["rounds"],
                     parent_firing_opt_bias=_parent_firing(rb["codes"], 0, t))
        out[name] = d
    return out


@register("absorption", "feature absorption: hierarchical vs absorbed dictionary, exact and learned, over lam and f")
def run(out_dir=None, quick: bool = False) -> dict:
    """Feature absorption on hierarchical data: exact objectives, the learned dictionary's kind, parent firing rate."""
    a, c, K = 2.0, 1.5, 3
    ratios = (2.0,) if quick else (2.0, 0.25)
    lams = np.round(np.linspace(0.25, 2.25, 3 if quick else 9), 4)
    fs = np.round(np.array([0.25, 0.75]) if quick else np.linspace(0.1, 0.9, 9), 4)
    ppc = 8 if quick else 20
    n_restarts = 1 if quick else 3
    cells = []
    for inactive_ratio, lam, f in ((r, lam, f) for r in ratios for lam in lams for f in fs):
        if True:
            X, t = _instance(f, K=K, ppc=ppc, a=a, c=c, inactive_ratio=inactive_ratio)
            cmp = compare(X, t, lam, optimise_bias=True)
            frac = float(np.mean(t["labels"] >= 0))
            best, fits = best_fit(X, lam=lam, width=K + 1, n_restarts=n_restarts, seed=0, inits=("data", "random", "rays"))
            cl = classify(best.dictionary, best.codes, best.bias, t)
            ex = solve(X, lam=lam)
            ce = classify(ex.dictionary, ex.sparse_codes, ex.bias, t)
            cells.append({
                "inactive_ratio": inactive_ratio, "lam": float(lam), "f_child": float(f), "n_points": X.shape[0],
                "child_fraction": frac,
                "exact": cmp,
                "delta_b0": cmp["hierarchical"]["value_b0"] - cmp["absorbed"]["value_b0"],
                "delta_b0_predicted": frac * float(absorption_gain(a, c, lam)),
                "delta_opt_bias": cmp["hierarchical"]["value_opt_bias"] - cmp["absorbed"]["value_opt_bias"],
                "learned": {"value": float(best.value), "restart_values": [float(x.value) for x in fits],
                            "kind": cl["kind"], "parent_firing_on_children": cl["parent_firing"],
                            "child_parent_cos": cl["child_parent_cos"], "parent_atom_cos": cl["parent_atom_cos"],
                            "bias_parent": cl["bias_parent"]},
                "wide_limit": {"value": ex.value, "width": ex.width, "kind": ce["kind"],
                               "bias_parent": ce["bias_parent"], "certified": bool(ex.certified),
                               "learned_rel_gap": (best.value - ex.lower_bound) / best.value},
            })
    kinds = [f'{x["inactive_ratio"]}: {x["learned"]["kind"]}' for x in cells]
    result = {"a": a, "c": c, "K": K, "inactive_ratios": ratios, "lams": lams, "fs": fs, "cells": cells,
              "max_abs_err_delta_b0": float(max(abs(x["delta_b0"] - x["delta_b0_predicted"]) for x in cells)),
              "max_certified_gap": float(max(max(x["exact"][k]["gap_b0"], x["exact"][k]["gap_opt_bias"])
                                             for x in cells for k in ("hierarchical", "absorbed"))),
              "learned_kind_counts": {k: kinds.count(k) for k in sorted(set(kinds))}}
    _plot(result, out_dir)
    write_json(out_dir, "absorption", result)
    return result


def _plot(res, out_dir):
    lams, fs = np.asarray(res["lams"]), np.asarray(res["fs"])
    cells = res["cells"]
    ratios = res["inactive_ratios"]
    fig, axs = subplots(1, 2 + len(ratios), figsize=(5 * (2 + len(ratios)), 4.4))
    ax = axs[0]
    lf = np.linspace(0.05, lams.max() * 1.05, 300)
    ax.plot(lf, absorption_gain(res["a"], res["c"], lf), "k-", label="h(a)+h(c)-h(sqrt(a²+c²))")
    xs = [x for x in cells if x["inactive_ratio"] == ratios[0]]
    ax.plot([x["lam"] for x in xs], [x["delta_b0"] / x["child_fraction"] for x in xs], "o", ms=5, mfc="none",
            label="certified optimal codes, all f")
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xlabel("lam")
    ax.set_ylabel("(L_hier - L_abs) / fraction of child points")
    ax.set_title(f"bias 0 (a = {res['a']}, c = {res['c']}): absorption never loses", fontsize=9)
    ax.legend(fontsize=7)
    kinds = {"absorbed": "A", "hierarchical": "H", "parent in bias": "B", "other": "?", "no features": "0"}
    dl = (lams[1] - lams[0]) if lams.size > 1 else 1.0
    df = (fs[1] - fs[0]) if fs.size > 1 else 1.0
    for ax, r in zip(axs[1:], ratios):
        M = {(x["lam"], x["f_child"]): x for x in cells if x["inactive_ratio"] == r}
        D = np.array([[M[(float(l), float(f))]["delta_opt_bias"] for f in fs] for l in lams])
        v = np.max(np.abs(D)) or 1.0
        im = ax.imshow(D, origin="lower", aspect="auto", cmap="RdBu", vmin=-v, vmax=v,
                       extent=[fs[0] - df / 2, fs[-1] + df / 2, lams[0] - dl / 2, lams[-1] + dl / 2])
        for l in lams:
            for f in fs:
                ax.text(f, l, kinds[M[(float(l), float(f))]["learned"]["kind"]], ha="center", va="center", fontsize=8)
        fig.colorbar(im, ax=ax, label="L_hier - L_abs, optimal bias each (blue: absorption wins)")
        ax.set_xlabel("child frequency f among parent points")
        ax.set_ylabel("lam")
        ax.set_title(f"{r:g} inactive points per parent point\nletters: learned width K+1 "
                     "(A absorbed, H hier., B parent in bias, 0 none)", fontsize=9)
    ax = axs[-1]
    for r, ls in zip(ratios, ("-", "--")):
        for f in (fs[0], fs[-1]):
            xs = [x for x in cells if x["inactive_ratio"] == r and x["f_child"] == f]
            ax.plot([x["lam"] for x in xs], [x["learned"]["parent_firing_on_children"] for x in xs], "o" + ls, ms=4,
                    label=f"learned, {r:g} inactive/parent, f = {f:g}")
    xs = [x for x in cells if x["inactive_ratio"] == ratios[0] and x["f_child"] == fs[0]]
    ax.plot([x["lam"] for x in xs], [x["exact"]["hierarchical"]["parent_firing_b0"] for x in xs], "k:",
            label="hierarchical dictionary, optimal codes, bias 0")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("lam")
    ax.set_ylabel("parent feature's firing rate on child points")
    ax.set_title("absorption = the parent stops firing on children", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_dir, "absorption")
