"""Superposition experiments: the tied-weight power-activation autoencoder (``docs/superposition.md``).

Registered names: ``superposition-linear``, ``superposition-sparse-growth``,
``superposition-p-sweep``, ``superposition-gd``, ``superposition-frames``.
Each writes ``<name>.png`` and ``<name>.json`` into ``out_dir``.
"""

from __future__ import annotations


import numpy as np

from .. import frames as fr
from .. import superposition as sp
from .. import superposition_train as spt
from ...plot import subplots
from . import register
from ._common import save_figure, write_json

_PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31]


def _save(out_dir, name: str, fig, result: dict) -> dict:
    save_figure(fig, out_dir, name, dpi=72)
    write_json(out_dir, name, result)
    return result


def _slope(x, y) -> float:
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return float(np.polyfit(lx, ly, 1)[0])


# --------------------------------------------------------------------------------------


@register("superposition-linear", "m=1: trained sup Ltilde equals p d E xi^2 for every n (no gain from superposition)")
def run_linear(out_dir=None, quick: bool = False) -> dict:
    """m = 1: Adam on the exact objective reaches p d E xi^2 for every n >= d; random frames stay below."""
    ds = [2, 4] if quick else [2, 4, 8]
    ns_all = [4, 16] if quick else [2, 4, 8, 16, 32, 64, 128]
    laws = ["rademacher", "gaussian"] if quick else ["rademacher", "gaussian", "uniform", "laplace"]
    combos = [(law, 0.1) for law in laws] + ([] if quick else [("rademacher", 0.5), ("gaussian", 0.01)])
    steps = 150 if quick else 400
    restarts = 1
    rows = []
    for law, p in combos:
        for d in ds:
            for n in [n for n in ns_all if n >= d]:
                res = spt.train(d, n, p, 1, law, restarts=restarts, steps=steps, lr=0.05, seed=d * 1000 + n)
                frame = sp.scaled_frame(fr.random_frame(d, n, seed=n).vectors, p, 1, law)
                opt = sp.linear_optimum(p, d, law, n=n)
                rows.append({"law": law, "p": p, "d": d, "n": n, "trained": res.value, "optimum": opt,
                             "random_frame": frame.value, "rel_err": abs(res.value - opt) / opt})
    fig, axes = subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    for d in ds:
        sel = [r for r in rows if r["d"] == d]
        ns = sorted({r["n"] for r in sel})
        tr = [max(r["trained"] / (r["p"] * sp.get_law(r["law"]).moment(2)) for r in sel if r["n"] == n) for n in ns]
        rf = [np.mean([r["random_frame"] / (r["p"] * sp.get_law(r["law"]).moment(2)) for r in sel if r["n"] == n]) for n in ns]
        (line,) = ax.plot(ns, tr, "o-", label=f"Adam, d={d}")
        ax.plot(ns, rf, "x--", color=line.get_color(), alpha=0.7, label=f"random unit frame, best scale, d={d}")
        ax.axhline(d, color=line.get_color(), lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (features)")
    ax.set_ylabel("Ltilde / (p E xi^2)")
    ax.set_title("m=1: sup Ltilde = p d E xi^2 (dotted), flat in n")
    ax.legend(fontsize=6)
    ax = axes[1]
    errs = [max(r["rel_err"], 1e-17) for r in rows]
    ax.semilogy(range(len(rows)), errs, ".")
    ax.set_xlabel("run (law x p x d x n)")
    ax.set_ylabel("|trained - p d E xi^2| / (p d E xi^2)")
    ax.set_title("relative gap of Adam to the exact optimum")
    fig.tight_layout()
    result = {"rows": rows, "max_rel_err": max(r["rel_err"] for r in rows),
              "max_random_frame_over_optimum": max(r["random_frame"] / r["optimum"] for r in rows)}
    return _save(out_dir, "superposition-linear", fig, result)


# --------------------------------------------------------------------------------------


def _best_ff(q: int, p: float, m: int, law, rmax: int) -> dict:
    best = None
    for r in range(0, min(q - 1, rmax) + 1):
        v = sp.finite_field_optimum(q, r, p, m, law)
        if best is None or v["value"] > best["value"]:
            best = v
    return best


@register("superposition-sparse-growth", "very sparse regime: sup Ltilde/p grows like d^m (finite-field frames) vs d (linear)")
def run_sparse_growth(out_dir=None, quick: bool = False) -> dict:
    """Very sparse regime (p = 1e-3 d^-m): exact Ltilde/p of the best finite-field frame vs d, log-log slopes."""
    law = "rademacher"
    ms = [1, 3] if quick else [1, 3, 5]
    qs = [3, 4, 5, 7, 11] if quick else [3, 4, 5, 7, 8, 9, 11, 13, 16, 17, 19, 23, 25]
    out = {}
    for m in ms:
        pts = []
        for q in qs:
            d = q * q
            p = 1e-3 * float(d) ** (-m)
            ff = _best_ff(q, p, m, law, rmax=2 * m - 1)
            pts.append({"q": q, "d": d, "p": p, "r": ff["r"], "n": ff["n"], "value_over_p": ff["value"] / p,
                        "unsuperposed_over_p": sp.unsuperposed_optimum(p, d, m, law) / p,
                        "ceiling_over_p": sp.sparse_limit_ceiling(d, m, law)})
        big = pts[len(pts) // 2 :]
        out[f"m={m}"] = {"points": pts, "slope_frames": _slope([t["d"] for t in big], [t["value_over_p"] for t in big]),
                         "slope_ceiling": _slope([t["d"] for t in big], [t["ceiling_over_p"] for t in big])}
    fig, ax = subplots(figsize=(7, 4.6))
    for m in ms:
        pts = out[f"m={m}"]["points"]
        d = [t["d"] for t in pts]
        (line,) = ax.loglog(d, [t["value_over_p"] for t in pts], "o-",
                            label=f"m={m}: best finite-field frame (slope {out[f'm={m}']['slope_frames']:.2f})")
        ax.loglog(d, [t["ceiling_over_p"] for t in pts], "--", color=line.get_color(), alpha=0.7,
                  label=f"m={m}: p->0 ceiling (mu_{m+1}^2/mu_{2*m}) d(d+2)..(d+{2 * m - 2})/{2 * m - 1}!!")
    ax.loglog([t["d"] for t in out["m=1"]["points"]], [t["unsuperposed_over_p"] for t in out["m=1"]["points"]], "k:",
              label="linear optimum = unsuperposed (Rademacher): d")
    ax.set_xlabel("d (hidden dimensions)")
    ax.set_ylabel("Ltilde / p")
    ax.set_title("very sparse regime p = 1e-3 d^-m (Rademacher): Ltilde/p ~ d^m")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return _save(out_dir, "superposition-sparse-growth", fig, out)


# --------------------------------------------------------------------------------------


@register("superposition-p-sweep", "p-sweep at fixed d: best constructions against the orders min(pd^m, dp^(1/m)) and min(pd^m, d)")
def run_p_sweep(out_dir=None, quick: bool = False) -> dict:
    """Fixed d = q^2, m = 3: exact best-scaled Ltilde of finite-field and random frames across p, against the orders."""
    m = 3
    q = 5 if quick else 7
    d = q * q
    ps = np.logspace(-8, 0, 9 if quick else 25)
    laws = ["rademacher", "gaussian"] if quick else ["rademacher", "gaussian", "uniform"]
    rand_ns = [d, 4 * d, 16 * d] if quick else [d, 2 * d, 4 * d, 8 * d, 16 * d, 40 * d, 100 * d, 250 * d]
    sums = {n: sp.gram_power_sums(fr.random_frame(d, n, seed=n).vectors, m) for n in rand_ns}  # p-, law-free
    res = {"d": d, "m": m, "q": q, "p": ps.tolist(), "laws": {}}
    for law in laws:
        ff, ff_r, rnd, rnd_n, uns = [], [], [], [], []
        for p in ps:
            b = _best_ff(q, float(p), m, law, rmax=q - 1)
            ff.append(b["value"])
            ff_r.append(b["r"])
            vals = {n: sp.best_scaled_value(g, float(p), m, law)[1] for n, g in sums.items()}
            nb = max(vals, key=vals.get)
            rnd.append(vals[nb])
            rnd_n.append(nb)
            uns.append(sp.unsuperposed_optimum(float(p), d, m, law))
        res["laws"][law] = {"finite_field": ff, "finite_field_r": ff_r, "random_frame": rnd, "random_frame_n": rnd_n,
                            "unsuperposed": uns, "best_over_unsuperposed": (np.maximum(ff, rnd) / np.array(uns)).tolist(),
                            "max_best_over_d": float(np.max(np.maximum(ff, rnd)) / d)}
    orders = sp.bound_orders(ps, d, m)
    fig, axes = subplots(1, len(laws), figsize=(4.2 * len(laws), 4), sharey=True)
    for ax, law in zip(axes, laws):
        r = res["laws"][law]
        ax.loglog(ps, r["finite_field"], "o-", ms=3, label="finite-field frame (best r), exact")
        ax.loglog(ps, r["random_frame"], "s-", ms=3, label="random frame (best n), exact")
        ax.loglog(ps, r["unsuperposed"], "k-", lw=1, label="best unsuperposed (exact)")
        ax.loglog(ps, orders["lower"], "g--", lw=1, label="order min(p d^3, d p^(1/3)) [const 1]")
        ax.loglog(ps, orders["upper"], "r:", lw=1.2, label="order min(p d^3, d) [const 1]")
        ax.loglog(ps, ps * sp.sparse_limit_ceiling(d, m, law), color="gray", lw=0.8, ls="-.",
                  label="p x p->0 ceiling d(d+2)(d+4)/15 (exact as p->0)")
        ax.set_title(f"{law} (d={d}, m={m})" + (", strongly log-concave" if sp.get_law(law).strongly_log_concave else ""),
                     fontsize=8)
        ax.set_xlabel("p")
        ax.set_ylim(1e-8 * d, 1e2 * d)
    axes[0].set_ylabel("sup Ltilde (constructions)")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    return _save(out_dir, "superposition-p-sweep", fig, res)


# --------------------------------------------------------------------------------------


@register("superposition-gd", "does Adam find superposition? trained Ltilde, represented features and dimensionalities across p")
def run_gd(out_dir=None, quick: bool = False) -> dict:
    """m = 3, Rademacher, d = 5, n = 20: Adam restarts across p vs unsuperposed and the p->0 ceiling."""
    m, law = 3, "rademacher"
    d, n = (3, 8) if quick else (5, 20)
    ps = [0.1, 0.01] if quick else [0.3, 0.1, 0.03, 0.01, 0.003, 0.001]
    restarts = 1 if quick else 5
    steps = 100 if quick else 1000
    rows = []
    best_W = {}
    for p in ps:
        t = spt.train(d, n, p, m, law, restarts=restarts, steps=steps, lr=0.02, seed=int(1e4 * p))
        rv = np.array(t.restart_values)
        uns = t.unsuperposed
        # start exactly at the best unsuperposed point (+ tiny noise): does Adam leave it?
        W0 = np.zeros((d, n))
        mu = sp.get_law(law)
        W0[np.arange(d), np.arange(d)] = (mu.moment(m + 1) / mu.moment(2 * m)) ** (1 / (2 * m))  # ||W_i||^(2m) = mu_{m+1}/mu_{2m}
        st_uns = spt.critical_point(W0, p, m, law)  # the exact unsuperposed optimum
        W0 += 1e-3 * np.random.default_rng(0).standard_normal((d, n))
        t0 = spt.train(d, n, p, m, law, restarts=1, steps=steps, lr=0.02, W0=W0)
        st_best = spt.critical_point(t.W, p, m, law)
        rows.append({"p": p, "best": t.value, "restarts": rv.tolist(), "unsuperposed": uns,
                     "ceiling_p_to_0": p * sp.sparse_limit_ceiling(d, m, law, n=n),
                     "n_represented": t.stats.n_represented, "sum_dimensionality": float(t.stats.dimensionality.sum()),
                     "frac_restarts_within_1pct": float(np.mean(rv >= 0.99 * t.value)),
                     "from_unsuperposed_start": t0.value, "from_unsuperposed_n_represented": t0.stats.n_represented,
                     "unsuperposed_point": st_uns.as_dict(), "best_point": st_best.as_dict()})
        best_W[p] = t
    mc_p = ps[-1]
    tmc = spt.train(d, n, mc_p, m, law, objective="mc", restarts=1, steps=steps, lr=0.02, batch_size=1024 if quick else 8192,
                   seed=1)
    result = {"d": d, "n": n, "m": m, "law": law, "rows": rows,
              "mc_objective": {"p": mc_p, "exact_value_of_mc_trained": tmc.value, "n_represented": tmc.stats.n_represented}}
    fig, axes = subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    for r in rows:
        ax.plot([r["p"]] * len(r["restarts"]), np.array(r["restarts"]) / r["unsuperposed"], "o", color="C0", alpha=0.4, ms=4)
    ax.plot(ps, [r["best"] / r["unsuperposed"] for r in rows], "C0-", label="Adam, best restart (dots: all)")
    ax.plot(ps, [r["from_unsuperposed_start"] / r["unsuperposed"] for r in rows], "C1s--", label="Adam from the unsuperposed optimum")
    ax.plot(ps, [r["ceiling_p_to_0"] / r["unsuperposed"] for r in rows], "k:", label="p->0 bound min(n, d(d+2)(d+4)/15) / d")
    ax.plot([mc_p], [tmc.value / rows[-1]["unsuperposed"]], "r*", ms=10, label="Adam on the Monte Carlo objective")
    ax.axhline(1, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("p")
    ax.set_ylabel("Ltilde / best unsuperposed")
    ax.set_title(f"m={m}, d={d}, n={n}, {law}", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[1]
    ax.plot(ps, [r["n_represented"] for r in rows], "o-", label="represented features (isolated gain >= 1/2)")
    ax.plot(ps, [r["sum_dimensionality"] for r in rows], "s--", label="sum_i D_i")
    ax.axhline(d, color="gray", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("p")
    ax.legend(fontsize=7)
    ax.set_title("features in superposition grow as p falls", fontsize=9)
    ax = axes[2]
    for p in (ps[0], ps[-1]):
        D = np.sort(best_W[p].stats.dimensionality)[::-1]
        ax.bar(np.arange(n) + (0.2 if p == ps[-1] else -0.2), D, width=0.4, label=f"p={p}")
    ax.set_xlabel("feature (sorted)")
    ax.set_ylabel("dimensionality D_i")
    ax.legend(fontsize=7)
    ax.set_title("Elhage et al. D_i = ||W_i||^4 / sum_j (W_i.W_j)^2", fontsize=9)
    fig.tight_layout()
    return _save(out_dir, "superposition-gd", fig, result)


# --------------------------------------------------------------------------------------


@register("superposition-frames", "finite-field and random frames against the Welch bounds (coherence and order-m sums)")
def run_frames(out_dir=None, quick: bool = False) -> dict:
    """Coherence vs the Welch bound and sum_ij G_ij^(2m) vs the order-m Welch bound, finite-field vs random frames."""
    qs = [3, 4, 5] if quick else [3, 4, 5, 7, 8, 9, 11, 13]
    rs = [1, 2, 3]
    ms = [1, 2, 3]
    max_rand_n = 1500 if quick else 4000
    rows = []
    for q in qs:
        for r in rs:
            if r > q - 1:
                continue
            d, n = q * q, q ** (r + 1)
            row = {"q": q, "r": r, "d": d, "n": n, "ff_coherence_predicted": r / q,
                   "welch": fr.welch_bound(d, n), "welch_best_order": fr.welch_coherence_bound(d, n)[0]}
            if d * n <= 2_000_000:
                V = fr.finite_field_frame(q, r)
                row["ff_coherence_measured"] = fr.coherence(V)
            for m in ms:
                row[f"ff_sum_ratio_m{m}"] = fr.finite_field_power_sum(q, r, m) / fr.welch_sum_bound(d, n, m)
            if n <= max_rand_n:
                R = fr.random_frame(d, n, seed=q * 100 + r)
                row["random_coherence"] = fr.coherence(R)
                for m in ms:
                    row[f"random_sum_ratio_m{m}"] = fr.frame_power_sum(R, m) / fr.welch_sum_bound(d, n, m)
            rows.append(row)
    fig, axes = subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    x = np.arange(len(rows))
    lab = [f"{r['q']},{r['r']}" for r in rows]
    ax.semilogy(x, [r["ff_coherence_predicted"] for r in rows], "o", label="finite-field coherence r/q")
    ax.semilogy(x, [r.get("random_coherence", np.nan) for r in rows], "s", label="random unit frame, same (d, n)")
    ax.semilogy(x, [r["welch"] for r in rows], "k_", ms=12, label="Welch bound sqrt((n-d)/(d(n-1)))")
    ax.semilogy(x, [r["welch_best_order"] for r in rows], "r_", ms=12, label="best order-k Welch coherence bound")
    ax.set_xticks(x, lab, fontsize=6)
    ax.set_xlabel("(q, r): d = q^2, n = q^(r+1)")
    ax.set_ylabel("coherence")
    ax.legend(fontsize=6)
    ax.set_title("coherence (d = q^2, n = q^(r+1))", fontsize=9)
    ax = axes[1]
    for m, mk in zip(ms, "o^v"):
        (h,) = ax.semilogy(x, [r[f"ff_sum_ratio_m{m}"] for r in rows], mk, label=f"finite field, m={m}")
        ax.semilogy(x, [r.get(f"random_sum_ratio_m{m}", np.nan) for r in rows], mk, mfc="none", color=h.get_color(),
                    label=f"random (open), m={m}")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xticks(x, lab, fontsize=6)
    ax.set_xlabel("(q, r): d = q^2, n = q^(r+1)")
    ax.set_ylabel("sum_ij G_ij^(2m) / max(n, n^2 (2m-1)!!/(d(d+2)..(d+2m-2)))")
    ax.set_title("order-m Welch sums (1 = bound met; p->0 Ltilde loses this factor)", fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    ok = all(abs(r["ff_coherence_measured"] - r["ff_coherence_predicted"]) < 1e-12 for r in rows if "ff_coherence_measured" in r)
    return _save(out_dir, "superposition-frames", fig, {"rows": rows, "coherence_matches_prediction": ok})
