r"""The order of ``sup Ltilde`` outside the very sparse regime (issue 30, open question 2; seed 003).

``m = 3``, ``d in {5, 10, 20, 35, 50}``, ``p in {1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1}``, Rademacher, Gaussian
(strongly log-concave: the paper's ``O(d)`` bound applies) and Laplace (log-concave, not strongly). At each
cell :func:`widelimit.lab.sup_ltilde.search` runs L-BFGS ascents from the unsuperposed optimum, random
starts with ``n = d, 2d, 4d, 8d, 16d`` features (at most :data:`N_CAP`), the best ``W`` of the next smaller
``p`` (``"warm"``) and block-diagonal assemblies of the best ``W`` at smaller ``d`` (``"block"``). The best
``W`` is rounded to float32, stored (``sup-ltilde-weights.npz``) and certified: its value by the pairing
formula, by the cumulant recursion of :func:`widelimit.lab.superposition.ltilde` and by Monte Carlo
(:func:`widelimit.lab.sup_ltilde.certify`).

What the search cannot guarantee is that the best found is the supremum. Three checks detect where it is
not: block-diagonal superadditivity (``sup_{d_1 + d_2} >= sup_{d_1} + sup_{d_2}``, exact, module docstring
of :mod:`widelimit.lab.sup_ltilde`) applied to the values found; a random unit frame at its best scale with
up to ``250 d`` features (:func:`frame_values`, an exact value of a ``W`` that exists); and whether the best
``W`` uses nearly every feature it was given (the cap). A ``(law, p)`` column is *trusted* when every ``d``
passes all three. Details and numbers: docs/experiments/sup_ltilde.md.
"""

from __future__ import annotations

import time

import numpy as np

from ..._runtime import limit_threads
from .. import frames as fr
from .. import superposition as sp
from .. import sup_ltilde as sl
from . import register
from ._common import save_figure, subplots, write_json

__all__ = ["run", "block_bound", "frame_values", "CONFIG"]

#: Largest number of features a start may have (the p -> 0 optimum at d = 50 needs about 8,830).
N_CAP = 400

CONFIG = {
    False: {"laws": ["rademacher", "gaussian", "laplace"], "ds": [5, 10, 20, 35, 50],
            "ps": [1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0], "factors": [1, 2, 4, 8, 16], "restarts": 1,
            "work": 4000, "max_iter": 300, "n_samples": 100_000, "n_cap": N_CAP,
            "frame_factors": [1, 2, 4, 8, 16, 40, 100, 250]},
    True: {"laws": ["rademacher", "laplace"], "ds": [3, 6], "ps": [0.1, 1.0], "factors": [1, 2], "restarts": 1, "work": 0,
           "max_iter": 100, "n_samples": 20_000, "n_cap": 12, "frame_factors": [1, 4]},
}


def block_bound(values: dict, d: int) -> tuple[float, list]:
    """Best sum of found values over block-diagonal assemblies of strictly smaller ``d`` (plus zero rows).

    ``values`` maps ``d' -> value``; returns ``(bound, parts)`` with ``sum(parts) <= d``: the ``Ltilde`` of
    ``diag(W_{d_1}, W_{d_2}, ..., 0)``, a value that weights of dimension ``d`` reach exactly.
    """
    smaller = sorted(k for k in values if k < d)
    best = {0: (0.0, [])}
    for r in range(1, d + 1):
        cand = [best[r - 1]]
        for k in smaller:
            if k <= r:
                v, parts = best[r - k]
                cand.append((v + values[k], parts + [k]))
        best[r] = max(cand, key=lambda t: t[0])
    return best[d]


def _block_starts(found: dict, d: int, n_cap: int) -> list:
    """Block-diagonal starts from the best ``W`` at smaller ``d`` (same law and ``p``), within the feature cap."""
    vals = {k: r.value for k, r in found.items()}
    _, parts = block_bound(vals, d)
    starts = []
    if parts and sum(found[k].n for k in parts) <= n_cap:
        W = sl.block_diagonal(*[found[k].W for k in parts])
        starts.append(("block", np.vstack([W, np.zeros((d - W.shape[0], W.shape[1]))])))
    return starts


def _restarts(cfg, d: int, n: int) -> int:
    """Random starts per ``n``: ``cfg["restarts"]``, more (up to 12) where ``d n`` is small and ascents cheap."""
    return max(cfg["restarts"], min(12, cfg["work"] // (d * n)))


def _cell(law, d, p, cfg, found_d, warm_W, seed):
    ns = sorted({min(cfg["n_cap"], f * d) for f in cfg["factors"]})
    warm = [("warm", warm_W)] if warm_W is not None else []
    warm += _block_starts(found_d, d, cfg["n_cap"])
    res = sl.search(d, p, law, ns=ns, restarts=lambda n: _restarts(cfg, d, n), warm=warm, max_iter=cfg["max_iter"], seed=seed)
    W32 = res.W.astype(np.float32)
    sq = np.sum(res.W * res.W, axis=0)
    n_active = int(np.sum(sq >= 1e-2 * sq.max())) if sq.max() > 0 else 0
    cert = sl.certify(W32.astype(np.float64), p, law, n_samples=cfg["n_samples"], seed=seed)
    row = res.as_dict()
    row.update({"value_search": res.value, "value": cert["value"], "certificate": cert,
                "unsuperposed": sp.unsuperposed_optimum(p, d, 3, law),
                "p_to_0_line": p * sp.sparse_limit_ceiling(d, 3, law), "n_max": max(r.n for r in res.runs),
                "n_active": n_active, "uses_cap": n_active > 0.9 * max(r.n for r in res.runs)})
    return res, W32, row


def frame_values(cfg) -> dict:
    """Best-scaled exact ``Ltilde`` of random unit frames (``n = f d`` for the ``frame_factors`` ``f``, the best
    ``n`` kept) at every ``(law, d, p)``: ``{(law, d, p): (value, n)}``. A frame is a ``W`` reached exactly, with
    up to ``250 d`` features (the search allows :data:`N_CAP`); the search should not end below it."""
    out = {}
    for d in cfg["ds"]:
        sums = {f * d: sp.gram_power_sums(fr.random_frame(d, f * d, seed=d * 1000 + f).vectors, 3)
                for f in cfg["frame_factors"]}  # independent of p and the law
        for law in cfg["laws"]:
            for p in cfg["ps"]:
                vals = {n: sp.best_scaled_value(g, p, 3, law)[1] for n, g in sums.items()}
                n = max(vals, key=vals.get)
                out[(law, d, p)] = (vals[n], n)
    return out


def _checks(rows, cfg, frames):
    """Block superadditivity and random frames per ``(law, p)``; the trusted columns."""
    for r in rows:
        r["frame_value"], r["frame_n"] = frames[(r["law"], r["d"], r["p"])]
        r["frame_ok"] = bool(r["value"] >= r["frame_value"] * (1 - 1e-9))
    for law in cfg["laws"]:
        for p in cfg["ps"]:
            col = {r["d"]: r for r in rows if r["law"] == law and r["p"] == p}
            for d, r in col.items():
                bound, parts = block_bound({k: c["value"] for k, c in col.items()}, d)
                r["block_bound"], r["block_parts"] = bound, parts
                r["block_ok"] = bool(r["value"] >= bound * (1 - 1e-9))
                r["best_reached"] = max(r["value"], bound, r["frame_value"])
            ok = all(c["block_ok"] and c["frame_ok"] and not c["uses_cap"] for c in col.values())
            for c in col.values():
                c["trusted"] = ok


def _slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _summary(rows, cfg) -> dict:
    """Fitted exponents in ``d`` and in ``p``, and the ratios the docs quote."""
    out = {"d_exponent": {}, "p_slope": {}, "over_d": {}, "over_d_p13": {}, "trusted_p": {}}
    big = cfg["ds"][-3:]
    for law in cfg["laws"]:
        sel = [r for r in rows if r["law"] == law]
        get = {(r["d"], r["p"]): r for r in sel}
        tp = sorted({r["p"] for r in sel if r["trusted"]})
        out["trusted_p"][law] = tp
        out["d_exponent"][law] = {str(p): _slope(big, [get[(d, p)]["value"] for d in big]) for p in cfg["ps"]}
        out["p_slope"][law] = {str(d): (_slope(tp, [get[(d, p)]["value"] for p in tp]) if len(tp) > 1 else None)
                               for d in cfg["ds"]}
        out["over_d"][law] = {f"{d},{p}": get[(d, p)]["value"] / d for d in cfg["ds"] for p in cfg["ps"]}
        out["over_d_p13"][law] = {f"{d},{p}": get[(d, p)]["value"] / (d * p ** (1 / 3)) for d in cfg["ds"]
                                  for p in cfg["ps"]}
    cert = [r["certificate"] for r in rows]
    out["max_rel_diff_cumulant"] = max(c["rel_diff_cumulant"] for c in cert)
    out["max_abs_mc_z"] = max(abs(c["mc_z"]) for c in cert)
    out["max_rel_diff_mc"] = max(abs(c["mc"] - c["value"]) / abs(c["value"]) for c in cert)
    out["n_searches"] = sum(r["n_runs"] for r in rows)
    out["n_block_violations"] = sum(not r["block_ok"] for r in rows)
    out["n_frame_violations"] = sum(not r["frame_ok"] for r in rows)
    out["n_uses_cap"] = sum(r["uses_cap"] for r in rows)
    return out


@register("sup-ltilde", "order of sup Ltilde (m=3) by L-BFGS with many restarts, d <= 50, three laws, across p; certified values")
def run(out_dir=None, quick: bool = False) -> dict:
    """Maximise ``Ltilde`` at every ``(law, d, p)``; certify the best ``W``; check superadditivity; fit orders."""
    cfg = CONFIG[bool(quick)]
    t0 = time.perf_counter()
    rows, weights = [], {}
    with limit_threads(1):  # OpenBLAS workers spinning between the many small products slow L-BFGS 10-20x
        for li, law in enumerate(cfg["laws"]):
            found = {p: {} for p in cfg["ps"]}
            for d in cfg["ds"]:
                warm = None
                for pi, p in enumerate(cfg["ps"]):
                    res, W32, row = _cell(law, d, p, cfg, found[p], warm, seed=1000 * li + 10 * d + pi)
                    found[p][d], warm = res, res.W
                    weights[f"{law}_d{d}_p{p:g}"] = W32
                    rows.append(row)
        frames = frame_values(cfg)
    _checks(rows, cfg, frames)
    result = {"m": 3, "config": {k: v for k, v in cfg.items()}, "rows": rows, "summary": _summary(rows, cfg),
              "time_s": time.perf_counter() - t0}
    if out_dir is not None:
        np.savez_compressed(f"{out_dir}/sup-ltilde-weights.npz", **weights)
    _plot(rows, cfg, out_dir)
    write_json(out_dir, "sup-ltilde", result)
    return result


def _plot(rows, cfg, out_dir):
    laws, ps = cfg["laws"], np.array(cfg["ps"])
    fig, axs = subplots(2, len(laws), figsize=(4.3 * len(laws), 7.4), sharex=True)
    for j, law in enumerate(laws):
        sel = [r for r in rows if r["law"] == law]
        mu = sl.law_moments(law)
        for i, d in enumerate(cfg["ds"]):
            rs = sorted((r for r in sel if r["d"] == d), key=lambda r: r["p"])
            v = np.array([r["value"] for r in rs])
            axs[0, j].loglog(ps, v / d, "o-", ms=3, color=f"C{i}", label=f"d={d}")
            axs[1, j].semilogx(ps, v / (d * ps ** (1 / 3)), "o-", ms=3, color=f"C{i}")
            bad = [r for r in rs if not r["block_ok"]]
            axs[0, j].loglog([r["p"] for r in bad], [r["block_bound"] / d for r in bad], "x", color=f"C{i}", ms=7)
            fb = [r for r in rs if not r["frame_ok"]]
            axs[0, j].loglog([r["p"] for r in fb], [r["frame_value"] / d for r in fb], "+", color=f"C{i}", ms=8)
        axs[0, j].loglog(ps, ps * mu[1] ** 2 / mu[2], "k--", lw=1, label="unsuperposed / d")
        axs[0, j].loglog(ps, ps * sp.sparse_limit_ceiling(cfg["ds"][-1], 3, law) / cfg["ds"][-1], ":", color="gray",
                         lw=1, label=f"p x (p->0 ceiling) / d, d={cfg['ds'][-1]}")
        axs[0, j].set_ylim(min(ps) * mu[1] ** 2 / mu[2] / 3, 3)
        tp = [r["p"] for r in sel if r["trusted"]]
        for ax in axs[:, j]:
            if tp:
                ax.axvspan(min(tp) / 1.3, max(ps) * 1.3, color="green", alpha=0.06)
        strong = ", strongly log-concave" if sp.get_law(law).strongly_log_concave else ""
        axs[0, j].set_title(f"{law}{strong}", fontsize=8)
        axs[1, j].set_xlabel("p")
    axs[0, 0].set_ylabel("best Ltilde found / d  (x: block bound, +: random frame above it)")
    axs[1, 0].set_ylabel("best Ltilde found / (d p^(1/3))")
    axs[0, 0].legend(fontsize=6)
    fig.suptitle("m = 3: certified best Ltilde over many L-BFGS restarts (green: trusted p)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out_dir, "sup-ltilde")
