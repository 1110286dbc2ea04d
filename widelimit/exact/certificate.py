r"""Optimality certificates for the wide-limit problem, for any candidate (W, Z, b).

For every width, dictionary and code (theory.md §3),

.. math:: L(W, Z, b) \;\ge\; H(b) \;\ge\; \min_b H(b),

so a certified lower bound on ``min_b H`` (the dual bound of
:func:`widelimit.huber_median`) and the objective of the candidate bracket the
global optimum: ``gap = L(W, Z, b) - lower_bound`` bounds the candidate's
suboptimality over all widths.

The certificate also reports the Q-form dual quantities of theory.md §4. With
``E`` the candidate's residual ``X - b - Z W`` and the balanced codes
``Zb_d = Z_d / sqrt(||Z_d||_1)`` (so that ``Q = Zb Zb^T``, unit atoms), the
dual matrix of the Q-problem is

.. math:: G = \frac{\lambda}{N}\Big(\mathbf 1\mathbf 1^\top - \frac{E E^\top}{\lambda^2}\Big).

It is never formed: by Cauchy-Schwarz the largest entry of ``E E^T`` lies on
its diagonal, so ``min_ij G_ij = (lam/N)(1 - max_i ||e_i||^2 / lam^2)``
exactly, in O(N n); and ``<G, Q> = (lam/N) sum_d (||Z_d||_1 -
||E^T Z_d||^2 / (lam^2 ||Z_d||_1))`` in O(nnz(Z) n). At an optimum ``G >= 0``
entrywise and ``<G, Q> = 0``, which makes ``G`` dual feasible for every cone
between CP and the entrywise-nonnegative matrices (the DNN relaxation is tight).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from .._validation import check_lam, row_norms
from .median import MedianResult, centered, huber_median
from .objective import _check_triple, _matmul_rows, huber_h
from ..engine import engine_for
from ..engine.local import raise_nonfinite, scratch

__all__ = ["Certificate", "verify"]


@dataclass(frozen=True)
class Certificate:
    """What is known about a candidate (W, Z, b) relative to the global optimum.

    Attributes
    ----------
    value : float
        Objective of the candidate (an upper bound on the optimum).
    reconstruction, penalty : float
        The two parts of ``value``.
    lower_bound : float
        Certified lower bound on the optimum over all widths (the Huber dual bound).
    lower_bound_error : float
        Certified suboptimality of the Huber median behind ``lower_bound``
        (``H(b*) - lower_bound``): how far the bound may sit below ``min_b H``.
    lower_bound_at_bias : float
        ``H(b)`` at the candidate's own bias: the best any width can do with that bias.
    gap, rel_gap : float
        ``value - lower_bound`` and ``gap / value``.
    bias_stationarity : float
        ``||mean_i e_i||``: zero at a bias-optimal candidate (theory.md §5).
    dual_min : float
        Smallest entry of the dual matrix ``G`` (exact, via Cauchy-Schwarz). ``>= 0`` is required.
    complementarity : float
        ``<G, Q>`` with ``Q`` from the balanced codes; 0 at an optimum.
    max_residual_norm : float
        ``max_i ||e_i||``; ``dual_min >= 0`` iff this is ``<= lam``.
    certified : bool
        ``gap <= tol * max(value, tiny)`` (plus ``atol``).
    tol, atol : float
    n_points, dim, width : int
    lam : float
    """

    value: float
    reconstruction: float
    penalty: float
    lower_bound: float
    lower_bound_error: float
    lower_bound_at_bias: float
    gap: float
    rel_gap: float
    bias_stationarity: float
    dual_min: float
    complementarity: float
    max_residual_norm: float
    certified: bool
    tol: float
    atol: float
    n_points: int
    dim: int
    width: int
    lam: float

    def as_dict(self) -> dict:
        """Plain-Python dict (JSON-serialisable)."""
        return {k: (bool(v) if isinstance(v, (bool, np.bool_)) else v) for k, v in asdict(self).items()}


def _cert_chunk(c, s, W, b, lam, norms, count, slot, n_multi, Zc):
    """The certificate's sums over one block of rows (a pure function of the block).

    Returns ``(sum ||e||^2, sum e, max ||e||^2, EtZ, sum h(||x - b||), comp_single)`` where, for
    sparse codes, ``EtZ`` holds ``E^T Z_d`` (unit atoms) only for atoms used by two or more
    points (``slot``) and ``comp_single`` settles atoms used by one point: ``z (1 - ||e||^2 / lam^2)``;
    for dense codes ``EtZ = E^T Z`` (k x n).
    """
    k, n = W.shape
    D = centered(c, b, "a")
    hub = float(huber_h(np.sqrt(np.einsum("ij,ij->i", D, D)), lam=lam).sum())
    E = np.subtract(D, _matmul_rows(Zc, 0, c.shape[0], W), out=scratch(c.shape, "b")) if k else D
    ee = np.einsum("ij,ij->i", E, E)
    rec = float(ee.sum())
    if not (np.isfinite(rec) and np.isfinite(hub)):
        raise_nonfinite(c, s)
    esum, emax = E.sum(axis=0), float(ee.max())
    if not k:
        return rec, esum, emax, np.zeros((0, n)), hub, 0.0
    if isinstance(Zc, np.ndarray):
        if Zc.size and not (Zc.min() >= 0 and np.isfinite(Zc).all()):  # dask blocks arrive unchecked
            i = int(np.flatnonzero(~((Zc >= 0) & np.isfinite(Zc)).all(axis=1))[0])
            raise ValueError(f"Z must be finite and >= 0 (nonnegative codes); row {s + i} is not")
        return rec, esum, emax, Zc.T @ E, hub, 0.0
    z = Zc.tocoo()
    c_row, c_col, c_val = z.row, z.col, z.data * norms[z.col]
    one = count[c_col] == 1
    comp_single = float(np.sum(c_val[one] * (1.0 - ee[c_row[one]] / (lam * lam))))
    EtZ = np.zeros((n_multi, n))
    m = ~one
    if m.any():
        S = sp.csr_array((c_val[m], (slot[c_col[m]], c_row[m])), shape=(n_multi, c.shape[0]))
        EtZ += S @ E
    return rec, esum, emax, EtZ, hub, comp_single


def _merge_cert(p, q):
    return p[0] + q[0], p[1] + q[1], max(p[2], q[2]), p[3] + q[3], p[4] + q[4], p[5] + q[5]


def _certificate(X, W, Z, b, lam, median: MedianResult, tol: float, atol: float, progress=None) -> Certificate:
    """Certificate of a validated triple (one pass over X); ``median`` supplies the global bound.

    The pass is one reduction of :func:`_cert_chunk` (in-process for arrays and sources, on the
    workers for Dask). Memory: O(chunk) plus, for sparse codes, ``n`` floats per atom used by two
    or more points (atoms used by one point are settled point by point), plus ``k x n`` for dense codes.
    """
    N, n = X.shape
    k = W.shape[0]
    norms = row_norms(W)
    sparse = hasattr(Z, "tocoo")
    colsum = np.asarray(Z.sum(axis=0), dtype=np.float64).ravel() * norms  # ||Z_d||_1 for unit atoms
    if sparse:
        count = np.bincount(Z.indices, minlength=k) if k else np.zeros(0, dtype=np.int64)
        multi = np.flatnonzero(count > 1)
        slot = np.full(k, -1, dtype=np.int64)
        slot[multi] = np.arange(multi.size)
    else:
        count = slot = multi = None
    engine = engine_for(X, progress)
    engine.stage = "certificate"
    rec, esum, emax, EtZ, hub, comp_single = engine.reduce(
        _cert_chunk, _merge_cert, W, b, lam, norms, count, slot, 0 if multi is None else multi.size, extras=(Z,))
    pen = 2.0 * lam * float(colsum.sum())
    if sparse:
        cs = colsum[multi]
        live = cs > 0
        comp_multi = float(np.sum(cs[live] - np.einsum("ij,ij->i", EtZ[live], EtZ[live]) / (lam * lam * cs[live])))
        comp = (lam / N) * (comp_single + comp_multi)
    else:
        EtZ *= norms[:, None]
        live = colsum > 0
        comp = (lam / N) * float(
            np.sum(colsum[live] - np.einsum("ij,ij->i", EtZ[live], EtZ[live]) / (lam * lam * colsum[live]))
        )
    return make_certificate(N, n, rec, pen, esum, emax, hub, comp, int(np.count_nonzero(colsum > 0)), lam, median,
                            tol, atol)


def make_certificate(N, n, rec, pen, esum, emax, hub, comp, width, lam, median: MedianResult, tol, atol) -> Certificate:
    """The :class:`Certificate` from a candidate's sums over the data.

    ``rec = sum ||e_i||^2``, ``pen = 2 lam sum_d ||Z_d||_1`` (unit atoms), ``esum = sum e_i``,
    ``emax = max ||e_i||^2``, ``hub = sum h(||x_i - b||)`` and ``comp = <G, Q>``; ``median``
    supplies the global lower bound.
    """
    value = (rec + pen) / N
    lb = median.lower_bound
    gap = max(0.0, value - lb)
    return Certificate(
        value=value,
        reconstruction=rec / N,
        penalty=pen / N,
        lower_bound=lb,
        lower_bound_error=median.gap,
        lower_bound_at_bias=hub / N,
        gap=gap,
        rel_gap=gap / max(abs(value), 1e-300),
        bias_stationarity=float(np.linalg.norm(esum / N)),
        dual_min=(lam / N) * (1.0 - emax / (lam * lam)),
        complementarity=comp,
        max_residual_norm=float(np.sqrt(emax)),
        certified=bool(gap <= tol * max(abs(value), 1e-300) + atol),
        tol=tol,
        atol=atol,
        n_points=N,
        dim=n,
        width=width,
        lam=lam,
    )


def verify(X, W, Z, b, *, lam, tol: float = 1e-9, atol: float = 0.0, median: MedianResult | None = None,
           progress=None, checkpoint=None) -> Certificate:
    r"""Certify any candidate dictionary, codes and bias against the global optimum.

    Parameters
    ----------
    X : array (N, n)
        Data.
    lam : float
        Sparsity parameter ``lam > 0``.
    W : array (k, n)
        Dictionary; rows need not be unit norm (norms are folded into the codes,
        see :func:`widelimit.sae_objective`).
    Z : array (N, k) or scipy.sparse matrix
        Nonnegative codes.
    b : array (n,)
        Bias.
    tol : float
        Relative gap under which the candidate counts as certified optimal.
    atol : float
        Absolute slack added to ``tol * value``.
    median : MedianResult, optional
        A Huber median of ``X`` at the same ``lam`` (reused instead of recomputed).
    progress : callable, optional
        Receives :class:`widelimit.engine.local.Progress` events (median passes, then the certificate pass).
    checkpoint : str or Path, optional
        Checkpoint file of the Huber median (see :func:`widelimit.huber_median`).

    Returns
    -------
    Certificate
        ``value`` (objective), ``lower_bound`` (global), ``gap``, ``certified`` and the dual quantities.

    Notes
    -----
    ``X`` may be an :class:`~widelimit.data.source.ActivationSource` (streamed, memory
    independent of N) or a ``dask.array`` (:mod:`widelimit.engine.dask_engine`);
    ``Z`` is then an in-memory dense or scipy.sparse array, or for Dask a
    ``dask.array`` with the same row chunks as ``X``. Cost: the median's
    passes plus one.
    """
    X, W, Z, b, lam = _check_triple(X, W, Z, b, lam)
    if median is None:
        median = huber_median(X, lam=lam, progress=progress, checkpoint=checkpoint)
    elif median.kind != "huber" or median.lam != check_lam(lam):
        raise ValueError("median must be a Huber median computed with the same lam")
    return _certificate(X, W, Z, b, lam, median, float(tol), float(atol), progress)
