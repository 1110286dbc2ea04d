r"""The medians' checkpoints: what is saved after every pass, and how a resume reads it without trusting it.

A checkpoint (:mod:`widelimit.engine.checkpoint`) holds the problem it belongs to, the data's
fingerprint, the current point ``b``, the weighted mean of the data with the bound ``e_mean`` on its
rounding error, the iteration's trajectory (iteration count, secant pairs, the (value, bound) history)
and the last bound. A file can be damaged or edited while its fingerprint still matches, so nothing in
it certifies (docs/theory.md §8.5):

* the lower bound is never read: the resume's own pass at ``b`` computes one from the data;
* the saved mean ``m_s`` is checked against the mean ``m_r`` that pass computes (error bound ``e_r``):
  since ``||m_r - m|| <= e_r`` for the exact mean ``m``, ``||m_s - m|| <= ||m_s - m_r|| + e_r``, which
  (rounded up) becomes ``e_mean`` unless the saved one is larger; a saved mean farther from ``m_r``
  than both bounds allow is refused;
* the trajectory only steers the iterations; it is checked for shape, finiteness and types, and every
  saved ``(value, bound)`` of the history for a bound at most the value (within its rounding error).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from ..engine.checkpoint import load_checkpoint
from .gap import InconsistentBound, check_consistent
from .median_bound import gamma, norm

__all__ = ["CKPT_VERSION", "load_problem_state", "saved_state", "verified_mean"]

CKPT_VERSION = 2


def load_problem_state(checkpoint, kind, lam, tol, xtol, max_iter, hess_rows, seed, N, n, w):
    """``(problem, state)``: the problem key saved with every checkpoint, and the saved state or ``None``.

    A checkpoint of another problem (data shape, ``lam``, weights, settings) is one ``ValueError``.
    """
    problem = {
        "version": CKPT_VERSION, "kind": kind, "lam": lam, "tol": tol, "xtol": xtol, "max_iter": max_iter,
        "hess_rows": hess_rows, "seed": seed, "shape": [N, n],
        "weights": None if w is None else hashlib.sha1(w.tobytes()).hexdigest(),
    }
    state = load_checkpoint(checkpoint)
    if state is not None and state[0].get("problem") != json.loads(json.dumps(problem)):
        raise ValueError(f"{checkpoint}: checkpoint of a different problem (data, lam, weights or "
                         "settings changed); delete it or choose another path")
    return problem, state


def _damaged(checkpoint, what: str) -> ValueError:
    return ValueError(f"{checkpoint}: damaged or edited checkpoint ({what}); delete it or choose another path")


def _count(meta, key) -> bool:
    v = meta.get(key)
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def saved_state(checkpoint, meta: dict, arr: dict, n: int, value_error) -> np.ndarray:
    """The saved point ``b``, after checking every saved field a resume reads (one ``ValueError`` otherwise).

    ``value_error(v)`` bounds the rounding error of a computed objective ``v`` (the history's values).
    """
    shapes = {"b": (n,), "mean": (n,)}
    for key, shape in shapes.items():
        if key not in arr or arr[key].shape != shape or not np.isfinite(arr[key]).all():
            raise _damaged(checkpoint, f"'{key}' is not {n} finite numbers")
    pairs = arr.get("pairs", np.zeros((0, 2, n)))
    if pairs.ndim != 3 or pairs.shape[1:] != (2, n) or not np.isfinite(pairs).all():
        raise _damaged(checkpoint, "'pairs' is not a finite array of secant pairs")
    hist = arr.get("history")
    if hist is None or hist.ndim != 2 or hist.shape[1] != 2 or not np.isfinite(hist).all():
        raise _damaged(checkpoint, "'history' is not a finite list of (value, bound) pairs")
    for i, (v, lb) in enumerate(hist.tolist()):
        try:
            check_consistent(v, value_error(v), lb, f"its history's value {i}")
        except InconsistentBound as e:
            raise _damaged(checkpoint, str(e)) from None
    if not (_count(meta, "it") and _count(meta, "passes") and isinstance(meta.get("small_step"), bool)):
        raise _damaged(checkpoint, "'it', 'passes' or 'small_step' is not a count or a flag")
    for key in ("prev_step", "e_mean"):
        v = meta.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise _damaged(checkpoint, f"'{key}' is not a finite number >= 0")
    return arr["b"]


def verified_mean(checkpoint, saved, saved_error, mean, error) -> tuple[np.ndarray, float]:
    """``(saved, e)``: the saved mean with a rigorous bound ``e`` on its error, checked against ``mean``.

    ``mean`` is the mean recomputed from the data, within ``error`` of the exact one. The saved mean is kept
    (so that a resumed run repeats the uninterrupted one's arithmetic) with the error bound
    ``max(saved_error, (||saved - mean|| + error)(1 + 2 gamma_{n+2}))``: the second term bounds its distance to
    the exact mean whatever the file says. A saved mean farther from ``mean`` than ``saved_error + error`` is
    not the mean of these data: refused.
    """
    n = mean.shape[0]
    dist = norm(saved - mean)
    bound = (dist + error) * (1.0 + 2.0 * gamma(n + 2))
    if dist * (1.0 - 2.0 * gamma(n + 2)) > (saved_error + error) * (1.0 + 2.0 * gamma(4)):
        raise _damaged(checkpoint, f"its saved mean of the data is {dist:.3g} from the mean of these data, more than "
                                   f"the {saved_error + error:.3g} rounding allows")
    return saved, max(float(saved_error), bound)
