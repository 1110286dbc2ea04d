"""widelimit: exact, certified solutions of the wide limit of sparse dictionary learning.

The main entry points:

- :func:`solve` -- the narrowest globally optimal (W, Z, b), with a certificate;
- :func:`verify` -- certify any candidate (W, Z, b) against the global optimum;
- :func:`optimal_codes` -- certified optimal nonnegative codes for a fixed dictionary and bias;
- :func:`fit_dictionary` -- torch gradient solver of the nonconvex objective at a finite width;
- :func:`crossvalidate`, :func:`frontier` -- the gradient solver against the exact optimum, loss vs width;
- :func:`huber_median`, :func:`geometric_median` -- certified optimal biases;
- :func:`first_order_conditions` -- the finite-width stationarity conditions and their margins;
- :class:`ActivationSource` -- activations on disk (``.npy`` / ``.safetensors`` shards, a
  ``datasets`` Arrow cache), streamed by every solver; ``dask.array`` input runs on a cluster;
- :func:`load_sae`, :func:`certify_sae` -- load a trained SAE (SAELens, dictionary_learning, sparsify)
  and measure how far it is from the global optimum of its own objective.
- :func:`sae_objective`, :func:`q_objective`, :func:`optimal_dictionary` -- the objective and its Q-form;
- :func:`sandwich` (module :mod:`widelimit.relax.cones`), :func:`solve_dnn`, :func:`factorize_cp`, :func:`refine` --
  the convex Q-problem over CP-cone approximations, checked against the closed form.
"""

from .exact.certificate import Certificate, verify
from .coding.pdas import CodingResult, optimal_codes
from .relax.cpfactor import CPFactorization, factorize_cp, refine
from .learn.crossval import CrossValidation, crossvalidate
from .relax.dnn import DNNResult, solve_dnn
from .exact.solve import WideLimitSolution, solve
from .learn.frontier import Frontier, frontier
from .learn.gradient import FitResult, fit_dictionary
from .exact.median import MedianResult, geometric_median, huber_median, huber_value
from .exact.objective import (
    ObjectiveValue,
    balance,
    huber_h,
    optimal_dictionary,
    q_objective,
    sae_objective,
    unconstrained_objective,
)
from .exact.rays import RayGroups, group_rays
from .data.source import ActivationSource
from .sae.model import SAE, load_sae
from .sae.certify import SAECertificate, certify_sae
from .relax.cones import RelaxationResult, SandwichReport, sandwich
from .exact.stationarity import Stationarity, first_order_conditions
from .data import datasets  # noqa: F401  (wl.datasets without an explicit import)

__version__ = "0.1.0"

__all__ = [
    "ActivationSource",
    "CPFactorization",
    "Certificate",
    "CodingResult",
    "CrossValidation",
    "DNNResult",
    "FitResult",
    "Frontier",
    "MedianResult",
    "ObjectiveValue",
    "RayGroups",
    "RelaxationResult",
    "SAE",
    "SAECertificate",
    "SandwichReport",
    "Stationarity",
    "WideLimitSolution",
    "balance",
    "certify_sae",
    "crossvalidate",
    "factorize_cp",
    "first_order_conditions",
    "fit_dictionary",
    "frontier",
    "geometric_median",
    "group_rays",
    "huber_h",
    "huber_median",
    "huber_value",
    "load_sae",
    "optimal_codes",
    "optimal_dictionary",
    "q_objective",
    "refine",
    "sae_objective",
    "sandwich",
    "solve",
    "solve_dnn",
    "unconstrained_objective",
    "verify",
]
