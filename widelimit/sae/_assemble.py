r"""The certificate of :func:`widelimit.sae.certify.certify_sae` from its parts' results (theory.md §1-§6).

``assemble`` turns the merged accumulators of :mod:`widelimit.sae.parts` and the wide-limit
bound into a :class:`~widelimit.sae.certify.SAECertificate`: the three objectives and their gaps,
the per-feature table, the violation / antipodal / absorption flags and the metrics.
"""

from __future__ import annotations

import time

import numpy as np

from ..exact.gap import is_certified
from ..results import ordered_bound
from ..exact.stationarity import tangent_norms
from ..learn.same_width import same_width_witness
from ._util import stability_columns, violation_tolerance
from .metrics import DEFINITIONS

__all__ = ["assemble", "storage_dtypes"]


_KINDS = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}


def storage_dtypes(acts) -> tuple:
    """The dtypes the activations are *stored* in (what their rounding is), not the wider one they are read as.

    A shard folder or file (:class:`widelimit.data.source.ActivationSource`) reads float16 / bfloat16
    as float32: its shards' kinds are the storage; a torch tensor keeps its own dtype (``bfloat16``);
    a byte-swapped array (``>f2``) is stored in its native equivalent.
    """
    kinds = getattr(acts, "storage_dtypes", None)
    if kinds:
        return tuple(_KINDS.get(k, k) for k in kinds)
    dt = getattr(acts, "dtype", np.float64)
    if isinstance(dt, np.dtype):
        return (dt.newbyteorder("="),)
    return (dt,)


def _tangent(ZR, Ut, N):
    """Norm of the Riemannian atom gradient ``(2/N) (ZR_d - <ZR_d, u_d> u_d)`` per feature (theory.md §5.2)."""
    return (tangent_norms(ZR, Ut) * (2.0 / N)).cpu().numpy()


def _features(setup, kkt, coding, firing, flags, N, has_enc):
    k = setup.k
    cnt = firing.count.cpu().numpy()
    freq = cnt / N
    nan = np.full(k, np.nan)
    return {
        "feature": np.arange(k),
        "frequency": freq,
        "mean_code": firing.code_sum.cpu().numpy() / N,
        "decoder_norm": setup.norms,
        "max_violation_firing": np.where(cnt > 0, kkt["viol_on"], np.nan) if has_enc else nan,
        "max_violation_silent": kkt["viol_off"] if has_enc else nan.copy(),
        "tangent_grad_norm": _tangent(kkt["ZR"], setup.Ut, N) if has_enc else nan.copy(),
        "tangent_grad_norm_optimal_codes": _tangent(coding["ZRo"], setup.Ut, N) if coding["ZRo"] is not None
        else nan.copy(),
        "dead": freq <= flags.dead_threshold,
        "dense": freq >= flags.dense_threshold,
        "antipodal_partner": np.full(k, -1),
        "absorbed_into": np.full(k, -1),
    }


def _violations(feats, thr, thr_t):
    out = []
    for cond, arr, t in (("feature-residual on firing tokens: <u_d, r_i> = lam", feats["max_violation_firing"], thr),
                         ("should have fired: <u_d, r_i> <= lam on silent tokens", feats["max_violation_silent"], thr),
                         ("atom stationarity: tangent gradient = 0", feats["tangent_grad_norm"], thr_t)):
        bad = np.flatnonzero(np.nan_to_num(arr, nan=0.0) > t)
        out += [{"feature": int(d), "condition": cond, "value": float(arr[d])} for d in bad]
    out.sort(key=lambda v: -v["value"])
    return out


def _antipodal(pairs, flags, feats):
    pa, pb, pc = pairs
    out = []
    am = pc <= flags.antipodal_cosine
    for a, bb, c in zip(pa[am], pb[am], pc[am]):
        if a < bb:
            out.append({"features": [int(a), int(bb)], "cosine": float(c)})
            feats["antipodal_partner"][a] = bb
            feats["antipodal_partner"][bb] = a
    out.sort(key=lambda d: d["cosine"])
    return out


def _absorbed(pairs, co, cnt, freq, flags, feats):
    pa, pb, pc = pairs
    mask = pc >= flags.absorb_cosine
    best = {}
    for a, bb, c, n_ab in zip(pa[mask], pb[mask], pc[mask], co):
        if cnt[a] > 0 and cnt[bb] > cnt[a] and n_ab >= flags.containment * cnt[a]:
            frac = n_ab / cnt[a]
            if a not in best or (frac, c) > (best[a][1], best[a][2]):
                best[a] = (int(bb), float(frac), float(c))
    out = []
    for a, (bb, frac, c) in sorted(best.items()):
        out.append({"feature": int(a), "contained_in": bb, "containment": frac, "cosine": c,
                    "frequency": float(freq[a]), "partner_frequency": float(freq[bb])})
        feats["absorbed_into"][a] = bb
    return out


def _metrics(enc, firing, metrics, feats, coding, antipodal, absorbed, N, has_enc):
    mean_x = metrics["sum_x"] / N
    var = enc["sum_x2"] / N - float(mean_x @ mean_x)
    reconstruction = enc["rec"] / N
    nanmax = (lambda a: float(np.nanmax(a)) if np.isfinite(a).any() else None)
    return {
        "mse": reconstruction if has_enc else None,
        "explained_variance": (1.0 - reconstruction / var) if var > 0 and has_enc else None,
        "l0": firing.l0 / N,
        "l1": enc["l1"] / N if has_enc else None,
        "l1_unit": enc["pen"] / N if has_enc else None,
        **{k_: v_ for k_, v_ in metrics["stats"].items() if k_ not in ("mse", "explained_variance", "l0", "l1")},
        "dead_features": int(feats["dead"].sum()),
        "dense_features": int(feats["dense"].sum()),
        "antipodal_pairs": len(antipodal),
        "absorbed_looking": len(absorbed),
        "max_violation_firing": nanmax(feats["max_violation_firing"]),
        "max_violation_silent": float(np.nanmax(feats["max_violation_silent"])) if has_enc else None,
        "max_tangent_grad_norm": float(np.nanmax(feats["tangent_grad_norm"])) if has_enc else None,
        "max_tangent_grad_norm_optimal_codes": float(np.nanmax(feats["tangent_grad_norm_optimal_codes"]))
        if coding["ZRo"] is not None else None,
        "coding_iterations": coding["n_iter"],
        "definitions": dict(DEFINITIONS),
    }


def assemble(cls, parts, setup, flags, coding_opts, *, choice, med, h_bias, width_opt, pairs, acts, Xb_all, sample,
             notes, storage, tol, t0, n_total, stability, stability_witnesses, same_width_steps):
    """The :class:`SAECertificate` (``cls``) from the merged parts and the wide-limit bound ``med``."""
    sae, lam, N, n, k = setup.sae, setup.lam, int(acts.shape[0]), setup.U.shape[1], setup.k
    has_enc = sae.has_encoder
    enc, kkt, coding = parts["encoder"].result(), parts["kkt"].result(), parts["coding"].result()
    metrics = parts["metrics"].result()
    firing = kkt["firing"] if has_enc else coding["firing"]
    lb = float(med.lower_bound)
    opt_obj, coding_gap = coding["value"] / N, coding["gap"] / N
    if has_enc:
        sae_obj = (enc["rec"] + 2.0 * lam * enc["pen"]) / N
        reconstruction, penalty, encoder_gap = enc["rec"] / N, 2.0 * lam * enc["pen"] / N, sae_obj - opt_obj
    else:
        sae_obj, reconstruction, penalty, encoder_gap = opt_obj, float("nan"), float("nan"), None
        notes.append("decoder-only SAE: the SAE objective is that of the optimal codes")
    # each part of the gap is a value minus a bound of it (theory.md §8.5): never negative; within rounding 0
    global_gap = sae_obj - ordered_bound(sae_obj, lb, what="SAE objective", bound="wide-limit lower bound")
    decoder_gap = opt_obj - ordered_bound(opt_obj, h_bias, what="optimal codes' objective",
                                          bound="wide-limit bound at the SAE's bias H(b_dec)")
    bias_gap = h_bias - ordered_bound(h_bias, lb, what="H(b_dec)", bound="wide-limit lower bound")
    feats = _features(setup, kkt, coding, firing, flags, N, has_enc)
    scale = float(np.linalg.norm(sample, axis=1).max() + np.linalg.norm(setup.b))  # size of the terms of r_i
    dts = storage + (sae.dtype,)
    thr = violation_tolerance(lam, flags.kkt_tol, scale, dts)
    thr_t = violation_tolerance(lam, flags.kkt_tol, 2.0 * feats["mean_code"] * scale, dts)
    violations = _violations(feats, thr, thr_t) if has_enc else []
    antipodal = _antipodal(pairs, flags, feats)
    absorbed = _absorbed(pairs, parts["pairs"].result()["co"], firing.count.cpu().numpy(), feats["frequency"], flags,
                         feats) if has_enc and parts["pairs"].qa.numel() else []
    stab = stability_columns(Xb_all, setup.U, coding["codes"], setup.b, lam, stability_witnesses, feats) \
        if stability else None
    same_width = None
    if same_width_steps > 0:
        sw = same_width_witness(np.asarray(Xb_all), setup.U, setup.b, lam=lam, max_iter=int(same_width_steps),
                                device="cpu" if str(setup.dev) == "cpu" else setup.dev,
                                coding_tol=coding_opts.coding_tol)
        same_width = {k2: v for k2, v in sw.items() if k2 != "fit"}
    if not coding["converged"]:
        notes.append("optimal coding did not reach coding_tol on every token; the encoder gap bound uses the "
                     "certified coding gap, which stays valid")
    return cls(
        sae_objective=float(sae_obj), reconstruction=float(reconstruction), penalty=float(penalty),
        optimal_code_objective=float(opt_obj), coding_gap=float(coding_gap), coding_max_gap=float(coding["max_gap"]),
        coding_certified=bool(coding["converged"]), lower_bound=lb, lower_bound_at_bias=h_bias,
        huber_median_gap=float(med.gap), encoder_gap=None if encoder_gap is None else float(encoder_gap),
        decoder_gap_at_bias=float(decoder_gap), bias_gap=float(bias_gap), global_gap=float(global_gap),
        certified=is_certified(global_gap, sae_obj, tol=tol), tol=float(tol), lam=lam, n_points=N, d_in=n,
        d_sae=k, bias_stationarity=float(np.linalg.norm(firing.sum_r.cpu().numpy() / N)),
        max_residual_norm=float(firing.max_rn), bias_distance=float(np.linalg.norm(setup.b - med.point)),
        metrics=_metrics(enc, firing, metrics, feats, coding, antipodal, absorbed, N, has_enc), features=feats,
        violations=violations, antipodal_pairs=antipodal, absorbed=absorbed, sae_info=sae.summary(),
        optimal_bias=np.asarray(med.point), time_s=time.perf_counter() - t0, device=str(setup.dev), notes=notes,
        stability=stab, same_width=same_width, objective=choice.as_dict(), violation_tolerance=float(thr),
        n_points_total=n_total, wide_optimum_width=width_opt,
        sparsity=parts["sparsity"].result() if "sparsity" in parts else None,
    )
