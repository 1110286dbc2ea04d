"""Reproducible experiments, run by name from the CLI (``widelimit experiment NAME``).

An experiment is a function ``run(out_dir: Path | None, quick: bool = False) -> dict``
registered with :func:`register`. It writes its PNG plots and a JSON of its
numbers into ``out_dir`` (when given) and returns the numbers. Each experiment
module registers itself on import; :data:`MODULES` lists them.
"""

from __future__ import annotations

import importlib
from typing import Callable

__all__ = ["register", "get", "names", "MODULES"]

_REGISTRY: dict[str, Callable] = {}
_DOCS: dict[str, str] = {}

#: Experiment modules (imported lazily by :func:`names` / :func:`get`).
MODULES: list[str] = ["antipodal", "exclusive", "rays", "absorption", "splitting", "superposition", "minilm_sae",
                     "stability", "finite_width", "spurious_width", "trained_predictions", "sup_ltilde"]


def register(name: str, doc: str = ""):
    """Decorator: make ``fn`` runnable as ``widelimit experiment <name>``."""

    def deco(fn):
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"experiment {name!r} registered twice")
        _REGISTRY[name] = fn
        _DOCS[name] = doc or (fn.__doc__ or "").strip().splitlines()[0] if (doc or fn.__doc__) else ""
        return fn

    return deco


def _load_all():
    for m in MODULES:
        importlib.import_module(f"{__name__}.{m}")


def names() -> dict[str, str]:
    """Registered experiment names with their one-line descriptions."""
    _load_all()
    return dict(sorted(_DOCS.items()))


def get(name: str) -> Callable:
    """The experiment function registered as ``name``."""
    _load_all()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none yet"
        raise ValueError(f"unknown experiment {name!r}; available: {known}")
    return _REGISTRY[name]
