r"""The tied-weight power-activation autoencoder: exact loss, Monte Carlo estimate, baselines, constructions.

Model (paper notation; note the layout differs from the SAE dictionary ``(k, n)``)
----------------------------------------------------------------------------------
``W`` has shape ``(d, n)``: ``n`` input features, ``d`` hidden dimensions; column
``W[:, i]`` is feature ``i``'s direction. Encoder ``x -> W x``, decoder
``y -> phi(W^T y)`` with ``phi(t) = t^m`` elementwise, ``m >= 1`` odd. Inputs
``x_i = xi_i b_i`` with ``b_i ~ Bernoulli(p)`` and ``xi_i ~ mu`` i.i.d., ``mu``
symmetric with moments ``mu_k = E xi^k``. With ``M = W^T W`` (``n x n``, PSD, rank
``<= d``) the loss is ``L(W) = E||x - (M x)^m||^2 = n p mu_2 - Ltilde(W)``,

    Ltilde(W) = 2 A(W) - B(W),   A = E <x, (M x)^m>,   B = E ||(M x)^m||^2.

Exact values for any odd ``m`` (cumulants)
------------------------------------------
Each ``x_j`` has moments ``E x^k = p mu_k`` (``k >= 1``) and hence cumulants
``kappa_k`` (odd ones vanish). Row ``i`` of ``M x`` is ``S_i = M_ii x_i + R_i`` with
``R_i = sum_{j != i} M_ij x_j`` independent of ``x_i``. Cumulants add over
independent summands and scale as ``c^k``, so

    kappa_k(R_i) = kappa_k * P_k(i),   P_k(i) = sum_{j != i} M_ij^k,
    kappa_k(S_i) = kappa_k * (M_ii^k + P_k(i)),

moments follow from ``E Y^K = sum_{k=1}^K C(K-1, k-1) kappa_k(Y) E Y^{K-k}``, and

    A = sum_i sum_{k odd} C(m, k) M_ii^k p mu_{k+1} E R_i^{m-k},     B = sum_i E S_i^{2m}.

Only the even power sums ``P_2, ..., P_2m`` of the off-diagonal rows of ``M`` enter:
``O(n^2 (d + m))`` time, exact, differentiable (torch). For ``m = 1`` this is
``Ltilde = p mu_2 (2 tr M - ||M||_F^2)``; for ``m = 3`` written out (see
``docs/superposition.md`` for the derivation by pairing indices)

    A = p mu_4 sum_i M_ii^3 + 3 p^2 mu_2^2 sum_i M_ii P_2(i),
    B = sum_i [ p mu_6 s_6 + 15 p^2 mu_4 mu_2 (s_4 s_2 - s_6) + 15 p^3 mu_2^3 (s_2^3 - 3 s_2 s_4 + 2 s_6) ],

with ``s_k = s_k(i) = sum_j M_ij^k`` (diagonal included).

Rescaling: ``Ltilde(c W) = 2 c^{2m} A - c^{4m} B`` is maximised at
``c^{2m} = A / B`` with value ``A^2 / B`` (``c = 0``, value 0, when ``A <= 0``).

Training and the analysis of trained weights (feature statistics, gradient and Hessian at ``W``)
are in :mod:`widelimit.lab.superposition_train`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from . import frames as _frames
from .._runtime import resolve_device
from .._validation import _float_dtype, to_numpy

__all__ = [
    "LAWS",
    "Law",
    "LtildeValue",
    "Rescaling",
    "best_scaled_value",
    "bound_orders",
    "check_m",
    "check_p",
    "check_W",
    "finite_field_optimum",
    "get_law",
    "gram_power_sums",
    "linear_optimum",
    "ltilde",
    "ltilde_from_gram_sums",
    "ltilde_exact_torch",
    "ltilde_mc",
    "optimal_scale",
    "scaled_frame",
    "sparse_limit_ceiling",
    "sphere_moment_constant",
    "unsuperposed_optimum",
]


# --------------------------------------------------------------------------------------
# laws of xi
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Law:
    """A symmetric, mean-zero law ``mu`` of the nonzero feature values ``xi``.

    Parameters
    ----------
    name : str
    moment : callable ``k -> E xi^k`` (used for even ``k``; odd moments are 0)
    sampler : callable ``(shape, generator, device, dtype) -> torch.Tensor`` or None
        Needed only for Monte Carlo.
    strongly_log_concave, log_concave : bool
        Whether the paper's ``O(d)`` upper bound (strong log-concavity) applies.
    """

    name: str
    moment: Callable[[int], float]
    sampler: Callable | None = None
    strongly_log_concave: bool = False
    log_concave: bool = False

    def moments(self, kmax: int) -> np.ndarray:
        """``[E xi^0, ..., E xi^kmax]`` (odd entries 0)."""
        out = np.zeros(kmax + 1)
        out[0] = 1.0
        for k in range(2, kmax + 1, 2):
            v = float(self.moment(k))
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"law {self.name!r}: moment E xi^{k} = {v!r} must be finite and > 0")
            out[k] = v
        return out

    @classmethod
    def from_moments(cls, name: str, even_moments: Sequence[float], sampler=None) -> "Law":
        """A law given by its even moments ``[E xi^2, E xi^4, ...]`` (exact formulas up to that order)."""
        ev = [float(v) for v in even_moments]

        def moment(k):
            j = k // 2 - 1
            if j >= len(ev):
                raise ValueError(f"law {name!r}: moment E xi^{k} not given (only up to order {2 * len(ev)})")
            return ev[j]

        return cls(name, moment, sampler)


def _torch():
    import torch

    return torch


def _rademacher_sample(shape, gen, device, dtype):
    torch = _torch()
    return torch.randint(0, 2, shape, generator=gen, device=device).to(dtype) * 2 - 1


def _gaussian_sample(shape, gen, device, dtype):
    return _torch().randn(shape, generator=gen, device=device, dtype=dtype)


def _uniform_sample(shape, gen, device, dtype):
    return (_torch().rand(shape, generator=gen, device=device, dtype=dtype) * 2 - 1) * math.sqrt(3.0)


def _laplace_sample(shape, gen, device, dtype):
    torch = _torch()
    e = -torch.log1p(-torch.rand(shape, generator=gen, device=device, dtype=dtype))
    s = torch.randint(0, 2, shape, generator=gen, device=device).to(dtype) * 2 - 1
    return s * e / math.sqrt(2.0)


def _double_factorial(k: int) -> float:
    return float(math.prod(range(k - 1, 0, -2))) if k > 1 else 1.0


#: Built-in laws, all with unit variance ``E xi^2 = 1``.
LAWS: dict[str, Law] = {
    "rademacher": Law("rademacher", lambda k: 1.0, _rademacher_sample),
    "gaussian": Law("gaussian", _double_factorial, _gaussian_sample, strongly_log_concave=True, log_concave=True),
    # uniform on [-sqrt 3, sqrt 3]: E xi^k = 3^{k/2} / (k + 1)
    "uniform": Law("uniform", lambda k: 3.0 ** (k / 2) / (k + 1), _uniform_sample, log_concave=True),
    # Laplace with scale 1/sqrt 2: E xi^k = k! / 2^{k/2}
    "laplace": Law("laplace", lambda k: math.factorial(k) / 2.0 ** (k / 2), _laplace_sample, log_concave=True),
}


def get_law(xi) -> Law:
    """``xi`` as a :class:`Law`: a :class:`Law` or a name in :data:`LAWS`."""
    if isinstance(xi, Law):
        return xi
    if isinstance(xi, str) and xi.lower() in LAWS:
        return LAWS[xi.lower()]
    raise ValueError(f"unknown law of xi {xi!r}; use one of {sorted(LAWS)} or a widelimit.lab.superposition.Law")


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


def check_m(m) -> int:
    """The activation power: a positive odd integer."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1 or m % 2 == 0:
        raise ValueError(f"m (the power in phi(t) = t^m) must be a positive odd integer, got {m!r}")
    return int(m)


def check_p(p) -> float:
    """The feature probability: a number in (0, 1]."""
    try:
        val = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"p (probability a feature is active) must be a number in (0, 1], got {p!r}") from None
    if not (0.0 < val <= 1.0):
        raise ValueError(f"p (probability a feature is active) must be in (0, 1], got {p!r}")
    return val


def check_W(W, name: str = "W") -> np.ndarray:
    """A weight matrix ``(d, n)`` (``d`` hidden dims, ``n`` features), finite, returned as float64."""
    W = _float_dtype(to_numpy(W, name), name)
    if W.ndim != 2 or W.size == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array of shape (d hidden, n features), got shape {W.shape}")
    if not np.isfinite(W).all():
        bad = np.argwhere(~np.isfinite(W))[0]
        raise ValueError(f"{name} has a non-finite value at [{bad[0]}, {bad[1]}]")
    return np.asarray(W, dtype=np.float64)


# --------------------------------------------------------------------------------------
# exact population values
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _x_moments_cumulants(p: float, m: int, law: Law) -> tuple[np.ndarray, np.ndarray]:
    """Moments ``E x^k`` and cumulants ``kappa_k`` of ``x = b xi`` for ``k = 0..2m``."""
    K = 2 * m
    mu = law.moments(K)
    mx = p * mu
    mx[0] = 1.0
    kap = np.zeros(K + 1)
    for n_ in range(1, K + 1):
        kap[n_] = mx[n_] - sum(math.comb(n_ - 1, k - 1) * kap[k] * mx[n_ - k] for k in range(1, n_))
    return mx, kap


def _moments_from_cumulants(cums: dict, K: int):
    """Moments ``E Y^0..E Y^K`` from even cumulants ``cums[k]`` (arrays or scalars); odd moments 0."""
    mom = [1.0]
    for n_ in range(1, K + 1):
        if n_ % 2:
            mom.append(0.0)
            continue
        acc = 0.0
        for k in range(2, n_ + 1, 2):
            acc = acc + math.comb(n_ - 1, k - 1) * cums[k] * mom[n_ - k]
        mom.append(acc)
    return mom


def _row_AB(diag, P: dict, p: float, m: int, law: Law):
    """Per-row ``A_i = E x_i S_i^m`` and ``B_i = E S_i^{2m}`` (numpy or torch arrays).

    ``diag`` holds ``M_ii`` and ``P[k]`` the off-diagonal power sums ``sum_{j!=i} M_ij^k``
    for even ``k = 2..2m``.
    """
    mx, kap = _x_moments_cumulants(p, m, law)
    momR = _moments_from_cumulants({k: float(kap[k]) * P[k] for k in range(2, m, 2)}, m - 1) if m > 1 else [1.0]
    A = 0.0
    for k in range(1, m + 1, 2):
        A = A + math.comb(m, k) * float(mx[k + 1]) * diag**k * momR[m - k]
    momS = _moments_from_cumulants({k: float(kap[k]) * (diag**k + P[k]) for k in range(2, 2 * m + 1, 2)}, 2 * m)
    return A, momS[2 * m]


@dataclass
class LtildeValue:
    """``Ltilde(W) = 2A - B`` with its parts.

    Attributes
    ----------
    value : float
        ``Ltilde(W)``.
    A, B : float
        ``E <x, phi(W^T W x)>`` and ``E ||phi(W^T W x)||^2`` (MC: their estimates).
    loss : float
        ``L(W) = E||x - phi(W^T W x)||^2 = n p mu_2 - Ltilde``.
    stderr : float
        Standard error of ``value`` (0 for the exact method).
    method : str
        ``"exact"`` or ``"mc"``.
    n_samples : int
        Monte Carlo sample count (0 for exact).
    """

    value: float
    A: float
    B: float
    loss: float
    stderr: float
    method: str
    n_samples: int
    m: int
    p: float
    law: str

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("value", "A", "B", "loss", "stderr", "method", "n_samples", "m", "p", "law")}


def gram_power_sums(W, m: int, rows: int | None = None) -> tuple[np.ndarray, dict]:
    """Per-feature Gram data of ``M = W^T W``: ``diag = M_ii`` and ``{k: sum_{j != i} M_ij^k}`` for even ``k <= 2m``.

    This is all the exact formula needs, and it does not depend on ``p`` or the law:
    compute it once and evaluate many ``(p, law)`` pairs with :func:`ltilde_from_gram_sums`.
    Rows of ``M`` are formed in chunks (``O(n)`` memory per row, ``O(n^2 (d + m))`` time).
    """
    W = check_W(W)
    m = check_m(m)
    d, n = W.shape
    rows = rows or max(1, (1 << 22) // max(1, n))
    diag = np.empty(n)
    P = {k: np.empty(n) for k in range(2, 2 * m + 1, 2)}
    for s in range(0, n, rows):
        Mc = W[:, s : s + rows].T @ W  # rows s.. of M
        idx = np.arange(Mc.shape[0])
        diag[s : s + len(idx)] = Mc[idx, s + idx]
        Mc[idx, s + idx] = 0.0
        M2 = Mc * Mc
        Mk = M2
        for k in range(2, 2 * m + 1, 2):
            P[k][s : s + len(idx)] = Mk.sum(axis=1)
            Mk = Mk * M2
    return diag, P


def _exact_AB_numpy(W: np.ndarray, p: float, m: int, law: Law, rows: int | None = None) -> tuple[float, float]:
    diag, P = gram_power_sums(W, m, rows)
    a, b = _row_AB(diag, P, p, m, law)
    return float(np.sum(a)), float(np.sum(b))


def ltilde_exact_torch(W, p: float, m: int, xi="rademacher"):
    """Differentiable exact ``(Ltilde, A, B)`` for a torch ``W`` ``(d, n)`` (used by :func:`train`)."""
    torch = _torch()
    law = get_law(xi)
    M = W.T @ W
    diag = torch.diagonal(M)
    off = M - torch.diag(diag)
    M2 = off * off
    P, Mk = {}, M2
    for k in range(2, 2 * m + 1, 2):
        P[k] = Mk.sum(dim=1)
        Mk = Mk * M2
    a, b = _row_AB(diag, P, p, m, law)
    A, B = a.sum(), b.sum()
    return 2 * A - B, A, B


def ltilde_from_gram_sums(diag, offdiag_power_sums: dict, p: float, m: int, xi="rademacher") -> tuple[float, float]:
    """Exact ``(A, B)`` from per-row Gram data, without the Gram matrix.

    Parameters
    ----------
    diag : array (R,)
        ``M_ii`` for ``R`` rows (or row classes).
    offdiag_power_sums : dict
        ``{k: array (R,)}`` with ``sum_{j != i} M_ij^k`` for every even ``k`` in ``2..2m``.
    p, m, xi :
        As in :func:`ltilde`.

    Returns
    -------
    (A, B) : arrays (R,)
        Per-row contributions; ``Ltilde = 2 sum A - sum B``.
    """
    m, p, law = check_m(m), check_p(p), get_law(xi)
    diag = np.asarray(diag, dtype=np.float64)
    P = {k: np.asarray(offdiag_power_sums[k], dtype=np.float64) for k in range(2, 2 * m + 1, 2)}
    return _row_AB(diag, P, p, m, law)


def ltilde(W, p: float, m: int = 3, xi="rademacher", *, method: str = "exact", **mc_kwargs) -> LtildeValue:
    r"""Population ``Ltilde(W) = 2 E<x, (W^T W x)^m> - E||(W^T W x)^m||^2``.

    Parameters
    ----------
    W : array (d, n)
        Weights; column ``i`` is feature ``i``'s direction. float32/float64/torch accepted.
    p : float in (0, 1]
        Probability that a feature is active.
    m : odd int >= 1
        Power of the activation ``phi(t) = t^m``.
    xi : str or Law
        Law of the active values (``"rademacher"``, ``"gaussian"``, ``"uniform"``,
        ``"laplace"``, all unit variance, or a :class:`Law`).
    method : ``"exact"`` or ``"mc"``
        ``"exact"``: the cumulant formula (any odd ``m``; ``O(n^2 (d + m))``).
        ``"mc"``: :func:`ltilde_mc` (keyword arguments passed on).

    Returns
    -------
    LtildeValue
    """
    W = check_W(W)
    m, p, law = check_m(m), check_p(p), get_law(xi)
    if method == "mc":
        return ltilde_mc(W, p, m, law, **mc_kwargs)
    if method != "exact":
        raise ValueError(f"method must be 'exact' or 'mc', got {method!r}")
    if mc_kwargs:
        raise ValueError(f"unexpected arguments for the exact method: {sorted(mc_kwargs)}")
    A, B = _exact_AB_numpy(W, p, m, law)
    val = 2 * A - B
    n = W.shape[1]
    return LtildeValue(val, A, B, n * p * law.moment(2) - val, 0.0, "exact", 0, m, p, law.name)


def ltilde_mc(
    W,
    p: float,
    m: int = 3,
    xi="rademacher",
    *,
    n_samples: int = 200_000,
    batch_size: int = 20_000,
    seed: int | None = 0,
    device="auto",
    dtype=None,
) -> LtildeValue:
    """Monte Carlo estimate of ``Ltilde(W)`` with its standard error (any odd ``m``, batched torch).

    Draws ``x = b * xi`` in batches on ``device`` (``"auto"``: CUDA when available),
    evaluates ``2 <x, f> - ||f||^2`` with ``f = (x W^T W)^m`` per sample and returns
    the mean with ``stderr = sd / sqrt(n_samples)``. Batches are capped at ``2^24 / n`` rows
    so memory stays bounded. ``A`` and ``B`` are estimated
    from the same samples.
    """
    torch = _torch()
    W = check_W(W)
    m, p, law = check_m(m), check_p(p), get_law(xi)
    if law.sampler is None:
        raise ValueError(f"law {law.name!r} has no sampler; Monte Carlo needs one (exact formulas do not)")
    if not isinstance(n_samples, (int, np.integer)) or n_samples < 2:
        raise ValueError(f"n_samples must be an integer >= 2, got {n_samples!r}")
    dev = resolve_device(device)
    dt = dtype or torch.float64
    gen = torch.Generator(device=dev)
    gen.manual_seed(0 if seed is None else int(seed))
    Wt = torch.as_tensor(W, device=dev, dtype=dt)
    n = W.shape[1]
    s1 = s2 = sa = sb = 0.0
    done = 0
    batch_size = max(1, min(int(batch_size), (1 << 24) // max(1, n)))  # <= 16M entries per (batch, n) array
    while done < n_samples:
        bs = min(batch_size, n_samples - done)
        mask = (torch.rand((bs, n), generator=gen, device=dev, dtype=dt) < p).to(dt)
        x = mask * law.sampler((bs, n), gen, dev, dt)
        f = ((x @ Wt.T) @ Wt) ** m
        a = (x * f).sum(1)
        b = (f * f).sum(1)
        v = (2 * a - b).double()
        s1 += float(v.sum())
        s2 += float((v * v).sum())
        sa += float(a.double().sum())
        sb += float(b.double().sum())
        done += bs
    mean = s1 / done
    var = max(0.0, (s2 - done * mean * mean) / (done - 1))
    return LtildeValue(
        mean, sa / done, sb / done, n * p * law.moment(2) - mean, math.sqrt(var / done), "mc", done, m, p, law.name
    )


# --------------------------------------------------------------------------------------
# rescaling, baselines, bounds
# --------------------------------------------------------------------------------------


@dataclass
class Rescaling:
    """Best rescaling ``c`` of ``W``: ``Ltilde(cW) = 2 c^{2m} A - c^{4m} B``.

    Attributes: ``c``, ``value = Ltilde(c W) = A^2/B`` (0 if ``A <= 0``), ``value_at_1 = 2A - B``,
    ``A``, ``B`` (at ``c = 1``), ``W`` (``c * W``).
    """

    c: float
    value: float
    value_at_1: float
    A: float
    B: float
    W: np.ndarray

    def at(self, c: float, m: int) -> float:
        """``Ltilde(c' W)`` for any ``c'`` (the polynomial in ``c'``)."""
        u = float(c) ** (2 * m)
        return 2 * u * self.A - u * u * self.B

    def as_dict(self) -> dict:
        return {"c": self.c, "value": self.value, "value_at_1": self.value_at_1, "A": self.A, "B": self.B}


def _best_scale(A: float, B: float, m: int) -> tuple[float, float]:
    if A <= 0 or B <= 0:
        return 0.0, 0.0
    return (A / B) ** (1.0 / (2 * m)), A * A / B


def optimal_scale(W, p: float, m: int = 3, xi="rademacher") -> Rescaling:
    """Best ``c >= 0`` for ``Ltilde(c W)`` (exact): ``c^{2m} = A/B``, value ``A^2/B``."""
    r = ltilde(W, p, m, xi)
    c, v = _best_scale(r.A, r.B, r.m)
    return Rescaling(c, v, r.value, r.A, r.B, c * check_W(W))


def linear_optimum(p: float, d: int, xi="rademacher", n: int | None = None) -> float:
    """``sup_W Ltilde`` for ``m = 1``: ``p E xi^2 min(d, n)`` (``Ltilde = p mu_2 sum(2 l - l^2)``
    over the eigenvalues ``l`` of ``W^T W``, at most ``d`` nonzero; best ``l = 1``). Independent of ``n >= d``."""
    p, law = check_p(p), get_law(xi)
    k = d if n is None else min(d, n)
    return p * law.moment(2) * k


def unsuperposed_optimum(p: float, d: int, m: int = 3, xi="rademacher", n: int | None = None) -> float:
    """Best ``Ltilde`` with ``W^T W`` diagonal: ``min(d, n) p mu_{m+1}^2 / mu_{2m}``.

    With ``M = diag(l)``, ``Ltilde = sum_i p (2 l_i^m mu_{m+1} - l_i^{2m} mu_{2m})``, at most
    ``d`` of the ``l_i`` nonzero; each is best at ``l^m = mu_{m+1}/mu_{2m}``.
    """
    p, m, law = check_p(p), check_m(m), get_law(xi)
    k = d if n is None else min(d, n)
    return k * p * law.moment(m + 1) ** 2 / law.moment(2 * m)


def sphere_moment_constant(d: int, m: int) -> float:
    r"""``d (d+2)...(d+2m-2) / (2m-1)!! = 1 / E[u_1^{2m}]`` (``u`` uniform on the sphere of ``R^d``): the largest
    ``(sum_i ||w_i||^{2m})^2 / sum_{ij} <w_i, w_j>^{2m}`` over real vectors (docs/superposition.md, with proof)."""
    return _frames.real_welch_constant(d, m)


def sparse_limit_ceiling(d: int, m: int = 3, xi="rademacher", n: int | None = None) -> float:
    r"""``lim_{p -> 0} sup_W Ltilde(W) / p = (mu_{m+1}^2 / mu_{2m}) d (d+2)...(d+2m-2) / (2m-1)!!``.

    As ``p -> 0`` only one-active-feature terms survive: ``A/p -> mu_{m+1} sum_i M_ii^m``
    and ``B/p -> mu_{2m} sum_{ij} M_ij^{2m}``. With ``u_i = w_i^{(x)m}`` and ``T = sum u_i u_i^T``,
    the best rescaling gives ``(mu_{m+1}^2/mu_{2m}) (tr T)^2 / ||T||_F^2``, and
    ``(tr T)^2 / ||T||_F^2 <= 1 / kappa``, ``kappa = E[u_1^{2m}] = (2m-1)!! / (d (d+2)...(d+2m-2))``
    (:func:`sphere_moment_constant`): with ``E = E_u[(u^{(x)m})(u^{(x)m})^T]``, ``<T, E> = kappa tr T``
    and ``||E||_F^2 = kappa``, so Cauchy-Schwarz gives it; a spherical ``2m``-design attains it
    (docs/superposition.md). So the ``O(p d^m)`` upper bound has the constant ``1/(2m-1)!!``, not the
    ``1/m!`` of ``C(d+m-1, m)``, which real frames do not reach. With ``n`` features also
    ``(tr T)^2/||T||_F^2 <= rank T <= n``, so the value is at most ``min(n, 1/kappa)`` times the
    prefactor (an upper bound; with ``n`` below a design's size it need not be reached).
    """
    m, law = check_m(m), get_law(xi)
    k = sphere_moment_constant(d, m) if n is None else min(float(n), sphere_moment_constant(d, m))
    return law.moment(m + 1) ** 2 / law.moment(2 * m) * k


def bound_orders(p, d, m: int = 3) -> dict:
    """The paper's orders (constants 1): lower ``min(p d^m, d p^{1/m})``, upper ``min(p d^m, d)``,
    unsuperposed/linear ``p d``. Arrays broadcast. These are orders, not values."""
    p = np.asarray(p, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    return {
        "lower": np.minimum(p * d**m, d * p ** (1.0 / m)),
        "upper": np.minimum(p * d**m, d),
        "unsuperposed": p * d,
    }


# --------------------------------------------------------------------------------------
# constructions
# --------------------------------------------------------------------------------------


def best_scaled_value(gram_sums: tuple, p: float, m: int = 3, xi="rademacher") -> tuple[float, float]:
    """``(c, value)``: best rescaling of the weights whose :func:`gram_power_sums` are ``gram_sums``."""
    a, b = ltilde_from_gram_sums(gram_sums[0], gram_sums[1], p, m, xi)
    return _best_scale(float(np.sum(a)), float(np.sum(b)), m)


def scaled_frame(V, p: float, m: int = 3, xi="rademacher") -> Rescaling:
    """``W = c V`` for a unit frame ``V`` (``(d, n)`` or :class:`~widelimit.lab.frames.Frame`) at the best ``c``."""
    return optimal_scale(_frames.check_frame(V), p, m, xi)


def finite_field_optimum(q: int, r: int, p: float, m: int = 3, xi="rademacher") -> dict:
    """Exact best-scaled ``Ltilde`` of the finite-field frame (``d = q^2``, ``n = q^{r+1}``) without building it.

    Every row of the Gram matrix has unit diagonal and holds ``k/q`` exactly
    ``E_r(k)`` times (:func:`~widelimit.lab.frames.finite_field_root_counts`), so the
    per-row power sums are identical and exact.

    Returns
    -------
    dict with ``q, r, d, n, c, value`` (best ``Ltilde``), ``A, B`` (at ``c = 1``), ``coherence``.
    """
    m, p, law = check_m(m), check_p(p), get_law(xi)
    E = _frames.finite_field_root_counts(q, r)
    n = q ** (r + 1)
    ks = np.arange(len(E), dtype=np.float64)
    P = {k: np.array([float(np.sum(E * (ks / q) ** k))]) for k in range(2, 2 * m + 1, 2)}
    a, b = _row_AB(np.array([1.0]), P, p, m, law)
    A, B = float(a[0]) * n, float(b[0]) * n
    c, v = _best_scale(A, B, m)
    return {"q": q, "r": r, "d": q * q, "n": n, "c": c, "value": v, "A": A, "B": B, "coherence": r / q}
