"""Near-orthogonal unit frames: finite-field constructions, random frames and Welch bounds.

A *frame* here is a matrix ``V`` of shape ``(d, n)`` whose ``n`` columns are unit
vectors in ``R^d`` (``n`` may be much larger than ``d``). Its Gram matrix
``G = V^T V`` has unit diagonal; its *coherence* is ``max_{i != j} |G_ij|``.

Welch bounds (real frames)
--------------------------
For every ``k >= 1`` the tensor powers ``v_i^{(x)k}`` lie in the symmetric power
``Sym^k(R^d)``, of dimension ``D_k = C(d + k - 1, k)``. With ``T = sum_i u_i u_i^T``
(``u_i = v_i^{(x)k}``), ``sum_{i,j} G_ij^{2k} = ||T||_F^2 >= (tr T)^2 / rank T``, so

    sum_{i,j} G_ij^{2k} >= n^2 / C(d + k - 1, k)                (order-k Welch bound)

and, splitting off the ``n`` diagonal terms,

    coherence^{2k} >= (n^2 / C(d + k - 1, k) - n) / (n (n - 1)).

``k = 1`` gives the classical Welch bound ``coherence >= sqrt((n - d) / (d (n - 1)))``.

Finite-field polynomial incidence frame
---------------------------------------
For a prime power ``q`` and ``0 <= r <= q - 1`` index the coordinates of ``R^{q^2}`` by
pairs ``(a, b)`` in ``F_q x F_q`` and each polynomial ``f`` over ``F_q`` of degree
``<= r`` by a unit vector ``v_f = q^{-1/2} 1[b = f(a)]`` (the normalised graph of
``f``). Then ``d = q^2``, ``n = q^{r+1}`` and

    <v_f, v_g> = #{a in F_q : f(a) = g(a)} / q = (number of roots of f - g) / q <= r / q,

because a nonzero polynomial of degree ``<= r < q`` has at most ``r`` roots; the
value ``r / q`` is attained (``f - g = a (a - 1) ... (a - r + 1)``). Every entry of
``G`` is a multiple of ``1/q`` and row ``f`` of ``G`` holds the values
``k / q`` with multiplicity ``E_r(k)`` = the number of nonzero polynomials of degree
``<= r`` with exactly ``k`` roots in ``F_q`` (the same for every row, since ``G_fg``
depends only on ``f - g``). :func:`finite_field_root_counts` computes ``E_r(k)``
exactly by inclusion--exclusion, so sums such as ``sum_ij G_ij^{2k}`` are exact for
frames far too large to store.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .._validation import _float_dtype, to_numpy

__all__ = [
    "Frame",
    "check_frame",
    "coherence",
    "finite_field_frame",
    "finite_field_root_counts",
    "finite_field_power_sum",
    "frame_power_sum",
    "gf_tables",
    "is_prime",
    "prime_power",
    "random_frame",
    "real_welch_constant",
    "welch_bound",
    "welch_coherence_bound",
    "welch_sum_bound",
]

#: Largest frame (``d * n`` entries) :func:`finite_field_frame` will build explicitly.
MAX_EXPLICIT_ENTRIES = 50_000_000


@dataclass
class Frame:
    """A unit-norm frame ``V`` (``(d, n)``, columns are the unit vectors).

    Attributes
    ----------
    vectors : ndarray (d, n)
    kind : str
        ``"finite-field"`` or ``"random"``.
    params : dict
        Construction parameters (``q``, ``r`` or ``seed``).
    predicted_coherence : float or None
        The coherence the construction guarantees (``r / q`` for the finite-field frame).
    """

    vectors: np.ndarray
    kind: str
    params: dict
    predicted_coherence: float | None = None

    @property
    def d(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def n(self) -> int:
        return int(self.vectors.shape[1])


def is_prime(q: int) -> bool:
    """True for a prime integer ``q``."""
    if not isinstance(q, (int, np.integer)) or isinstance(q, bool) or q < 2:
        return False
    q = int(q)
    if q % 2 == 0:
        return q == 2
    f = 3
    while f * f <= q:
        if q % f == 0:
            return False
        f += 2
    return True


def prime_power(q) -> tuple[int, int] | None:
    """``(p, k)`` with ``q = p^k``, ``p`` prime, ``k >= 1``; ``None`` if ``q`` is not a prime power."""
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 2:
        return None
    q = int(q)
    p = next(f for f in range(2, q + 1) if q % f == 0)  # smallest factor: prime
    k, rest = 0, q
    while rest % p == 0:
        rest //= p
        k += 1
    return (p, k) if rest == 1 else None


def _poly_mulmod(a: list, b: list, mod: list, p: int) -> list:
    """Product of coefficient lists (low degree first) over F_p, reduced modulo the monic ``mod``."""
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] = (out[i + j] + x * y) % p
    k = len(mod) - 1
    for top in range(len(out) - 1, k - 1, -1):
        c = out[top]
        if c:
            for j in range(k + 1):
                out[top - k + j] = (out[top - k + j] - c * mod[j]) % p
    return (out + [0] * k)[:k]


def _digits(x: int, p: int, k: int) -> list:
    return [(x // p**i) % p for i in range(k)]


@functools.lru_cache(maxsize=32)
def gf_tables(q: int) -> tuple[np.ndarray, np.ndarray]:
    """Addition and multiplication tables of the finite field ``F_q`` (``q`` a prime power).

    Elements are ``0..q-1``; for ``q = p^k`` the base-``p`` digits of an element are the
    coefficients of a polynomial over ``F_p`` of degree ``< k``, multiplied modulo the first
    monic irreducible polynomial of degree ``k`` (found by checking that every nonzero
    element then has an inverse).
    """
    pk = prime_power(q)
    if pk is None:
        raise ValueError(f"q must be a prime power (the field F_q), got {q!r}")
    p, k = pk
    elems = np.arange(q)
    dig = np.array([_digits(x, p, k) for x in range(q)])
    add = ((dig[:, None, :] + dig[None, :, :]) % p) @ (p ** np.arange(k))
    if k == 1:
        return add.astype(np.int64), np.outer(elems, elems) % p
    for tail in range(p**k):  # monic candidates x^k + tail
        mod = _digits(tail, p, k) + [1]
        if mod[0] == 0:
            continue
        mul = np.zeros((q, q), dtype=np.int64)
        for x in range(q):
            for y in range(x, q):
                v = _poly_mulmod(_digits(x, p, k), _digits(y, p, k), mod, p)
                mul[x, y] = mul[y, x] = sum(c * p**i for i, c in enumerate(v))
        if all(len(set(mul[x, 1:].tolist())) == q - 1 and 0 not in mul[x, 1:] for x in range(1, q)):
            return add.astype(np.int64), mul
    raise RuntimeError(f"no irreducible polynomial found for q = {q}")  # pragma: no cover


def _check_qr(q, r) -> tuple[int, int]:
    if prime_power(q) is None:
        raise ValueError(f"q must be a prime power (the field F_q), got {q!r}")
    if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r <= q - 1:
        raise ValueError(
            f"r (the polynomial degree bound) must be an integer in [0, q-1] = [0, {q - 1}], got {r!r}; "
            "for r >= q distinct polynomials can agree on all of F_q and the frame repeats vectors"
        )
    return int(q), int(r)


def finite_field_frame(q: int, r: int) -> Frame:
    """The polynomial-incidence frame over ``F_q``: ``d = q^2`` dims, ``n = q^(r+1)`` unit vectors.

    Column ``t`` is the normalised graph of the polynomial whose coefficients
    ``(c_0, ..., c_r)`` are the base-``q`` digits of ``t`` (``c_0`` least
    significant); coordinate ``a * q + b`` is ``q^{-1/2}`` when ``b = f(a)``.
    Coherence is exactly ``r / q`` (``0`` for ``r = 0``).

    Parameters
    ----------
    q : int
        A prime power (2, 3, 4, 5, 7, 8, 9, ...).
    r : int
        Degree bound, ``0 <= r <= q - 1``.

    Raises
    ------
    ValueError
        If ``q`` is not a prime power, ``r`` is out of range, or the frame has more than
        :data:`MAX_EXPLICIT_ENTRIES` entries (use :func:`finite_field_root_counts`
        for exact sums over larger frames).
    """
    q, r = _check_qr(q, r)
    d, n = q * q, q ** (r + 1)
    if d * n > MAX_EXPLICIT_ENTRIES:
        raise ValueError(
            f"finite_field_frame(q={q}, r={r}) has d*n = {d * n:.3g} entries (> {MAX_EXPLICIT_ENTRIES:.0e}); "
            "use finite_field_root_counts / finite_field_power_sum for exact sums without building it"
        )
    add, mul = gf_tables(q)
    t = np.arange(n, dtype=np.int64)
    coeffs = np.stack([(t // q**k) % q for k in range(r + 1)], axis=0)  # (r+1, n)
    a = np.arange(q, dtype=np.int64)
    vals = np.zeros((n, q), dtype=np.int64)
    for k in range(r, -1, -1):  # Horner in F_q
        vals = add[mul[vals, a[None, :]], coeffs[k][:, None]]
    V = np.zeros((d, n))
    V[a[None, :] * q + vals, t[:, None]] = 1.0 / math.sqrt(q)
    return Frame(V, "finite-field", {"q": q, "r": r}, predicted_coherence=r / q)


def finite_field_root_counts(q: int, r: int) -> np.ndarray:
    """``E[k]``: how many nonzero polynomials of degree ``<= r`` over ``F_q`` have exactly ``k`` roots.

    Exact integers by inclusion--exclusion: the polynomials of degree ``<= r``
    vanishing on a fixed ``s``-set number ``F(s) = q^(r+1-s)`` for ``s <= r + 1``
    and ``1`` (only zero) otherwise, and ``sum_k C(k, s) E'(k) = C(q, s) F(s)``
    (``E'`` counts the zero polynomial too, at ``k = q``), so
    ``E'(k) = sum_{s >= k} (-1)^(s-k) C(s, k) C(q, s) F(s)``.

    Returns
    -------
    ndarray of int, shape (r + 1,)
        ``E[k]`` for ``k = 0..r`` (nonzero polynomials have at most ``r`` roots);
        ``E.sum() == q^(r+1) - 1``. In the frame, row ``f`` of the Gram matrix
        holds the value ``k / q`` exactly ``E[k]`` times off the diagonal.
    """
    q, r = _check_qr(q, r)

    def F(s):
        return q ** (r + 1 - s) if s <= r + 1 else 1

    E = []
    for k in range(q + 1):
        E.append(sum((-1) ** (s - k) * math.comb(s, k) * math.comb(q, s) * F(s) for s in range(k, q + 1)))
    E[q] -= 1  # the zero polynomial (f = g: the diagonal)
    if any(E[k] != 0 for k in range(r + 1, q + 1)):  # pragma: no cover - guarded by r <= q - 1
        raise RuntimeError("inconsistent root counts")
    return np.array(E[: r + 1], dtype=np.int64)


def finite_field_power_sum(q: int, r: int, k: int) -> float:
    """Exact ``sum_{i,j} G_ij^{2k}`` for the finite-field frame (diagonal included), without building it."""
    E = finite_field_root_counts(q, r)
    n = q ** (r + 1)
    row = 1.0 + sum(int(E[j]) * (j / q) ** (2 * k) for j in range(1, r + 1))
    return float(n * row)


def random_frame(d: int, n: int, seed: int | None = 0) -> Frame:
    """``n`` i.i.d. uniformly random unit vectors in ``R^d`` (normalised Gaussians)."""
    for name, v in (("d", d), ("n", n)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((int(d), int(n)))
    V /= np.linalg.norm(V, axis=0, keepdims=True)
    return Frame(V, "random", {"seed": seed})


def check_frame(V, name: str = "V") -> np.ndarray:
    """Validate a frame: 2-D ``(d, n)``, finite, no zero column; returned as float64 with unit columns."""
    if isinstance(V, Frame):
        V = V.vectors
    V = _float_dtype(to_numpy(V, name), name)
    if V.ndim != 2 or V.size == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array (d, n) with unit columns, got shape {V.shape}")
    if not np.isfinite(V).all():
        raise ValueError(f"{name} has a non-finite value in column {int(np.flatnonzero(~np.isfinite(V).all(0))[0])}")
    V = np.asarray(V, dtype=np.float64)
    norms = np.linalg.norm(V, axis=0)
    if (norms == 0).any():
        raise ValueError(f"{name} has a zero column ({int(np.flatnonzero(norms == 0)[0])})")
    return V / norms


def _gram_blocks(V, rows: int = 2048):
    n = V.shape[1]
    for s in range(0, n, rows):
        yield s, V[:, s : s + rows].T @ V


def coherence(V) -> float:
    """``max_{i != j} |<v_i, v_j>|`` of the normalised columns of ``V`` (blockwise, O(n^2 d))."""
    V = check_frame(V)
    n = V.shape[1]
    if n < 2:
        return 0.0
    best = 0.0
    for s, G in _gram_blocks(V):
        idx = np.arange(G.shape[0])
        G[idx, s + idx] = 0.0
        best = max(best, float(np.abs(G).max()))
    return best


def frame_power_sum(V, k: int) -> float:
    """``sum_{i,j} <v_i, v_j>^{2k}`` over the normalised columns (diagonal included)."""
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    V = check_frame(V)
    return float(sum((G ** (2 * k)).sum() for _, G in _gram_blocks(V)))


def welch_bound(d: int, n: int) -> float:
    """Classical Welch lower bound on coherence: ``sqrt(max(0, (n - d) / (d (n - 1))))``."""
    if n <= 1:
        return 0.0
    return math.sqrt(max(0.0, (n - d) / (d * (n - 1))))


def real_welch_constant(d: int, k: int) -> float:
    """``d (d+2) ... (d+2k-2) / (2k-1)!!``: ``1 / E[u_1^{2k}]`` for ``u`` uniform on the sphere of ``R^d``."""
    num = 1
    for j in range(k):
        num *= d + 2 * j
    den = 1
    for j in range(1, 2 * k, 2):
        den *= j
    return num / den


def welch_sum_bound(d: int, n: int, k: int) -> float:
    """Real order-``k`` Welch bound: ``sum_{i,j} G_ij^{2k} >= n^2 (2k-1)!! / (d (d+2)...(d+2k-2))`` (and ``>= n``).

    For real unit vectors this is sharper than the ``n^2 / C(d+k-1, k)`` that holds over the complex
    numbers (equal at ``k = 1``); equality needs a spherical ``2k``-design (docs/superposition.md).
    """
    return max(float(n), n * n / real_welch_constant(d, k))


def welch_coherence_bound(d: int, n: int, k_max: int = 8) -> tuple[float, int]:
    """Best coherence lower bound from the order-``k`` Welch bounds, ``k = 1..k_max``.

    Returns ``(bound, k)`` with ``bound = max_k ((n^2 kappa_k - n) / (n(n-1)))^(1/(2k))``,
    ``kappa_k = (2k-1)!! / (d (d+2)...(d+2k-2))`` (the real bound of :func:`welch_sum_bound`).
    """
    if n <= 1:
        return 0.0, 1
    best, arg = 0.0, 1
    for k in range(1, k_max + 1):
        val = (n * n / real_welch_constant(d, k) - n) / (n * (n - 1))
        if val > 0:
            b = val ** (1.0 / (2 * k))
            if b > best:
                best, arg = b, k
    return best, arg
