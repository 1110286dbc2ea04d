r"""Optimal codes for a fixed dictionary and bias, with a certified duality gap (theory.md §8.6).

One entry point, :func:`optimal_codes`, over three algorithms with the same
problem, the same float64 certificate (the per-token lasso dual point, :mod:`widelimit.coding.lasso`)
and the same result type (:class:`~widelimit.coding.result.CodingResult`):

* ``"cd"`` -- working-set coordinate descent on the Gram matrix, with gap-safe
  screening, BLAS-3 correlations and Newton polishing (:mod:`widelimit.coding.cd`;
  CPU, numba);
* ``"working_set"`` -- torch working sets with batched active-set Newton steps
  (:mod:`widelimit.coding.working_set`; CPU or CUDA);
* ``"fista"`` -- accelerated projected gradient on the whole dictionary, float32
  batches with float64 polishing (:mod:`widelimit.coding.fista`; CPU or CUDA).

``algorithm="auto"`` (:func:`choose_algorithm`) takes ``"cd"`` on the CPU when the
``k x k`` Gram fits (``k <= 8192``) and ``"fista"`` on a GPU or for wider
dictionaries; the choice was measured by ``benchmarks/certify_speed.py``
(docs/sae_certification.md, "Speed").
"""

from __future__ import annotations

import dataclasses
import time

from .._params import (DEVICE, LAM, NONNEG_INT, POSITIVE_INT, PROGRESS, TIME_LIMIT, TOL, ArrayLike, Boolean, Data,
                       StrOptions, validate_params)
from .._runtime import resolve_device, with_thread_limit
from .cd import cd_codes
from .fista import fista_codes
from .result import CodingResult
from .working_set import optimal_codes_working_set

__all__ = ["optimal_codes", "choose_algorithm", "CodingResult", "ALGORITHMS", "GRAM_LIMIT"]

ALGORITHMS = ("auto", "cd", "working_set", "fista")
#: Widest dictionary for which the Gram-based algorithms form ``G = U U^T`` (512 MiB in float64).
GRAM_LIMIT = 8192
#: Options only ``"fista"`` accepts; with ``algorithm="auto"`` they select it.
_FISTA_ONLY = frozenset({"dtype", "check_every"})
#: The options of the algorithms (``**options`` of :func:`optimal_codes`), each with its constraint.
_OPTIONS = {"max_iter": POSITIVE_INT, "time_limit": TIME_LIMIT, "dtype": StrOptions(("float32", "float64")),
            "check_every": POSITIVE_INT, "ws_size": POSITIVE_INT, "ws_extra": NONNEG_INT, "inner_iter": POSITIVE_INT}


def choose_algorithm(k: int, device) -> str:
    """The default algorithm for ``k`` atoms on ``device`` (a ``torch.device`` or its name).

    ``"cd"`` on the CPU with ``k <= GRAM_LIMIT``; ``"fista"`` otherwise (CUDA, or a
    Gram too large to form).
    """
    dtype = getattr(device, "type", str(device).split(":")[0])
    if dtype == "cpu" and int(k) <= GRAM_LIMIT:
        return "cd"
    return "fista"


@validate_params({
    "X": Data(), "W": ArrayLike(), "b": ArrayLike(), "lam": LAM, "algorithm": StrOptions(ALGORITHMS), "tol": TOL,
    "device": DEVICE, "Z0": [ArrayLike(), None], "return_codes": Boolean(), "batch_size": [POSITIVE_INT, None],
    "progress": PROGRESS, "options": _OPTIONS,
})
@with_thread_limit
def optimal_codes(X, W, b, *, lam, algorithm: str = "auto", tol: float = 1e-6, device="auto", Z0=None,
                  return_codes: bool = True, batch_size: int | None = None, progress=None, **options) -> CodingResult:
    r"""Certified optimal nonnegative codes for a fixed dictionary and bias (one lasso per point).

    For every point ``x_i`` solves

    .. math:: \min_{z \ge 0}\ \|z W + b - x_i\|^2 + 2\lambda \sum_d z_d \|w_d\|

    and certifies it with a per-point duality gap ``gap_i >= P_i(z_i) - min P_i``
    (float64, whatever the algorithm; theory.md §8.6). ``value - gap`` is a certified
    lower bound on the best objective any encoder reaches with this decoder and bias.

    Parameters
    ----------
    X : array (N, n)
        Data (read batch by batch, so a memory-mapped ``.npy`` works).
    W : array (k, n)
        Dictionary, one atom per row (any norms; SAELens ``W_dec`` layout).
    b : array (n,)
        Bias (SAELens ``b_dec``).
    lam : float
        Sparsity ``lam > 0`` (SAELens ``l1_coefficient = 2 lam``).
    algorithm : {"auto", "cd", "working_set", "fista"}
        See the module docstring; ``"auto"`` uses :func:`choose_algorithm` (or ``"fista"`` when an
        option only it has is given: ``dtype``, ``check_every``).
    tol : float
        Per-point target ``gap_i <= tol * max(P_i, gap_floor(lam))``.
    device : {"auto", "cpu", "cuda", "cuda:N"}
        ``"cd"`` runs on the CPU only.
    Z0 : array (N, k) or scipy.sparse, optional
        Warm start (nonnegative, in the units of ``W``), e.g. an SAE encoder's codes.
    return_codes : bool
        Return the codes as a CSR array.
    batch_size : int, optional
        Points per batch (memory is bounded by a batch).
    progress : callable(Progress), optional
        Receives a :class:`widelimit.Progress` event after each batch (``stage="optimal codes"``).
    **options
        Passed to the algorithm: ``max_iter`` (iterations of ``"fista"``, working-set rounds of the
        others), ``dtype``, ``check_every`` for ``"fista"``; ``ws_size``, ``inner_iter`` for
        ``"working_set"``; ``ws_extra``, ``time_limit`` (seconds) for ``"cd"``. Another option is refused.

    Returns
    -------
    CodingResult

    Examples
    --------
    >>> import numpy as np
    >>> from widelimit.coding import optimal_codes
    >>> W = np.eye(2); X = np.array([[3.0, 0.5], [0.2, -1.0]])
    >>> res = optimal_codes(X, W, np.zeros(2), lam=1.0, device="cpu")
    >>> np.round(res.codes.toarray(), 6).tolist()   # (x - lam)_+ per coordinate for an orthonormal W
    [[2.0, 0.0], [0.0, 0.0]]
    """
    t0 = time.perf_counter()
    res = _optimal_codes(X, W, b, lam=lam, algorithm=algorithm, tol=tol, device=device, Z0=Z0,
                         return_codes=return_codes, batch_size=batch_size, progress=progress, **options)
    return dataclasses.replace(res, time_s=time.perf_counter() - t0)


def _optimal_codes(X, W, b, *, lam, algorithm, tol, device, Z0, return_codes, batch_size, progress, **options):
    """:func:`optimal_codes` on checked arguments: the algorithm chosen and run."""
    dev = resolve_device(device)
    k = getattr(W, "shape", (None,))[0]
    if algorithm == "auto":
        algorithm = choose_algorithm(k if k is not None else len(W), dev)
        if algorithm == "cd" and _FISTA_ONLY & set(options):  # options only FISTA has: FISTA
            algorithm = "fista"
    if algorithm == "cd":
        if dev.type != "cpu":
            raise ValueError(f"algorithm='cd' runs on the CPU only, got device {device!r}")

        return cd_codes(X, W, b, lam=lam, tol=tol, Z0=Z0, return_codes=return_codes, batch_size=batch_size,
                        progress=progress, **options)
    if algorithm == "working_set":
        if progress is not None:
            raise ValueError("progress is not supported by algorithm='working_set'")

        return optimal_codes_working_set(X, W, b, lam=lam, tol=tol, device=dev, Z0=Z0, return_codes=return_codes,
                                         batch_size=batch_size, **options)
    return fista_codes(X, W, b, lam=lam, tol=tol, device=dev, Z0=Z0, return_codes=return_codes, batch_size=batch_size,
                       progress=progress, **options)
