"""Helpers of :func:`widelimit.sae.certify.certify_sae`: the rounding tolerance, token sampling, sparse products."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._validation import to_numpy
from ..data.source import unmapped
import warnings
from ..coding.fista import finish_rows
from ..exact.stability import stability_rows

__all__ = ["violation_tolerance", "sample_rows", "csr_pair", "diag", "finish_codes", "Rows", "check_acts",
           "stability_columns"]


def violation_tolerance(lam: float, kkt_tol: float, scale, dtypes):
    r"""Threshold above which a first-order violation is real, not rounding (a float; an array for an array ``scale``).

    ``kkt_tol * lam + 8 * eps * scale`` with ``eps`` the machine epsilon of the
    coarsest storage dtype among ``dtypes`` (activations and SAE weights; float32:
    ``1.2e-7``, bfloat16: ``7.8e-3``) and ``scale`` the size of the quantity
    compared (``max_i ||x_i - b||`` for ``<u_d, r_i>``). A model trained in float32
    cannot meet a condition more tightly than its inputs are rounded.
    """
    eps = 0.0
    for dt in dtypes:
        try:
            eps = max(eps, float(np.finfo(np.dtype(str(dt).replace("torch.", "").replace("bfloat16", "float16"))).eps))
        except TypeError:
            continue
        if "bfloat16" in str(dt):
            eps = max(eps, 2.0 ** -7)
    out = kkt_tol * lam + 8.0 * eps * np.asarray(scale, dtype=np.float64)
    return float(out) if out.ndim == 0 else out


def sample_rows(acts, max_tokens: int, seed: int = 0):
    """``max_tokens`` rows drawn without replacement (sorted, reproducible from ``seed``), or ``acts`` if fewer."""
    N = int(acts.shape[0])
    if max_tokens is None or max_tokens >= N:
        return acts
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    idx = np.sort(np.random.default_rng(seed).choice(N, size=int(max_tokens), replace=False))
    return np.asarray(acts[idx])


#: Dictionaries up to this width use dense products for the codes (sparse ones cost more there).
_DENSE_K = 1024


def csr_pair(rows, cols, vals, m: int, k: int):
    """A sparse (m, k) matrix and its transpose as torch CSR tensors (for sparse x dense products)."""
    import torch

    dev = vals.device
    Z = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (m, k), device=dev, check_invariants=False)
    ZT = torch.sparse_coo_tensor(torch.stack([cols, rows]), vals, (k, m), device=dev, check_invariants=False)
    with warnings.catch_warnings():  # "sparse CSR support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return Z.coalesce().to_sparse_csr(), ZT.coalesce().to_sparse_csr()


def diag(v):
    return sp.diags(np.asarray(v, dtype=np.float64))


def finish_codes(res, Xb, U, b, lam: float, tol: float):
    """A :class:`~widelimit.coding.result.CodingResult` of the Gram coder with the tokens its rounds left
    uncertified re-solved by full-dictionary FISTA in float64, warm-started (``lam``, ``tol``: those of ``res``)."""
    return finish_rows(Xb, U, b, res, dtype="float64", max_iter=20000)


class Rows:
    """Row-sliceable view applying the SAE's per-token normalisation (float64); ``__array__`` converts all."""

    def __init__(self, acts, sae):
        self._a, self._sae = acts, sae
        self.shape = tuple(acts.shape)
        self.ndim = 2
        self.dtype = np.dtype(np.float64)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, idx):
        return self._sae.preprocess(np.asarray(self._a[idx], dtype=np.float64))

    def __array__(self, dtype=None, copy=None):
        out = np.empty(self.shape, dtype=np.float64)
        step = max(1, (1 << 24) // max(1, self.shape[1]))
        for s in range(0, self.shape[0], step):
            out[s : s + step] = self[s : s + step]
        return out if dtype is None else out.astype(dtype)


def check_acts(acts, sae):
    if hasattr(acts, "detach") and hasattr(acts, "cpu"):  # a torch tensor (any device, bf16 too)
        acts = to_numpy(acts, "activations")
    shape = getattr(acts, "shape", None)
    if shape is None:
        acts = np.asarray(acts)
        shape = acts.shape
    if len(shape) != 2:
        raise ValueError(f"activations must be 2-D (tokens, d_in), got shape {tuple(shape)}")
    if shape[0] == 0:
        raise ValueError("activations are empty (0 tokens)")
    if shape[1] != sae.d_in:
        raise ValueError(f"activations have d_in={shape[1]} but the SAE expects d_in={sae.d_in}")
    kind = np.dtype(getattr(acts, "dtype", np.float64)).kind
    if kind not in "fiu":
        raise ValueError(f"activations must be numeric, got dtype {acts.dtype}")
    return unmapped(acts)  # a memory map is read through its file: resident memory stays one batch


def stability_columns(X, U, codes, b, lam, max_witnesses, feats) -> dict:
    """Hook: :func:`widelimit.exact.stability.stability_rows` on the optimal codes, merged into ``feats``."""
    rows, summary = stability_rows(np.asarray(X), U, sp.vstack(codes).tocsr(), b, lam=lam,
                                   max_witnesses=max_witnesses)
    for col in rows[0]:
        if col == "feature":
            continue
        vals = [r[col] for r in rows]
        feats["stability_" + col] = (np.array(vals) if isinstance(vals[0], str)
                                     else np.array([np.nan if v is None else v for v in vals]))
    return summary
