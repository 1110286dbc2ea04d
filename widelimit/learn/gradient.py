r"""Gradient dictionary learning on the original nonconvex objective, in torch (CPU or CUDA).

Minimises theory.md §1's objective directly over a finite width ``k``:

.. math::

    L(W, Z, b) = \frac1N\sum_i \|z_i W + b - x_i\|^2 + 2\lambda\|z_i\|_1,
    \qquad Z \ge 0,\ \|w_d\| = 1 .

**Free codes** (``encoder="none"``, true dictionary learning), one outer step =

1. codes: exact coordinate descent on each point's nonnegative lasso restricted to a
   small *working set* of atoms: its current support plus the atoms that violate the
   optimality conditions (``<w_d, r_i> > lam`` for the residual ``r_i`` with
   ``z_id = 0``), at most ``ws_size`` of them (more when a support is larger). The
   coordinate step ``z_d <- (z_d + <w_d, r> - lam)_+`` is the exact minimiser along
   ``z_d``, so the step never increases ``L``; sweeps stop once the restricted
   optimality conditions hold to ``1e-3 lam`` per point on average or after
   ``code_steps`` sweeps. With ``L0 << k`` a sweep costs ``O(N L0 m)`` instead of the
   ``O(N k n)`` of a full-dictionary gradient step, and since every outer step
   re-admits the violating atoms, a fixed point is an exact alternating minimiser;
2. atoms: block-coordinate sweeps on the sphere with ``A = Z^T Z``, ``B = Z^T (X - b)``:
   atom ``d`` becomes ``c / ||c||`` with ``c = B_d - sum_{j != d} A_dj w_j``, the exact
   minimiser over the unit sphere with the other atoms fixed (the projected block
   gradient step of length ``1 / A_dd``), so the step never increases the objective;
3. bias: the exact minimiser ``b = mean_i (x_i - z_i W)``;
4. extrapolation: the iterate moves on along its last step,
   ``W <- normalise(W + beta (W - W_prev))``, ``Z <- (Z + beta (Z - Z_prev))_+`` (bias re-fit),
   and keeps the move only if the objective goes down; ``beta`` grows by 1.5 (at most 4)
   after a success and halves (at least 0.05) after a failure. This is the extrapolation
   that accelerates alternating schemes for nonnegative factorisations (Ang and Gillis,
   Neural Computation 2019); it costs one evaluation of the objective per step and cuts
   the slow tail of alternating minimisation.

Every step is monotone, so the recorded objective decreases. In minibatch mode
(``batch_size`` given) step 1 codes a random batch, ``A`` and ``B`` are running
sums with forgetting (online dictionary learning, Mairal et al. 2010) and the bias
follows the batch residual mean, and step 1 is ``code_steps`` accelerated proximal
steps ``z <- (v + ((x - b - vW)W^T - lam)/L)_+`` from zero (``L = lambda_max(W W^T)``,
per-point Nesterov momentum with adaptive restart; :func:`widelimit.coding.fista.code_steps`).
Atoms no point uses are moved to the direction of the worst-reconstructed points
(this cannot increase the objective).

**Amortised codes** (``encoder="standard" | "jumprelu" | "topk"``, SAELens' names) train an SAE in the
SAELens layout: ``f = sigma((x - b_dec) W_enc + b_enc)`` with ``W_enc (n, k)``,
``b_enc (k,)``, a JumpReLU ``threshold (k,)`` (straight-through estimator with a
rectangle kernel, Rajamanoharan et al. 2024) or TopK's ``k``; decoder
``W_dec = W`` (atoms projected back on the unit sphere after every Adam step) and
``b_dec = b``, on the same objective. The result reports the objective of the
encoder's own codes and of the optimal codes for its decoder
(:func:`widelimit.optimal_codes`), whose difference is the encoder gap.

Compute is float32 on the device; the returned value is a float64 evaluation of
the returned ``(dictionary, codes, bias)``, the codes being the certified optimal
codes of the final dictionary and bias. float32 squares overflow near ``1.8e19``
and underflow near ``1e-19``: data whose largest ``|x - b|`` (from up to 257 rows)
lies outside ``[2^-16, 2^16]`` are fitted as ``f X`` with ``lam f``, ``f`` an exact
power of two, and everything is mapped back (docs/theory.md §8.4); the fit of
``2^e X`` is then that of ``X`` times the powers of ``2^e``, number for number
(``lr`` applies to the rescaled problem).

**Initialisation**: ``"rays"`` (ray clustering: 1-sparse codes
``z = (<w, x - b> - lam)_+`` on the best atom, each atom re-fit to its cluster as
``w ∝ sum_i z_i (x_i - b)``, bias re-fit, from k-means++ seeds on the directions
around the Huber median), ``"data"`` (k-means++ seeded data directions around the
Huber median), ``"random"`` (Gaussian atoms), or an array ``(k, n)``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.sparse as sp

from .._memory import check_memory
from .._runtime import resolve_device, with_thread_limit
from .._params import (DEVICE, LAM, MAX_ITER, NONNEG, NONNEG_INT, POSITIVE, POSITIVE_INT, PROGRESS, SEED, ArrayLike,
                       Boolean, Data, StrOptions, validate_params)
from .._validation import check_dictionary, check_vector, writable
from ..coding import GRAM_LIMIT
from ..coding import optimal_codes as _entry_codes
from ..coding.fista import fista_codes as optimal_codes
from ..exact.median import huber_median
from ..exact.scaling import normaliser
from ..engine.local import Progress, ScaledRows
from ..exact.objective import sae_objective
from ._steps import _fit_free, _fit_free_minibatch, _init_dictionary, _rownorm
from ..sae.model import SAE
from .amortised import _fit_amortised, encoder_codes

__all__ = ["FitResult", "fit_dictionary", "encoder_codes", "ENCODERS", "INITS", "fit_bytes", "check_fit_memory"]

ENCODERS = ("none", "standard", "jumprelu", "topk")
INITS = ("rays", "data", "random")


@dataclass(frozen=True)
class FitResult:
    """A dictionary learned by :func:`fit_dictionary`.

    Attributes
    ----------
    dictionary : ndarray (k, n)
        Unit-norm atoms (SAELens ``W_dec``).
    codes : scipy.sparse.csr_array (N, k)
        Certified optimal nonnegative codes for ``dictionary`` and ``bias``.
    bias : ndarray (n,)
        ``b`` (SAELens ``b_dec``).
    value : float
        float64 objective of ``(dictionary, codes, bias)``.
    reconstruction, penalty : float
        Its two parts.
    coding_gap : float
        Certified duality gap of ``codes`` for this dictionary and bias (mean per point).
    history : list of dict
        ``{"step", "time_s", "value"}`` per step: the float32 objective (full batch), or the
        mean batch loss over the last ``window`` steps (minibatch and encoder training).
    n_iter : int
        Steps made.
    stop_reason : str
        ``"rtol"`` (relative improvement below ``rtol``), ``"max_iter"`` or ``"time_limit"``.
    encoder : str
    encoder_params : dict
        SAELens-layout parameters for amortised encoders: ``W_enc (n, k)``, ``b_enc (k,)``,
        ``threshold (k,)`` (jumprelu), ``k`` (topk). Empty for ``"none"``.
    encoder_value : float or None
        float64 objective of the encoder's own codes (amortised encoders).
    lam : float
    width : int
    init : str
    seed : int
    device : str
    time_s : float
        Wall-clock time of the whole fit.
    """

    dictionary: np.ndarray
    codes: sp.csr_array = field(repr=False)
    bias: np.ndarray
    value: float
    reconstruction: float
    penalty: float
    coding_gap: float
    history: list = field(repr=False)
    n_iter: int
    stop_reason: str
    encoder: str
    encoder_params: dict = field(repr=False)
    encoder_value: float | None
    lam: float
    width: int
    init: str
    seed: int
    device: str
    time_s: float

    @property
    def encoder_gap(self) -> float | None:
        """``encoder_value - value``: loss due to the encoder (amortised encoders only)."""
        return None if self.encoder_value is None else self.encoder_value - self.value

    @property
    def live_atoms(self) -> int:
        """Atoms with at least one nonzero code."""
        return int(np.count_nonzero(np.asarray(self.codes.sum(axis=0)).ravel() > 0))

    def to_sae(self, *, dtype: str = "float32"):
        """The fit as a :class:`widelimit.SAE` (SAELens layout; save it with :func:`widelimit.sae.formats.save_saelens`).

        ``W_dec`` = the unit atoms, ``b_dec`` = the bias, ``l1_coefficient = 2 lam``.
        Amortised encoders keep their ``W_enc``, ``b_enc`` (+ ``threshold`` /
        ``k``) under SAELens' architecture names. Free codes (``encoder="none"``)
        have no encoder: the SAE gets the tied ReLU encoder ``W_enc = W_dec^T``,
        ``b_enc = -lam`` (one proximal step from zero), which was never trained. Its
        codes are the optimal ones only for tokens whose atoms with
        ``<w_d, x - b> > lam`` are mutually orthogonal; with antipodal or correlated
        atoms (most fits) they fire more and cost more, so the exported SAE's objective
        is above :attr:`value`. The SAE carries a warning saying so, which
        :func:`~widelimit.sae.formats.save_saelens` writes into the config and
        ``widelimit certify`` reports; the certified optimal codes stay in :attr:`codes`.
        """
        W = np.asarray(self.dictionary, dtype=np.float64)
        kw = {"W_dec": W, "b_dec": np.asarray(self.bias, dtype=np.float64), "l1_coefficient": 2.0 * self.lam,
              "dtype": dtype}
        p = self.encoder_params
        if self.encoder == "none":
            return SAE(**kw, W_enc=W.T.copy(), b_enc=np.full(W.shape[0], -self.lam), architecture="standard",
                       warnings=["free-code fit: the encoder is the tied ReLU encoder W_dec^T, b_enc = -lam, "
                                 "not a trained one (its codes are not the fit's optimal codes)"])
        kw.update(W_enc=np.asarray(p["W_enc"], dtype=np.float64), b_enc=np.asarray(p["b_enc"], dtype=np.float64),
                  architecture=self.encoder)
        if self.encoder == "jumprelu":
            kw["threshold"] = np.asarray(p["threshold"], dtype=np.float64)
        if self.encoder == "topk":
            kw["k"] = int(p["k"])
        return SAE(**kw)

    def as_dict(self) -> dict:
        """Summary as plain Python (JSON-serialisable); arrays are left out."""
        return {
            "value": self.value, "reconstruction": self.reconstruction, "penalty": self.penalty,
            "coding_gap": self.coding_gap, "n_iter": self.n_iter, "stop_reason": self.stop_reason,
            "encoder": self.encoder, "encoder_value": self.encoder_value, "encoder_gap": self.encoder_gap,
            "lam": self.lam, "width": self.width, "live_atoms": self.live_atoms, "init": self.init,
            "seed": self.seed, "device": self.device, "time_s": self.time_s,
            "encoder_k": self.encoder_params.get("k"),
        }


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


#: Share of ``time_limit`` kept for the final certified re-coding after the steps.
_FINAL_SHARE = 0.15

#: Measured peak memory of a full-batch free-code fit: ``base + c * N * width`` bytes (codes, scores,
#: working sets and their copies per point and atom), fitted by ``benchmarks/memory_models.py`` at
#: N * width = 1e6..1.6e7 (``benchmarks/results/memory_models.md``: base 79 MiB, c = 24.0; largest
#: measured / fitted 1.07), with a 1.25 margin.
_FIT_BASE, _FIT_PER_ENTRY, _FIT_SAFETY = 79 * 2**20, 24.0, 1.25


def fit_bytes(N: int, n: int, width: int, *, batch: int | None = None) -> int:
    """Peak memory (bytes) of :func:`fit_dictionary` on ``N x n`` data at ``width`` atoms, from measurements.

    ``batch``: rows per step (``None``: all ``N``, the full-batch free codes). The per point-and-atom
    arrays scale with the rows of a step; the data (float32), the atoms with their optimiser state
    and the final coding's Gram matrix (float64, ``width^2``) come on top (docs/theory.md §9).
    """
    rows = N if batch is None else min(N, int(batch))
    per_entry = _FIT_BASE + _FIT_PER_ENTRY * rows * width
    return int(_FIT_SAFETY * (per_entry + 4 * N * n + 6 * 4 * width * n + 8 * width * width))
_FLOAT32_LIMIT = 16  # data whose largest |x - b| lies outside [2^-16, 2^16] are fitted rescaled (float32 squares)


class _Reporter:
    """History, stopping rule (relative improvement / step or time budget) and the progress events.

    Deterministic (full-batch) objectives: stop when ``v[-1-window] - v[-1] <= rtol * window * |v[-1]|``.
    Stochastic ones (``stochastic=True``: minibatch losses): the same test on the means of the
    last two blocks of ``window`` steps, so batch noise does not stop or prolong the run.
    """

    def __init__(self, rtol, window, time_limit, progress, t0, stochastic=False, budget=0, unit=1.0):
        self.rtol, self.window, self.time_limit, self.progress, self.t0 = rtol, window, time_limit, progress, t0
        self.unit = unit  # the values of the scaled data times unit = 1 / f^2 are those of X
        self.budget = int(budget or 0)
        self.stochastic = stochastic
        self.history: list[dict] = []
        self.raw: list[float] = []
        self.reason = "max_iter"

    def __call__(self, step, value) -> bool:
        t = time.perf_counter() - self.t0
        if not math.isfinite(value):
            raise FloatingPointError(f"the objective became {value} at step {step}; lower the learning rate")
        self.raw.append(float(value))
        w = self.window
        shown = (float(np.mean(self.raw[-w:])) if self.stochastic else float(value)) * self.unit
        self.history.append({"step": int(step), "time_s": t, "value": shown})
        if self.progress is not None:
            self.progress(Progress(stage="fit", pass_index=int(step), rows_done=int(step), rows_total=self.budget,
                                   value=shown))
        if self.time_limit is not None and t >= self.time_limit:
            self.reason = "time_limit"
            return True
        if self.rtol <= 0:
            return False
        if self.stochastic:
            if len(self.raw) >= 2 * w and len(self.raw) % w == 0:
                old, new = np.mean(self.raw[-2 * w : -w]), np.mean(self.raw[-w:])
                if old - new <= self.rtol * w * abs(new):
                    self.reason = "rtol"
                    return True
        elif len(self.raw) > w:
            old, new = self.raw[-1 - w], self.raw[-1]
            if old - new <= self.rtol * w * abs(new):
                self.reason = "rtol"
                return True
        return False


def check_fit_memory(N: int, n: int, width: int, *, encoder: str = "none", batch_size=None, device="cpu") -> None:
    """Refuse (one :class:`widelimit._memory.MemoryBudgetError` line) a fit whose :func:`fit_bytes` is above
    the memory budget, before anything is allocated. On a GPU the large arrays live in its own memory: not checked."""
    if resolve_device(device).type != "cpu":
        return
    batch = None if encoder == "none" and batch_size is None else (batch_size or 4096)
    how = "full batch" if batch is None else f"batches of {min(N, batch)}"
    check_memory(fit_bytes(N, n, width, batch=batch),
                 f"fit_dictionary at width {width} on N = {N} points in n = {n} dimensions ({how})",
                 hint="use a smaller width" + ("" if batch is not None else ", or minibatches (batch_size)"))


@validate_params({
    "X": Data(), "lam": LAM, "width": POSITIVE_INT, "encoder": StrOptions(ENCODERS),
    "init": [StrOptions(INITS), ArrayLike()], "device": DEVICE, "seed": SEED, "max_iter": MAX_ITER, "rtol": NONNEG,
    "window": POSITIVE_INT, "time_limit": [POSITIVE, None], "batch_size": [POSITIVE_INT, None],
    "code_steps": [POSITIVE_INT, None], "dict_steps": POSITIVE_INT, "ws_size": POSITIVE_INT,
    "resample_every": NONNEG_INT, "bias": [ArrayLike(), None], "learn_bias": Boolean(), "lr": POSITIVE,
    "topk": [POSITIVE_INT, None], "bandwidth": [POSITIVE, None], "coding_tol": POSITIVE, "progress": PROGRESS,
})
@with_thread_limit
def fit_dictionary(X, *, lam, width, encoder: str = "none", init="rays", device="auto", seed: int = 0,
                   max_iter: int | None = None, rtol: float = 1e-8, window: int = 10,
                   time_limit: float | None = None, batch_size: int | None = None, code_steps: int | None = None,
                   dict_steps: int = 2, ws_size: int = 16, resample_every: int = 25, bias=None,
                   learn_bias: bool = True, lr: float = 1e-3,
                   topk: int | None = None, bandwidth: float | None = None, coding_tol: float = 1e-7,
                   progress: Callable[[Progress], None] | None = None) -> FitResult:
    r"""Learn a width-``k`` dictionary, codes and bias by minimising the SAE objective (theory.md §1).

    .. math:: \min_{W, Z\ge 0, b}\ \frac1N\sum_i \|z_i W + b - x_i\|^2 + 2\lambda\|z_i\|_1,\quad \|w_d\| = 1.

    A local method on a nonconvex problem: compare with the global optimum via
    :func:`widelimit.crossvalidate` or :func:`widelimit.verify`.

    Parameters
    ----------
    X : array (N, n)
        Data (float32 kept; torch tensors accepted).
    lam : float
        Sparsity ``lam > 0`` (SAELens ``l1_coefficient = 2 lam``).
    width : int
        Number of atoms ``k >= 1``.
    encoder : {"none", "standard", "jumprelu", "topk"}
        ``"none"``: free codes (dictionary learning). Otherwise an amortised SAE encoder.
    init : {"rays", "data", "random"} or array (k, n)
        Initial atoms (see the module docstring); the bias starts at the Huber
        median unless ``bias`` is given.
    device : {"auto", "cpu", "cuda", "cuda:N"}
    seed : int
        Seeds the initialisation and minibatch order; CPU runs are deterministic given it.
    max_iter : int, optional
        Step budget (outer steps for free codes, Adam steps for encoders). Default
        2000 full-batch, 5000 minibatch / encoders.
    rtol : float
        Stop when the objective improved by less than ``rtol`` per step (relative) over
        the last ``window`` recorded steps.
    window : int
        Steps over which the improvement is measured (at least 200 for minibatch and
        encoder training, whose recorded objective is a moving average of batch losses).
    time_limit : float, optional
        Wall-clock budget of the whole fit in seconds: the steps stop at 85% of it, leaving the rest
        for the final certified re-coding (``stop_reason="time_limit"``), which on the CPU stops when
        the budget is spent (its ``coding_gap`` is certified whether or not it reached ``coding_tol``).
    batch_size : int, optional
        Minibatch size; ``None`` = full batch (free codes) or 4096 (encoders).
    code_steps : int, optional
        Code iterations per outer step (free codes): at most this many coordinate-descent
        sweeps over the working sets (full batch, default 30; fewer are run once the codes
        are optimal on the working sets), or this many accelerated proximal steps on a
        minibatch (default 60).
    dict_steps : int
        Block-coordinate sweeps over the atoms per outer step (free codes).
    ws_size : int
        Working-set size per point for the full-batch code step: the support plus the
        largest optimality violations, at most ``max(ws_size, 2 * largest support)`` atoms.
    resample_every : int
        Every so many steps, unused atoms move to the worst-served residuals (0 = never).
    bias : array (n,), optional
        Initial bias (default: the Huber median of ``X``).
    learn_bias : bool
        Optimise the bias (default). ``False`` keeps it fixed at ``bias`` (e.g. ``0``,
        scikit-learn's bias-free objective); the ray clustering then leaves it alone too.
    lr : float
        Adam learning rate (amortised encoders).
    topk : int, optional
        Active features per point for ``encoder="topk"`` (SAELens ``k``; default ``min(width, 32)``).
    bandwidth : float, optional
        JumpReLU straight-through bandwidth (default ``0.1 lam``).
    coding_tol : float
        Tolerance of the final optimal (re-)coding (:func:`widelimit.optimal_codes`).
    progress : callable(Progress), optional
        Receives a :class:`widelimit.Progress` event per recorded step (``stage="fit"``,
        ``rows_done`` = step, ``value`` = the objective shown in the history).

    Returns
    -------
    FitResult
    """
    import torch

    t0 = time.perf_counter()
    N, n = X.shape
    if width > N:
        raise ValueError(f"width={width} exceeds the number of points N = {N}: the wide-limit optimum needs "
                         "at most N atoms")
    init_arr = None
    if not isinstance(init, str):
        init_arr = check_dictionary(init, n, "init")
        if init_arr.shape[0] != width:
            raise ValueError(f"init has {init_arr.shape[0]} atoms but width = {width}")
    if topk is not None and not (1 <= int(topk) <= width):
        raise ValueError(f"topk must be between 1 and width = {width}, got {topk!r}")
    if encoder != "topk" and topk is not None:
        raise ValueError("topk is only used with encoder='topk'")
    dev = resolve_device(device)
    cdt = torch.float32
    amortised = encoder != "none"
    minibatch = batch_size is not None and not amortised
    if max_iter is None:
        max_iter = 5000 if (amortised or minibatch) else 2000
    gen = torch.Generator().manual_seed(int(seed))
    check_fit_memory(N, n, width, encoder=encoder, batch_size=batch_size, device=dev)

    if bias is None:
        b0 = huber_median(X, lam=lam).point
    else:
        b0 = check_vector(bias, n, "bias")
    # float32 holds squares up to 3.4e38 and loses them below 1e-38: data far from unit magnitude around the
    # starting bias are fitted as f X with lam f, f an exact power of two (docs/theory.md §8.4), and the results
    # mapped back; the final certified coding is on X itself
    f = normaliser(X, limit=_FLOAT32_LIMIT, centre=b0)
    Xs = X if f == 1.0 else ScaledRows(X, f)
    lam_s = lam * f
    Xd, W, b = _start(X, Xs, f, b0, lam_s, width, init, init_arr, gen, bool(learn_bias), seed, dev,
                      stream=minibatch or amortised)
    # stochastic objectives (minibatches, Adam) are judged over a longer window
    stochastic = amortised or minibatch
    # the budget covers the whole fit: the steps stop early enough to leave the final certified
    # re-coding (and the encoder's evaluation) _FINAL_SHARE of it
    loop_time = None if time_limit is None else (1.0 - _FINAL_SHARE) * float(time_limit)
    report = _Reporter(float(rtol), max(int(window), 200) if stochastic else int(window), loop_time, progress, t0,
                       stochastic=stochastic, budget=max_iter, unit=1.0 / f / f)
    opts = {"max_iter": int(max_iter), "cd_sweeps": 30 if code_steps is None else int(code_steps),
            "dict_steps": int(dict_steps),
            "ws_size": int(ws_size), "resample_every": int(resample_every), "batch_size": batch_size,
            "seed": int(seed), "batch_code_steps": 60 if code_steps is None else max(30, 3 * int(code_steps)),
            "lr": float(lr), "topk": topk,
            "bandwidth": bandwidth, "learn_bias": bool(learn_bias)}
    Wt, bt, steps, reason, enc_params, Z_warm = _run(Xs, Xd, W, b, lam_s, f, encoder, opts, report, dev, cdt,
                                                     minibatch=minibatch)
    Wf = Wt.detach().cpu().double().numpy()
    Wf /= np.where(np.linalg.norm(Wf, axis=1) > 0, np.linalg.norm(Wf, axis=1), 1.0)[:, None]
    bf = bt.detach().cpu().double().numpy() / f
    enc_value = None
    if amortised:
        Z_warm = encoder_codes(X, encoder, enc_params, bf)
        enc_value = sae_objective(X, Wf, Z_warm, bf, lam=lam).value
    left = None if time_limit is None else max(0.0, float(time_limit) - (time.perf_counter() - t0))
    coded = _final_codes(X, Wf, bf, lam, coding_tol, Z_warm, dev, left)
    return FitResult(
        dictionary=Wf, codes=coded.codes, bias=bf, value=coded.value, reconstruction=coded.reconstruction,
        penalty=coded.penalty, coding_gap=coded.gap, history=report.history, n_iter=int(steps),
        stop_reason=reason, encoder=encoder, encoder_params=enc_params, encoder_value=enc_value, lam=lam,
        width=width, init=init if isinstance(init, str) else "array", seed=int(seed), device=str(dev),
        time_s=time.perf_counter() - t0,
    )


def _start(X, Xs, f, b0, lam_s, width, init, init_arr, gen, learn_bias, seed, dev, *, stream):
    """The data on the device (float32) and the starting dictionary and bias (on the scaled data ``Xs``).

    A minibatch or encoder run (``stream``) on data too large for the device reads its batches from ``X``
    and returns ``Xd = None`` (the initialisation then sees a subsample of 200,000 rows).
    """
    import torch

    N, n = X.shape
    cdt = torch.float32
    stream = stream and not N * n * 4 <= (1 << 34 if dev.type == "cuda" else 1 << 32)
    with torch.no_grad():
        if stream:
            sub = np.sort(np.random.default_rng(seed).choice(N, size=min(N, 200_000), replace=False))
            Xd, src = None, torch.as_tensor(writable(np.asarray(Xs[sub], dtype=np.float32)), device=dev)
        else:
            Xd = torch.as_tensor(writable(np.asarray(X if f == 1.0 else Xs[:], dtype=np.float32)), device=dev)
            src = Xd
        b = torch.as_tensor(b0 * f, dtype=cdt, device=dev)
        if init_arr is not None:
            W = _rownorm(torch.as_tensor(init_arr, dtype=cdt, device=dev))
        else:
            W, b = _init_dictionary(src, b, lam_s, width, init, gen, learn_bias=learn_bias)
    return Xd, W, b


def _run(Xs, Xd, W, b, lam_s, f, encoder, opts, report, dev, cdt, *, minibatch):
    """The steps of the fit on the scaled data: an encoder's (amortised), minibatches of free codes, or
    free codes on all data. Returns ``(W, b, steps, stop reason, encoder parameters, warm-start codes)``,
    the encoder's parameters and the codes in the units of ``X``."""
    import torch

    enc_params: dict = {}
    Z_warm = None
    if encoder != "none":
        Wt, bt, steps, reason, enc_params = _fit_amortised(Xs, Xd, W, b, lam_s, encoder, opts, report, dev, cdt)
        for name in ("b_enc", "threshold"):  # codes scale with the data; W_enc does not
            if name in enc_params:
                enc_params[name] = enc_params[name] / f
    elif minibatch:
        with torch.no_grad():
            Wt, bt, _, steps, reason = _fit_free_minibatch(Xs, W, b, lam_s, opts, report, dev, cdt)
    else:
        with torch.no_grad():
            Wt, bt, Zt, steps, reason = _fit_free(Xd, W, b, lam_s, opts, report)
        N, width = Zt.shape
        rows = max(1, (1 << 26) // max(1, width))
        Z_warm = sp.csr_array(sp.vstack([sp.csr_array(Zt[s:s + rows].cpu().double().numpy() / f)
                                         for s in range(0, N, rows)], format="csr"))
        del Zt
    return Wt, bt, steps, reason, enc_params, Z_warm


def _final_codes(X, Wf, bf, lam, coding_tol, Z_warm, dev, time_left):
    """The certified optimal codes of the fitted dictionary and bias on ``X`` itself, warm-started."""
    # near-duplicate atoms make some lassos degenerate (sublinear convergence): a generous budget,
    # spent only on the points that need it
    if dev.type == "cpu" and Wf.shape[0] <= GRAM_LIMIT:  # the fastest certified coder on the CPU
        return _entry_codes(X, Wf, bf, lam=lam, algorithm="cd", tol=coding_tol, Z0=Z_warm, time_limit=time_left)
    return optimal_codes(X, Wf, bf, lam=lam, tol=coding_tol, device=dev, Z0=Z_warm, max_iter=20000)

