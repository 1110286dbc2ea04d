r"""Certify a trained SAE: how far is it from the global optimum of its own objective?

For an SAE with decoder ``W_dec`` (rows read as unit atoms ``u_d`` with codes
``z_id = f_id ||W_dec,d||``) and bias ``b = b_dec``, on activations ``x_i``, the
objective of theory.md §1 (SAELens' loss with ``l1_coefficient = 2 lam``) is

.. math:: L(f) = \frac1N\sum_i \|x_i - b - f_i W_{dec}\|^2 + 2\lambda\sum_d f_{id}\|W_{dec,d}\| .

Three numbers bracket it, every one certified:

1. ``sae_objective``: ``L`` at the SAE's own encoder codes.
2. ``optimal_code_objective``: ``min_{Z >= 0} L`` for the SAE's decoder and bias,
   a nonnegative lasso per token solved to a certified duality gap (``coding_gap``)
   by :class:`widelimit.coding.cd.GramCoder` on the CPU (working-set coordinate descent,
   warm-started from the SAE's own codes and their residual correlations; theory.md §8.6) or the
   coder ``coding_algorithm`` names (:func:`widelimit.coding.optimal_codes`). The difference is the
   **encoder (amortisation) gap**, certified to lie in
   ``[encoder_gap, encoder_gap + coding_gap]``.
3. ``lower_bound``: the wide-limit bound ``min_b H(b)`` with
   ``H(b) = mean_i h_lam(||x_i - b||)`` (theory.md §3), certified from below by
   :func:`widelimit.huber_median`; no width, dictionary, bias or code does
   better. ``lower_bound_at_bias = H(b_dec)`` is the best any dictionary can do
   with the SAE's own bias. ``global_gap = sae_objective - lower_bound``.

    global_gap = encoder_gap + decoder_gap_at_bias + bias_gap,
    decoder_gap_at_bias = optimal_code_objective - H(b_dec),  bias_gap = H(b_dec) - lower_bound.

``certified`` is :func:`widelimit.exact.certificate.is_certified`
(``global_gap <= tol * sae_objective``, the one definition the toolkit uses):
then the SAE is a global minimiser of its objective over *all* widths, to that
tolerance. Which objective (and ``lam``) is certified for each architecture is
decided by :func:`widelimit.sae.objective.resolve_objective`: an L0-trained SAE
(TopK, BatchTopK, JumpReLU, Matryoshka) is compared at equal sparsity.

First-order diagnostics (theory.md §5), at the SAE's own codes with residual
``r_i = x_i - b - z_i W``:

* feature-residual (code KKT) condition: ``<u_d, r_i> = lam`` where ``z_id > 0``
  and ``<u_d, r_i> <= lam`` where ``z_id = 0``; per feature the largest
  violation on firing tokens (``max |<u_d, r_i> - lam|``) and on silent tokens
  (``max (<u_d, r_i> - lam)_+``);
* atom stationarity on the sphere: the Riemannian gradient
  ``(2/N) sum_i z_id (r_i - <r_i, u_d> u_d)`` must vanish (its norm per feature,
  also at the optimal codes, where it measures the dictionary alone);
* bias stationarity ``||mean_i r_i||`` and dual feasibility ``max_i ||r_i|| <= lam``
  (theory.md §4: ``G >= 0``).

Feature flags: dead (never fires), dense (fires on at least ``dense_threshold``
of tokens), antipodal pairs (decoder cosine ``<= antipodal_cosine``, the dense
antipodal pattern of theory.md §6), and absorbed-looking features (feature ``a``
whose firing set is contained, to ``containment``, in that of a more frequent
feature ``b`` with decoder cosine ``>= absorb_cosine``).

Metrics under SAELens / SAEBench names (:mod:`widelimit.sae.metrics`): ``mse``,
``explained_variance``, ``cossim``, ``l2_ratio``, ``relative_reconstruction_bias``,
``l0``, ``l1``, ``frac_alive``, plus ``l1_unit`` = mean of ``sum_d f_id ||W_dec,d||``
(the penalised quantity) and the optimal codes' ``optimal_mse`` / ``optimal_l0``.

A first-order condition counts as violated only above
:func:`violation_tolerance`, which adds to ``kkt_tol * lam`` the rounding of the
data and weights' storage precision (float32 rounding of ``<u_d, r_i>`` is about
``eps32 * max ||x_i - b||``), so that real violations stand out from rounding.

Activations are read in row batches ``acts[s:e]`` (any array-like with
``shape``, ``dtype`` and slicing: memory maps, :func:`widelimit.open_activations`),
converted to float64 per batch; memory is bounded by the batch except for the
wide-limit bound, which reads float16/bfloat16 or normalised activations as one
array (see :func:`certify_sae`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from .._runtime import limit_threads, resolve_device
from .._params import validate_params
from ..coding import choose_algorithm
from ..engine import engine_for
from ..engine.dask_engine import DaskEngine, _client
from ..engine.local import Progress, pass_timer, raise_nonfinite
from ..exact.gap import relative_gap
from ..exact.median import huber_median, huber_value
from .formats import as_sae
from ._assemble import assemble, storage_dtypes
from ._pairs import decoder_pairs, pair_rows
from ._util import Rows as _Rows, check_acts as _check_acts, sample_rows, violation_tolerance
from .objective import resolve_lam, resolve_objective
from .options import CERTIFY_CONSTRAINTS, CodingOptions, FlagOptions, RunOptions
from ..results import CertifiedResult, shared_dict, status_of
from .parts import Batch, Setup, default_parts
from .certify_l0 import certify_l0
from .sparsity import SparsityOptions
from .report import flat_dict, plot_sae_certificate, write_sae_certificate  # noqa: F401  (re-exported)

#: Most bytes of one batch's ``batch x d_sae`` float64 correlations (the batch shrinks for wide SAEs).
BATCH_BYTES = 1 << 28

__all__ = ["SAECertificate", "certify_sae", "plot_sae_certificate", "write_sae_certificate", "resolve_lam",
           "violation_tolerance", "sample_rows", "run_parts"]


@dataclass
class SAECertificate(CertifiedResult):
    """The certification report of one SAE on one set of activations.

    Scalars are means over tokens (float64). Per-feature arrays have length
    ``d_sae``. See the module docstring for the definitions. The shared fields of a certified result
    (:mod:`widelimit.results`): ``value`` is ``sae_objective``, ``gap`` is ``global_gap``, ``rel_gap`` is
    ``global_gap / sae_objective``, ``n_iter`` is ``None`` (the certification iterates only inside its parts),
    ``time_s`` the wall-clock seconds; ``n_points`` tokens were certified (of ``n_points_total``).
    """

    sae_objective: float
    reconstruction: float
    penalty: float
    optimal_code_objective: float | None
    coding_gap: float | None
    coding_max_gap: float | None
    coding_certified: bool | None
    lower_bound: float
    lower_bound_at_bias: float
    huber_median_gap: float
    encoder_gap: float | None
    decoder_gap_at_bias: float | None
    bias_gap: float
    global_gap: float
    certified: bool
    tol: float
    lam: float
    n_points: int
    d_in: int
    d_sae: int
    bias_stationarity: float
    max_residual_norm: float
    bias_distance: float
    metrics: dict
    features: dict = field(repr=False)
    violations: list = field(repr=False)
    antipodal_pairs: list = field(repr=False)
    absorbed: list = field(repr=False)
    sae_info: dict = field(repr=False)
    optimal_bias: np.ndarray = field(repr=False)
    time_s: float = 0.0
    device: str = "cpu"
    notes: list = field(default_factory=list)
    stability: dict | None = None  # feature_stability summary (theory.md §5.3-§5.5), when requested
    same_width: dict | None = None  # same_width_witness summary, when requested
    objective: dict = field(default_factory=dict)
    violation_tolerance: float = 0.0
    n_points_total: int | None = None
    wide_optimum_width: int | None = None
    sparsity: dict | None = None  # the bracket at the SAE's own L0 (widelimit.sae.sparsity, theory.md §10)
    downstream: dict | None = None  # CE loss score and KL with the SAE spliced in (widelimit.sae.downstream)

    @property
    def value(self) -> float | None:
        return self.sae_objective

    @property
    def gap(self) -> float | None:
        return self.global_gap

    @property
    def rel_gap(self) -> float | None:
        if self.global_gap is None or self.sae_objective is None:
            return None  # an L0 SAE without an L1 objective: no global gap
        return relative_gap(self.global_gap, self.sae_objective)

    @property
    def status(self) -> str:
        if self.certified is None:
            return "not_applicable"  # the L0 bracket alone: nothing global is certified
        return status_of(self.certified, self.sae_objective)

    n_iter = None

    @property
    def l1_coefficient(self) -> float | None:
        """``2 lam`` (``None`` without an L1 objective)."""
        return None if self.lam is None else 2.0 * self.lam

    def violating_features(self, condition: str | None = None) -> list[int]:
        """Features listed in :attr:`violations` (optionally only those of one condition)."""
        return sorted({v["feature"] for v in self.violations if condition is None or v["condition"] == condition})

    def as_dict(self, max_listed: int = 50) -> dict:
        """JSON-serialisable summary (per-feature arrays left out; see :func:`write_sae_certificate`)."""
        enc_hi = None if self.encoder_gap is None else self.encoder_gap + (self.coding_gap or 0.0)
        return {
            **shared_dict(self), "sae_objective": self.sae_objective, "reconstruction": self.reconstruction,
            "penalty": self.penalty,
            "optimal_code_objective": self.optimal_code_objective, "coding_gap": self.coding_gap,
            "coding_max_gap": self.coding_max_gap, "coding_certified": self.coding_certified,
            "lower_bound_at_bias": self.lower_bound_at_bias,
            "huber_median_gap": self.huber_median_gap,
            "encoder_gap": self.encoder_gap, "encoder_gap_upper": enc_hi,
            "decoder_gap_at_bias": self.decoder_gap_at_bias, "bias_gap": self.bias_gap,
            "global_gap": self.global_gap,
            "lam": self.lam, "l1_coefficient": self.l1_coefficient,
            "n_points": self.n_points, "d_in": self.d_in, "d_sae": self.d_sae,
            "bias_stationarity": self.bias_stationarity, "max_residual_norm": self.max_residual_norm,
            "bias_distance": self.bias_distance, "metrics": dict(self.metrics),
            "n_violating_features": len(self.violating_features()),
            "violations": self.violations[:max_listed],
            "antipodal_pairs": self.antipodal_pairs[:max_listed],
            "absorbed": self.absorbed[:max_listed],
            "sae": self.sae_info,
            "tokens_per_second": self.n_points / self.time_s if self.time_s > 0 else None,
            "device": self.device, "notes": list(self.notes), "stability": self.stability,
            "same_width": self.same_width,
            "objective": dict(self.objective), "violation_tolerance": self.violation_tolerance,
            "n_points_total": self.n_points_total, "wide_optimum_width": self.wide_optimum_width,
            "sparsity": self.sparsity, "downstream": self.downstream,
        }

    def as_flat_dict(self, prefix: str = "") -> dict:
        """Scalars only, ``/``-separated keys (``gap/encoder``, ``metrics/l0``): ready for a logger (see report)."""
        return flat_dict(self, prefix=prefix)


def _rel(gap, value):
    return None if gap is None else relative_gap(gap, value)


@validate_params(CERTIFY_CONSTRAINTS)
def certify_sae(acts, sae, *, lam=None, l1_coefficient=None, architecture: str | None = None,
                max_tokens: int | None = None, seed: int = 0, tol: float = 1e-6, coding_tol: float = 1e-6,
                batch_size: int = 4096, device="auto", optimal_codes_diagnostics: bool = True,
                dead_threshold: float = 0.0, dense_threshold: float = 0.5, antipodal_cosine: float = -0.99,
                absorb_cosine: float = 0.5, containment: float = 0.9, kkt_tol: float = 1e-6,
                max_pairs: int = 200_000, pair_budget: float | None = 2.0, coding_algorithm: str = "auto",
                threads: int | None = None, backend="auto",
                progress: Callable[[Progress], None] | None = None, stability: bool = False,
                stability_witnesses: int = 8, same_width_steps: int = 0, objective: str = "auto",
                sparsity=None, calibration_time: float | None = 60.0) -> SAECertificate:
    r"""Certify a trained SAE against the global optimum of its own objective.

    Parameters
    ----------
    sae : SAE, library object or path
        A widelimit :class:`SAE`, a ``sae_lens.SAE``, a dictionary_learning or
        sparsify SAE, any module with ``W_dec`` / ``b_dec``, or a path
        (:func:`widelimit.sae.formats.as_sae`).
    acts : array-like (N, d_in)
        Token activations; anything with ``shape``, ``dtype`` and row slicing
        (``np.memmap``, :func:`widelimit.open_activations`, a torch tensor).
        float16 / bfloat16 / float32 / float64.
    lam, l1_coefficient : float, optional
        At most one: the sparsity ``lam`` or the library coefficient ``2 lam``.
        Neither: from the SAE's config, or calibrated at equal L0 for L0-trained
        SAEs (:func:`widelimit.sae.objective.resolve_objective`).
    architecture : str, optional
        For a path or object that does not name its encoder.
    max_tokens : int, optional
        Certify a random sample of this many tokens (``seed``).
    tol : float
        ``certified`` iff ``global_gap <= tol * sae_objective``
        (:func:`widelimit.exact.certificate.is_certified`).
    coding_tol : float
        Relative per-token duality gap of the optimal coding: ``gap_i <= coding_tol * scale_i`` with
        ``scale_i`` the token's own objective scale (:func:`widelimit.sae.parts.coding_scale`).
    batch_size : int
        Most tokens per batch (memory ~ ``batch_size * d_sae`` float64 several times; fewer tokens when
        ``batch_size * d_sae`` float64 exceeds :data:`BATCH_BYTES`).
    device : {"auto", "cpu", "cuda"}
        Where the encoder, diagnostics and optimal coding run.
    backend : {"auto", "numba", "torch"}
        The products with the sparse codes: numba kernels on the CPU (``"auto"`` there) or the torch products
        a GPU runs (``"auto"`` on CUDA; on the CPU the same code path as on a GPU).
    optimal_codes_diagnostics : bool
        Also compute the atom tangent gradient at the optimal codes.
    dead_threshold, dense_threshold : float
        A feature is dead if its firing frequency is ``<= dead_threshold``, dense if ``>= dense_threshold``.
    antipodal_cosine : float
        Pairs with decoder cosine ``<=`` this are reported as antipodal.
    absorb_cosine, containment : float
        Absorbed-looking: ``|fire(a) & fire(b)| >= containment * |fire(a)|``,
        ``freq(b) > freq(a)`` and ``cos(u_a, u_b) >= absorb_cosine``.
    kkt_tol : float
        A first-order condition counts as violated when its violation exceeds
        :func:`violation_tolerance` (``kkt_tol * lam`` plus the storage precision's rounding).
    max_pairs : int
        Most decoder pairs examined for antipodal / absorption patterns (the most extreme cosines, from
        the blocked search :func:`widelimit.sae._pairs.decoder_pairs`; 0 skips the search).
    pair_budget : float or None
        Most multiply-adds of that search, in encoder products over the certified tokens (``N d_sae d_in``
        each; the default 2.0 is one forward pass). A wider decoder than fits is searched for the pairs
        of a seeded random sample of its atoms (``seed``; :func:`widelimit.sae._pairs.pair_rows`), and
        ``notes`` says so; decoders up to :data:`widelimit.sae._pairs.PAIR_FULL_MADDS` multiply-adds are
        always searched in full. ``None``: the full search (``d_sae^2 d_in / 2``) at any width.
    coding_algorithm : {"auto", "cd", "working_set", "fista"}
        Algorithm of the optimal coding (:func:`widelimit.coding.optimal_codes`); ``"auto"``
        takes working-set coordinate descent on the CPU and FISTA batches on a GPU. Every
        algorithm certifies the same float64 duality gap.
    threads : int, optional
        Threads of torch and numba during the call (one count for both, on their shared OpenMP pool;
        numpy's BLAS gets one thread, its products are small here: :class:`widelimit._runtime.limit_threads`);
        default :func:`widelimit._runtime.default_threads`.
    progress : callable(Progress), optional
        Receives :class:`widelimit.engine.local.Progress` events: ``stage="certify"`` after each
        batch (``rows_done`` of ``rows_total`` tokens, ``time_s`` since the pass began: ``rows_per_s``
        tokens/s and ``time_left_s``), then the events of the wide-limit bound
        (:func:`widelimit.huber_median`). Cheap enough to drive a progress bar or a training-loop log.
    stability, stability_witnesses : bool, int
        Also run :func:`widelimit.feature_stability` (theory.md §5.3-§5.5) on the decoder with its
        optimal codes (kept in memory, sparse), following at most ``stability_witnesses`` features;
        its per-feature rows become ``stability_*`` columns of ``features`` and its summary
        :attr:`SAECertificate.stability`.
    same_width_steps : int
        When ``> 0``, run :func:`widelimit.learn.same_width.same_width_witness` (the gradient solver started at the
        decoder, this many steps, certified optimal codes): :attr:`SAECertificate.same_width` says
        whether a dictionary of the same width reaches a lower objective than the decoder's optimal codes.
    objective : {"auto", "l1", "l0"}
        ``"auto"``: the SAE's own objective -- the L1 objective for L1-trained SAEs; for L0-trained ones
        (TopK, BatchTopK, JumpReLU, Matryoshka) the bracket at their own sparsity alone, with no ``lam``
        (the L1 fields ``None``: :func:`widelimit.sae.certify_l0.certify_l0`); ``"l1"``: the L1 objective
        for any SAE (``lam`` calibrated at equal L0 when not given); ``"l0"``: the bracket alone.
    sparsity : SparsityOptions, optional
        The bracket at the SAE's own L0, run for every SAE with an encoder
        (:class:`widelimit.sae.sparsity.SparsityOptions`: rounds, time limit -- default at most what the
        rest of the pass takes; theory.md §10).
    calibration_time : float, optional
        Seconds for calibrating ``lam`` at equal L0 (``objective="l1"`` without ``lam``).

    Returns
    -------
    SAECertificate
    """
    coding = CodingOptions(coding_tol, coding_algorithm, optimal_codes_diagnostics, keep_codes=bool(stability))
    flags = FlagOptions(kkt_tol, dead_threshold, dense_threshold, antipodal_cosine, absorb_cosine, containment,
                        max_pairs, pair_budget)
    run = RunOptions(batch_size, device, backend)
    with limit_threads(threads, blas_threads=1):  # products in torch; numpy's BLAS idle (limit_threads)
        return _certify(acts, sae, lam, l1_coefficient, architecture=architecture, max_tokens=max_tokens, seed=seed,
                        tol=tol, coding=coding, flags=flags, run=run, progress=progress, stability=stability,
                        stability_witnesses=stability_witnesses, same_width_steps=same_width_steps,
                        objective=(objective, calibration_time),
                        sparsity=SparsityOptions() if sparsity is None else sparsity)


def _setup(sae, acts, lam, l1_coefficient, seed, coding: CodingOptions, run: RunOptions, objective=("auto", None),
           progress=None):
    """The SAE on the device, the certified objective's ``lam`` (:class:`ObjectiveChoice`) and a calibration sample.

    ``objective``: ``(name, calibration_time)``. For the L0 objective alone (``choice.lam is None``) the setup's
    ``lam`` is 0 (no part reads it then but the first-order statistics, which are not reported)."""
    dev = resolve_device(run.device)
    if run.backend == "numba" and dev.type != "cpu":
        raise ValueError(f"backend='numba' runs on the CPU only, got device {run.device!r}")
    sample = sae.preprocess(np.asarray(sample_rows(acts, 2048, seed), dtype=np.float64))  # calibration, scale
    choice = resolve_objective(sae, sample, lam, l1_coefficient, objective=objective[0], coding_tol=coding.coding_tol,
                               device=dev, time_limit=objective[1], progress=progress)
    algorithm = coding.coding_algorithm
    if algorithm == "auto":  # the Gram coder where its k x k Gram fits on the CPU, else the screened coder
        algorithm = "screened" if choose_algorithm(sae.d_sae, dev) == "fista" else choose_algorithm(sae.d_sae, dev)
    if algorithm == "cd" and dev.type != "cpu":
        raise ValueError(f"coding_algorithm='cd' runs on the CPU only, got device {run.device!r}")
    setup = Setup(sae=sae, lam=0.0 if choice.lam is None else choice.lam, dev=dev, numba=dev.type == "cpu" and run.backend != "torch",
                  coding_algorithm=algorithm, coding_tol=coding.coding_tol, U=sae.unit_dictionary(),
                  norms=sae.decoder_norms(), b=np.asarray(sae.b_dec, dtype=np.float64))
    return setup, choice, sample


def update_parts(parts: dict, batch: Batch) -> None:
    """Every part reads the batch, in order (each may leave on it what the later ones use)."""
    for part in parts.values():
        part.update(batch)


def _merge_parts(a: dict, b: dict) -> dict:
    for name, part in a.items():
        part.merge(b[name])
    return a


def _block_parts(block, start, setup, make, batch_size):
    """One Dask block: fresh parts, updated batch by batch (the local driver's loop), returned for merging."""
    parts = make(setup)
    block = np.asarray(block)
    for s in range(0, block.shape[0], batch_size):
        raw = block[s : s + batch_size]
        if not np.isfinite(raw).all():
            raise_nonfinite(raw, start + s)
        update_parts(parts, Batch(start + s, raw, setup))
    for part in parts.values():
        part.s = None  # the setup stays on the worker
    return parts


def run_parts(acts, make, setup: Setup, batch_size: int, progress=None) -> dict:
    """The pass of a certification: ``make(setup)`` parts updated with every batch of ``acts``' engine.

    In this process (arrays, memory maps, shard folders) the batches are read in row order, one ahead,
    and update one set of parts. On a ``dask.array`` each block is one task on a worker (the setup --
    the SAE -- sent once per worker with a ``dask.distributed`` client), updating its own parts, which a
    binary tree of merges combines in row order, as the exact passes merge theirs
    (:class:`widelimit.engine.dask_engine.DaskEngine`). Returns the parts (a dict).
    """
    engine = engine_for(acts)
    N = engine.N
    since = pass_timer()
    if isinstance(engine, DaskEngine):
        import dask

        client = _client()
        shared = client.scatter(setup, broadcast=True) if client is not None else dask.delayed(setup, pure=True)
        task = dask.delayed(_block_parts, pure=True)
        merge = dask.delayed(_merge_parts, pure=True)
        parts = [task(blk, int(s), shared, make, batch_size) for blk, s in zip(engine._blocks(), engine.offsets[:-1])]
        while len(parts) > 1:
            parts = [merge(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        out = engine._compute(parts[0])
        for part in out.values():
            part.s = setup
        if progress is not None:
            progress(Progress(stage="certify", pass_index=1, rows_done=N, rows_total=N, done=True, time_s=since()))
        return out
    parts = make(setup)
    for start, raw in engine.batches(batch_size, name="activations"):
        update_parts(parts, Batch(start, raw, setup))
        if progress is not None:
            e = start + raw.shape[0]
            progress(Progress(stage="certify", pass_index=1, rows_done=e, rows_total=N, done=e >= N,
                              time_s=since()))
    return parts


def _wide_bound(acts, sae, b, lam, tol, batch_size, progress):
    """The wide-limit bound ``min H`` (certified), ``H(b_dec)`` and the width of the wide optimum (theory.md §3)."""
    Xb_all = acts if sae.normalize_activations == "none" else _Rows(acts, sae)
    # a Hessian from 512 rows per Newton step: 5-15x faster than 4096 on MiniLM activations at the
    # same certified tolerance (one more step); the bound and its certificate do not depend on it.
    # Certified to a relative gap 1000x below `tol` (one Newton step less than the median's default
    # 1e-12): the bound's slack then cannot decide whether the SAE is certified
    med = huber_median(Xb_all, lam=lam, hess_rows=512, tol=min(1e-9, 1e-3 * tol), progress=progress)
    h_bias = float(huber_value(Xb_all, b, lam=lam))
    # width of the wide-limit optimum: one atom per ray; tokens outside the lam ball around b* (an upper bound,
    # exact when no two tokens share a direction from b*)
    width_opt = 0
    N = int(acts.shape[0])
    for s0 in range(0, N, batch_size):
        Xc = np.asarray(Xb_all[s0 : s0 + batch_size], dtype=np.float64) - np.asarray(med.point)
        width_opt += int((np.einsum("ij,ij->i", Xc, Xc) > lam * lam).sum())
    return Xb_all, med, h_bias, width_opt


def _certify(acts, sae, lam, l1_coefficient, *, architecture, max_tokens, seed, tol, coding, flags, run, progress,
             stability, stability_witnesses, same_width_steps, objective, sparsity):
    """The driver of :func:`certify_sae` (inside its thread limits): set up, one pass of the parts, the bound."""
    if lam is not None or l1_coefficient is not None:
        resolve_lam(lam, l1_coefficient)  # bad input fails before any work
    sae = as_sae(sae, architecture=architecture)
    storage = storage_dtypes(acts)  # before any conversion: the rounding of the violation flags
    acts = _check_acts(acts, sae)
    n_total = int(acts.shape[0])
    acts = sample_rows(acts, max_tokens, seed) if max_tokens is not None else acts
    setup, choice, sample = _setup(sae, acts, lam, l1_coefficient, seed, coding, run, objective, progress)
    t0 = time.perf_counter()
    notes: list[str] = [str(w) for w in sae.warnings]  # what loading or exporting the SAE changed or substituted
    if choice.calibration.get("stopped"):
        notes.append(f"lam calibration stopped at its time limit: the optimal codes' L0 is "
                     f"{choice.calibration['optimal_l0']:.4g}, the SAE's {choice.calibration['target_l0']:.4g}")
    if sae.normalize_activations != "none":
        notes.append(f"activations normalised per token ({sae.normalize_activations}) as the SAE does; "
                     "all numbers are in that normalised space")
    # decoder-pair candidates for antipodal / absorption patterns (blocked search, bounded memory)
    k_, n_ = setup.U.shape
    rows = pair_rows(k_, n_, None if flags.pair_budget is None else flags.pair_budget * int(acts.shape[0]) * k_ * n_,
                     seed) if flags.max_pairs else None
    if rows is not None:
        notes.append(f"decoder-pair search (antipodal / absorbed flags) partial: the pairs of {rows.size} of {k_} "
                     f"atoms (a seeded random sample, {rows.size * k_ * n_:.3g} of {0.5 * k_ * k_ * n_:.3g} "
                     "multiply-adds; pair_budget=None searches all)")
    pa, pb, pc = decoder_pairs(setup.U, flags.antipodal_cosine, flags.absorb_cosine, flags.max_pairs, setup.dev,
                               block_rows=None, rows=rows)
    absorb = pc >= flags.absorb_cosine
    l1 = choice.lam is not None  # else the SAE's own sparsity alone: no optimal L1 coding, no wide limit
    make = partial(default_parts, coding=coding if l1 else None, pairs=(pa[absorb], pb[absorb]), sparsity=sparsity)
    # a batch's (batch x d_sae) float64 correlations within BATCH_BYTES: memory bounded by the batch at any width
    rows = min(run.batch_size, max(64, BATCH_BYTES // (8 * setup.k)))
    parts = run_parts(acts, make, setup, rows, progress)
    if not l1:
        return certify_l0(SAECertificate, parts, setup, flags, choice=choice, pairs=(pa, pb, pc), N=int(acts.shape[0]),
                          notes=notes, t0=t0, n_total=n_total)
    Xb_all, med, h_bias, width_opt = _wide_bound(acts, sae, setup.b, setup.lam, tol, run.batch_size, progress)
    return assemble(SAECertificate, parts, setup, flags, coding, choice=choice, med=med, h_bias=h_bias,
                    width_opt=width_opt, pairs=(pa, pb, pc), acts=acts, Xb_all=Xb_all, sample=sample, notes=notes,
                    storage=storage,
                    tol=tol, t0=t0, n_total=n_total, stability=stability, stability_witnesses=stability_witnesses,
                    same_width_steps=same_width_steps)
