r"""First-order conditions of the finite-width problem (theory.md §5), with margins.

For a triple ``(W, Z, b)`` with unit atoms and residuals ``r_i = x_i - b - z_i W``:

- codes (nonnegative-lasso KKT): ``<w_d, r_i> = lam`` where ``z_id > 0`` and
  ``<w_d, r_i> <= lam`` where ``z_id = 0``. The **margin** is
  ``lam - max_{z_id = 0} <w_d, r_i>``: how far the inactive features are from
  wanting to fire. A positive margin means strict complementarity: the support
  is stable under small perturbations of the data.
- atoms (tangent to the sphere): the gradient of ``L`` with respect to atom ``d`` on the
  unit sphere vanishes,

  .. math:: g_d = -\frac{2}{N}\sum_i z_{id}\,\big(r_i - \langle r_i, w_d\rangle w_d\big) = 0 ,

  the projection of :math:`\partial L/\partial w_d = -\frac2N\sum_i z_{id} r_i` on the tangent
  space at ``w_d``. Its norm ``||g_d||`` is the one tangent-gradient scale of the package:
  :func:`widelimit.certify_sae` reports the same quantity per feature (``tangent_grad_norm``).
- bias: ``sum_i r_i = 0`` (reported as ``||mean_i r_i||``, half the norm of
  :math:`\partial L/\partial b = -\frac2N\sum_i r_i`, the scale of every bias-stationarity
  number in the package: :class:`widelimit.Certificate`, :func:`widelimit.certify_sae`).

Rows of ``W`` that are not unit are normalised and their norms folded into the
codes (as in :func:`widelimit.sae_objective`). Everything is computed in
float64, one chunk of rows at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .._validation import row_norms
from .objective import _check_triple, residual_pass

__all__ = ["Stationarity", "first_order_conditions"]


@dataclass(frozen=True)
class Stationarity:
    """Residuals of theory.md §5's first-order conditions for one ``(W, Z, b)``.

    Attributes
    ----------
    code_active_error : float
        ``max |<w_d, r_i> - lam|`` over active codes ``z_id > 0`` (0 at a stationary point).
    code_margin : float
        ``lam - max <w_d, r_i>`` over inactive codes ``z_id = 0`` (``>= 0`` needed; ``> 0`` is strict).
        ``inf`` when every code is active.
    atom_residual : float
        Largest tangent-gradient norm ``max_d ||g_d||``,
        ``g_d = (2/N) sum_i z_id (r_i - <r_i, w_d> w_d)`` (module docstring).
    bias_residual : float
        ``||mean_i r_i||``.
    lam : float
    """

    code_active_error: float
    code_margin: float
    atom_residual: float
    bias_residual: float
    lam: float

    def holds(self, tol: float = 1e-8) -> bool:
        """All conditions hold to ``tol`` (relative to ``lam`` for the code conditions)."""
        return bool(self.code_active_error <= tol * self.lam and self.code_margin >= -tol * self.lam
                    and self.atom_residual <= tol and self.bias_residual <= tol)

    def as_dict(self) -> dict:
        return asdict(self)


def first_order_conditions(X, W, Z, b, *, lam) -> Stationarity:
    r"""Evaluate the first-order conditions of ``L(W, Z, b)`` (theory.md §5).

    Parameters
    ----------
    X : array (N, n)
    W : array (k, n)
        Atoms (rows; normalised here, norms folded into ``Z``).
    Z : array (N, k) or scipy.sparse
        Nonnegative codes.
    b : array (n,)
    lam : float

    Returns
    -------
    Stationarity
    """
    X, W, Z, b, lam = _check_triple(X, W, Z, b, lam)
    N, n = X.shape
    k = W.shape[0]
    norms = row_norms(W)  # float64 even for float32 atoms
    W64 = np.asarray(W, dtype=np.float64)
    Wu = np.divide(W64, norms[:, None], out=np.zeros_like(W64), where=norms[:, None] > 0)
    def chunk(E, s, Zc):
        out = [E.sum(axis=0), 0.0, -np.inf, np.zeros((k, n))]
        if k:
            Zc = Zc if isinstance(Zc, np.ndarray) else Zc.toarray()
            Zc = np.asarray(Zc, dtype=np.float64) * norms  # codes of the unit atoms
            C = E @ Wu.T  # <w_d, r_i>
            on = Zc > 0
            if on.any():
                out[1] = float(np.max(np.abs(C[on] - lam)))
            if (~on).any():
                out[2] = float(np.max(C[~on]))
            out[3] = Zc.T @ E
        return out

    def merge(a, c):
        return [a[0] + c[0], max(a[1], c[1]), max(a[2], c[2]), a[3] + c[3]]

    rsum, act_err, inact_max, EtZ = residual_pass(X, W, Z, b, chunk, merge, stage="first-order conditions")
    if k:
        tang = EtZ - np.einsum("dj,dj->d", EtZ, Wu)[:, None] * Wu
        atom_res = 2.0 * float(np.max(np.linalg.norm(tang, axis=1))) / N  # the tangent gradient's norm
    else:
        atom_res = 0.0
    return Stationarity(code_active_error=act_err, code_margin=float(lam - inact_max), atom_residual=atom_res,
                        bias_residual=float(np.linalg.norm(rsum / N)), lam=lam)
