r"""The accumulators of :func:`widelimit.sae.certify.certify_sae`: one per concern, batch by batch.

A certification is one pass over the tokens. Each batch becomes a :class:`Batch` (the
preprocessed tokens, float64), and every *part* of the pipeline reads it and adds to its own
sums:

====================  ===========================================================================
:class:`EncoderPart`  the SAE's own codes, their residuals ``r_i = x_i - b - z_i U`` and correlations
                      ``C = R U^T`` (put on the batch for the parts after it); the objective's sums
:class:`KKTPart`      first-order statistics at the SAE's codes (theory.md §5): the code conditions'
                      largest violations per feature, ``Z^T R`` (atom stationarity), firing counts,
                      ``sum_i r_i`` (bias stationarity), ``max_i ||r_i||``
:class:`PairPart`     co-firing counts of the decoder pairs the blocked search proposed
                      (:func:`widelimit.sae._pairs.decoder_pairs`): absorbed-looking features
:class:`CodingPart`   certified optimal codes of the SAE's decoder and bias (theory.md §8.6): their
                      objective, duality gaps, ``Z^T R`` at the optimal codes
:class:`MetricsPart`  SAELens / SAEBench reconstruction metrics (:mod:`widelimit.sae.metrics`)
====================  ===========================================================================

Every part has ``update(batch)``, ``merge(other)`` (associative: the partial sums of two row
ranges, in row order) and ``result() -> dict``. The driver (:func:`widelimit.sae.certify.run_parts`)
runs them in the order above on every batch of the data's engine: in this process
(arrays, memory maps, shard folders; the CPU or a GPU) or as one task per block on the
workers of a Dask cluster, whose partial parts are merged like the exact passes merge theirs.
A further concern (e.g. an L0 bracket of the encoder) is one more class with the same
three methods, added to the list :func:`default_parts` returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..coding import optimal_codes
from ..coding.cd import GramCoder
from ..coding.lasso import gap_floor
from ..coding.screened import ScreenedCoder, product_error
from ..exact.stationarity import code_conditions
from . import _kernels
from ._util import _DENSE_K, csr_pair, diag, finish_codes
from .metrics import ReconstructionStats
from .sparsity import SparsityPart

__all__ = ["Batch", "Setup", "EncoderPart", "KKTPart", "PairPart", "CodingPart", "MetricsPart", "default_parts",
           "coding_scale"]


#: Set bits of every byte (``np.bitwise_count`` needs numpy 2).
_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def coding_scale(P, lam):
    r"""The per-token objective scale a coding gap is compared with: ``max(P_i, gap_floor(lam))``.

    Relative to the token's own objective (:func:`widelimit.coding.lasso.gap_floor`; the former floor
    ``lam^2`` let a ``lam`` far above the data's scale pass the SAE's codes as optimal: theory.md §8.6).
    """
    return np.maximum(P, gap_floor(lam))


@dataclass
class Setup:
    """What every part needs about the SAE: unit atoms, norms, bias and the chosen backend (torch tensors on ``dev``)."""

    sae: object
    lam: float
    dev: object
    numba: bool  # sparse-code products in numba (CPU) instead of torch
    coding_algorithm: str
    coding_tol: float
    U: np.ndarray
    norms: np.ndarray
    b: np.ndarray
    Ut: object = None
    nt: object = None
    bt: object = None
    _coder: object = field(default=None, repr=False)
    _U32: object = field(default=None, repr=False)

    def __post_init__(self):
        self.tensors()

    def tensors(self):
        """Move the dictionary to ``dev`` (again after unpickling on a worker)."""
        import torch

        self.Ut = torch.as_tensor(self.U, device=self.dev)
        self.nt = torch.as_tensor(self.norms, device=self.dev)
        self.bt = torch.as_tensor(self.b, device=self.dev)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(Ut=None, nt=None, bt=None, _coder=None, _U32=None, dev=str(self.dev))  # rebuilt where it lands
        return state

    def __setstate__(self, state):
        import torch

        self.__dict__.update(state)
        self.dev = torch.device(self.dev)
        self.tensors()

    @property
    def k(self) -> int:
        return self.U.shape[0]

    @property
    def U32(self):
        """The unit atoms in float32 on ``dev``, made once: the screened coder's certificate products and the L0
        bracket's correlations share them (two copies were 1.2 GB at 65,536 x 2,304)."""
        import torch

        if self._U32 is None:
            self._U32 = self.Ut.to(torch.float32)
        return self._U32

    @property
    def coder(self):
        """The Gram coder (``"cd"``) or the screened coder (``"screened"``), made once where the setup lives."""
        if self._coder is None and self.coding_algorithm == "screened":
            self._coder = ScreenedCoder(self.U, lam=self.lam, tol=self.coding_tol, device=self.dev, U32=self.U32,
                                        numba=self.numba)
        if self._coder is None and self.coding_algorithm == "cd":
            # forms G = U U^T once (float64); float32 products (made exact) pay off for wide dictionaries
            self._coder = GramCoder(self.U, lam=self.lam, tol=self.coding_tol, fast_products=self.k > _DENSE_K)
        return self._coder


class Batch:
    """One batch of tokens and what the parts before a part computed on it (torch tensors on the device).

    Set by :class:`EncoderPart`: ``f`` (SAE activations), ``rows, cols`` (nonzeros), ``fv`` (their values),
    ``zv`` (codes on unit atoms), ``Y0`` (CSR codes, unit atoms), ``R`` (residuals), ``tok`` (per-token sums of
    :func:`widelimit.sae._kernels.residuals`), ``C`` (correlations ``R U^T``). Set by :class:`CodingPart`:
    ``Yo`` (optimal codes, CSR) and ``Ro`` (their residuals).
    """

    def __init__(self, start: int, raw, setup: Setup):
        import torch

        self.start = int(start)
        self.Xb = setup.sae.preprocess(np.asarray(raw, dtype=np.float64))
        self.m = self.Xb.shape[0]
        self.x = torch.as_tensor(self.Xb, device=setup.dev)
        self.xt = self.x - setup.bt
        self.sx = self.x.sum(0)
        self.f = self.rows = self.cols = self.fv = self.zv = self.Y0 = self.R = self.R0 = self.tok = self.C = None
        self.Zs = self.ZsT = None
        self.Yo = self.Ro = None


def _t(a):
    return a.cpu().numpy() if a is not None else None


class EncoderPart:
    """The SAE's own codes on a batch and the sums of its objective ``mean ||r_i||^2 + 2 lam sum_d z_id``."""

    def __init__(self, setup: Setup):
        self.s = setup
        self.rec = self.pen = self.l0 = self.l1 = 0.0
        self.sum_x2 = 0.0

    def update(self, bt: Batch) -> None:
        import torch

        s = self.s
        if not s.sae.has_encoder:
            self.sum_x2 += float((bt.x * bt.x).sum())
            return
        f = s.sae.encode(bt.x, device=s.dev)
        rows, cols = torch.nonzero(f, as_tuple=True)
        fv = f[rows, cols]
        zv = fv * s.nt[cols]  # codes on unit atoms
        bt.f, bt.rows, bt.cols, bt.fv, bt.zv = f, rows, cols, fv, zv
        m, k = bt.m, s.k
        if s.numba or s.coder is not None:
            bt.Y0 = sp.csr_array((_t(zv), (_t(rows), _t(cols))), shape=(m, k))
        if s.numba:  # sparse products in numba, O(L0 n) per token (widelimit.sae._kernels)
            bt.R0, tok = _kernels.residuals(bt.Xb, s.b, s.U, bt.Y0)
            bt.R, bt.tok = torch.from_numpy(bt.R0), torch.from_numpy(tok)
        else:
            if k <= _DENSE_K or rows.numel() > 0.1 * m * k:  # narrow or dense codes: BLAS products
                bt.Zs = f * s.nt
                bt.ZsT = bt.Zs.T
            else:
                bt.Zs, bt.ZsT = csr_pair(rows, cols, zv, m, k)
            bt.R = bt.xt - bt.Zs @ s.Ut
            bt.tok = _kernels.token_sums(bt.x, bt.xt, bt.R)
        if s.coding_algorithm == "cd":  # (the Gram coder's workspace too)
            bt.C = bt.R @ s.Ut.T
        self.sum_x2 += float(bt.tok[:, 0].sum())
        self.rec += float(bt.tok[:, 3].sum())
        self.pen += float(zv.sum())
        self.l0 += float(rows.numel())
        self.l1 += float(fv.sum())

    def merge(self, other: "EncoderPart") -> "EncoderPart":
        for a in ("rec", "pen", "l0", "l1", "sum_x2"):
            setattr(self, a, getattr(self, a) + getattr(other, a))
        return self

    def result(self) -> dict:
        return {"rec": self.rec, "pen": self.pen, "l0": self.l0, "l1": self.l1, "sum_x2": self.sum_x2}


class _Firing:
    """Per-feature firing counts and code sums, ``sum_i r_i`` and ``max_i ||r_i||`` of one set of codes."""

    def __init__(self, setup: Setup):
        import torch

        f64 = dict(dtype=torch.float64, device=setup.dev)
        k, n = setup.U.shape
        self.count = torch.zeros(k, **f64)
        self.code_sum = torch.zeros(k, **f64)
        self.sum_r = torch.zeros(n, **f64)
        self.max_rn = 0.0
        self.l0 = 0.0

    def add(self, cols, vals, R, max_rn: float) -> None:
        import torch

        k = self.count.shape[0]
        self.count += torch.bincount(cols, minlength=k).to(torch.float64)
        self.code_sum += torch.bincount(cols, weights=vals, minlength=k)
        self.l0 += float(cols.numel())
        self.sum_r += R.sum(0)
        self.max_rn = max(self.max_rn, max_rn)

    def merge(self, o: "_Firing") -> None:
        self.count += o.count.to(self.count.device)
        self.code_sum += o.code_sum.to(self.count.device)
        self.sum_r += o.sum_r.to(self.count.device)
        self.max_rn = max(self.max_rn, o.max_rn)
        self.l0 += o.l0


def code_conditions_f32(R, rows, cols, U64, U32, lam, numba=None):
    r""":func:`widelimit.exact.stationarity.code_conditions` of ``C = R U^T`` from one float32 product, exact to
    float64 rounding: the active entries in float64 (``O(L0 n)`` per token), and per column every inactive
    entry that could be the maximum recomputed in float64. With ``e_i`` the float32 error bound of row ``i``
    (:func:`widelimit.coding.screened.product_error`) and ``E = max_i e_i``, the column's float32 maximum
    ``m_d`` is within ``E`` of a true entry, so no entry below ``m_d - 2 E`` in float32 can be the true maximum.
    Half the multiply-add cost of the float64 product and half its memory (theory.md §5, §8.6). ``numba`` (default:
    ``R`` on the CPU; ``False``: the torch code a GPU runs) recomputes the entries by a loop each."""
    import torch

    k = U64.shape[0]

    def entry_dots(r_, d_):  # <r_i, u_d> at (r_, d_), float64: on the CPU a loop per entry, no gathered copies
        if R.device.type == "cpu" if numba is None else numba:
            return torch.from_numpy(_kernels.entry_dots(R.numpy(), U64.numpy(), r_.numpy(), d_.numpy()))
        return (R[r_] * U64[d_]).sum(1)

    cz = entry_dots(rows, cols)
    act = torch.zeros(k, dtype=R.dtype, device=R.device).scatter_reduce(0, cols, (cz - lam).abs(), reduce="amax")
    inact = torch.full((k,), -math.inf, dtype=R.dtype, device=R.device)
    if not R.shape[0]:
        return act, inact
    C32 = R.to(torch.float32) @ U32.T
    C32[rows, cols] = -math.inf
    m32 = C32.amax(0).to(torch.float64)
    thr = m32 - 2.0 * float(product_error(R).max()) * 1.001 - 1e-300
    thr32 = thr.to(torch.float32).nextafter(torch.tensor(-math.inf, dtype=torch.float32, device=R.device))
    ri, di = torch.nonzero((C32 >= thr32) & (C32 > -math.inf), as_tuple=True)  # (not the masked active entries)
    del C32
    # in chunks of 128 MiB of gathered rows: a column of ties (a dead feature's zero decoder row: all its
    # correlations are 0) makes every token a candidate
    step = max(1, (1 << 24) // R.shape[1])
    for c0 in range(0, ri.numel(), step):
        r_, d_ = ri[c0 : c0 + step], di[c0 : c0 + step]
        inact.scatter_reduce_(0, d_, entry_dots(r_, d_), reduce="amax")
    return act, inact


class KKTPart:
    """First-order statistics at the SAE's codes (theory.md §5): code conditions, ``Z^T R``, firing counts."""

    def __init__(self, setup: Setup):
        import torch

        self.s = setup
        f64 = dict(dtype=torch.float64, device=setup.dev)
        k, n = setup.U.shape
        self.viol_on = torch.zeros(k, **f64)
        self.viol_off = torch.zeros(k, **f64)
        self.ZR = torch.zeros(k, n, **f64) if setup.sae.has_encoder else None
        self.firing = _Firing(setup)

    def update(self, bt: Batch) -> None:
        import torch

        s, lam = self.s, self.s.lam
        if not s.sae.has_encoder:
            return
        if s.numba:
            _kernels.add_codes_t_residuals(bt.Y0, bt.R0, self.ZR.numpy())
        else:
            self.ZR += bt.ZsT @ bt.R
        if bt.C is not None:
            on_err, off_max = code_conditions(bt.C, bt.rows, bt.cols, lam)  # the first-order kernel (exact/stationarity)
        else:
            on_err, off_max = code_conditions_f32(bt.R, bt.rows, bt.cols, s.Ut, s.U32, lam, numba=s.numba)
        self.viol_on = torch.maximum(self.viol_on, on_err)
        self.viol_off = torch.maximum(self.viol_off, torch.relu(off_max - lam))
        self.firing.add(bt.cols, bt.zv, bt.R, math.sqrt(float(bt.tok[:, 3].max())))

    def merge(self, other: "KKTPart") -> "KKTPart":
        import torch

        self.viol_on = torch.maximum(self.viol_on, other.viol_on.to(self.viol_on.device))
        self.viol_off = torch.maximum(self.viol_off, other.viol_off.to(self.viol_off.device))
        if self.ZR is not None:
            self.ZR += other.ZR.to(self.ZR.device)
        self.firing.merge(other.firing)
        return self

    def result(self) -> dict:
        return {"viol_on": _t(self.viol_on), "viol_off": _t(self.viol_off), "ZR": self.ZR, "firing": self.firing}


class PairPart:
    """Co-firing counts ``|fire(a) & fire(b)|`` of the candidate pairs ``(a, b)`` (absorbed-looking features)."""

    def __init__(self, setup: Setup, qa, qb):
        import torch

        self.s = setup
        self.qa = torch.as_tensor(np.asarray(qa, dtype=np.int64), device=setup.dev)
        self.qb = torch.as_tensor(np.asarray(qb, dtype=np.int64), device=setup.dev)
        self.co = torch.zeros(self.qa.numel(), dtype=torch.float64, device=setup.dev)

    def update(self, bt: Batch) -> None:
        import torch

        if not self.qa.numel() or bt.f is None:
            return
        act = bt.f > 0
        if act.device.type == "cpu":  # the tokens as bits: a pair's count is the popcount of an AND (8x fewer bytes
            # gathered than the bool columns; 6.3 s -> 0.2 s for 200,000 pairs x 2,000 tokens at d_sae 16,384)
            bits = np.packbits(act.numpy().T, axis=1)  # (d_sae, ceil(m / 8)) uint8
            if hasattr(np, "bitwise_count"):  # numpy >= 2: 64 tokens a word, the processor's popcount
                bits = np.ascontiguousarray(np.pad(bits, ((0, 0), (0, -bits.shape[1] % 8)))).view(np.uint64)
            qa, qb = self.qa.numpy(), self.qb.numpy()
            for c0 in range(0, qa.size, 1 << 14):
                ia, ib = qa[c0 : c0 + (1 << 14)], qb[c0 : c0 + (1 << 14)]
                both = bits[ia] & bits[ib]
                cnt = np.bitwise_count(both) if hasattr(np, "bitwise_count") else _POPCOUNT8[both]
                self.co[c0 : c0 + ia.size] += torch.as_tensor(cnt.sum(1, dtype=np.int64), dtype=torch.float64)
            return
        for c0 in range(0, self.qa.numel(), 1 << 14):
            ia, ib = self.qa[c0 : c0 + (1 << 14)], self.qb[c0 : c0 + (1 << 14)]
            self.co[c0 : c0 + ia.numel()] += (act[:, ia] & act[:, ib]).sum(0).to(torch.float64)

    def merge(self, other: "PairPart") -> "PairPart":
        self.co += other.co.to(self.co.device)
        return self

    def result(self) -> dict:
        return {"co": _t(self.co)}


class CodingPart:
    """Certified optimal codes of the SAE's decoder and bias per batch (theory.md §8.6) and their sums."""

    def __init__(self, setup: Setup, diagnostics: bool = True, keep_codes: bool = False):
        import torch

        self.s = setup
        self.val = self.gap = self.max_gap = 0.0
        self.converged = True
        self.n_iter = 0
        self.ZRo = torch.zeros(setup.k, setup.U.shape[1], dtype=torch.float64, device=setup.dev) \
            if diagnostics else None
        self.keep_codes = bool(keep_codes)
        self.codes: list = []
        self.firing = None if setup.sae.has_encoder else _Firing(setup)  # decoder-only: stats of the optimal codes

    def _solve(self, bt: Batch):
        """Optimal codes of the batch: ``(P, gap, codes (CSR, unit atoms), residuals (tensor), iterations)``."""
        import torch

        s = self.s
        coder = s.coder
        if coder is not None:
            if s.coding_algorithm == "screened":
                # from zero codes, not the SAE's: its support is often far wider than the optimum's (a SAELens ReLU
                # SAE at d_sae 16,384: L0 150 against 8) and the restricted solves on it cost 4-12x more;
                # measured on every cell of benchmarks/certify_scale.py and certify_saelens16k.py
                res = coder.solve(bt.xt)
            else:  # (C and R0 are its workspace: R0 becomes the optimal codes' residuals)
                C0 = None if bt.C is None else bt.C.numpy()
                res = coder.solve(bt.xt.cpu().numpy(), bt.Y0, C0, R0=bt.R0, overwrite_c0=True)
            res = finish_codes(res, bt.Xb, s.U, s.b, s.lam, s.coding_tol)  # uncertified tokens: FISTA, float64
            return res.point_values, res.point_gaps, res.codes, torch.as_tensor(res.residuals, device=s.dev), \
                res.n_iter
        Z0 = None if bt.f is None else bt.f.cpu().numpy()
        res = optimal_codes(bt.Xb, s.sae.W_dec, s.b, lam=s.lam, algorithm=s.coding_algorithm, tol=s.coding_tol,
                            device=s.dev, Z0=Z0, return_codes=True)
        Yo = res.codes @ diag(s.norms)
        Ro = bt.xt - torch.as_tensor(Yo.toarray(), device=s.dev) @ s.Ut
        return res.point_values, res.point_gaps, Yo, Ro, res.n_iter

    def update(self, bt: Batch) -> None:
        import torch

        s = self.s
        P, gap_t, Yo, Ro, n_it = self._solve(bt)
        bt.Yo, bt.Ro = Yo, Ro
        if self.keep_codes:
            self.codes.append(sp.csr_array(Yo))
        self.val += float(np.sum(P))
        self.gap += float(np.sum(gap_t))
        self.max_gap = max(self.max_gap, float(np.max(gap_t)))
        self.converged = self.converged and bool(np.all(gap_t <= s.coding_tol * coding_scale(P, s.lam)))
        self.n_iter = max(self.n_iter, int(n_it))
        if self.ZRo is not None and s.numba:
            _kernels.add_codes_t_residuals(Yo, Ro.numpy(), self.ZRo.numpy())
        if (self.ZRo is not None and not s.numba) or self.firing is not None:  # diagnostics at the optimal codes
            Yc = Yo.tocoo()
            ro = torch.as_tensor(Yc.row.astype(np.int64), device=s.dev)
            cl = torch.as_tensor(Yc.col.astype(np.int64), device=s.dev)
            yv = torch.as_tensor(Yc.data, device=s.dev)
            if s.k <= _DENSE_K:
                YsT = torch.as_tensor(Yo.toarray(), device=s.dev).T
            else:
                _, YsT = csr_pair(ro, cl, yv, bt.m, s.k)
            if self.ZRo is not None and not s.numba:
                self.ZRo += YsT @ Ro
            if self.firing is not None:
                self.firing.add(cl, yv, Ro, float(torch.linalg.norm(Ro, dim=1).max()))

    def merge(self, other: "CodingPart") -> "CodingPart":
        self.val += other.val
        self.gap += other.gap
        self.max_gap = max(self.max_gap, other.max_gap)
        self.converged = self.converged and other.converged
        self.n_iter = max(self.n_iter, other.n_iter)
        if self.ZRo is not None:
            self.ZRo += other.ZRo.to(self.ZRo.device)
        self.codes += other.codes
        if self.firing is not None:
            self.firing.merge(other.firing)
        return self

    def result(self) -> dict:
        return {"value": self.val, "gap": self.gap, "max_gap": self.max_gap, "converged": self.converged,
                "n_iter": self.n_iter, "ZRo": self.ZRo, "codes": self.codes, "firing": self.firing}


class MetricsPart:
    """SAELens / SAEBench reconstruction metrics of the SAE's codes and of the optimal codes."""

    def __init__(self, setup: Setup):
        import torch

        self.s = setup
        self.stats = ReconstructionStats(setup.k)
        self.sum_x = torch.zeros(setup.U.shape[1], dtype=torch.float64, device=setup.dev)

    def update(self, bt: Batch) -> None:
        self.sum_x += bt.sx
        if bt.tok is not None:
            self.stats.update(bt.sx, bt.tok, bt.cols, bt.fv, x=bt.x)
        if bt.Ro is not None:
            self.stats.update_optimal(bt.m, float((bt.Ro * bt.Ro).sum()) / bt.m, bt.Yo.nnz)

    def merge(self, other: "MetricsPart") -> "MetricsPart":
        self.stats.merge(other.stats)
        self.sum_x += other.sum_x.to(self.sum_x.device)
        return self

    def result(self) -> dict:
        return {"stats": self.stats.result(), "sum_x": _t(self.sum_x)}


def default_parts(setup: Setup, coding, pairs, sparsity=None) -> dict:
    """The parts of a certification, in the order they run on a batch (a dict: name -> part).

    ``coding``: :class:`widelimit.sae.options.CodingOptions` (``None``: no L1 objective, no optimal coding);
    ``pairs``: the absorption candidates ``(qa, qb)``; ``sparsity``:
    :class:`widelimit.sae.sparsity.SparsityOptions` of the bracket at the SAE's own L0 (last: it measures
    the time the others take between its updates, its default time budget).
    """
    parts = {"encoder": EncoderPart(setup), "kkt": KKTPart(setup), "pairs": PairPart(setup, *pairs)}
    if coding is not None:
        parts["coding"] = CodingPart(setup, coding.optimal_codes_diagnostics, coding.keep_codes)
    parts["metrics"] = MetricsPart(setup)
    if sparsity is not None and sparsity.enabled and setup.sae.has_encoder:
        parts["sparsity"] = SparsityPart(setup, sparsity, own_objective=coding is None)
    return parts
