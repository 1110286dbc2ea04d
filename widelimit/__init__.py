"""widelimit: exact, certified solutions of the wide limit of sparse dictionary learning.

The front door is :class:`Problem` (data + ``lam``, opened once, with a cached median);
the functions below are the same computations one at a time. Data flows one way:
data (:func:`open_activations`) -> problem -> solver -> solution -> certificate / report.

- :func:`solve`, :func:`verify` -- the exact optimum with a certificate; the certificate of any (W, Z, b);
- :func:`huber_median`, :func:`geometric_median`, :func:`huber_value` -- the certified optimal bias;
- :func:`optimal_codes` -- certified optimal nonnegative codes for a fixed dictionary and bias;
- :func:`first_order_conditions` -- finite-width stationarity margins;
- :func:`feature_stability` -- per-feature optimality (code, atom, feature-feature, second order) with witnesses;
- :func:`sae_objective`, :func:`q_objective`, :func:`optimal_dictionary` -- the objective and its Q-form;
- :func:`fit_dictionary`, :func:`crossvalidate`, :func:`frontier` -- the gradient solver at finite width;
- :func:`relax`, :func:`sandwich`, :func:`solve_dnn`, :func:`factorize_cp`, :func:`refine` -- the convex
  Q-problem over CP-cone approximations, checked against the closed form;
- :func:`load_sae`, :func:`certify_sae` -- trained SAEs against the optimum of their own objective;
- :func:`open_activations` -- activations on disk or in memory, streamed by every solver.

Internals live in the subpackages: ``data``, ``engine``, ``exact``, ``coding``, ``learn``,
``relax``, ``sae``, ``lab``, ``cli`` (docs/architecture.md).
"""

import importlib as _importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: less start-up before the CLI's Ctrl-C handler

_LAZY = {  # public name -> module that defines it; imported on first use (PEP 562)
    "datasets": ".data.datasets",  # a module
    "CodingResult": ".coding",
    "optimal_codes": ".coding",
    "ActivationSource": ".data",
    "DataError": ".data",
    "open_activations": ".data",
    "Progress": ".engine",
    "Certificate": ".exact.certificate",
    "verify": ".exact.certificate",
    "MedianResult": ".exact.median",
    "geometric_median": ".exact.median",
    "huber_median": ".exact.median",
    "huber_value": ".exact.median",
    "ObjectiveValue": ".exact.objective",
    "optimal_dictionary": ".exact.objective",
    "q_objective": ".exact.objective",
    "sae_objective": ".exact.objective",
    "WideLimitSolution": ".exact.solve",
    "solve": ".exact.solve",
    "FeatureStability": ".exact.stability",
    "feature_stability": ".exact.stability",
    "FiniteSolution": ".finite",
    "Stationarity": ".exact.stationarity",
    "first_order_conditions": ".exact.stationarity",
    "CrossValidation": ".learn.crossval",
    "crossvalidate": ".learn.crossval",
    "Frontier": ".learn.frontier",
    "frontier": ".learn.frontier",
    "FitResult": ".learn.gradient",
    "fit_dictionary": ".learn.gradient",
    "Problem": ".problem",
    "RelaxationResult": ".relax.cones",
    "relax": ".relax",  # the subpackage, callable as relax.cones.relax (widelimit/relax/__init__.py)
    "CPFactorization": ".relax.cpfactor",
    "RefinedSolution": ".relax.cpfactor",
    "factorize_cp": ".relax.cpfactor",
    "refine": ".relax.cpfactor",
    "DNNResult": ".relax.dnn",
    "solve_dnn": ".relax.dnn",
    "SandwichReport": ".relax.sandwich",
    "sandwich": ".relax.sandwich",
    "SAECertificate": ".sae.certify",
    "certify_sae": ".sae.certify",
    "load_sae": ".sae.formats",
    "SAE": ".sae.model",
}
_SUBPACKAGES = ("cli", "coding", "data", "engine", "exact", "finite", "lab", "learn", "plot", "problem", "relax", "sae")

__version__ = "0.2.0"

__all__ = [
    # the front door and the data
    "Problem", "open_activations", "ActivationSource", "DataError", "Progress", "datasets",
    # the exact wide limit
    "solve", "WideLimitSolution", "FiniteSolution", "verify", "Certificate",
    "huber_median", "geometric_median", "huber_value", "MedianResult",
    "sae_objective", "ObjectiveValue", "q_objective", "optimal_dictionary",
    "first_order_conditions", "Stationarity", "feature_stability", "FeatureStability",
    # codes for a fixed dictionary
    "optimal_codes", "CodingResult",
    # finite width: gradient solver
    "fit_dictionary", "FitResult", "crossvalidate", "CrossValidation", "frontier", "Frontier",
    # relaxations of the CP cone
    "relax", "RelaxationResult", "sandwich", "SandwichReport", "solve_dnn", "DNNResult",
    "factorize_cp", "CPFactorization", "refine", "RefinedSolution",
    # trained SAEs
    "load_sae", "SAE", "certify_sae", "SAECertificate",
]


def __getattr__(name):
    """Import a public name, or a subpackage, the first time it is used.

    ``import widelimit`` stays cheap (no numpy, torch or cvxpy), so ``python -m widelimit``
    starts fast and a Ctrl-C during start-up is caught by the command line's own handler."""
    if name in _LAZY:
        module = _importlib.import_module(_LAZY[name], __name__)
        value = module if module.__name__.endswith(f".{name}") and not hasattr(module, name) else getattr(module, name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'widelimit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .data import datasets  # noqa: F401  (wl.datasets: the built-in datasets)
    from .coding import CodingResult, optimal_codes
    from .data import ActivationSource, DataError, open_activations
    from .engine import Progress
    from .exact.certificate import Certificate, verify
    from .exact.median import MedianResult, geometric_median, huber_median, huber_value
    from .exact.objective import ObjectiveValue, optimal_dictionary, q_objective, sae_objective
    from .exact.solve import WideLimitSolution, solve
    from .exact.stability import FeatureStability, feature_stability
    from .finite import FiniteSolution
    from .exact.stationarity import Stationarity, first_order_conditions
    from .learn.crossval import CrossValidation, crossvalidate
    from .learn.frontier import Frontier, frontier
    from .learn.gradient import FitResult, fit_dictionary
    from .problem import Problem
    from . import relax
    from .relax.cones import RelaxationResult
    from .relax.cpfactor import CPFactorization, RefinedSolution, factorize_cp, refine
    from .relax.dnn import DNNResult, solve_dnn
    from .relax.sandwich import SandwichReport, sandwich
    from .sae.certify import SAECertificate, certify_sae
    from .sae.formats import load_sae
    from .sae.model import SAE
