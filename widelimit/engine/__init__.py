r"""Passes over the data: one engine per data object, made once and handed to every solver.

* :class:`~widelimit.engine.local.LocalEngine` -- NumPy arrays, memory maps and
  :class:`~widelimit.data.source.ActivationSource` (threaded, streamed);
* :class:`~widelimit.engine.dask_engine.DaskEngine` -- ``dask.array`` on a cluster;
* :mod:`~widelimit.engine.kernels` -- the fused numba kernels of the passes.

:func:`engine_for` returns the engine of a data object. It is made on first use and
kept for as long as the data object lives (a :class:`widelimit.Problem` makes it when
it is created), so the stages of one solve -- median, rays, dictionary, certificate --
share one engine (for Dask: one persisted array) instead of setting up a new one each.
"""

from __future__ import annotations

import weakref

from .dask_engine import DaskEngine
from .fingerprint import _keep, _none
from .local import LocalEngine, Progress, ProgressFn, ScaledRows, is_dask_array

__all__ = ["engine_for", "fingerprint_of", "LocalEngine", "DaskEngine", "Progress"]

_ENGINES: dict = {}  # id(data) -> (weakref to data, engine)


def _forget(key, engines=_ENGINES):
    engines.pop(key, None)


def engine_for(X, progress: ProgressFn | None = None):
    """The engine that runs passes over ``X`` (Dask for ``dask.array``, else local), bound to ``progress``.

    The engine is created once per data object and reused by every later call with
    the same object; each call gets a view with its own ``progress`` callback and pass
    counter.
    """
    key = id(X)
    hit = _ENGINES.get(key)
    engine = hit[1] if hit is not None and hit[0]() is X else None
    if engine is None:
        if isinstance(X, ScaledRows) and is_dask_array(X.base):  # a normalised dask array stays on the cluster
            engine = DaskEngine(X.base, scale=X.factor)
        else:
            engine = DaskEngine(X) if is_dask_array(X) else LocalEngine(X)
        try:
            _ENGINES[key] = (weakref.ref(X, lambda _r, k=key, forget=_forget: forget(k)), engine)
        except TypeError:  # not weak-referenceable: no reuse
            pass
    return engine.bind(progress)


def fingerprint_of(X) -> str:
    """The fingerprint of ``X`` by a pass of its own (use ``reduce(..., fingerprint=True)`` to get it for free)."""
    engine = engine_for(X)
    engine.reduce(_none, _keep, fingerprint=True, stage="fingerprint")
    return engine.fingerprint
