"""A dictionary of the same width as a given one, from the gradient solver (issue 15, part 4).

With the wide-limit lower bound (theory.md §3) it brackets what a dictionary of that width can
reach: ``lower_bound <= best at width k <= min(value_given, value_found)``.
"""

from __future__ import annotations

import numpy as np

from ..coding.fista import fista_codes as optimal_codes
from .gradient import fit_dictionary

__all__ = ["same_width_witness"]


def same_width_witness(X, W, b, *, lam, max_iter: int = 200, device="cpu", seed: int = 0,
                       coding_tol: float = 1e-7) -> dict:
    """A dictionary of the same width as ``W`` with a lower objective, if the gradient solver finds one.

    Starts :func:`widelimit.fit_dictionary` at ``W`` (and bias ``b``) with free, certified
    optimal codes, and compares with the best objective ``W`` itself reaches with optimal codes.
    With the wide-limit bound this brackets what a dictionary of this width can reach:
    ``lower_bound <= best at width k <= min(value_W, value_found)``.

    Returns
    -------
    dict
        ``width``, ``value_given`` (``W``'s objective with optimal codes), ``value_found``,
        ``lower`` (``value_found < value_given``), ``message`` ("a dictionary of the same width
        reaches X" when lower), ``fit`` (the :class:`FitResult`).
    """
    X = np.asarray(X)
    W = np.asarray(W, dtype=np.float64)
    norms = np.linalg.norm(W, axis=1)
    Wu = W / np.where(norms > 0, norms, 1.0)[:, None]
    base = optimal_codes(X, Wu, b, lam=lam, tol=coding_tol, device=device)
    fit = fit_dictionary(X, lam=lam, width=W.shape[0], init=Wu, bias=np.asarray(b, dtype=np.float64), device=device,
                         seed=seed, max_iter=max_iter, coding_tol=coding_tol)
    # the fit's value is the float64 objective of (dictionary, certified optimal codes, bias)
    lower = bool(fit.value < base.value)
    msg = (f"a dictionary of the same width reaches {fit.value:.6g} (this one: {base.value:.6g} with optimal codes)"
           if lower else f"the gradient solver found nothing below {base.value:.6g} at this width")
    return {"width": int(W.shape[0]), "value_given": float(base.value), "value_found": float(fit.value),
            "lower": lower, "message": msg, "fit": fit}
