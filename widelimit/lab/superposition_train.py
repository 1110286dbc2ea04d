r"""Training the tied-weight power-activation autoencoder, and what a trained ``W`` is.

:func:`train` maximises ``Ltilde`` (exact cumulant formula or Monte Carlo batches, see
:mod:`widelimit.lab.superposition` for the model and the exact values); :func:`feature_stats`
reports which features a ``W`` represents; :func:`critical_point` gives the exact gradient and
Hessian spectrum of ``Ltilde`` at ``W`` (is it a local maximum?).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .._runtime import resolve_device
from ..engine.local import Progress
from .superposition import (
    _torch,
    check_m,
    check_p,
    check_W,
    get_law,
    ltilde_exact_torch,
    optimal_scale,
    unsuperposed_optimum,
)

__all__ = ["CriticalPoint", "FeatureStats", "TrainResult", "critical_point", "feature_stats", "train"]


# --------------------------------------------------------------------------------------
# per-feature statistics
# --------------------------------------------------------------------------------------


@dataclass
class FeatureStats:
    """Per-feature summary of ``W`` (``(d, n)``).

    Attributes
    ----------
    norms : (n,) ``||W_i||``
    dimensionality : (n,) Elhage et al.'s ``D_i = ||W_i||^4 / sum_j (W_i . W_j)^2`` (0 for ``W_i = 0``);
        ``sum_i D_i <= d``, ``D_i = 1`` for a feature with a dimension of its own.
    isolated_gain : (n,) ``g_i / g*``: the gain ``2 mu_{m+1} M_ii^m - mu_{2m} sum_j M_ij^{2m}`` of
        reconstructing feature ``i`` when it is the only active one, relative to the best
        possible ``g* = mu_{m+1}^2 / mu_{2m}`` (a dedicated dimension at the optimal norm).
    represented : (n,) bool, ``isolated_gain >= threshold``.
    n_represented : int
    """

    norms: np.ndarray
    dimensionality: np.ndarray
    isolated_gain: np.ndarray
    represented: np.ndarray
    n_represented: int
    threshold: float

    def as_dict(self) -> dict:
        return {
            "n_represented": self.n_represented,
            "threshold": self.threshold,
            "sum_dimensionality": float(self.dimensionality.sum()),
            "norms": self.norms.tolist(),
            "dimensionality": self.dimensionality.tolist(),
            "isolated_gain": self.isolated_gain.tolist(),
        }


def feature_stats(W, m: int = 3, xi="rademacher", threshold: float = 0.5) -> FeatureStats:
    """Norms, dimensionalities and which features are represented (see :class:`FeatureStats`)."""
    W = check_W(W)
    m, law = check_m(m), get_law(xi)
    M = W.T @ W
    norms = np.sqrt(np.diag(M))
    sq = (M * M).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        D = np.where(sq > 0, np.diag(M) ** 2 / np.where(sq > 0, sq, 1.0), 0.0)
    g_star = law.moment(m + 1) ** 2 / law.moment(2 * m)
    gain = (2 * law.moment(m + 1) * np.diag(M) ** m - law.moment(2 * m) * (M ** (2 * m)).sum(axis=1)) / g_star
    rep = gain >= threshold
    return FeatureStats(norms, D, gain, rep, int(rep.sum()), float(threshold))


@dataclass
class CriticalPoint:
    """Gradient and Hessian of the exact ``Ltilde`` at ``W`` (flattened ``d*n`` parameters).

    Attributes
    ----------
    grad_norm : float
        ``||grad Ltilde(W)||_2``.
    eigenvalues : ndarray (d*n,)
        Eigenvalues of the Hessian, ascending.
    n_flat : int
        Eigenvalues with ``|lambda| <= tol * max|lambda|`` (the ``d(d-1)/2`` rotations
        ``W -> U W`` are always flat).
    local_max : bool
        ``grad_norm <= tol * scale`` and no eigenvalue above ``tol * max|lambda|``: a
        second-order stationary point for ascent (flat directions not resolved).
    """

    grad_norm: float
    eigenvalues: np.ndarray
    n_flat: int
    local_max: bool

    def as_dict(self) -> dict:
        scale = max(float(np.abs(self.eigenvalues).max()), 1e-300)
        return {"grad_norm": self.grad_norm, "max_eigenvalue": float(self.eigenvalues[-1]),
                "max_eigenvalue_rel": float(self.eigenvalues[-1]) / scale, "grad_norm_rel": self.grad_norm / scale,
                "min_eigenvalue": float(self.eigenvalues[0]), "n_flat": self.n_flat, "local_max": self.local_max}


def critical_point(W, p: float, m: int = 3, xi="rademacher", tol: float = 1e-7) -> CriticalPoint:
    """Exact gradient norm and Hessian spectrum of ``Ltilde`` at ``W`` (torch autograd, float64).

    Cost ``O((d n)^2)`` Hessian entries: meant for the small models of :func:`train`.
    """
    torch = _torch()
    W = check_W(W)
    m, p, law = check_m(m), check_p(p), get_law(xi)
    d, n = W.shape
    if d * n > 4000:
        raise ValueError(f"critical_point: d*n = {d * n} parameters is too many for a dense Hessian (max 4000)")

    def f(w):
        return ltilde_exact_torch(w.reshape(d, n), p, m, law)[0]

    w0 = torch.tensor(W.reshape(-1), dtype=torch.float64)
    g = torch.autograd.functional.jacobian(f, w0)
    H = torch.autograd.functional.hessian(f, w0)
    ev = torch.linalg.eigvalsh((H + H.T) / 2).numpy()
    scale = max(float(np.abs(ev).max()), 1e-300)
    gn = float(torch.linalg.norm(g))
    flat = int(np.sum(np.abs(ev) <= tol * scale))
    local_max = gn <= tol * scale * max(1.0, float(np.linalg.norm(W))) and ev[-1] <= tol * scale
    return CriticalPoint(gn, ev, flat, bool(local_max))


# --------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """Best of several Adam runs maximising ``Ltilde``.

    Attributes
    ----------
    W : (d, n) best weights, at their optimal rescaling
    value : exact ``Ltilde(W)`` (for ``objective="mc"`` still computed exactly when ``m``'s
        exact formula applies, which is every odd ``m``)
    restart_values : exact ``Ltilde`` of every restart (after rescaling)
    history : objective trace of the best restart (every ``log_every`` steps)
    stats : :class:`FeatureStats` of ``W``
    unsuperposed : best unsuperposed value for comparison
    """

    W: np.ndarray
    value: float
    restart_values: list
    history: list
    stats: FeatureStats
    unsuperposed: float
    params: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "value": self.value,
            "restart_values": self.restart_values,
            "unsuperposed": self.unsuperposed,
            "n_represented": self.stats.n_represented,
            "sum_dimensionality": float(self.stats.dimensionality.sum()),
            "params": self.params,
        }


def train(
    d: int,
    n: int,
    p: float,
    m: int = 3,
    xi="rademacher",
    *,
    objective: str = "exact",
    restarts: int = 4,
    steps: int = 1500,
    lr: float = 0.02,
    init_scale: float = 1.0,
    batch_size: int = 4096,
    seed: int = 0,
    device="auto",
    W0=None,
    log_every: int = 50,
    polish: bool = True,
    progress: Callable | None = None,
) -> TrainResult:
    r"""Gradient ascent (Adam) on ``Ltilde`` from random starts; returns the best restart.

    Parameters
    ----------
    d, n : hidden dimensions and number of features.
    p, m, xi : as in :func:`ltilde`.
    objective : ``"exact"`` (the cumulant formula, differentiable, any odd ``m``) or ``"mc"``
        (a fresh Monte Carlo batch of ``batch_size`` inputs every step).
    restarts, steps, lr : Adam restarts, steps per restart, learning rate (cosine-decayed to lr/20).
    init_scale : initial ``W`` entries are ``N(0, init_scale^2 / d)`` (columns of norm ~ init_scale).
    W0 : optional starting weights ``(d, n)`` for the first restart.
    polish : after Adam, run L-BFGS (strong Wolfe) on the exact objective to converge to the
        nearby stationary point (``objective="exact"`` only).
    progress : callable(Progress), optional
        Receives a :class:`widelimit.Progress` event every ``log_every`` steps (``stage="restart r"``).

    The objective is divided by ``n p mu_2`` (= ``E||x||^2``) for a scale-free learning
    rate. The result is rescaled optimally (:func:`optimal_scale`) and evaluated exactly.
    """
    torch = _torch()
    m, p, law = check_m(m), check_p(p), get_law(xi)
    for name, v in (("d", d), ("n", n), ("restarts", restarts), ("steps", steps)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if objective not in ("exact", "mc"):
        raise ValueError(f"objective must be 'exact' or 'mc', got {objective!r}")
    if objective == "mc" and law.sampler is None:
        raise ValueError(f"law {law.name!r} has no sampler; use objective='exact'")
    if W0 is not None:
        W0 = check_W(W0, "W0")
        if W0.shape != (d, n):
            raise ValueError(f"W0 has shape {W0.shape}, expected (d, n) = ({d}, {n})")
    dev = resolve_device(device)
    dt = torch.float64 if objective == "exact" else torch.float32
    norm = n * p * law.moment(2)
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(seed))
    best = None
    values = []
    for rs in range(restarts):
        if rs == 0 and W0 is not None:
            Wt = torch.tensor(W0, device=dev, dtype=dt)
        else:
            Wt = torch.randn((d, n), generator=gen, device=dev, dtype=dt) * (init_scale / math.sqrt(d))
        Wt.requires_grad_(True)
        hist = _adam(Wt, p, m, law, objective, steps, lr, batch_size, gen, norm, log_every, progress, rs)
        if polish and objective == "exact":
            _polish_lbfgs(Wt, p, m, law, norm)
        Wn = Wt.detach().cpu().double().numpy()
        if not np.isfinite(Wn).all():
            values.append(float("nan"))
            continue
        res = optimal_scale(Wn, p, m, law)
        values.append(res.value)
        if best is None or res.value > best[0]:
            best = (res.value, res.W, hist)
    if best is None:
        raise ValueError("every restart diverged (non-finite W); lower lr")
    val, Wb, hist = best
    return TrainResult(
        Wb,
        val,
        values,
        hist,
        feature_stats(Wb, m, law),
        unsuperposed_optimum(p, d, m, law, n=n),
        {"d": d, "n": n, "p": p, "m": m, "law": law.name, "objective": objective, "restarts": restarts,
         "steps": steps, "lr": lr, "seed": seed, "polish": polish},
    )


def _adam(Wt, p, m, law, objective, steps, lr, batch_size, gen, norm, log_every, progress, rs) -> list:
    """Adam on ``-Ltilde / norm`` from ``Wt`` (in place; cosine-decayed learning rate), the exact objective or a
    fresh Monte Carlo batch each step; returns the values logged every ``log_every`` steps."""
    torch = _torch()
    dev, dt = Wt.device, Wt.dtype
    n = Wt.shape[1]
    opt = torch.optim.Adam([Wt], lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr / 20)
    hist = []
    for step in range(steps):
        opt.zero_grad()
        if objective == "exact":
            val = ltilde_exact_torch(Wt, p, m, law)[0]
        else:
            mask = (torch.rand((batch_size, n), generator=gen, device=dev, dtype=dt) < p).to(dt)
            x = mask * law.sampler((batch_size, n), gen, dev, dt)
            f = ((x @ Wt.T) @ Wt) ** m
            val = (2 * (x * f).sum(1) - (f * f).sum(1)).mean()
        (-val / norm).backward()
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            v = float(val.detach())
            hist.append(v)
            if progress is not None:
                progress(Progress(stage=f"restart {rs}", pass_index=step + 1, rows_done=step + 1, rows_total=steps,
                                  value=v))
    return hist


def _polish_lbfgs(Wt, p, m, law, norm) -> None:
    """L-BFGS (strong Wolfe) on the exact objective from ``Wt``, in place; Adam's point is kept when it fails."""
    torch = _torch()
    lbfgs = torch.optim.LBFGS([Wt], lr=1.0, max_iter=150, tolerance_grad=1e-12, tolerance_change=1e-16,
                              history_size=50, line_search_fn="strong_wolfe")

    def closure():
        lbfgs.zero_grad()
        loss = -ltilde_exact_torch(Wt, p, m, law)[0] / norm
        loss.backward()
        return loss

    before = Wt.detach().clone()
    with torch.no_grad():
        start = float(ltilde_exact_torch(Wt, p, m, law)[0])
    lbfgs.step(closure)
    with torch.no_grad():
        after = float(ltilde_exact_torch(Wt, p, m, law)[0])
        if not math.isfinite(after) or after < start:  # keep Adam's point if L-BFGS failed
            Wt.copy_(before)
