r"""Which objective a trained SAE is certified against, and the ``lam`` of it.

An L0-trained SAE (TopK, BatchTopK, JumpReLU, Matryoshka) is certified by default against its own
sparsity only: the bracket of :mod:`widelimit.sae.sparsity` (theory.md §10), with no ``lam`` at all
(``ObjectiveChoice.lam is None``). The L1 objective below is certified for it only when asked
(``objective="l1"`` or a ``lam`` / ``l1_coefficient`` given), and then it is a stand-in.

The L1 certificate is about the objective of theory.md §1,

.. math:: L = \frac1N\sum_i \|x_i - b - f_i W_{dec}\|^2 + 2\lambda\sum_{i,d} f_{id}\|W_{dec,d}\| ,

because that is the objective whose global optimum over every width is known
(the wide limit). How that relates to the SAE's own training objective depends
on the architecture:

============  ================================================================================
standard      its own objective (SAELens / dictionary_learning ``l1_coefficient = 2 lam``);
              ``lam`` from the config when it records the coefficient
gated         a stand-in: the gated loss puts the L1 on the gate pre-activations and adds an
              auxiliary reconstruction; ``lam`` from the config's ``l1_coefficient`` or the caller
topk,         a stand-in for an L0 objective (a budget of ``k`` features, or an L0 penalty):
batchtopk,    compared at **equal sparsity**, with ``lam`` calibrated so that the optimal codes
jumprelu,     of the SAE's decoder and bias fire as often as the SAE's own codes (mean L0);
matryoshka    the optimal codes' MSE at that L0 is then the SAE's MSE's benchmark. A topk or
              jumprelu SAE whose SAELens v6 config records an L1 training coefficient
              (``metadata.training_architecture_details.l1_coefficient``, as widelimit's own
              encoder fits do) was trained on the L1 objective: certified against it at that ``lam``
============  ================================================================================

A ``lam`` (or ``l1_coefficient``) given by the caller always wins; the report then
says whether it is the SAE's own objective or a stand-in.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .._validation import check_lam
from ..coding.working_set import optimal_codes_working_set
from ..engine.local import Progress
from .model import SAE

__all__ = ["ObjectiveChoice", "resolve_objective", "calibrate_lam", "resolve_lam", "L0_OBJECTIVE", "OBJECTIVES"]


def resolve_lam(lam=None, l1_coefficient=None) -> float:
    """``lam`` from exactly one of ``lam`` or ``l1_coefficient`` (``= 2 lam``, SAELens / dictionary_learning)."""
    if (lam is None) == (l1_coefficient is None):
        raise ValueError("give exactly one of lam or l1_coefficient (l1_coefficient = 2 * lam)")
    if lam is not None:
        return check_lam(lam)
    try:
        return check_lam(float(l1_coefficient) / 2.0)
    except (TypeError, ValueError):
        raise ValueError(f"l1_coefficient must be a positive finite number, got {l1_coefficient!r}") from None


#: The certified objective of an L0-trained SAE when no L1 stand-in is asked for.
L0_OBJECTIVE = "L0: MSE of codes at the SAE's own sparsity, same decoder and bias (theory.md §10)"
OBJECTIVES = ("auto", "l1", "l0")


@dataclass
class ObjectiveChoice:
    """The certified objective: its ``lam`` (``None`` for the L0 objective alone), where ``lam`` came from and how
    it relates to the SAE's own loss."""

    lam: float | None
    training_objective: str
    certified_objective: str
    stand_in: bool
    lam_source: str
    calibration: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"lam": self.lam, "training_objective": self.training_objective,
                "certified_objective": self.certified_objective, "stand_in": self.stand_in,
                "lam_source": self.lam_source, "calibration": dict(self.calibration)}


_TRAINING = {
    "standard": "L1: mean ||x - x_hat||^2 + l1_coefficient * mean sum_d f_d ||W_dec,d||",
    "gated": "gated L1 (on the gate pre-activations) + auxiliary reconstruction",
    "topk": "L0 budget: k features per token",
    "batchtopk": "L0 budget: k features per token on average over the batch",
    "matryoshka": "L0 budget (batch top-k) with nested prefix reconstructions",
    "jumprelu": "L0 penalty (JumpReLU, straight-through thresholds)",
    "decoder_only": "unknown (decoder only)",
}
_L1 = "L1 objective of theory.md §1: mean ||x - b - z W||^2 + 2 lam sum_d z_d, unit atoms"


def _arch(sae: SAE) -> str:
    return sae.training_architecture or sae.architecture


def _trained_with_l1(sae: SAE) -> bool:
    """Whether a SAELens v6 config records an L1 training coefficient (``metadata.training_architecture_details.
    l1_coefficient``, written for L1-trained SAEs only; the flat pre-6 ``l1_coefficient`` is a runner default that
    TopK runs carry too, so it does not count)."""
    meta = (sae.config or {}).get("metadata") if isinstance(sae.config, dict) else None
    details = meta.get("training_architecture_details") if isinstance(meta, dict) else None
    return sae.l1_coefficient is not None and isinstance(details, dict) and details.get("l1_coefficient") is not None


def resolve_objective(sae: SAE, X_sample, lam=None, l1_coefficient=None, *, objective: str = "auto",
                      coding_tol: float = 1e-6, device="cpu", time_limit: float | None = None,
                      progress=None) -> ObjectiveChoice:
    """Pick ``lam`` and name the certified objective (module docstring and table).

    ``objective``: ``"auto"`` (the SAE's own: L1 for L1-trained SAEs, the L0 bracket alone for L0-trained ones),
    ``"l1"`` (the L1 objective; for an L0-trained SAE without ``lam``, ``lam`` calibrated at equal L0 within
    ``time_limit`` seconds) or ``"l0"`` (the L0 bracket alone, for any SAE). ``X_sample`` (preprocessed rows,
    float64) is used only for that calibration.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(map(repr, OBJECTIVES))}, got {objective!r}")
    arch = _arch(sae)
    train = _TRAINING.get(arch, arch)
    stand_in = arch != "standard"
    if objective == "l0":
        if lam is not None or l1_coefficient is not None:
            raise ValueError("objective='l0' certifies no L1 objective: give no lam / l1_coefficient with it")
        return ObjectiveChoice(None, train, L0_OBJECTIVE, False, "none (the L0 objective has no lam)", {})
    if lam is not None or l1_coefficient is not None:
        lam = resolve_lam(lam, l1_coefficient)
        return ObjectiveChoice(lam, train, _L1, stand_in, "given", {})
    if arch in ("standard", "gated") and sae.l1_coefficient is not None:
        return ObjectiveChoice(resolve_lam(l1_coefficient=sae.l1_coefficient), train, _L1, stand_in,
                               "the SAE's config (l1_coefficient / 2)", {})
    if arch in ("topk", "jumprelu") and _trained_with_l1(sae):  # e.g. widelimit's own encoder fits
        return ObjectiveChoice(resolve_lam(l1_coefficient=sae.l1_coefficient),
                               f"L1 with a {arch} encoder: " + _TRAINING["standard"].split(": ", 1)[1], _L1, False,
                               "the SAE's config (metadata.training_architecture_details.l1_coefficient / 2)", {})
    if arch in ("topk", "batchtopk", "matryoshka", "jumprelu") and objective == "auto":
        return ObjectiveChoice(None, train, L0_OBJECTIVE, False, "none (the L0 objective has no lam)", {})
    if arch in ("topk", "batchtopk", "matryoshka", "jumprelu"):
        X = np.asarray(X_sample, dtype=np.float64)
        target = float((sae.encode(X) != 0).sum(1).mean())
        if target == 0.0:
            raise ValueError("this SAE fires no feature on the calibration sample (L0 = 0): no lam gives optimal "
                             "codes at equal L0; give lam, or certify objective='l0'")
        lam, info = calibrate_lam(sae, X, target, coding_tol=coding_tol, device=device, time_limit=time_limit,
                                  progress=progress)
        return ObjectiveChoice(lam, train, _L1 + ", lam at equal L0", True,
                               f"calibrated: optimal codes' mean L0 = the SAE's ({target:.4g})", info)
    raise ValueError(f"this {arch} SAE records no l1_coefficient: give lam or l1_coefficient (= 2 lam)")


def calibrate_lam(sae: SAE, X, target_l0: float, *, coding_tol: float = 1e-6, device="cpu", rel_tol: float = 0.01,
                  max_iter: int = 40, time_limit: float | None = None, progress=None) -> tuple[float, dict]:
    r"""``lam`` at which the optimal codes of the SAE's decoder and bias have mean L0 ``target_l0``.

    Bisection on ``log lam`` between ``lam_hi = max_{i,d} <u_d, x_i - b>`` (every
    optimal code is 0 there: the zero code satisfies the optimality conditions)
    and ``lam_hi * 1e-6``, with certified optimal codes
    (:func:`widelimit.coding.working_set.optimal_codes_working_set`) at every
    step; stops when the mean L0 is within ``rel_tol * max(1, target)`` of the
    target or the bracket is narrower than 0.1 %. The L0 of lasso solutions is
    not monotone in ``lam`` in general, so the result is the bracket end closest
    to the target; ``info`` records the L0 reached. ``time_limit`` (seconds) stops the bisection after the
    step that passes it (``info["stopped"]`` says so); ``progress`` receives a
    :class:`widelimit.engine.local.Progress` event (``stage="calibrate lam"``) per step.
    """
    t0 = time.perf_counter()
    X = np.asarray(X, dtype=np.float64)
    U, b = sae.unit_dictionary(), np.asarray(sae.b_dec, dtype=np.float64)
    C = (X - b) @ U.T
    hi = float(max(C.max(), 1e-12))
    lo = hi * 1e-6

    def l0(lam):
        res = optimal_codes_working_set(X, U, b, lam=lam, tol=coding_tol, device=device)
        return float(res.codes.nnz) / X.shape[0], float(res.reconstruction)

    best = (math.inf, hi, 0.0, math.nan)
    tol = rel_tol * max(1.0, target_l0)
    it, stopped = 0, False
    for it in range(1, max_iter + 1):
        mid = math.sqrt(lo * hi)
        z, rec = l0(mid)
        if abs(z - target_l0) < best[0]:
            best = (abs(z - target_l0), mid, z, rec)
        if progress is not None:
            progress(Progress(stage="calibrate lam", pass_index=it, rows_done=it, rows_total=max_iter))
        if abs(z - target_l0) <= tol or hi / lo < 1.001:
            break
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            stopped = True
            break
        if z > target_l0:
            lo = mid
        else:
            hi = mid
    _, lam, z, rec = best
    return lam, {"target_l0": target_l0, "optimal_l0": z, "optimal_mse": rec, "iterations": it,
                 "n_tokens": int(X.shape[0]), "stopped": "time_limit" if stopped else None,
                 "time_s": time.perf_counter() - t0}
