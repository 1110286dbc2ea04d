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

The per-feature quantities are computed by one kernel, shared by every user of these conditions:
:func:`code_conditions` (the code errors and margins of a chunk from its correlations ``<w_d, r_i>``),
:func:`first_order_chunk` (those, ``Z^T E`` and ``sum_i r_i`` of a chunk of residuals) and
:func:`tangent_norms` (``||g_d||`` from ``Z^T E``). :func:`first_order_conditions` reduces them to the
worst feature, :func:`widelimit.exact.stability.feature_stability` keeps them per feature, and
:func:`widelimit.certify_sae` accumulates them over its torch batches (the kernels take numpy arrays or
torch tensors).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from .._params import LAM, ArrayLike, validate_params
from .._validation import row_norms
from .objective import _check_triple, residual_pass

__all__ = ["Stationarity", "first_order_conditions", "code_conditions", "first_order_chunk", "tangent_norms"]


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
    atom_gradient : float
        Largest tangent-gradient norm ``max_d ||g_d||``,
        ``g_d = (2/N) sum_i z_id (r_i - <r_i, w_d> w_d)`` (module docstring).
    bias_residual : float
        ``||mean_i r_i||``.
    lam : float
    """

    code_active_error: float
    code_margin: float
    atom_gradient: float
    bias_residual: float
    lam: float

    def holds(self, tol: float = 1e-8) -> bool:
        """All conditions hold to ``tol`` (relative to ``lam`` for the code conditions)."""
        return bool(self.code_active_error <= tol * self.lam and self.code_margin >= -tol * self.lam
                    and self.atom_gradient <= tol and self.bias_residual <= tol)

    def as_dict(self) -> dict:
        return asdict(self)


def _is_torch(a) -> bool:
    return type(a).__module__.startswith("torch")


def code_conditions(C, rows, cols, lam):
    r"""Per feature, the code conditions of a chunk: ``(active_error, inactive_max)``, both ``(k,)``.

    ``active_error[d] = max |C_id - lam|`` over the active entries ``(rows, cols)`` of column ``d``
    (0 when there is none) and ``inactive_max[d] = max C_id`` over the other entries (``-inf`` when
    there is none); ``C`` (m, k) holds ``<w_d, r_i>``. numpy arrays or torch tensors; ``C`` is
    modified during the call and restored.
    """
    k = C.shape[1]
    cz = C[rows, cols]
    if _is_torch(C):
        import torch

        act = torch.zeros(k, dtype=C.dtype, device=C.device).scatter_reduce(0, cols, (cz - lam).abs(), reduce="amax")
        C[rows, cols] = -math.inf  # the active entries masked, then restored
        inact = C.amax(0) if C.shape[0] else torch.full((k,), -math.inf, dtype=C.dtype, device=C.device)
    else:
        act = np.zeros(k)
        np.maximum.at(act, cols, np.abs(cz - lam))
        C[rows, cols] = -np.inf
        inact = C.max(axis=0) if C.shape[0] else np.full(k, -np.inf)
    C[rows, cols] = cz
    return act, inact


def first_order_chunk(E, Zc, Wu, lam):
    """The first-order quantities of a chunk of residuals ``E`` (m, n) with codes ``Zc`` of the unit atoms ``Wu``.

    Returns a dict: ``C = E Wu^T`` (the correlations ``<w_d, r_i>``), the active entries ``rows``,
    ``cols`` of ``Zc``, the per-feature ``active_error`` and ``inactive_max`` of
    :func:`code_conditions`, ``EtZ = Zc^T E`` (k, n) and ``rsum = sum_i r_i`` (n,). numpy, float64.
    """
    C = E @ Wu.T
    if sp.issparse(Zc):
        Zo = sp.coo_array(Zc)
        keep = Zo.data > 0
        rows, cols = Zo.row[keep].astype(np.int64), Zo.col[keep].astype(np.int64)
    else:
        rows, cols = np.nonzero(np.asarray(Zc) > 0)
    act, inact = code_conditions(C, rows, cols, lam)
    return dict(C=C, rows=rows, cols=cols, active_error=act, inactive_max=inact, EtZ=np.asarray(Zc.T @ E),
                rsum=E.sum(axis=0))


#: Entries of ``Z^T E`` per block of :func:`tangent_norms` (2 MiB of float64: the block's temporaries stay in cache).
TANGENT_BLOCK = 1 << 18


def tangent_norms(EtZ, Wu):
    r"""``||g_d||`` with ``g_d = (Z^T E)_d - <(Z^T E)_d, w_d> w_d``: the atom gradient projected on the sphere's
    tangent space at ``w_d``, up to the factor ``-2/N`` (module docstring). numpy arrays or torch tensors.

    In blocks of rows (:data:`TANGENT_BLOCK` entries): the temporaries are a block, not ``d_sae x d_in``
    (three of them were 2.4 GB at 131,072 x 768 float64, and 3x slower out of cache); the same arithmetic per row.
    """
    k = EtZ.shape[0]
    step = max(1, TANGENT_BLOCK // max(1, EtZ.shape[1]))
    out = []
    for s in range(0, max(k, 1), step):
        e, w = EtZ[s : s + step], Wu[s : s + step]
        g = e - (e * w).sum(1)[:, None] * w
        out.append(((g * g).sum(1)) ** 0.5)
    if len(out) == 1:
        return out[0]
    if isinstance(out[0], np.ndarray):
        return np.concatenate(out)
    import torch

    return torch.cat(out)


@validate_params({"X": ArrayLike(), "W": ArrayLike(), "Z": ArrayLike(), "b": ArrayLike(), "lam": LAM})
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
        if not k:
            return [E.sum(axis=0), np.zeros(0), np.zeros(0), np.zeros((0, n))]
        Zc = Zc if isinstance(Zc, np.ndarray) else Zc.toarray()
        q = first_order_chunk(E, np.asarray(Zc, dtype=np.float64) * norms, Wu, lam)  # codes of the unit atoms
        return [q["rsum"], q["active_error"], q["inactive_max"], q["EtZ"]]

    def merge(a, c):
        return [a[0] + c[0], np.maximum(a[1], c[1]), np.maximum(a[2], c[2]), a[3] + c[3]]

    rsum, act_err, inact_max, EtZ = residual_pass(X, W, Z, b, chunk, merge, stage="first-order conditions")
    atom_res = 2.0 * float(tangent_norms(EtZ, Wu).max()) / N if k else 0.0
    return Stationarity(code_active_error=float(act_err.max(initial=0.0)),
                        code_margin=float(lam - inact_max.max(initial=-np.inf)), atom_gradient=atom_res,
                        bias_residual=float(np.linalg.norm(rsum / N)), lam=lam)
