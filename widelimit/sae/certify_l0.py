r"""The certificate of an SAE against its own sparsity alone (no L1 objective, no ``lam``): theory.md §10.

What :func:`widelimit.sae.certify.certify_sae` returns for an L0-trained SAE (TopK, BatchTopK, JumpReLU,
Matryoshka) unless an L1 stand-in is asked for, and for ``objective="l0"``: the pass runs the parts of
:mod:`widelimit.sae.parts` without the optimal L1 coding, plus :class:`widelimit.sae.sparsity.SparsityPart`
(the bracket at the SAE's L0), and no wide-limit bound. Kept: the reconstruction metrics, the firing
statistics, the decoder-pair flags (dead, dense, antipodal, absorbed-looking). ``None``: the L1 fields
(objective, gaps, wide-limit bound, certified) and the first-order flags, which assume the L1
objective; the atom tangent gradient at the SAE's codes stays in ``features`` (the L0 penalty does not
depend on the atoms' directions, so it is the MSE's own stationarity condition on the sphere).
"""

from __future__ import annotations

import time

import numpy as np

from ._assemble import _absorbed, _antipodal, _features, _metrics

__all__ = ["certify_l0"]

#: Metrics of the L1 first-order conditions and optimal coding, left out of an L0 certificate.
_L1_METRICS = ("max_violation_firing", "max_violation_silent", "max_tangent_grad_norm_optimal_codes",
               "coding_iterations", "optimal_mse", "optimal_l0")


def certify_l0(cls, parts, setup, flags, *, choice, pairs, N: int, notes: list, t0: float, n_total: int):
    """The :class:`~widelimit.sae.certify.SAECertificate` (``cls``) of the L0 objective from the merged parts."""
    sae = setup.sae
    has_enc = sae.has_encoder
    enc, kkt, metrics = parts["encoder"].result(), parts["kkt"].result(), parts["metrics"].result()
    firing = kkt["firing"]
    no_coding = {"ZRo": None, "n_iter": None}
    feats = _features(setup, kkt, no_coding, firing, flags, N, has_enc)
    antipodal = _antipodal(pairs, flags, feats)
    absorbed = _absorbed(pairs, parts["pairs"].result()["co"], firing.count.cpu().numpy(), feats["frequency"], flags,
                         feats) if has_enc and parts["pairs"].qa.numel() else []
    m = _metrics(enc, firing, metrics, feats, no_coding, antipodal, absorbed, N, has_enc)
    m = {k: v for k, v in m.items() if k not in _L1_METRICS}
    for key in ("max_violation_firing", "max_violation_silent"):  # the L1 code conditions: not this objective's
        feats[key] = np.full(setup.k, np.nan)
    if m.get("l0") == 0.0 and N:
        notes.append(f"the SAE is dead: no feature fires on any of the {N} tokens (L0 = 0); at its L0 the only codes "
                     "are empty, so the bracket is exact (MSE = mean ||x - b_dec||^2) and there is nothing to gain "
                     "at this sparsity")
    spx = parts["sparsity"].result() if "sparsity" in parts else None
    if spx is not None and spx["batches_stopped_by_time"]:
        notes.append(f"the pursuit stopped at its time budget on {spx['batches_stopped_by_time']} batches "
                     "(default: what the rest of the pass took); a larger pursuit time may find better codes")
    U = setup.U
    return cls(
        sae_objective=None, reconstruction=m.get("mse"), penalty=None, optimal_code_objective=None, coding_gap=None,
        coding_max_gap=None, coding_certified=None, lower_bound=None, lower_bound_at_bias=None,
        huber_median_gap=None, encoder_gap=None, decoder_gap_at_bias=None, bias_gap=None, global_gap=None,
        certified=None, tol=None, lam=None, n_points=N, d_in=U.shape[1], d_sae=U.shape[0],
        bias_stationarity=float(np.linalg.norm(firing.sum_r.cpu().numpy() / N)), max_residual_norm=float(firing.max_rn),
        bias_distance=None, metrics=m, features=feats, violations=[], antipodal_pairs=antipodal, absorbed=absorbed,
        sae_info=sae.summary(), optimal_bias=None, time_s=time.perf_counter() - t0, device=str(setup.dev),
        notes=notes, objective=choice.as_dict(), n_points_total=n_total, sparsity=spx)
