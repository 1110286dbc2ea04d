r"""The options of :func:`widelimit.sae.certify.certify_sae`, grouped by concern and checked when made.

Each group is a frozen dataclass whose ``__post_init__`` refuses a bad value in one line
naming the option; :func:`certify_sae` builds them from its keyword arguments, so a bad
argument fails before any work. The groups follow the accumulators of
:mod:`widelimit.sae.parts` (theory.md §5 for the first-order conditions, §8.6 for the coding).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validation import check_int, check_real, check_tol

__all__ = ["CodingOptions", "FlagOptions", "RunOptions", "BACKENDS", "CODING_ALGORITHMS"]

#: Where the products with the sparse codes run on the CPU: numba kernels, or the torch products every device runs.
BACKENDS = ("auto", "numba", "torch")
CODING_ALGORITHMS = ("auto", "cd", "working_set", "fista", "screened")


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
        object.__setattr__(self, "coding_tol", check_tol(self.coding_tol, "coding_tol"))
        if self.coding_algorithm not in CODING_ALGORITHMS:
            raise ValueError(f"coding_algorithm must be one of {', '.join(CODING_ALGORITHMS)}, "
                             f"got {self.coding_algorithm!r}")


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
    """

    kkt_tol: float = 1e-6
    dead_threshold: float = 0.0
    dense_threshold: float = 0.5
    antipodal_cosine: float = -0.99
    absorb_cosine: float = 0.5
    containment: float = 0.9
    max_pairs: int = 200_000

    def __post_init__(self):
        object.__setattr__(self, "kkt_tol", check_tol(self.kkt_tol, "kkt_tol"))
        for name in ("dead_threshold", "dense_threshold", "containment"):
            v = check_real(getattr(self, name), name, low=0.0)
            if v > 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
            object.__setattr__(self, name, v)
        for name in ("antipodal_cosine", "absorb_cosine"):
            v = check_real(getattr(self, name), name, low=-1.0)
            if v > 1.0:
                raise ValueError(f"{name} must be in [-1, 1], got {v!r}")
            object.__setattr__(self, name, v)
        object.__setattr__(self, "max_pairs", check_int(self.max_pairs, "max_pairs", low=0))


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
        object.__setattr__(self, "batch_size", check_int(self.batch_size, "batch_size", low=1))
        object.__setattr__(self, "pair_block", check_int(self.pair_block, "pair_block", low=1))
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
