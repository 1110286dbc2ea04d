r"""The certification report of a trained SAE: table, flat dict for loggers, figures, files, a training callback.

The table leads with what the SAE could gain at its own width and sparsity (module :func:`certificate_rows`):

1. **the bracket at its L0** (:mod:`widelimit.sae.sparsity`, theory.md §10): the best MSE of codes of its own
   decoder and bias that fire at most as often as its encoder's, between a proven lower bound and a
   verified witness, and so what a better encoder gains at this width and sparsity;
2. **the encoder gap of the L1 objective** ``L(SAE codes) - L(optimal codes)`` when the L1 objective is the
   SAE's own (an L1-trained SAE). For an L0-trained SAE the L1 objective is certified only when asked
   (``objective="l1"`` or ``lam`` given) and its row is then an "objective difference" of a stand-in,
   never called a gain (the lasso codes can have a larger MSE at the same L0);
3. the same-width witness, when asked.

Then what ANY width could reach (L1 objective only): the **dictionary gap at the SAE's bias**
``L(optimal codes) - H(b_dec)``, the **bias gap** ``H(b_dec) - min_b H(b)`` and **the wide-limit bound**
``min_b H(b)`` (theory.md §3), whose optimum uses about one atom per token: it bounds what width can buy,
it is not a target at a practical width. Every number has :data:`DIGITS` significant digits.

"Features that should have fired" are features whose residual correlation
``<u_d, r_i>`` exceeds ``lam`` on tokens where they are silent, beyond the
rounding tolerance of :func:`widelimit.sae.certify.violation_tolerance`: a first-order condition of the L1
objective, listed only when that objective is the SAE's own (a TopK SAE cannot fire more than ``k``).
Figures are :class:`matplotlib.figure.Figure` objects (pyplot's backend is never
touched); :func:`write_sae_certificate` saves them. The training-loop callback is
:class:`widelimit.sae.callback.CertifyCallback`.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from .._json import to_jsonable
from ..exact.gap import relative_gap

__all__ = ["certificate_rows", "flat_dict", "figures", "plot_sae_certificate", "write_sae_certificate",
           "SHOULD_HAVE_FIRED", "sig", "DIGITS"]

SHOULD_HAVE_FIRED = "should have fired: <u_d, r_i> <= lam on silent tokens"


def _num(v):
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    v = float(v)
    return v if math.isfinite(v) else None


def flat_dict(cert, prefix: str = "") -> dict:
    """Scalars of a :class:`~widelimit.sae.certify.SAECertificate` under ``/``-separated keys (non-finite -> None).

    Keys: ``sparsity/value``, ``sparsity/lower_bound``, ``sparsity/gain``, ``sparsity/gain_upper``,
    ``sparsity/sae_value``, ``sparsity/l0`` (the bracket at the SAE's L0; None without one),
    ``objective/sae``, ``objective/optimal_codes``, ``gap/encoder``,
    ``gap/encoder_upper``, ``gap/dictionary_at_bias``, ``gap/bias``, ``gap/global``,
    ``gap/relative``, ``bound/wide_limit``, ``bound/at_bias``, ``bound/wide_optimum_width``,
    ``lam``, ``lam/stand_in``, ``certified``, ``metrics/<name>`` (SAELens names),
    ``features/<count>``, ``n_points``, ``time_s``.
    """
    m = cert.metrics
    enc_hi = None if cert.encoder_gap is None else cert.encoder_gap + (cert.coding_gap or 0.0)
    d = {
        "objective/sae": cert.sae_objective, "objective/optimal_codes": cert.optimal_code_objective,
        "gap/encoder": cert.encoder_gap, "gap/encoder_upper": enc_hi,
        "gap/dictionary_at_bias": cert.decoder_gap_at_bias, "gap/bias": cert.bias_gap,
        "gap/global": cert.global_gap, "gap/relative": None if cert.global_gap is None else relative_gap(cert.global_gap, cert.sae_objective),
        "gap/coding": cert.coding_gap,
        "bound/wide_limit": cert.lower_bound, "bound/at_bias": cert.lower_bound_at_bias,
        "bound/wide_optimum_width": getattr(cert, "wide_optimum_width", None),
        "lam": cert.lam, "lam/l1_coefficient": None if cert.lam is None else 2 * cert.lam,
        "lam/stand_in": bool(cert.objective.get("stand_in", False)),
        "certified": None if cert.certified is None else bool(cert.certified),
        "features/violating": len(cert.violating_features()),
        "features/should_have_fired": len(cert.violating_features(SHOULD_HAVE_FIRED)),
        "features/dead": m.get("dead_features"), "features/dense": m.get("dense_features"),
        "features/antipodal_pairs": m.get("antipodal_pairs"), "features/absorbed_looking": m.get("absorbed_looking"),
        "diagnostics/bias_stationarity": cert.bias_stationarity,
        "diagnostics/max_residual_norm": cert.max_residual_norm,
        "diagnostics/violation_tolerance": cert.violation_tolerance,
        "n_points": cert.n_points, "time_s": cert.time_s,
    }
    spx = getattr(cert, "sparsity", None) or {}
    for key in ("value", "lower_bound", "gain", "gain_upper", "sae_value", "l0"):
        d[f"sparsity/{key}"] = spx.get(key)
    for k, v in m.items():
        if not isinstance(v, (dict, list)) and k not in ("dead_features", "dense_features", "antipodal_pairs",
                                                          "absorbed_looking"):
            d[f"metrics/{k}"] = v
    return {prefix + k: _num(v) for k, v in d.items()}


def _g(v):
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


#: Significant digits of every number in the table (one precision for all of them).
DIGITS = 4


def sig(v, digits: int = DIGITS) -> str:
    """``v`` with ``digits`` significant digits (``n/a`` for None / non-finite; integers and text as they are)."""
    if v is None or isinstance(v, str):
        return "n/a" if v is None else v
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "NO"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    v = float(v)
    return f"{v:.{digits}g}" if math.isfinite(v) else "n/a"


def _sparsity_rows(c) -> list[tuple]:
    """The bracket at the SAE's own width and sparsity (widelimit.sae.sparsity), what the SAE could gain there."""
    sp_ = getattr(c, "sparsity", None)
    if not sp_:
        return []
    rows = [
        ("gain at its L0 (MSE)", f"{sig(sp_['gain'])} .. {sig(sp_['gain_upper'])}",
         "MSE the SAE's encoder leaves on the table at its width and sparsity: found by codes of its own "
         "decoder and bias (left), at most (right)"),
        ("best MSE at its L0", f"{sig(sp_['lower_bound'])} .. {sig(sp_['value'])}",
         f"codes {sp_['budget']}: a verified witness (right, L0 {sig(sp_['l0'])}) and a proven lower bound "
         f"(left; {sp_['status']})"),
        ("SAE's own MSE / L0", f"{sig(sp_['sae_value'])} / {sig(sp_['sae_l0'])}", "its encoder's codes"),
    ]
    pen = sp_.get("penalised")
    if pen:
        rows.append(("gain on its own objective", f"{sig(pen['gain'])}",
                     f"{pen['objective']}: SAE {sig(pen['sae_value'])}, better codes {sig(pen['value'])}, "
                     f"proven >= {sig(pen['lower_bound'])}"))
    return rows


def _l1_rows(c) -> tuple[list, list]:
    """``(at this width, any width)`` rows of the L1 objective, when one is certified (``c.lam`` not None)."""
    if getattr(c, "lam", None) is None:
        return [], []
    obj = c.objective or {}
    m = c.metrics
    enc_hi = None if c.encoder_gap is None else c.encoder_gap + (c.coding_gap or 0.0)
    rel = relative_gap(c.global_gap, c.sae_objective)
    width = getattr(c, "wide_optimum_width", None)
    lam = f"lam = {sig(c.lam)}, l1_coefficient {sig(2 * c.lam)}"
    codes = (f"optimal L1 codes: mse {sig(m.get('optimal_mse'))} at L0 {sig(m.get('optimal_l0'))} vs the SAE's "
             f"mse {sig(m.get('mse'))} at L0 {sig(m.get('l0'))}")
    if obj.get("stand_in"):  # not the SAE's objective: a difference, never called a gain
        here = [("L1 stand-in: objective difference", _num(c.encoder_gap),
                 f"L1 objective ({lam}) of the SAE's codes minus the lasso codes'; NOT the SAE's own objective, "
                 f"not a gain: {codes}")]
    else:
        here = [("encoder gap (L1)", _num(c.encoder_gap),
                 f"what optimal codes gain on the SAE's own L1 objective ({lam}); certified <= {sig(enc_hi)}; {codes}")]
    anyw = [
        ("dictionary gap at its bias", c.decoder_gap_at_bias, "what a dictionary of ANY width could gain at b_dec (L1)"),
        ("bias gap", c.bias_gap, "what moving b_dec gains, at any width (L1)"),
        ("wide-limit bound", c.lower_bound,
         f"best L1 objective at ANY width; its optimum has ~{_g(width)} atoms (one per ray), not a practical target"),
        ("global gap (relative)", f"{sig(c.global_gap)} ({sig(rel)})", "SAE objective - bound = the gaps above"),
        ("SAE objective (L1)", c.sae_objective, lam + (" (a stand-in: see objective)" if obj.get("stand_in") else "")),
        ("certified optimal (L1)", c.certified, f"global gap <= {c.tol:g} * objective"),
    ]
    return here, anyw


def _flag_rows(c) -> list[tuple]:
    """Feature flags; the first-order ones only where the L1 objective is the SAE's own (they assume it)."""
    m = c.metrics
    obj = c.objective or {}
    rows = [("frac_alive", m.get("frac_alive"), f"dead {m.get('dead_features')}, dense {m.get('dense_features')}")]
    if getattr(c, "lam", None) is not None and not obj.get("stand_in"):
        rows += [
            ("features that should have fired", len(c.violating_features(SHOULD_HAVE_FIRED)),
             f"silent where <u_d, r> > lam + {c.violation_tolerance:.2g} (L1 objective; tolerance incl. rounding)"),
            ("features off first order", len(c.violating_features()), "any theory.md §5 condition, same tolerance"),
        ]
    rows += [
        ("antipodal pairs", m.get("antipodal_pairs"), "decoder cosine near -1 (theory.md §6: optimal SAEs have them)"),
        ("absorbed-looking features", m.get("absorbed_looking"), "firing set inside another's, similar atom"),
    ]
    return rows


def certificate_rows(c) -> list[tuple]:
    """``(name, value, meaning)`` rows for a terminal table: first what the SAE could gain at its own width and
    sparsity, then the width-independent numbers (what any width could reach), then the metrics and flags.
    Every number is given with :data:`DIGITS` significant digits."""
    m = c.metrics
    obj = c.objective or {}
    here, anyw = _l1_rows(c)
    rows = _sparsity_rows(c) + here
    same = getattr(c, "same_width", None)
    if same is not None:
        rows.append(("same-width dictionary", same["value_found"], same["message"]))
    rows += anyw
    rows += [
        ("objective certified", obj.get("certified_objective", "L1"), f"lam: {obj.get('lam_source', 'given')}"),
        ("SAE trained with", obj.get("training_objective", "?"), f"{c.sae_info.get('architecture')} SAE "
                                                                   f"({c.sae_info.get('source_format')})"),
        ("tokens x d_in, d_sae", f"{c.n_points} x {c.d_in}, {c.d_sae}",
         "sampled" if (c.n_points_total or c.n_points) > c.n_points else "all tokens"),
        ("explained_variance", _g(m.get("explained_variance")), "SAELens: 1 - E||x - x_hat||^2 / (E||x||^2 - ||E x||^2)"),
        ("explained_variance_legacy", _g(m.get("explained_variance_legacy")),
         "SAELens (old formula): mean over tokens of 1 - ||x - x_hat||^2 / ||x - mean_batch x||^2"),
        ("mse", _g(m.get("mse")), "mean over tokens of ||x - x_hat||^2"),
        ("cossim / l2_ratio", f"{sig(m.get('cossim'))} / {sig(m.get('l2_ratio'))}", "mean cos(x, x_hat) / ||x_hat||/||x||"),
        ("relative_reconstruction_bias", _g(m.get("relative_reconstruction_bias")), "E||x_hat||^2 / E<x, x_hat>"),
        ("l0 / l1", f"{sig(m.get('l0'))} / {sig(m.get('l1'))}", "mean active features / mean sum f"),
    ]
    ds = getattr(c, "downstream", None)
    if ds:
        rows += [("ce_loss_score", _g(ds.get("ce_loss_score")),
                  f"SAELens CE loss recovered (zero ablation baseline): CE clean {sig(ds['ce_loss_without_sae'])}, "
                  f"with SAE {sig(ds['ce_loss_with_sae'])}, ablated {sig(ds['ce_loss_with_ablation'])}"),
                 ("kl_div_with_sae", _g(ds.get("kl_div_with_sae")),
                  f"mean KL(clean || SAE spliced) per token; with ablation {sig(ds['kl_div_with_ablation'])}")]
    rows += _flag_rows(c)
    stab = getattr(c, "stability", None)
    if stab is not None:
        n = stab["counts"]
        rows.append(("feature stability", f"{n['stable']} stable, {n['unstable']} unstable, {n['violated']} "
                     f"violated, {n.get('undecided', 0)} undecided", "unstable: a verified lower objective was found"))
    return [(name, sig(v) if not isinstance(v, str) else v, meaning) for name, v, meaning in rows]


# ---- figures -----------------------------------------------------------------------------------


def figures(cert) -> dict:
    """``{"feature_frequency": Figure, "feature_violations": Figure}`` (matplotlib Figure objects).

    ``feature_frequency``: histogram of ``log10`` firing frequency (dead features
    at the dotted left edge). ``feature_violations``: per feature id (x axis =
    feature index), the feature-residual violation on firing tokens, the
    "should have fired" violation on silent tokens and the atom tangent-gradient
    norm, log scale, with the rounding tolerance as a line; exact zeros at 1e-18.
    """
    from matplotlib.figure import Figure

    F = cert.features
    freq = np.asarray(F["frequency"], dtype=np.float64)
    floor = 0.5 / cert.n_points
    f1 = Figure(figsize=(6.4, 4.0))
    ax = f1.subplots()
    ax.hist(np.log10(np.maximum(freq, floor)), bins=50, color="tab:blue")
    ax.axvline(np.log10(floor), color="tab:red", ls=":", label=f"dead ({int(np.sum(F['dead']))})")
    ax.set_xlabel("log10 firing frequency")
    ax.set_ylabel("features")
    ax.set_title(f"feature firing frequency ({cert.d_sae} features, {cert.n_points} tokens)")
    ax.legend()
    f1.tight_layout()

    f2 = Figure(figsize=(7.2, 4.0))
    ax = f2.subplots()
    tiny = 1e-18
    x = np.arange(cert.d_sae)
    for key, lab, mk in (("max_violation_firing", "|<u_d,r>-lam| on firing tokens", "o"),
                         ("max_violation_silent", "should have fired: (<u_d,r>-lam)+ on silent tokens", "x"),
                         ("tangent_grad_norm", "atom tangent gradient", ".")):
        v = np.asarray(F[key], dtype=np.float64)
        if np.isfinite(v).any():
            ax.scatter(x, np.maximum(np.nan_to_num(v, nan=tiny), tiny), s=8, marker=mk, label=lab)
    ax.axhline(max(cert.violation_tolerance, tiny), color="k", ls=":", lw=1,
               label=f"tolerance {cert.violation_tolerance:.2g}")
    ax.set_yscale("log")
    ax.set_xlabel("feature id")
    ax.set_ylabel("violation")
    ax.set_title(f"first-order conditions (lam = {cert.lam:g}); global gap {cert.global_gap:.3g}")
    ax.legend(fontsize=7)
    f2.tight_layout()
    return {"feature_frequency": f1, "feature_violations": f2}


def plot_sae_certificate(cert, out_dir) -> list[Path]:
    """Save :func:`figures` as ``feature_frequency.png`` and ``feature_violations.png`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures(cert).items():
        p = out / f"{name}.png"
        fig.savefig(p, dpi=120)
        paths.append(p)
    return paths


def write_sae_certificate(cert, out_dir) -> list[Path]:
    """Write ``certificate.json`` (nested), ``metrics.json`` (flat), ``features.csv`` and the two PNGs."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js = out / "certificate.json"
    d = cert.as_dict(max_listed=10_000)
    d["optimal_bias"] = np.asarray(cert.optimal_bias).tolist()
    js.write_text(json.dumps(to_jsonable(d), indent=2))
    fl = out / "metrics.json"
    fl.write_text(json.dumps(flat_dict(cert), indent=2))
    cs = out / "features.csv"
    cols = list(cert.features)
    with open(cs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        arrays = [np.asarray(cert.features[c]) for c in cols]
        for i in range(cert.d_sae):
            row = []
            for a in arrays:
                v = a[i]
                if isinstance(v, str):
                    row.append(v)
                elif isinstance(v, (np.floating, float)):
                    row.append("" if not math.isfinite(v) else repr(float(v)))
                else:
                    row.append(int(v))
            w.writerow(row)
    return [js, fl, cs, *plot_sae_certificate(cert, out)]
