r"""The certification report of a trained SAE: table, flat dict for loggers, figures, files, a training callback.

The table leads with what a user can act on (module :func:`certificate_rows`):

1. **encoder gap** ``L(SAE codes) - L(optimal codes)``: what a better encoder
   (or inference-time optimal coding) would gain with the same dictionary;
2. **dictionary gap at the SAE's bias** ``L(optimal codes) - H(b_dec)``: what any
   dictionary of any width would gain at the same bias;
3. **bias gap** ``H(b_dec) - min_b H(b)``;
4. **the wide-limit bound** ``min_b H(b)``: the objective of the best SAE of
   *any* width (theory.md §3). Its optimum uses one atom per ray of the data, so
   for N tokens in general position it is about one atom per token (the
   ``wide optimum width`` row: tokens outside the ``lam`` ball around the optimal
   bias): it bounds what width can buy, it is not a target at a practical width.

"Features that should have fired" are features whose residual correlation
``<u_d, r_i>`` exceeds ``lam`` on tokens where they are silent, beyond the
rounding tolerance of :func:`widelimit.sae.certify.violation_tolerance`.
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
           "SHOULD_HAVE_FIRED"]

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

    Keys: ``objective/sae``, ``objective/optimal_codes``, ``gap/encoder``,
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
        "gap/global": cert.global_gap, "gap/relative": relative_gap(cert.global_gap, cert.sae_objective),
        "gap/coding": cert.coding_gap,
        "bound/wide_limit": cert.lower_bound, "bound/at_bias": cert.lower_bound_at_bias,
        "bound/wide_optimum_width": getattr(cert, "wide_optimum_width", None),
        "lam": cert.lam, "lam/l1_coefficient": 2 * cert.lam,
        "lam/stand_in": bool(cert.objective.get("stand_in", False)),
        "certified": bool(cert.certified),
        "features/violating": len(cert.violating_features()),
        "features/should_have_fired": len(cert.violating_features(SHOULD_HAVE_FIRED)),
        "features/dead": m.get("dead_features"), "features/dense": m.get("dense_features"),
        "features/antipodal_pairs": m.get("antipodal_pairs"), "features/absorbed_looking": m.get("absorbed_looking"),
        "diagnostics/bias_stationarity": cert.bias_stationarity,
        "diagnostics/max_residual_norm": cert.max_residual_norm,
        "diagnostics/violation_tolerance": cert.violation_tolerance,
        "n_points": cert.n_points, "time_s": cert.time_s,
    }
    for k, v in m.items():
        if not isinstance(v, (dict, list)) and k not in ("dead_features", "dense_features", "antipodal_pairs",
                                                          "absorbed_looking"):
            d[f"metrics/{k}"] = v
    return {prefix + k: _num(v) for k, v in d.items()}


def _g(v):
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def certificate_rows(c) -> list[tuple]:
    """``(name, value, meaning)`` rows for a terminal table, most actionable first."""
    m = c.metrics
    obj = c.objective or {}
    enc_hi = None if c.encoder_gap is None else c.encoder_gap + (c.coding_gap or 0.0)
    rel = relative_gap(c.global_gap, c.sae_objective)
    width = getattr(c, "wide_optimum_width", None)
    stand = " (a stand-in: see objective)" if obj.get("stand_in") else ""
    rows = [
        ("encoder gap", _g(c.encoder_gap),
         f"what optimal codes gain with this decoder and bias (certified <= {_g(enc_hi)})"),
        ("dictionary gap at its bias", c.decoder_gap_at_bias, "what any dictionary of any width gains at b_dec"),
        ("bias gap", c.bias_gap, "what moving b_dec to the optimal bias gains (wide limit)"),
        ("wide-limit bound", c.lower_bound,
         f"best SAE of any width; its optimum has ~{_g(width)} atoms (one per ray), not a practical target"),
        ("global gap (relative)", f"{c.global_gap:.6g} ({rel:.3g})", "SAE objective - bound = the three gaps above"),
        ("SAE objective", c.sae_objective, f"at lam = {c.lam:.6g} (l1_coefficient {2 * c.lam:.6g}){stand}"),
        ("objective certified", obj.get("certified_objective", "L1"), f"lam: {obj.get('lam_source', 'given')}"),
        ("SAE trained with", obj.get("training_objective", "?"), f"{c.sae_info.get('architecture')} SAE "
                                                                   f"({c.sae_info.get('source_format')})"),
        ("tokens x d_in, d_sae", f"{c.n_points} x {c.d_in}, {c.d_sae}",
         "sampled" if (c.n_points_total or c.n_points) > c.n_points else "all tokens"),
        ("explained_variance", _g(m.get("explained_variance")), "1 - E||x - x_hat||^2 / Var(x)"),
        ("mse", _g(m.get("mse")), "mean over tokens of ||x - x_hat||^2"),
        ("cossim / l2_ratio", f"{_g(m.get('cossim'))} / {_g(m.get('l2_ratio'))}", "mean cos(x, x_hat) / ||x_hat||/||x||"),
        ("relative_reconstruction_bias", _g(m.get("relative_reconstruction_bias")), "E||x_hat||^2 / E<x, x_hat>"),
        ("l0 / l1", f"{_g(m.get('l0'))} / {_g(m.get('l1'))}", "mean active features / mean sum f"),
        ("optimal codes: mse / l0", f"{_g(m.get('optimal_mse'))} / {_g(m.get('optimal_l0'))}",
         "same decoder and bias, certified optimal codes at this lam"),
        ("frac_alive", _g(m.get("frac_alive")), f"dead {m.get('dead_features')}, dense {m.get('dense_features')}"),
        ("features that should have fired", len(c.violating_features(SHOULD_HAVE_FIRED)),
         f"silent where <u_d, r> > lam + {c.violation_tolerance:.2g} (tolerance incl. rounding)"),
        ("features off first order", len(c.violating_features()), "any theory.md §5 condition, same tolerance"),
        ("antipodal pairs", m.get("antipodal_pairs"), "decoder cosine near -1 (theory.md §6: optimal SAEs have them)"),
        ("absorbed-looking features", m.get("absorbed_looking"), "firing set inside another's, similar atom"),
        ("certified optimal", c.certified, f"global gap <= {c.tol:g} * objective"),
    ]
    stab = getattr(c, "stability", None)
    if stab is not None:
        n = stab["counts"]
        rows.insert(-1, ("feature stability", f"{n['stable']} stable, {n['unstable']} unstable, {n['violated']} "
                         f"violated, {n.get('undecided', 0)} undecided", "unstable: a verified lower objective was found"))
    same = getattr(c, "same_width", None)
    if same is not None:
        rows.insert(-1, ("same-width dictionary", same["value_found"], same["message"]))
    return rows


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
