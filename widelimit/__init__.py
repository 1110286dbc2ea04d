"""widelimit: exact, certified solutions of the wide limit of sparse dictionary learning.

The main entry points:

- :func:`solve` -- the narrowest globally optimal (W, Z, b), with a certificate;
- :func:`verify` -- certify any candidate (W, Z, b) against the global optimum;
- :func:`huber_median`, :func:`geometric_median` -- certified optimal biases;
- :func:`sae_objective`, :func:`q_objective`, :func:`optimal_dictionary` -- the objective and its Q-form;
- :func:`sandwich` (module :mod:`widelimit.relax`), :func:`solve_dnn`, :func:`factorize_cp`, :func:`refine` --
  the convex Q-problem over CP-cone approximations, checked against the closed form.
"""

from .certificate import Certificate, verify
from .cpfactor import CPFactorization, factorize_cp, refine
from .dnn_solver import DNNResult, solve_dnn
from .exact import WideLimitSolution, solve
from .median import MedianResult, geometric_median, huber_median, huber_value
from .objective import (
    ObjectiveValue,
    balance,
    huber_h,
    optimal_dictionary,
    q_objective,
    sae_objective,
    unconstrained_objective,
)
from .rays import RayGroups, group_rays
from .relax import RelaxationResult, SandwichReport, sandwich

__version__ = "0.1.0"

__all__ = [
    "CPFactorization",
    "Certificate",
    "DNNResult",
    "MedianResult",
    "ObjectiveValue",
    "RayGroups",
    "RelaxationResult",
    "SandwichReport",
    "WideLimitSolution",
    "balance",
    "factorize_cp",
    "geometric_median",
    "group_rays",
    "huber_h",
    "huber_median",
    "huber_value",
    "optimal_dictionary",
    "q_objective",
    "refine",
    "sandwich",
    "sae_objective",
    "solve",
    "solve_dnn",
    "unconstrained_objective",
    "verify",
]
