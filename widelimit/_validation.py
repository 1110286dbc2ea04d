"""Input validation and chunked float64 iteration, shared by every module.

One place for the checks users hit first: shapes, finiteness, ``lam``, weights.
Errors are :class:`ValueError` with a one-line message that names the argument
and, for non-finite data, the first offending row.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from .engine import engine_for
from .engine.dask_engine import known_chunks
from .engine.local import CHUNK_BYTES, chunk_rows, is_dask_array, raise_nonfinite  # noqa: F401  (re-exported)

#: The largest row norm accepted: ``sqrt(max float64) / u = 2^565`` (about 1.2e170, ``u = 2^-53``).
#: The solvers rescale data of extreme magnitude by a power of two (exact/scaling.py), so every
#: pass works in units where the data are about 1, and rows far above ``sqrt(max float64)`` (1.34e154)
#: are solved and certified where the objective itself fits in float64 (it is lam-dependent, checked on
#: the results). Beyond ``2^565`` even the rounding error of a row (``u`` times its norm: any
#: reconstruction of it is off by that much) squares past the float64 range, so no objective of such
#: data can be evaluated, whatever ``lam``.
SQUARE_LIMIT = 2.0**565
#: The smallest ``lam`` accepted: the smallest normal float64. The certificate's rounding bounds
#: (exact/median_bound.py, exact/certificate.py) are relative bounds ``gamma_K |value|``, which
#: do not hold for subnormal numbers (their absolute underflow term ``ETA = 2^-1075`` rounds to 0).
LAM_MIN = float(np.finfo(np.float64).tiny)


def to_numpy(a, name: str = "array") -> np.ndarray:
    """Return ``a`` as a NumPy array; torch tensors (any device, bf16 too) are accepted."""
    if a is None:
        raise ValueError(f"{name} is None")
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch.Tensor without importing torch
        t = a.detach().cpu()
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.numpy()
    if hasattr(a, "toarray") and not isinstance(a, np.ndarray):  # scipy.sparse
        return a
    if isinstance(a, np.ma.MaskedArray):  # its mask would be silently dropped by np.asarray
        mask = np.ma.getmaskarray(a)
        if mask.any():
            where = np.argwhere(mask)[0]
            at = f"row {int(where[0])}" if mask.ndim == 2 else f"index {tuple(int(i) for i in where)}"
            raise ValueError(f"{name} is a masked array with masked entries (first in {at}); "
                             "drop those rows or fill them (np.ma.filled) first")
        a = np.ma.getdata(a)
    arr = np.asarray(a)
    if arr.dtype == object:
        raise ValueError(f"{name} could not be converted to a numeric array")
    return arr


def _float_dtype(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype.kind == "b":
        return arr.astype(np.float64)
    if arr.dtype.kind in "iu":
        return exact_float64(arr, name)
    if arr.dtype.kind == "c":
        raise ValueError(f"{name} is complex; widelimit works with real data")
    if arr.dtype.kind != "f":
        raise ValueError(f"{name} has non-numeric dtype {arr.dtype}")
    if arr.dtype == np.float16:
        return arr.astype(np.float32)
    if arr.dtype not in (np.float32, np.float64):
        return exact_float64(arr, name)
    return arr


_EXACT_INT = 2**53  # every integer of magnitude up to 2^53 is a float64


def exact_float64(arr: np.ndarray, name: str) -> np.ndarray:
    """``arr`` (integers, or floats wider than float64 such as ``np.longdouble``) as float64, refused with a
    one-line ``ValueError`` naming the first entry that float64 does not hold exactly.

    A certificate speaks about the numbers it computed with: integers beyond ``2^53`` or long doubles
    rounded to float64 would make it speak about other data (``2^53`` and ``2^53 + 1`` become one point).
    """
    out = arr.astype(np.float64)
    if arr.size == 0:
        return out
    if arr.dtype.kind in "iu":
        big = np.flatnonzero((arr > _EXACT_INT).ravel() | ((arr < -_EXACT_INT).ravel() if arr.dtype.kind == "i"
                                                           else np.zeros(arr.size, dtype=bool)))
        flat, conv = arr.ravel(), out.ravel()
        bad = next((int(i) for i in big if int(conv[i]) != int(flat[i])), None) if big.size else None
    else:
        same = (out.astype(arr.dtype) == arr) | (np.isnan(arr) & np.isnan(out))
        bad = None if same.all() else int(np.flatnonzero(~same.ravel())[0])
    if bad is None:
        return out
    where = np.unravel_index(bad, arr.shape)
    at = f"row {where[0]}" + (f", column {where[1]}" if arr.ndim == 2 else "")
    raise ValueError(f"{name}: the {arr.dtype} value {arr.ravel()[bad]} at {at} is not exactly a float64 number "
                     "(widelimit computes and certifies in float64; integers are exact only up to 2^53): "
                     "round the data to float64 yourself, so that the certificate speaks about the data it used")


def refuse_bool(dtype, name: str) -> None:
    """Data of dtype bool are refused (like complex data): a mask is not a set of points."""
    if np.dtype(dtype).kind == "b":
        raise ValueError(f"{name} has dtype bool; widelimit needs floating point or integer data")


def bad_row(c) -> tuple[int, str, float] | None:
    """The first row of the 2-D chunk ``c`` that holds NaN / Inf or is too large to square, or ``None``.

    Returns ``(i, what, norm)`` with ``what`` one of ``"NaN"``, ``"Inf"``, ``"large"`` (a row whose
    Euclidean norm exceeds :data:`SQUARE_LIMIT`; ``norm`` is that norm, ``inf`` when it overflows).
    Two reductions per chunk when the chunk is fine (``max``, ``min``; NaN propagates through both).
    """
    if c.size == 0:
        return None
    m = max(float(c.max()), -float(c.min()))
    if not math.isfinite(m):
        ok = np.isfinite(c).all(axis=1)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            return i, ("NaN" if np.isnan(c[i]).any() else "Inf"), math.nan
        m = math.inf  # pragma: no cover - max/min of finite data are finite
    n = c.shape[1]
    if m * math.sqrt(n) <= SQUARE_LIMIT:
        return None
    amax = np.abs(c).max(axis=1).astype(np.float64)
    for i in np.flatnonzero(amax * math.sqrt(n) > SQUARE_LIMIT):
        q = np.asarray(c[i], dtype=np.float64) / amax[i]
        with np.errstate(over="ignore"):
            nrm = float(amax[i] * math.sqrt(float(q @ q)))
        if nrm > SQUARE_LIMIT:
            return int(i), "large", nrm
    return None


def too_large(norm: float) -> str:
    """Why a row :func:`bad_row` calls ``"large"`` is refused (the caller says which row)."""
    shown = f"{norm:.3g}" if math.isfinite(norm) else "above 1.8e+308"
    return (f"its norm is {shown}, above 2^565 = {SQUARE_LIMIT:.3g}, where even its float64 rounding error "
            "(2^-53 of it) squares past the float64 range, so no objective of it can be evaluated; rescale the data")


def _sample_rows(N: int) -> np.ndarray:
    """Up to 257 evenly spaced rows (the rows :func:`widelimit.exact.scaling.normaliser` reads)."""
    return np.unique(np.linspace(0, N - 1, min(N, 257)).astype(np.int64))


def check_magnitude_sample(X, name: str = "X") -> None:
    """Refuse data whose sampled rows are too large to square in float64 (random access, no pass).

    For data whose finiteness is checked in the first pass of the computation (``finite=False`` or a
    source): the rows :func:`~widelimit.exact.scaling.normaliser` reads anyway. A larger row that the
    sample misses shows in that pass, which rescales from every row.
    """
    N = int(X.shape[0])
    if N == 0 or is_dask_array(X):
        return
    idx = _sample_rows(N)
    try:
        S = np.asarray(X[idx])
    except (TypeError, IndexError, NotImplementedError):  # a row-wise wrapper without fancy indexing
        return
    S = S if S.dtype.kind == "f" else S.astype(np.float64)
    S = np.where(np.isfinite(S), S, 0.0)  # non-finite rows are the first pass's to report
    hit = bad_row(S)
    if hit is not None:
        row = int(idx[hit[0]])
        msg = getattr(X, "bad_row_message", None)  # a source names its file and row (or line) itself
        if msg is not None:
            raise ValueError(msg(row, "large", hit[2]))
        raise ValueError(f"{name} has values too large to square in float64 in row {row} (0-based): "
                         f"{too_large(hit[2])}")


def iter_chunks(X: np.ndarray, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, chunk)`` with ``chunk`` a float64 copy of ``X[start:start+rows]``."""
    N = X.shape[0]
    rows = rows or chunk_rows(X.shape[1] if X.ndim > 1 else 1)
    for s in range(0, N, rows):
        yield s, np.asarray(X[s : s + rows], dtype=np.float64)


def first_nonfinite_row(X: np.ndarray) -> int | None:
    """Index of the first row of ``X`` holding NaN or Inf, or ``None``; chunked, O(N n)."""
    if X.ndim == 1:
        bad = np.flatnonzero(~np.isfinite(X))
        return int(bad[0]) if bad.size else None
    rows = chunk_rows(X.shape[1])
    for s in range(0, X.shape[0], rows):
        ok = np.isfinite(X[s : s + rows]).all(axis=1)
        if not ok.all():
            return s + int(np.flatnonzero(~ok)[0])
    return None


def is_out_of_core(X) -> bool:
    """Whether ``X`` is read by row slices rather than converted to an array.

    True for :class:`~widelimit.data.source.ActivationSource`, ``dask.array`` and any other 2-D
    array-like with ``shape``, ``dtype`` and slicing that is not a NumPy array, a torch
    tensor or a scipy.sparse matrix (h5py / zarr arrays, row-wise wrappers).
    """

    if isinstance(X, np.ndarray) or hasattr(X, "detach") or hasattr(X, "toarray"):
        return False
    if is_dask_array(X):
        return True
    shape = getattr(X, "shape", None)
    return (shape is not None and len(shape) == 2 and hasattr(X, "dtype") and hasattr(X, "__getitem__")
            and not isinstance(X, (list, tuple)))


def _finite_chunk(c, s):

    if not np.isfinite(c).all():
        raise_nonfinite(c, s)
    return None


def _check_out_of_core(X, name: str, finite: bool | None):
    """Shape/dtype checks of an ActivationSource or a dask array, without reading it."""

    known_chunks(X, name)
    if len(X.shape) != 2:
        raise ValueError(f"{name} must be 2-D of shape (N points, n dims), got shape {tuple(X.shape)}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(X.shape)}")
    refuse_bool(X.dtype, name)
    kind = np.dtype(X.dtype).kind
    if kind not in "fiu":
        raise ValueError(f"{name} has non-numeric dtype {X.dtype}")
    if is_dask_array(X):
        if kind != "f" or X.dtype == np.float16:
            X = X.astype(np.float32 if X.dtype == np.float16 else np.float64)
        if len(X.chunks[1]) > 1:
            X = X.rechunk({1: -1})  # passes need whole rows
    if finite:  # chunkwise; otherwise the first pass of each computation checks
        engine_for(X).reduce(_finite_chunk, lambda a, b: None, stage="check")
    check_magnitude_sample(X, name)
    return X


def check_data(X, name: str = "X", *, finite: bool | None = None):
    """Validate a data matrix: 2-D ``(N, n)``, non-empty, finite; float32 kept, ints -> float64.

    Booleans are refused (floating point or integer data are needed), and so are rows whose norm
    is too large to square in float64 (above :data:`SQUARE_LIMIT`, about 1.2e170); rows are
    numbered from 0 in messages.

    float32 input is kept as float32 (no full-size copy); every computation
    reads it in float64 chunks.

    An :class:`~widelimit.data.source.ActivationSource` or a ``dask.array`` is checked
    without being read: shape and dtype now, finiteness (``finite=None``,
    the default) in the first pass of the computation that uses it, which
    names the first bad row (and its shard); ``finite=True`` checks it now,
    chunk by chunk. In-memory arrays are checked at once.
    """
    if is_out_of_core(X):
        return _check_out_of_core(X, name, finite)
    arr = to_numpy(X, name)
    if hasattr(arr, "toarray") and not isinstance(arr, np.ndarray):
        raise ValueError(f"{name} must be a dense array, got a sparse matrix")
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array of shape (N points, n dims), got ndim={arr.ndim} "
            f"with shape {arr.shape}"
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {arr.shape}")
    refuse_bool(arr.dtype, name)
    arr = _float_dtype(arr, name)
    if finite is False:  # the first pass checks every row; too large rows are caught from a sample here
        check_magnitude_sample(arr, name)
        return arr
    bad = first_bad_row(arr)
    if bad is not None:
        row, what, nrm = bad
        if what == "large":
            raise ValueError(f"{name} has values too large to square in float64 in row {row} (0-based): "
                             f"{too_large(nrm)}")
        raise ValueError(f"{name} has a non-finite value ({what}) in row {row} (0-based)")
    return arr


def first_bad_row(X: np.ndarray) -> tuple[int, str, float] | None:
    """:func:`bad_row` over all of ``X`` (2-D), chunk by chunk: ``(row, what, norm)`` or ``None``."""
    rows = chunk_rows(X.shape[1])
    for s in range(0, X.shape[0], rows):
        hit = bad_row(X[s : s + rows])
        if hit is not None:
            return s + hit[0], hit[1], hit[2]
    return None


def check_vector(v, n: int, name: str) -> np.ndarray:
    """Validate a finite float64 vector of length ``n``."""
    arr = _float_dtype(to_numpy(v, name), name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of length {n}, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} has length {arr.shape[0]} but the data has {n} dims")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} has a non-finite value at index {int(np.flatnonzero(~np.isfinite(arr))[0])}")
    return np.asarray(arr, dtype=np.float64)


def check_lam(lam) -> float:
    """Validate the sparsity parameter: a finite real number > 0 (not a bool, not a string)."""
    if isinstance(lam, (bool, np.bool_, str, bytes)):
        raise ValueError(f"lam must be a finite number > 0, got {shown(lam)}")
    try:
        if isinstance(lam, (int, float)):
            val = float(lam)
        else:
            a = to_numpy(lam, "lam")
            if getattr(a, "ndim", 1) != 0 or a.dtype.kind not in "iuf":
                raise TypeError
            val = float(a)
    except (TypeError, ValueError):
        raise ValueError(f"lam must be a finite number > 0, got {type(lam).__name__} {str(lam)[:60]!r}") from None
    if not math.isfinite(val) or val <= 0:
        raise ValueError(f"lam must be a finite number > 0, got {shown(val)}")
    if val < LAM_MIN:
        raise ValueError(f"lam must be at least {LAM_MIN!r} (the smallest normal float64; the certificate's "
                         f"rounding bounds do not hold for subnormal numbers), got {val!r}")
    return val


def check_tol(tol, name: str = "tol") -> float:
    """Validate a tolerance (``tol``, ``atol``, ...): a finite real number ``>= 0``.

    An infinite or NaN tolerance would certify anything; a negative one nothing. A bool or a
    string is not a number here (``tol=False``, ``tol="1e-6"`` are refused).
    """
    return check_real(tol, name, low=0)


def check_weights(weights, N: int) -> np.ndarray | None:
    """Validate point weights: shape ``(N,)``, finite, ``>= 0``, not all zero. ``None`` means 1."""
    if weights is None:
        return None
    w = _float_dtype(to_numpy(weights, "weights"), "weights")
    if w.ndim != 1 or w.shape[0] != N:
        raise ValueError(f"weights must have shape ({N},), got {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError(f"weights has a non-finite value at index {int(np.flatnonzero(~np.isfinite(w))[0])}")
    if (w < 0).any():
        raise ValueError(f"weights must be >= 0; weights[{int(np.flatnonzero(w < 0)[0])}] < 0")
    if not (w > 0).any():
        raise ValueError("weights are all zero")
    if not math.isfinite(float(np.sum(w, dtype=np.float64))):
        raise ValueError(f"weights: their sum overflows float64 (largest weight {float(w.max()):.3g}); divide them "
                         "by a common factor (the median does not change)")
    return np.asarray(w, dtype=np.float64)


def check_codes(Z, N: int, k: int, name: str = "Z", nonneg: bool = True):
    """Validate codes ``(N, k)``: dense float64 array or scipy sparse (kept sparse, CSR).

    A ``dask.array`` is checked for shape here and for sign and finiteness
    block by block in the pass that reads it.
    """

    if is_dask_array(Z):
        known_chunks(Z, name)
        if Z.ndim != 2 or tuple(Z.shape) != (N, k):
            raise ValueError(f"{name} has shape {tuple(Z.shape)}, expected (N, k) = ({N}, {k}) from X and W")
        return Z.astype(np.float64)
    Z = to_numpy(Z, name)
    if hasattr(Z, "tocsr") and not isinstance(Z, np.ndarray):
        Z = Z.tocsr().astype(np.float64)
        data = Z.data
    else:
        Z = _float_dtype(np.asarray(Z), name)
        if Z.ndim != 2:
            raise ValueError(f"{name} must be a 2-D array of shape (N, k), got shape {Z.shape}")
        Z = np.asarray(Z, dtype=np.float64)
        data = Z
    if Z.shape != (N, k):
        raise ValueError(f"{name} has shape {Z.shape}, expected (N, k) = ({N}, {k}) from X and W")
    if not np.isfinite(data).all():
        raise ValueError(f"{name} has non-finite values")
    if nonneg and data.size and data.min() < 0:
        if isinstance(Z, np.ndarray):
            i, d = np.argwhere(Z < 0)[0]
            raise ValueError(f"{name} must be >= 0 (nonnegative codes); {name}[{i}, {d}] = {Z[i, d]:.3g}")
        raise ValueError(f"{name} must be >= 0 (nonnegative codes)")
    return Z


def check_code_block(Zc, start: int, *, nonneg: bool = True, name: str = "Z") -> None:
    """The block-wise part of :func:`check_codes` for codes that arrive unchecked (``dask.array`` blocks).

    ``Zc`` holds the codes of rows ``start, start + 1, ...`` (dense or scipy.sparse). A NaN / Inf code (or a
    negative one with ``nonneg``) is one ``ValueError`` naming ``name`` and the row, before any product with it:
    a residual made non-finite by the codes would otherwise be blamed on the data.
    """
    if hasattr(Zc, "tocoo") and not isinstance(Zc, np.ndarray):
        z = Zc.tocoo()
        rows, data = np.asarray(z.row), np.asarray(z.data)
    else:
        data = np.asarray(Zc)
        rows = None
    if not data.size:
        return
    bad = ~np.isfinite(data)
    if nonneg:
        bad |= data < 0
    if not bad.any():
        return
    if rows is None:
        i, j = (int(v) for v in np.argwhere(bad)[0])
    else:
        k = int(np.flatnonzero(bad)[0])
        i, j = int(rows[k]), None
    v = data[i, j] if rows is None else data[k]
    what = ("finite and >= 0 (nonnegative codes)" if nonneg else "finite")
    at = f"{name}[{start + i}, {j}] = {v:.3g}" if j is not None else f"row {start + i} holds {v:.3g}"
    raise ValueError(f"{name} must be {what}; {at}")


def check_dictionary(W, n: int, name: str = "W") -> np.ndarray:
    """Validate a dictionary ``(k, n)`` (rows are atoms); k = 0 is allowed; float32 is kept."""
    W = _float_dtype(to_numpy(W, name), name)
    if W.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of shape (k atoms, n dims), got shape {W.shape}")
    if W.shape[1] != n:
        raise ValueError(f"{name} has {W.shape[1]} columns but the data has {n} dims")
    if not np.isfinite(W).all():
        raise ValueError(f"{name} has a non-finite value in row {int(np.flatnonzero(~np.isfinite(W).all(1))[0])}")
    return W  # float32 kept (no full-size copy); read in float64 by row_norms / per chunk


def row_norms(A: np.ndarray) -> np.ndarray:
    """Euclidean norms of the rows of ``A``, computed in float64 chunk by chunk.

    Rows whose squares under- or overflow (entries below about 1e-154 or above 1e154: a norm of 0 for a
    nonzero row, or inf for a finite one) are recomputed scaled by their largest entry.
    """
    out = np.empty(A.shape[0])
    rows = chunk_rows(A.shape[1] if A.ndim > 1 else 1)
    for s in range(0, A.shape[0], rows):
        c = np.asarray(A[s : s + rows], dtype=np.float64)
        r = np.sqrt(np.einsum("ij,ij->i", c, c))
        m = np.abs(c).max(axis=1) if c.size else np.zeros(c.shape[0])
        redo = ((r == 0) & (m > 0)) | (np.isinf(r) & np.isfinite(m)) | ((r > 0) & (r < 1e-150))
        if redo.any():
            cs = c[redo] / m[redo, None]
            r[redo] = m[redo] * np.sqrt(np.einsum("ij,ij->i", cs, cs))
        out[s : s + rows] = r
    return out


# --------------------------------------------------------------------------------------
# scalar options: one-line ValueErrors naming the parameter
# --------------------------------------------------------------------------------------


def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def shown(v) -> str:
    """A refused value as the messages show it: a number as itself (``-1``, ``2.5``, ``nan``), anything
    else with its type (``str 'abc'``, ``bool True``, ``NoneType None``)."""
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
        v = v.item() if isinstance(v, np.generic) else v
        s = _show(v)
        return s[:-2] if isinstance(v, float) and s.endswith(".0") else s
    return f"{type(v).__name__} {_show(v)}"


def interval_words(kind: str, low=None, high=None, *, low_strict: bool = False, high_strict: bool = False,
                   finite: bool = True) -> str:
    """What an interval option allows, in words: ``"an integer >= 0"``, ``"a finite number in (0, 1)"``.

    The one wording of :func:`check_int`, :func:`check_real` and :class:`widelimit._params.Interval`
    (so that a Python call and the command line say the same)."""
    what = "an integer" if kind == "int" else f"a{' finite' if finite else ''} number"
    fmt = (lambda x: f"{x}") if kind == "int" else (lambda x: f"{x:g}")
    if low is not None and high is not None:
        return f"{what} in {'(' if low_strict else '['}{fmt(low)}, {fmt(high)}{')' if high_strict else ']'}"
    if low is not None:
        return f"{what} {'>' if low_strict else '>='} {fmt(low)}"
    if high is not None:
        return f"{what} {'<' if high_strict else '<='} {fmt(high)}"
    return what


def check_int(v, name: str, *, low: int | None = None, high: int | None = None, none_ok: bool = False):
    """An integer option (Python or NumPy int, not a bool) in ``[low, high]``; ``None`` if ``none_ok``."""
    if v is None and none_ok:
        return None
    what = f"{name} must be {interval_words('int', low, high)}"
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{what}, got {shown(v)}")
    v = int(v)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{what}, got {v}")
    return v


def check_real(v, name: str, *, low: float | None = None, strict: bool = False, none_ok: bool = False,
               finite: bool = True, high: float | None = None, high_strict: bool = False):
    """A real option (not a bool), finite unless ``finite=False``, ``> low`` (``strict``) or ``>= low``,
    and ``< high`` (``high_strict``) or ``<= high``."""
    if v is None and none_ok:
        return None
    what = f"{name} must be {interval_words('real', low, high, low_strict=strict, high_strict=high_strict, finite=finite)}"
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what}, got {shown(v)}")
    v = float(v)
    if (math.isnan(v) or (finite and not math.isfinite(v)) or (low is not None and (v <= low if strict else v < low))
            or (high is not None and (v >= high if high_strict else v > high))):
        raise ValueError(f"{what}, got {shown(v)}")
    return v


def check_seed(seed, name: str = "seed") -> int:
    """A random seed: an integer >= 0."""
    return check_int(seed, name, low=0)


def writable(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy of it when it is read-only (a memory map): ``torch.as_tensor`` warns on read-only arrays."""
    return a if a.flags.writeable else a.copy()
