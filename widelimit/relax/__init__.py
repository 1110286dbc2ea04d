"""Relaxations of the completely positive cone, and a benchmark family with a known optimum.

Calling the subpackage runs its main entry point, ``widelimit.relax(X, lam=..., cone=...)``
(:func:`widelimit.relax.cones.relax`), so that ``wl.relax`` is both the function people call
and the package ``import widelimit.relax.cones`` reaches. Modules: ``cones`` (the convex
Q-problem over a cone), ``dnn`` (a first-order DNN solver), ``sandwich`` (inner and outer
approximations side by side), ``cpfactor`` (CP factorisations of the solution), ``families``
and ``export`` (benchmark instances with a known optimum, in SDPA / CBF formats).
"""

from __future__ import annotations

import inspect as _inspect
import sys as _sys
import types as _types

from .cones import relax as _relax


class _CallableModule(_types.ModuleType):
    """The package ``widelimit.relax``, callable as :func:`widelimit.relax.cones.relax`."""

    __wrapped__ = staticmethod(_relax)  # inspect.unwrap(wl.relax) is the function
    __signature__ = _inspect.signature(_relax)

    def __call__(self, *args, **kwargs):
        return _relax(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
