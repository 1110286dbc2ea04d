"""The options of :func:`widelimit.certify_sae`: what each accepts (:mod:`widelimit._params`).

Checked once, when ``certify_sae`` is called, before any work (docs/api.md, the glossary).
"""

from __future__ import annotations

from .._params import (DEVICE, LAM, NONNEG_INT, POSITIVE_INT, PROGRESS, SEED, THREADS, TIME_LIMIT, TOL, ArrayLike,
                       Boolean, InstanceOf, Interval, Lam, Passed, StrOptions)
from .model import ARCHITECTURES

__all__ = ["CERTIFY_CONSTRAINTS", "CODING_ALGORITHMS"]

#: The optimal coding's algorithms (:func:`widelimit.coding.optimal_codes`).
CODING_ALGORITHMS = ("auto", "cd", "working_set", "fista")

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
    "coding_algorithm": StrOptions(CODING_ALGORITHMS), "threads": THREADS,
    "progress": PROGRESS, "stability": Boolean(), "stability_witnesses": NONNEG_INT,
    "same_width_steps": NONNEG_INT,
    "objective": StrOptions(("auto", "l1", "l0")),
    "sparsity": [InstanceOf("widelimit.sae.sparsity:SparsityOptions"), None],
    "calibration_time": TIME_LIMIT,
}
