r"""The options of :func:`widelimit.sae.certify.certify_sae`, grouped by concern and checked when made.

Each group is a frozen dataclass whose ``__post_init__`` refuses a bad value in one line
naming the option; :func:`certify_sae` builds them from its keyword arguments, so a bad
argument fails before any work. The groups follow the accumulators of
:mod:`widelimit.sae.parts` (theory.md §5 for the first-order conditions, §8.6 for the coding).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._params import (DEVICE, LAM, NONNEG_INT, POSITIVE_INT, PROGRESS, SEED, THREADS, TIME_LIMIT, TOL, ArrayLike,
                       Boolean, InstanceOf, Interval, Lam, Passed, StrOptions, check_fields)
from .model import ARCHITECTURES

__all__ = ["CodingOptions", "FlagOptions", "RunOptions", "BACKENDS", "CODING_ALGORITHMS", "CERTIFY_CONSTRAINTS"]

#: Where the products with the sparse codes run on the CPU: numba kernels, or the torch products every device runs.
BACKENDS = ("auto", "numba", "torch")
#: The optimal coding's algorithms (:func:`widelimit.coding.optimal_codes`, and the screened coder).
CODING_ALGORITHMS = ("auto", "cd", "working_set", "fista", "screened")

#: What each option of :func:`widelimit.certify_sae` accepts (:mod:`widelimit._params`), checked before any work.
CERTIFY_CONSTRAINTS = {
    "acts": ArrayLike(allowed="an array of activations (N, d_in)"),
    "sae": Passed("widelimit.sae.formats.as_sae"),  # an SAE, a library's SAE object or a path: as_sae says which
    "lam": [LAM, None], "l1_coefficient": [Lam(), None],
    "architecture": [StrOptions(ARCHITECTURES), None],
    "max_tokens": [POSITIVE_INT, None], "seed": SEED, "tol": TOL, "coding_tol": TOL, "batch_size": POSITIVE_INT,
    "device": DEVICE, "optimal_codes_diagnostics": Boolean(),
    "dead_threshold": Interval("real", 0, 1), "dense_threshold": Interval("real", 0, 1),
    "antipodal_cosine": Interval("real", -1, 1), "absorb_cosine": Interval("real", -1, 1),
    "containment": Interval("real", 0, 1), "kkt_tol": TOL, "max_pairs": NONNEG_INT,
    "pair_budget": [Interval("real", 0, None), None],
    "coding_algorithm": StrOptions(CODING_ALGORITHMS), "threads": THREADS, "backend": StrOptions(BACKENDS),
    "progress": PROGRESS, "stability": Boolean(), "stability_witnesses": NONNEG_INT,
    "same_width_steps": NONNEG_INT,
    "objective": StrOptions(("auto", "l1", "l0")),
    "sparsity": [InstanceOf("widelimit.sae.sparsity:SparsityOptions"), None],
    "calibration_time": TIME_LIMIT,
}


def _check(obj, names) -> None:
    check_fields(obj, {name: CERTIFY_CONSTRAINTS[name] for name in names})


@dataclass(frozen=True)
class CodingOptions:
    """Options of the optimal coding (:class:`widelimit.sae.parts.CodingPart`).

    Attributes
    ----------
    coding_tol : float
        Per-token target ``gap_i <= coding_tol * scale_i`` of the certified duality gap, ``scale_i`` the token's
        own objective scale (:func:`widelimit.sae.parts.coding_scale`).
    coding_algorithm : {"auto", "cd", "working_set", "fista", "screened"}
        :func:`widelimit.coding.optimal_codes`, or ``"screened"`` (:class:`widelimit.coding.screened.ScreenedCoder`,
        no Gram matrix; ``"auto"`` takes it above :data:`widelimit.coding.GRAM_LIMIT` atoms and on CUDA, else
        :func:`widelimit.coding.choose_algorithm`).
    optimal_codes_diagnostics : bool
        Also accumulate the atom tangent gradient at the optimal codes.
    keep_codes : bool
        Keep the optimal codes (sparse) for the stability analysis.
    """

    coding_tol: float = 1e-6
    coding_algorithm: str = "auto"
    optimal_codes_diagnostics: bool = True
    keep_codes: bool = False

    def __post_init__(self):
        _check(self, ("coding_tol", "coding_algorithm", "optimal_codes_diagnostics"))
        check_fields(self, {"keep_codes": Boolean()})


@dataclass(frozen=True)
class FlagOptions:
    """Thresholds of the feature flags and first-order violations (:mod:`widelimit.sae.parts`).

    Attributes
    ----------
    kkt_tol : float
        A condition is violated above ``kkt_tol * lam`` plus the storage rounding
        (:func:`widelimit.sae._util.violation_tolerance`).
    dead_threshold, dense_threshold : float
        Dead: firing frequency ``<= dead_threshold``; dense: ``>= dense_threshold``.
    antipodal_cosine : float
        Decoder pairs with cosine ``<=`` this are antipodal (in ``[-1, 1]``).
    absorb_cosine, containment : float
        Absorbed-looking: ``cos >= absorb_cosine`` and the firing set contained to ``containment``.
    max_pairs : int
        Most decoder pairs examined (the most extreme cosines first).
    pair_budget : float or None
        Most multiply-adds of the decoder-pair search, in encoder products over the certified tokens
        (``N d_sae d_in`` each); the full search runs when it fits (or is below
        :data:`widelimit.sae._pairs.PAIR_FULL_MADDS`), else the pairs of a seeded sample of atoms
        (:func:`widelimit.sae._pairs.pair_rows`). ``None``: always the full search.
    """

    kkt_tol: float = 1e-6
    dead_threshold: float = 0.0
    dense_threshold: float = 0.5
    antipodal_cosine: float = -0.99
    absorb_cosine: float = 0.5
    containment: float = 0.9
    max_pairs: int = 200_000
    pair_budget: float | None = 2.0

    def __post_init__(self):
        _check(self, ("kkt_tol", "dead_threshold", "dense_threshold", "antipodal_cosine", "absorb_cosine",
                      "containment", "max_pairs", "pair_budget"))


@dataclass(frozen=True)
class RunOptions:
    """How the passes run (the driver of :func:`widelimit.sae.certify.certify_sae`).

    Attributes
    ----------
    batch_size : int
        Tokens per batch: memory ``O(batch_size * d_sae + d_sae * d_in)``.
    device : {"auto", "cpu", "cuda", "cuda:N"}
    backend : {"auto", "numba", "torch"}
        The products with the sparse codes on the CPU: numba kernels (``"auto"`` on the CPU) or the torch
        products a GPU runs (``"auto"`` on CUDA); the two give the same certificate to rounding.
    pair_block : int
        Rows of the decoder-pair search's blocks (:func:`widelimit.sae._pairs.decoder_pairs`).
    """

    batch_size: int = 4096
    device: str = "auto"
    backend: str = "auto"
    pair_block: int = 2048

    def __post_init__(self):
        _check(self, ("batch_size", "device", "backend"))
        check_fields(self, {"pair_block": POSITIVE_INT})
