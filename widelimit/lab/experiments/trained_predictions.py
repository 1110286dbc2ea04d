r"""Do SAEs trained on real activations follow theory.md §6.1 (antipodal pairs) and §6.2 (absorption)?

SAEs of SAELens's ReLU (``standard``), TopK and JumpReLU architectures are trained with SAELens's own
training code (:func:`widelimit.lab.saelens_train.train_saelens`) on all-MiniLM-L6-v2 token activations
(:mod:`widelimit.lab.lm`), and every live latent is held against the two predictions. Definitions (they
are the experiment; docs/experiments/trained_predictions.md states them with the numbers):

- **live latent** ``d``: fires (code ``f_d > 0``) on at least one token; ``u_d`` its unit decoder row.
- **activity** ``p_d``: the fraction of tokens on which ``d`` fires.
- **1-D data of a direction**: the projections ``y_i = <x_i, u_d>``; the "zero" of §6.1 is the median of
  ``y`` over the tokens where ``d`` is silent, and the active values are ``s_i = y_i - zero`` on the tokens
  where it fires (negative ones count, clipped to ``-1`` in ``g``).
- **lam**: ReLU: the SAE's own, ``l1_coefficient / 2`` (theory.md §1). TopK and JumpReLU have none; their
  lam-equivalent is calibrated by the code optimality condition of the L1 problem, ``<r_i, u_d> = lam``
  for every active ``(i, d)`` (``r_i`` the reconstruction residual): ``lam_eq`` = the median of
  ``<r_i, u_d>`` over active pairs, floored at ``1e-9`` (on the ReLU SAEs the same statistic is reported
  next to the true lam, as a check of the calibration).
- **prediction** (§6.1): ``d`` has an antipodal partner iff ``p_d > p*_d = 1/(1 + g(lam))`` with
  ``g = mean clip(s/lam - 1, -1, 1)`` over its active values
  (:func:`widelimit.lab.experiments.antipodal.antipodal_threshold`); since ``g <= 1``, ``p* >= 1/2``.
- **found**: another live latent ``e`` of the same SAE with ``<u_d, u_e> <= -0.9``.
- **absorption** (§6.2): pairs of live latents with ``<u_P, u_C> >= 0.3`` (the parent ``P`` is the more
  frequent one) stand in for parent and child. On each token where the child fires (a *case*),
  ``a = <x - b_dec, u_P>``, ``c = <x - b_dec, v>`` with ``v`` the child's atom made orthogonal to the
  parent, and the predicted gain is ``h(a+) + h(c+) - h(sqrt(a+^2 + c+^2))`` (bias at ``b_dec``).
  The case is *absorbed* when the parent is silent. Prediction: absorbed where the gain is positive, more
  often the larger the gain. **Baseline**: the parent's silent rate over all tokens, ``1 - p_P``
  (what the absorbed rate would be if the parent ignored the child).
- **planted control**: 1-D data ``x = s u`` (``s`` uniform on ``[1, 3]`` with probability ``p``, else 0)
  through the same training code (ReLU, lam = 0.3, ``p* = 1/2``): it shows that the pair appears when
  ``p > p*`` and that the detector finds it.
- **planted in real activations**: the MiniLM tokens plus ``s u`` (``s`` uniform on ``[2, 6]`` with
  probability ``p``, ``u`` random), a ReLU SAE at lam = 0.5 (``p* = 1/2``): is there an atom ``-u``?
"""

from __future__ import annotations

import time

import numpy as np

from ...data import datasets
from ...exact.solve import solve
from ...sae.formats.objects import from_object
from ..lm import shipped_text, token_activations
from ..saelens_train import train_saelens
from . import register
from ._common import save_figure, subplots, write_json
from .absorption import absorption_gain
from .antipodal import antipodal_threshold

__all__ = ["calibrated_lam", "direction_table", "absorption_cases", "planted_control", "run"]

NAME = "trained-predictions"
ANTI_COS = -0.9       # a pair of atoms at most this cosine is "antipodal"
PARENT_COS = 0.3      # a pair of atoms at least this cosine stands in for parent and child
LAM_FLOOR = 1e-9
CONTROL_LAM = 0.3
#: (architecture, label, sparsities, SAELens config): lam for ReLU, k for TopK, l0_coefficient for JumpReLU
ARCHS = [("standard", "ReLU", (0.05, 0.5, 1.0), {}),
         ("topk", "TopK", (32, 8), {}),
         ("jumprelu", "JumpReLU", (0.5, 1.0), {"jumprelu_sparsity_loss_mode": "tanh"})]


def calibrated_lam(X, sae, F) -> float:
    """Median of ``<r_i, u_d>`` over the active ``(i, d)`` (``r = x - x_hat``), floored at ``1e-9``.

    For optimal L1 codes with unit atoms every active pair has ``<r_i, u_d> = lam`` exactly (theory.md §5.2),
    so this reads an L1-equivalent lam off any encoder.
    """
    R = np.asarray(X, dtype=np.float64) - sae.decode(F)
    C = R @ sae.unit_dictionary().T
    act = F > 0
    return max(float(np.median(C[act])), LAM_FLOOR) if act.any() else LAM_FLOOR


def direction_table(X, sae, F, lam: float) -> dict:
    """Per live latent: activity ``p``, threshold ``p*`` of its 1-D data, predicted and found antipodal partner.

    Returns arrays (over live latents, in latent order) ``latent``, ``p``, ``pstar``, ``predicted``, ``found``
    and ``min_cos`` (the smallest cosine of its atom with another live atom).
    """
    act = F > 0
    live = np.flatnonzero(act.any(axis=0))
    U = sae.unit_dictionary()[live]
    Y = np.asarray(X, dtype=np.float64) @ U.T
    p, pstar = np.empty(live.size), np.empty(live.size)
    for j, d in enumerate(live):
        on = act[:, d]
        zero = float(np.median(Y[~on, j])) if (~on).any() else 0.0
        p[j] = on.mean()
        pstar[j] = antipodal_threshold(Y[on, j] - zero, lam)
    G = U @ U.T
    np.fill_diagonal(G, np.inf)
    min_cos = G.min(axis=1) if live.size > 1 else np.full(live.size, np.inf)
    return {"latent": live, "p": p, "pstar": pstar, "predicted": p > pstar, "found": min_cos <= ANTI_COS,
            "min_cos": min_cos}


def absorption_cases(X, sae, F, lam: float) -> dict:
    """Every (parent, child, token) case of §6.2 (see the module docstring): arrays ``gain``, ``absorbed``,
    ``baseline`` (the parent's silent rate over all tokens), ``baseline_present`` (its silent rate over the
    tokens with ``a > lam``), ``a``, ``c`` and the number of pairs."""
    act = F > 0
    live = np.flatnonzero(act.any(axis=0))
    U = sae.unit_dictionary()[live]
    freq = act[:, live].mean(axis=0)
    Y0 = (np.asarray(X, dtype=np.float64) - sae.b_dec) @ U.T
    G = U @ U.T
    iu, ju = np.nonzero(np.triu(G >= PARENT_COS, 1) & (np.triu(G, 1) < 1 - 1e-9))
    out = {"gain": [], "absorbed": [], "baseline": [], "baseline_present": [], "a": [], "c": []}
    for i, j in zip(iu, ju):
        P, C = (i, j) if freq[i] >= freq[j] else (j, i)
        rows = np.flatnonzero(act[:, live[C]])
        cos = G[P, C]
        a = Y0[rows, P]
        c = (Y0[rows, C] - cos * a) / np.sqrt(1.0 - cos * cos)
        out["a"].append(a)
        out["c"].append(c)
        out["gain"].append(absorption_gain(np.maximum(a, 0), np.maximum(c, 0), lam))
        out["absorbed"].append(~act[rows, live[P]])
        out["baseline"].append(np.full(rows.size, 1.0 - freq[P]))
        there = Y0[:, P] > lam        # tokens where the parent is present: silent rate there, all tokens
        out["baseline_present"].append(np.full(rows.size, float(np.mean(~act[there, live[P]])) if there.any() else 0.0))
    res = {k: np.concatenate(v) if v else np.empty(0) for k, v in out.items()}
    res["absorbed"] = res["absorbed"].astype(bool)
    res["n_pairs"] = int(iu.size)
    return res


def _spearman(x, y):
    from scipy.stats import spearmanr

    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def _absorption_summary(cases, lam=None) -> dict:
    """Rates over the cases; with ``lam``, also over the cases where the parent is present (``a > lam``)."""
    g, ab, base = cases["gain"], cases["absorbed"], cases["baseline"]
    pos = g > 0
    present = {}
    if lam is not None:
        m = cases["a"] > lam
        present = {"n_parent_present": int(m.sum()),
                   "absorbed_rate_parent_present": float(ab[m].mean()) if m.any() else None,
                   "baseline_parent_present": float(cases["baseline_present"][m].mean()) if m.any() else None,
                   "spearman_parent_present": _spearman(g[m], ab[m].astype(float))}
    return {"n_pairs": cases["n_pairs"], "n_cases": int(g.size),
            "frac_gain_positive": float(pos.mean()) if g.size else None,
            "absorbed_rate": float(ab.mean()) if g.size else None,
            "absorbed_rate_gain_positive": float(ab[pos].mean()) if pos.any() else None,
            "absorbed_rate_gain_zero": float(ab[~pos].mean()) if (~pos).any() else None,
            "baseline_rate": float(base.mean()) if g.size else None,
            "spearman_gain_absorbed": _spearman(g, ab.astype(float)), **present}


def planted_control(p: float, *, lam: float = CONTROL_LAM, n_points: int = 400, dim: int = 8, steps: int = 300,
                    seed: int = 0) -> dict:
    """Train a width-4 ReLU SAE (SAELens) on ``x = s u`` at activity ``p``; compare with the certified optimum.

    Returns ``p``, ``pstar`` (of the sample's active values), ``predicted``, ``found`` (two live atoms with
    cosine ``<= -0.9``), ``min_cos``, the SAE's objective and the certified wide-limit optimum of the data.
    """
    X, truth = datasets.sparse_variable(n_points, dim, n_active=int(round(p * n_points)), low=1.0, high=3.0,
                                        seed=seed)
    s = truth["values"]
    sae = from_object(train_saelens(X, "standard", width=4, sparsity=lam, steps=steps, batch_size=256, lr=1e-2,
                                    seed=seed))
    F = sae.encode(sae.preprocess(X))
    live = (F > 0).any(axis=0)
    U = sae.unit_dictionary()[live]
    G = U @ U.T
    min_cos = float(G.min()) if live.sum() > 1 else None
    R = sae.decode(F) - X
    value = float(np.mean(np.sum(R * R, axis=1)) + 2 * lam * np.mean(F @ sae.decoder_norms()))
    pstar = antipodal_threshold(s[s > 0], lam)
    opt = solve(X, lam=lam)
    return {"p": float((s > 0).mean()), "lam": lam, "pstar": pstar, "predicted": bool((s > 0).mean() > pstar),
            "found": min_cos is not None and min_cos <= ANTI_COS, "min_cos": min_cos,
            "cos_with_u": (U @ truth["direction"]).tolist(), "sae_objective": value, "optimum": opt.value,
            "optimum_width": opt.width, "n_points": n_points, "seed": seed}


def planted_in_real(X, p: float, *, lam: float = 0.5, width: int = 256, steps: int = 200, low: float = 2.0,
                    high: float = 6.0, seed: int = 0) -> dict:
    """The same question on real activations with a planted dense variable: ``x_i + s_i u`` (``u`` random unit,
    ``s_i`` uniform on ``[low, high]`` with probability ``p``, else 0), a ReLU SAE (SAELens) at ``lam``.

    §6.1 predicts the atom ``-u`` (for the tokens where ``s = 0``) iff ``p > p*`` of the planted values.
    Returns ``p``, ``pstar``, ``predicted``, ``found`` (some live atom has ``<w, u> <= -0.9``), ``min_cos_u``,
    ``max_cos_u`` and, for the most negative atom, its activity and the fraction of the ``s = 0`` tokens it fires on.
    """
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(X.shape[1])
    u /= np.linalg.norm(u)
    on = rng.random(X.shape[0]) < p
    s = np.where(on, rng.uniform(low, high, X.shape[0]), 0.0)
    Xp = np.asarray(X, dtype=np.float64) + s[:, None] * u
    sae = from_object(train_saelens(Xp, "standard", width=width, sparsity=lam, steps=steps, seed=seed))
    F = sae.encode(sae.preprocess(Xp))
    live = np.flatnonzero((F > 0).any(axis=0))
    cu = sae.unit_dictionary()[live] @ u
    neg = live[int(np.argmin(cu))] if live.size else None
    pstar = antipodal_threshold(s[on], lam)
    return {"p": float(on.mean()), "p_target": p, "lam": lam, "pstar": pstar, "predicted": bool(on.mean() > pstar),
            "found": bool(live.size and cu.min() <= ANTI_COS), "min_cos_u": float(cu.min()) if live.size else None,
            "max_cos_u": float(cu.max()) if live.size else None,
            "minus_u_activity": float((F[:, neg] > 0).mean()) if neg is not None else None,
            "minus_u_fires_on_zeros": float((F[~on, neg] > 0).mean()) if neg is not None and (~on).any() else None}


def _train_all(X, widths, steps, seed, quick):
    for arch, label, sparsities, cfg in ARCHS:
        for width in widths:
            for sp in sparsities[:1] if quick else sparsities:
                t = time.perf_counter()
                sae = from_object(train_saelens(X, arch, width=width, sparsity=sp, steps=steps, seed=seed, config=cfg))
                yield {"arch": arch, "label": label, "width": width, "sparsity": sp, "train_s": time.perf_counter() - t}, sae


def _one_sae(X, info, sae):
    """Both predictions on one trained SAE: its summary row and its per-direction table and cases."""
    F = sae.encode(sae.preprocess(X))
    live = (F > 0).any(axis=0)
    R = sae.decode(F) - X
    lam_kkt = calibrated_lam(X, sae, F)
    lam = sae.l1_coefficient / 2 if info["arch"] == "standard" else lam_kkt
    tab = direction_table(X, sae, F, lam)
    cases = absorption_cases(X, sae, F, lam)
    U = sae.unit_dictionary()[live]
    G = U @ U.T
    np.fill_diagonal(G, np.inf)
    row = {**info, "lam": lam, "lam_calibrated": lam_kkt, "l0": float((F > 0).sum(axis=1).mean()),
           "fvu": float((R * R).sum() / ((X - X.mean(axis=0)) ** 2).sum()), "n_live": int(live.sum()),
           "max_p": float(tab["p"].max()) if tab["p"].size else 0.0,
           "n_p_above_half": int((tab["p"] > 0.5).sum()), "min_decoder_cos": float(G.min()) if live.sum() > 1 else None,
           "n_predicted": int(tab["predicted"].sum()), "n_found": int(tab["found"].sum()),
           "predicted_not_found_p_minus_pstar": (tab["p"] - tab["pstar"])[tab["predicted"] & ~tab["found"]].tolist(),
           "absorption": _absorption_summary(cases, lam)}
    return row, tab, cases


def _confusion(tabs) -> dict:
    pr = np.concatenate([t["predicted"] for t in tabs])
    fo = np.concatenate([t["found"] for t in tabs])
    return {"n_directions": int(pr.size), "none_none": int((~pr & ~fo).sum()), "predicted_found": int((pr & fo).sum()),
            "predicted_not_found": int((pr & ~fo).sum()), "found_not_predicted": int((~pr & fo).sum())}


def _gain_bins(rows_cases, n_bins=8):
    """Absorbed rate by bins of gain/lam (quantiles over all cases with gain > 0, plus a gain = 0 bin)."""
    g = np.concatenate([c["gain"] / r["lam"] for r, c in rows_cases])
    ab = np.concatenate([c["absorbed"] for _, c in rows_cases])
    base = np.concatenate([c["baseline"] for _, c in rows_cases])
    pos = g > 0
    out = [{"gain_over_lam": [0.0, 0.0], "n": int((~pos).sum()),
            "absorbed_rate": float(ab[~pos].mean()) if (~pos).any() else None,
            "baseline_rate": float(base[~pos].mean()) if (~pos).any() else None}]
    if pos.sum() >= n_bins:
        edges = np.quantile(g[pos], np.linspace(0, 1, n_bins + 1))
        idx = np.clip(np.searchsorted(edges, g[pos], side="right") - 1, 0, n_bins - 1)
        for b in range(n_bins):
            m = idx == b
            out.append({"gain_over_lam": [float(edges[b]), float(edges[b + 1])], "n": int(m.sum()),
                        "absorbed_rate": float(ab[pos][m].mean()) if m.any() else None,
                        "baseline_rate": float(base[pos][m].mean()) if m.any() else None})
    return out


def _plot(res, tabs, out_dir):
    fig, ax = subplots(1, 3, figsize=(15, 4.4))
    colors = {"ReLU": "C0", "TopK": "C1", "JumpReLU": "C2"}
    for row, t in zip(res["saes"], tabs):
        ax[0].scatter(t["p"], np.minimum(t["pstar"], 1.05), s=4, alpha=0.4, color=colors[row["label"]],
                      label=None)
    for lab, col in colors.items():
        ax[0].scatter([], [], s=10, color=col, label=lab)
    ax[0].plot([0, 1], [0, 1], "k--", lw=0.8, label="p = p*")
    ax[0].axvline(0.5, color="grey", lw=0.6)
    found = [(t["p"][t["found"]], t["pstar"][t["found"]]) for t in tabs]
    fp = np.concatenate([f[0] for f in found]) if found else np.empty(0)
    if fp.size:
        ax[0].scatter(fp, np.minimum(np.concatenate([f[1] for f in found]), 1.05), marker="x", color="r",
                      label="antipodal found")
    ax[0].set(xlabel="activity p of the direction", ylabel="p*(lam) of its 1-D data (inf drawn at 1.05)",
              title="§6.1: pair predicted iff p > p*", xlim=(0, 1), ylim=(0.45, 1.08))
    ax[0].legend(fontsize=7)
    bins = res["absorption_by_gain"]
    mid = [0.5 * sum(b["gain_over_lam"]) for b in bins]
    ax[1].plot(mid, [b["absorbed_rate"] for b in bins], "o-", label="parent silent | child fires")
    ax[1].plot(mid, [b["baseline_rate"] for b in bins], "s--", label="baseline: parent silent overall")
    ax[1].set(xlabel="predicted gain / lam (bin middle; first point: gain 0)", ylabel="rate",
              title="§6.2: absorption vs predicted gain (all SAEs)")
    ax[1].legend(fontsize=7)
    ctl = res["control"]
    ax[2].plot([c["p"] for c in ctl], [c["min_cos"] if c["min_cos"] is not None else 1.0 for c in ctl], "o-",
               label="1-D data: min cosine of live atoms")
    pir = res["planted_in_real"]
    ax[2].plot([c["p"] for c in pir], [c["min_cos_u"] for c in pir], "s-", label="MiniLM + planted s u: min <w, u>")
    ax[2].axvline(ctl[0]["pstar"], color="k", ls="--", lw=0.8, label=f"p* = {ctl[0]['pstar']:.3f}")
    ax[2].axhline(ANTI_COS, color="r", lw=0.6, label=f"detector: cos <= {ANTI_COS}")
    ax[2].set(xlabel="activity p of the planted variable", ylabel="cosine",
              title=f"planted controls (lam {CONTROL_LAM}; in MiniLM: lam {pir[0]['lam']})")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_dir, NAME)


def _gain_examples(rows_cases, n=20):
    """The first ``n`` cases (``a``, ``c``, gain) of the first SAE that has any, with its lam (checked by the tests)."""
    for row, cases in rows_cases:
        if cases["gain"].size:
            return {"sae": f"{row['label']} {row['width']} {row['sparsity']}", "lam": row["lam"],
                    "a": cases["a"][:n].tolist(), "c": cases["c"][:n].tolist(), "gain": cases["gain"][:n].tolist()}
    return {"sae": None, "lam": None, "a": [], "c": [], "gain": []}


def _measure(X, quick, steps, seed):
    rows, tabs, rows_cases = [], [], []
    for info, sae in _train_all(X, (32,) if quick else (256, 512), steps, seed, quick):
        row, tab, cases = _one_sae(X, info, sae)
        rows.append(row)
        tabs.append(tab)
        rows_cases.append((row, cases))
    ps = (0.3, 0.8) if quick else (0.2, 0.3, 0.4, 0.45, 0.55, 0.6, 0.7, 0.8, 0.9)
    control = [planted_control(p, steps=150 if quick else 300, seed=seed) for p in ps]
    in_real = [planted_in_real(X, p, width=32 if quick else 256, steps=steps, seed=seed)
               for p in ((0.8,) if quick else (0.2, 0.4, 0.6, 0.8))]
    all_cases = {k: np.concatenate([c[k] for _, c in rows_cases])
                 for k in ("gain", "absorbed", "baseline", "baseline_present", "a")}
    all_cases["n_pairs"] = sum(c["n_pairs"] for _, c in rows_cases)
    res = {"saes": rows, "confusion": _confusion(tabs), "absorption": _absorption_summary(all_cases),
           "absorption_by_gain": _gain_bins(rows_cases), "control": control, "planted_in_real": in_real,
           "gain_examples": _gain_examples(rows_cases)}
    return res, tabs


@register(NAME, "SAELens SAEs on MiniLM activations vs theory.md §6.1 (antipodal p*) and §6.2 (absorption gain)")
def run(out_dir=None, quick: bool = False, *, layer: int = 3, steps: int | None = None, seed: int = 0) -> dict:
    """Train the SAEs, test both predictions on every live latent, run the planted controls; JSON + PNG."""
    import torch

    t0 = time.perf_counter()
    texts = shipped_text(max_sentences=12 if quick else None)
    X = np.asarray(token_activations(texts, layer=layer)[0], dtype=np.float64)
    steps = steps or (30 if quick else 200)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # one thread: the same SAEs whatever the machine's load
    try:
        measured, tabs = _measure(X, quick, steps, seed)
    finally:
        torch.set_num_threads(threads)
    res = {"layer": layer, "n_tokens": int(X.shape[0]), "d_in": int(X.shape[1]), "steps": steps,
           "widths": [32] if quick else [256, 512], "quick": quick, "anti_cos": ANTI_COS, "parent_cos": PARENT_COS,
           **measured, "seconds": time.perf_counter() - t0}
    write_json(out_dir, NAME, res)
    _plot(res, tabs, out_dir)
    return res
