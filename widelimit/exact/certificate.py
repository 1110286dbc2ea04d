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

from .._params import LAM, NONNEG, PROGRESS, TOL, ArrayLike, Boolean, Data, InstanceOf, PathLike, validate_params
from .._validation import check_code_block, check_codes, check_dictionary, check_vector, row_norms
from ..results import CertifiedResult, shared_dict, status_of
from .gap import allowed_gap, is_certified, relative_gap  # noqa: F401 (is_certified is documented here)
from .median import MedianResult, huber_median
from .median_pass import centered
from .objective import _matmul_rows, code_mass, huber_h
from ..engine import engine_for
from ..engine.fingerprint import mismatch_error
from ..engine.local import FloatOverflow, is_dask_array, raise_nonfinite, scratch
from .scaling import on_scaled_data, scale_median, unscale_certificate
from .median_bound import ETA, U, check_consistent, gamma, sum_depth

__all__ = ["Certificate", "verify", "is_certified", "relative_gap"]


@dataclass(frozen=True)
class Certificate(CertifiedResult):
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
        ``gap + rounding_error <= tol * max(value, tiny) + atol``: a proof under the
        floating-point model of docs/theory.md §8.
    tol, atol : float
    n_points, dim, width : int
    lam : float
    rounding_error : float
        Rigorous bound on ``|value - exact objective of the candidate|`` (``lower_bound`` is
        already lowered by its own rounding bound).
    fingerprint : str or None
        Content fingerprint of the data the certificate was computed on (the median's).
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
    rounding_error: float = 0.0
    fingerprint: str | None = None

    @property
    def status(self) -> str:
        """``"optimal"`` when certified, else ``"not_certified"`` (``"overflow"``: the value is not finite)."""
        return status_of(self.certified, self.value)

    n_iter = None  #: a certificate iterates nothing (its passes are its solver's)
    time_s = None  #: not measured (a certificate is one or two passes of a solve or verify)

    def as_dict(self) -> dict:
        """Plain-Python dict (JSON-serialisable): the shared fields and every field."""
        return {**shared_dict(self),
                **{k: (bool(v) if isinstance(v, (bool, np.bool_)) else v) for k, v in asdict(self).items()}}


def check_given_median(median, *, lam: float, n: int) -> None:
    """Refuse a median handed to :func:`widelimit.solve` / :func:`widelimit.verify` that is not the Huber median of
    this problem: another kind, another ``lam``, another dimension, point weights, or no data fingerprint (the
    fingerprint itself is compared with the data's in the first pass)."""
    if not isinstance(median, MedianResult) or median.kind != "huber" or median.lam != lam \
            or median.point.shape != (n,):
        got = (f"a {median.kind} median at lam={median.lam!r} of {median.point.size}-dimensional data"
               if isinstance(median, MedianResult) else type(median).__name__)
        raise ValueError(f"median: a Huber median at lam={lam!r} of {n}-dimensional data is needed, got {got}")
    if median.weighted:
        raise ValueError("median: computed with point weights, so it is the median of another problem; "
                         "recompute it with huber_median(X, lam=lam) and no weights")
    if median.fingerprint is None:
        raise ValueError("median carries no data fingerprint; recompute it with huber_median(X, lam=lam)")


def _cert_chunk(c, s, W, b, lam, norms, count, slot, n_multi, Zc):
    """The certificate's sums over one block of rows (a pure function of the block).

    Returns ``(sum ||e||^2, sum e, max ||e||^2, EtZ, sum h(||x - b||), comp_single)`` where, for
    sparse codes, ``EtZ`` holds ``E^T Z_d`` (unit atoms) only for atoms used by two or more
    points (``slot``) and ``comp_single`` settles atoms used by one point: ``z (1 - ||e||^2 / lam^2)``;
    for dense codes ``EtZ = E^T Z`` (k x n).
    """
    k, n = W.shape
    if k:
        check_code_block(Zc, s)  # dask blocks arrive unchecked: a bad code is named before it reaches a residual
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
        return rec, esum, emax, Zc.T @ E, hub, 0.0
    z = Zc.tocoo()
    c_row, c_col, c_val = z.row, z.col, z.data * norms[z.col]
    one = count[c_col] == 1
    q = np.sqrt(ee[c_row[one]]) / lam
    comp_single = float(np.sum(c_val[one] * (1.0 - q * q)))
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
    colsum = code_mass(Z, norms)  # ||Z_d||_1 for unit atoms
    if sparse:
        count = np.bincount(Z.indices, minlength=k) if k else np.zeros(0, dtype=np.int64)
        multi = np.flatnonzero(count > 1)
        slot = np.full(k, -1, dtype=np.int64)
        slot[multi] = np.arange(multi.size)
    else:
        count = slot = multi = None
    engine = engine_for(X, progress)
    engine.stage = "certificate"
    try:
        rec, esum, emax, EtZ, hub, comp_single = engine.reduce(
            _cert_chunk, _merge_cert, W, b, lam, norms, count, slot, 0 if multi is None else multi.size,
            extras=(Z,), fingerprint=median.fingerprint is not None)
    except FloatOverflow:
        if is_dask_array(Z):
            raise
        size = np.asarray(abs(Z) @ norms, dtype=np.float64).ravel()  # ||z_i W|| <= sum_j z_ij ||w_j||
        i = int(np.argmax(size))
        if not size[i] > 1e150:  # the data themselves (their own message)
            raise
        raise ValueError(f"Z, W: the candidate's reconstruction of row {i} is about {size[i]:.1e} (codes times atom "
                         "norms), so its squared residuals leave the float64 range; its objective has no "
                         "float64 value") from None
    if median.fingerprint is not None and engine.fingerprint != median.fingerprint:
        raise mismatch_error("median", median.fingerprint, engine.fingerprint)
    pen = 2.0 * lam * float(colsum.sum())
    if sparse:
        cs = colsum[multi]
        live = cs > 0
        comp_multi = float(np.sum(cs[live] - _sq_over_lam(EtZ[live], lam) / cs[live]))
        comp = (lam / N) * (comp_single + comp_multi)
    else:
        EtZ *= norms[:, None]
        live = colsum > 0
        comp = (lam / N) * float(np.sum(colsum[live] - _sq_over_lam(EtZ[live], lam) / colsum[live]))
    kmax = int(np.diff(Z.indptr).max()) if sparse and N else k
    return make_certificate(N, n, rec, pen, esum, emax, hub, comp, int(np.count_nonzero(colsum > 0)), lam, median,
                            tol, atol, depth=sum_depth(engine) + kmax)


def _sq_over_lam(E, lam) -> np.ndarray:
    """``||E_d||^2 / lam^2`` row by row, without forming ``lam^2`` (which under/overflows for extreme ``lam``)."""
    Q = E / lam
    return np.einsum("ij,ij->i", Q, Q)


def value_rounding(N, rec, pen, emax, hub, lam, depth) -> float:
    r"""Rigorous bound on ``|value - exact objective|`` of a candidate whose sums were computed in float64.

    With ``gamma = gamma_depth`` (docs/theory.md §8), each residual ``e_i = x_i - b - z_i W``
    is computed to within ``gamma (r_i + sum_d z_id ||w_d||)`` in norm, so
    ``|fl(||e_i||^2) - ||e_i||^2| <= gamma ||e_i||^2 + 2 ||e_i|| delta_i + delta_i^2``; summed with
    ``sum_i r_i <= sqrt(N hub) + hub / lam`` (``r <= sqrt(h(r))`` for ``r <= lam``, else
    ``r <= h(r) / lam``) and ``sum_i sum_d z_id ||w_d|| = pen / (2 lam)``.
    """
    g = gamma(depth)
    T = float(np.sqrt(N * max(hub, 0.0))) + hub / lam + pen / (2.0 * lam)
    err = 2.0 * g * (rec + pen) + 4.0 * g * float(np.sqrt(emax)) * T + 4.0 * g * g * T * T + 8.0 * g * hub
    err += 16.0 * N * depth * ETA * (1.0 + T)  # underflow of the products (subnormal sums are exact)
    return err / N + 2.0 * U * (rec + pen) / N


def make_certificate(N, n, rec, pen, esum, emax, hub, comp, width, lam, median: MedianResult, tol, atol, *,
                     depth: int) -> Certificate:
    """The :class:`Certificate` from a candidate's sums over the data.

    ``rec = sum ||e_i||^2``, ``pen = 2 lam sum_d ||Z_d||_1`` (unit atoms), ``esum = sum e_i``,
    ``emax = max ||e_i||^2``, ``hub = sum h(||x_i - b||)`` and ``comp = <G, Q>``; ``median``
    supplies the global lower bound; ``depth`` bounds the roundings of the sums
    (:func:`widelimit.exact.median_bound.sum_depth` plus the atoms per point).

    Raises
    ------
    InconsistentBound
        If the objective lies below the lower bound by more than its rounding error: then
        the median is not of these data, and nothing is certified.
    """
    value = (rec + pen) / N
    lb = median.lower_bound
    err = value_rounding(N, rec, pen, emax, hub, lam, depth)
    check_consistent(value, err, lb, "the candidate's objective",
                     "; the median was computed on other data (or with another lam)")
    gap = value - lb
    q = float(np.sqrt(emax)) / lam
    return Certificate(
        value=value,
        reconstruction=rec / N,
        penalty=pen / N,
        lower_bound=lb,
        lower_bound_error=median.gap,
        lower_bound_at_bias=hub / N,
        gap=gap,
        rel_gap=relative_gap(gap, value),
        bias_stationarity=float(np.linalg.norm(esum / N)),
        dual_min=(lam / N) * (1.0 - q * q),
        complementarity=comp,
        max_residual_norm=float(np.sqrt(emax)),
        certified=is_certified(gap + err, value, tol=tol, atol=atol),
        tol=tol,
        atol=atol,
        n_points=N,
        dim=n,
        width=width,
        lam=lam,
        rounding_error=err,
        fingerprint=median.fingerprint,
    )


@validate_params({
    "X": Data(), "W": ArrayLike(), "Z": ArrayLike(), "b": ArrayLike(), "lam": LAM, "tol": TOL, "atol": NONNEG,
    "median": [InstanceOf(MedianResult, allowed="a MedianResult (widelimit.huber_median)"), None],
    "progress": PROGRESS, "checkpoint": [PathLike(), None], "signed": Boolean(),
})
def verify(X, W, Z, b, *, lam, tol: float = 1e-9, atol: float = 0.0, median: MedianResult | None = None,
           progress=None, checkpoint=None, signed: bool = False) -> Certificate:
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
        Nonnegative codes (any sign with ``signed=True``).
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
    signed : bool
        Signed codes (``z`` in R with penalty ``|z|``, as ``solve(signed=True)`` returns): certified as the
        nonnegative codes ``[Z+, Z-]`` of the dictionary ``[W; -W]``, which have the same objective
        (:func:`split_signed`); the lower bound is the same (theory.md §3).

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
    N, n = X.shape
    W = check_dictionary(W, n)
    Z = check_codes(Z, N, W.shape[0], nonneg=not signed)
    b = check_vector(b, n, "b")
    if signed:
        W, Z = split_signed(W, Z)
    return verify_checked(X, W, Z, b, lam=lam, tol=tol, atol=atol, median=median, progress=progress,
                          checkpoint=checkpoint)


def split_signed(W, Z):
    """Signed codes as nonnegative ones: ``([W; -W], [Z+, Z-])``, the same products ``Z W`` and the same
    penalty ``sum |z|``, so the certificate of the pair certifies the signed triple (theory.md §3)."""
    if sp.issparse(Z):
        pos, neg = Z.maximum(0), (-Z).maximum(0)
        return np.vstack([W, -W]), sp.hstack([pos, neg]).tocsr()
    if is_dask_array(Z):
        import dask.array as da

        return np.vstack([W, -W]), da.concatenate([Z.clip(0, None), (-Z).clip(0, None)], axis=1)
    return np.vstack([W, -W]), np.hstack([np.maximum(Z, 0.0), np.maximum(-Z, 0.0)])


def verify_checked(X, W, Z, b, *, lam, tol, atol=0.0, median=None, progress=None, checkpoint=None) -> Certificate:
    """:func:`verify` on checked arguments (nonnegative codes); for callers that checked them already."""
    if median is not None:
        check_given_median(median, lam=lam, n=X.shape[1])
    def run(Xf, lam_f, f):  # data far from unit magnitude: certified as f X (f an exact power of two)
        med = (huber_median(Xf, lam=lam_f, progress=progress, checkpoint=checkpoint) if median is None
               else median if f == 1.0 else scale_median(median, f, lam_f))
        if f == 1.0:
            return _certificate(X, W, Z, b, lam, med, tol, atol, progress)
        atol_f = min(atol * f * f, float(np.finfo(np.float64).max))
        return _certificate(Xf, W, Z * f, b * f, lam_f, med, tol, atol_f, progress)

    return on_scaled_data(X, lam, run, lambda cert, f: unscale_certificate(cert, f, lam, atol), one_blas=False)
