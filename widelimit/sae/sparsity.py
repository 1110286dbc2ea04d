r"""The amortisation gap at an SAE's own sparsity, as a bracket (theory.md §10): one part of a certification.

For the SAE's decoder and bias, the best codes that fire at most as often as the SAE's own on every
token (the budget ``s_i``: ``k`` for TopK, the SAE's own count on the token for BatchTopK, JumpReLU
and Matryoshka) have a mean MSE ``m* = mean_i m_{s_i}(x_i)`` that no encoder of this decoder can beat
at this sparsity. :class:`SparsityPart` brackets it, batch by batch:

* upper end ``value``: the MSE of codes found by :func:`widelimit.coding.pursuit.pursue_batch`
  warm-started from the SAE's own codes (and from nonnegative OMP and gradient pursuit on its decoder), evaluated in float64 from those codes (a witness: codes at
  the SAE's L0 with this MSE exist); never above the SAE's own MSE, since the search starts from its
  codes and keeps a token's codes only when they are better;
* lower end ``lower_bound``: :func:`widelimit.coding.sparse_bound.sparse_lower_bound`, proven per token,
  or ``0`` with the reason in ``status``.

``gain = sae_value - value`` is what better codes (a better encoder, or inference-time pursuit) gain at
the SAE's own width and sparsity; ``gain_upper = sae_value - lower_bound`` is the most they could gain.

A JumpReLU SAE whose SAELens config records its L0 coefficient ``c`` (``metadata.training_architecture_details
.l0_coefficient`` with ``jumprelu_sparsity_loss_mode = "step"``) is also bracketed on its own objective
``mean ||r_i||^2 + c L0_i``: the pursuit then also drops and adds atoms by that objective, and the lower
end is ``mean_i min(||x_i - b||^2, c)`` (a nonempty code pays at least ``c``).

The time the pursuit may take is bounded by ``time_limit`` (seconds; ``None``: at most ``time_share`` times
the time the other parts of the certification have taken so far, measured between this part's updates,
which run last; the share is 1 where the bracket is the SAE's own objective (TopK, BatchTopK, JumpReLU,
Matryoshka) and 1/10 for an L1-trained SAE, whose own objective the rest certifies): the
SAE's own codes are always a witness (the upper end is at most the SAE's MSE), and their NNLS refit, the
cold starts and the rounds run while the allowance lasts (the refit in chunks of tokens, none started after
it: a ReLU SAE's supports of ~150 atoms made the refit alone 10x the rest of a certification).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .._validation import check_int, check_real
from ..coding._atoms import Atoms, spectral_norm_sq
from ..coding.pursuit import PursuitOptions, pursue_batch
from ..coding.sparse_bound import METHODS, babel, babel_s_min, sparse_lower_bound
from ..exact.gap import is_certified, relative_gap

__all__ = ["SparsityOptions", "SparsityPart", "budget_rule", "l0_penalty"]


@dataclass(frozen=True)
class SparsityOptions:
    """Options of the sparsity bracket (checked).

    Attributes
    ----------
    enabled : bool
        Run the bracket (default: for SAEs with an encoder).
    max_iter : int
        Pursuit rounds per batch (:class:`widelimit.coding.pursuit.PursuitOptions`).
    time_limit : float or None
        Seconds for the whole pass; ``None``: at most ``time_share`` times what the rest of the certification
        has taken.
    time_share : float or None
        That share; ``None``: 1 for an SAE whose own objective is its L0 (the bracket is then its certificate),
        1/10 for an L1-trained SAE (:data:`L1_SHARE`; the bracket is a side number there; measured: with the whole
        share it doubled the certification of a SAELens ReLU SAE at d_sae 16,384, with 1/4 it was 20% of the
        certification at optimal L0 108, docs/sae_certification.md).
    max_subsets : int
        Enumerate supports for the lower bound when ``C(d_sae, s) <= max_subsets``.
    tol : float
        ``certified`` iff ``value - lower_bound <= tol * value``.
    """

    enabled: bool = True
    max_iter: int = 8
    time_limit: float | None = None
    time_share: float | None = None
    max_subsets: int = 2000
    tol: float = 1e-6

    def __post_init__(self):
        check_int(self.max_iter, "max_iter", low=0)
        check_real(self.time_limit, "time_limit", low=0.0, none_ok=True, finite=False)
        check_real(self.time_share, "time_share", low=0.0, none_ok=True)
        check_int(self.max_subsets, "max_subsets", low=0)
        check_real(self.tol, "tol", low=0.0)


def budget_rule(sae) -> tuple[int | None, str]:
    """``(k, text)``: the fixed per-token budget ``k`` of a TopK SAE, or ``None`` for the SAE's own count per token."""
    arch = sae.training_architecture or sae.architecture
    if arch == "topk" and sae.k is not None:
        return int(sae.k), f"at most k = {int(sae.k)} features per token (the SAE's TopK budget)"
    return None, "at most the SAE's own number of active features on each token"


def l0_penalty(sae) -> float | None:
    """JumpReLU's L0 coefficient when its SAELens config records it with the step (L0) sparsity loss, else ``None``."""
    if (sae.training_architecture or sae.architecture) != "jumprelu" or not isinstance(sae.config, dict):
        return None
    meta = sae.config.get("metadata") or {}
    det = meta.get("training_architecture_details") if isinstance(meta, dict) else None
    if not isinstance(det, dict) or det.get("jumprelu_sparsity_loss_mode", "step") != "step":
        return None
    c = det.get("l0_coefficient")
    return float(c) if isinstance(c, (int, float)) and math.isfinite(c) and c > 0 else None


#: The default time share of the L0 bracket of an L1-trained SAE (module docstring): 1/10 (was 1/4: the bracket took 20%
#: of a certification at d_sae 16,384 and optimal L0 108, 2.4x the forward pass, on a side number).
L1_SHARE = 0.1


class SparsityPart:
    """The bracket of the module docstring, accumulated over batches (``update`` / ``merge`` / ``result``).

    Reads from each batch the centred tokens ``xt`` and the SAE's own codes on unit atoms (``Y0``, or
    ``rows``, ``cols``, ``zv``) and their squared residual norms (``tok[:, 3]``), as
    :class:`widelimit.sae.parts.EncoderPart` leaves them.
    """

    def __init__(self, setup, options: SparsityOptions = SparsityOptions(), own_objective: bool = True):
        import torch

        self.s, self.o = setup, options
        self.share = options.time_share if options.time_share is not None else (1.0 if own_objective else L1_SHARE)
        self.k_budget, self.rule = budget_rule(setup.sae)
        self.penalty = l0_penalty(setup.sae)
        self.popts = PursuitOptions(max_iter=options.max_iter)
        self.pen_opts = None if self.penalty is None else PursuitOptions(max_iter=options.max_iter, penalty=self.penalty,
                                                                         cold_start=False, grad_start=False)
        U = torch.as_tensor(setup.U, device=setup.dev)
        self._atoms, self._mu = Atoms(U, U32=setup.U32), None
        self._Lsq = spectral_norm_sq(self._atoms.U32)  # a step size: float32 products (half the memory traffic)
        self._scale = torch.as_tensor(np.asarray(setup.norms, dtype=np.float64), device=setup.dev)
        self._babel_s_min = 1 << 62  # the smallest budget babel was asked about (below it: NaN)
        self.sums = dict(n=0, value=0.0, lower=0.0, sae=0.0, start=0.0, l0=0.0, sae_l0=0.0, pen_value=0.0,
                         pen_lower=0.0, pen_sae=0.0, rounds=0, own_s=0.0, rest_s=0.0, timed_out=0)
        self.methods = np.zeros(len(METHODS), dtype=np.int64)
        self._mark = time.perf_counter()

    def _deadline(self, now: float) -> float:
        if self.o.time_limit is not None:
            return self._t0 + self.o.time_limit if hasattr(self, "_t0") else now + self.o.time_limit
        return now + max(0.0, self.share * self.sums["rest_s"] - self.sums["own_s"])

    def update(self, bt) -> None:
        import torch

        s = self.s
        if not s.sae.has_encoder:
            return
        now = time.perf_counter()
        self.sums["rest_s"] += now - self._mark
        if not hasattr(self, "_t0"):
            self._t0 = now
        Y0 = bt.Y0 if bt.Y0 is not None else sp.csr_array(
            (bt.zv.cpu().numpy(), (bt.rows.cpu().numpy(), bt.cols.cpu().numpy())), shape=(bt.m, s.k))
        own = np.diff(sp.csr_array(Y0).indptr)
        budget = np.full(bt.m, self.k_budget) if self.k_budget is not None else own
        bud = torch.as_tensor(np.maximum(budget, own), device=s.dev)
        xt = bt.xt.to(torch.float64)
        out = pursue_batch(self._atoms.U, xt, bud, Y0, opts=self.popts, deadline=self._deadline(now),
                           Lsq=self._Lsq, atoms=self._atoms, scale=self._scale)
        s_need, s_top = babel_s_min(bud, s.k, self.o.max_subsets), (int(bud.max()) if bud.numel() else 0)
        if self._mu is None or len(self._mu) <= s_top or (s_need <= s_top and np.isnan(self._mu[s_need])):
            self._babel_s_min = min(s_need, self._babel_s_min)  # (NaN below it: not computed, babel's s_min)
            self._mu = babel(self._atoms.U, max(s_top, 2 * int(own.mean() + 1)), s_min=self._babel_s_min, cap=1.0)
        lb, meth = sparse_lower_bound(self._atoms.U, xt, bud, out["residuals"], mu=self._mu,
                                      max_subsets=self.o.max_subsets)
        pen = None
        if self.pen_opts is not None:  # the L0-penalised objective, from the budgeted witness
            pen = pursue_batch(self._atoms.U, xt, torch.as_tensor(out["l0"], device=s.dev), out["codes"],
                               opts=self.pen_opts, deadline=self._deadline(time.perf_counter()), Lsq=self._Lsq,
                               atoms=self._atoms)
        self._add(out["mse"], np.minimum(lb, out["mse"]), out["start_mse"], out, own, meth, xt, pen)
        self.sums["timed_out"] += int(out["stopped"] == "time_limit")
        self.sums["own_s"] += time.perf_counter() - now
        self._mark = time.perf_counter()

    def _add(self, v, lb, sae_mse, out, own, meth, xt, pen) -> None:
        S = self.sums
        S["n"] += v.size
        S["value"] += float(v.sum())
        S["lower"] += float(lb.sum())
        S["sae"] += float(sae_mse.sum())
        S["l0"] += float(out["l0"].sum())
        S["sae_l0"] += float(own.sum())
        S["rounds"] = max(S["rounds"], int(out["rounds"]))
        self.methods += np.bincount(meth, minlength=len(METHODS))
        if pen is not None:
            c = self.penalty
            xx = (xt * xt).sum(1).cpu().numpy()
            S["pen_value"] += float(np.minimum(pen["mse"] + c * pen["l0"], v + c * out["l0"]).sum())
            S["pen_sae"] += float((sae_mse + c * own).sum())
            S["pen_lower"] += float(np.minimum(xx, c).sum())

    def merge(self, other: "SparsityPart") -> "SparsityPart":
        for key, val in other.sums.items():
            self.sums[key] = max(self.sums[key], val) if key == "rounds" else self.sums[key] + val
        self.methods += other.methods
        return self

    def result(self) -> dict:
        S = self.sums
        n = max(1, S["n"])
        value, lower, sae = S["value"] / n, S["lower"] / n, S["sae"] / n
        counts = {METHODS[j]: int(c) for j, c in enumerate(self.methods) if c}
        none = counts.get(METHODS[0], 0)
        status = ("proven on every token" if none == 0 else
                  f"only MSE >= 0 proven on {none} of {S['n']} tokens: the decoder is too coherent for a "
                  "restricted-eigenvalue bound at this L0, its supports too many to enumerate")
        out = {"objective": "mse at L0 <= budget", "budget": self.rule, "value": value, "lower_bound": lower,
               "gap": value - lower, "rel_gap": relative_gap(value - lower, value),
               "certified": is_certified(value - lower, value, tol=self.o.tol), "tol": self.o.tol,
               "sae_value": sae, "gain": sae - value, "gain_upper": sae - lower, "l0": S["l0"] / n,
               "sae_l0": S["sae_l0"] / n, "status": status, "bound_methods": counts, "n_iter": S["rounds"],
               "time_s": S["own_s"], "n_points": S["n"], "time_limit": self.o.time_limit, "penalised": None,
               "batches_stopped_by_time": S["timed_out"]}
        if self.penalty is not None:
            pv, pl, ps = S["pen_value"] / n, S["pen_lower"] / n, S["pen_sae"] / n
            out["penalised"] = {"objective": f"mse + {self.penalty:g} * L0 (JumpReLU's recorded l0_coefficient)",
                                "l0_coefficient": self.penalty, "value": pv, "lower_bound": pl, "gap": pv - pl,
                                "sae_value": ps, "gain": ps - pv}
        return out
