r"""Numerical maximisation of ``Ltilde`` for ``m = 3`` (issue 30, open question 2; seed 003).

The model is that of :mod:`widelimit.lab.superposition` (``W`` ``(d, n)``, ``M = W^T W``, inputs
``x_i = xi_i b_i``). For ``m = 3`` the pairing formula of docs/superposition.md gives, with
``D_i = M_ii``, ``s_k(i) = sum_j M_ij^k`` (diagonal included) and ``mu_k = E xi^k``,

    A = p mu_4 sum_i D_i^3 + 3 p^2 mu_2^2 sum_i D_i (s_2(i) - D_i^2),
    B = sum_i f(s_2(i), s_4(i), s_6(i)),
    f = p mu_6 s_6 + 15 p^2 mu_4 mu_2 (s_4 s_2 - s_6) + 15 p^3 mu_2^3 (s_2^3 - 3 s_2 s_4 + 2 s_6),

and ``Ltilde = 2A - B``. Its gradient is written by hand: with ``G = dLtilde/dM`` (entries of ``M``
taken as independent), ``dLtilde/dW = W (G + G^T)``, where

    dA/dM_ab = [a = b] (3 p mu_4 D_a^2 + 3 p^2 mu_2^2 (s_2(a) - 3 D_a^2)) + 6 p^2 mu_2^2 D_a M_ab,
    dB/dM_ab = 2 f_2(a) M_ab + 4 f_4(a) M_ab^3 + 6 f_6(a) M_ab^5,    f_k = df/ds_k.

One evaluation costs two ``O(n^2 d)`` products and ``O(n^2)`` elementwise work; with
``scipy.optimize.minimize(method="L-BFGS-B")`` one evaluation is 1.2-7x faster than torch autograd
through the cumulant code (``benchmarks/sup_ltilde_objective.py``), and it needs no torch. :func:`search` runs many such ascents from
random, unsuperposed, warm and block-diagonal starts and returns the best; :func:`certify`
re-evaluates a ``W`` by the independent cumulant code (:func:`widelimit.lab.superposition.ltilde`)
and by Monte Carlo, so a reported value is one that the stored ``W`` reaches.

Two facts the experiment uses as checks (docs/experiments/sup_ltilde.md):

* **Block-diagonal additivity.** If ``W = diag(W_1, W_2)`` (``d = d_1 + d_2``, disjoint features on
  orthogonal coordinates), ``M`` is block diagonal, row ``i`` of ``M x`` involves only its own block,
  and ``Ltilde(W) = Ltilde(W_1) + Ltilde(W_2)`` exactly. Hence ``sup_d`` is superadditive in ``d``
  (and nondecreasing): ``sup_{d_1 + d_2} >= sup_{d_1} + sup_{d_2}``.
* **Rescaling.** ``Ltilde(cW) = 2 c^6 A - c^{12} B`` is best at ``c^6 = A/B`` with value ``A^2/B``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import superposition as sp

__all__ = ["SearchRun", "SearchResult", "law_moments", "ltilde3", "ltilde3_grad", "rescale", "block_diagonal",
           "ascend", "search", "certify"]

M_POWER = 3


def law_moments(xi) -> tuple[float, float, float]:
    """``(mu_2, mu_4, mu_6)`` of the law ``xi`` (a name of :data:`~widelimit.lab.superposition.LAWS` or a Law)."""
    law = sp.get_law(xi)
    return float(law.moment(2)), float(law.moment(4)), float(law.moment(6))


def _parts(W: np.ndarray, p: float, mu):
    """``M``, its diagonal, ``M∘M``, the row sums ``s_2, s_4, s_6``, ``A``, ``B`` and the coefficients of ``f``."""
    mu2, mu4, mu6 = mu
    M = W.T @ W
    D = np.diagonal(M).copy()
    M2 = M * M
    M4 = M2 * M2
    s2, s4, s6 = M2.sum(1), M4.sum(1), np.einsum("ij,ij->i", M4, M2)
    A = p * mu4 * np.sum(D**3) + 3 * p * p * mu2 * mu2 * np.sum(D * (s2 - D * D))
    c1, c2, c3 = p * mu6, 15 * p * p * mu4 * mu2, 15 * p**3 * mu2**3
    f = c1 * s6 + c2 * (s4 * s2 - s6) + c3 * (s2**3 - 3 * s2 * s4 + 2 * s6)
    return M, D, M2, (s2, s4, s6), float(A), float(np.sum(f)), (c1, c2, c3)


def ltilde3(W, p: float, xi="rademacher") -> tuple[float, float, float]:
    """Exact ``(Ltilde, A, B)`` for ``m = 3`` by the pairing formula (module docstring); ``W`` ``(d, n)``."""
    W = sp.check_W(W)
    *_, A, B, _ = _parts(W, sp.check_p(p), law_moments(xi))
    return 2 * A - B, A, B


def ltilde3_grad(W: np.ndarray, p: float, mu) -> tuple[float, np.ndarray]:
    """``(Ltilde(W), dLtilde/dW)`` for ``m = 3``, ``mu = (mu_2, mu_4, mu_6)`` (module docstring; no checks)."""
    mu2, mu4, _ = mu
    M, D, M2, (s2, s4, s6), A, B, (c1, c2, c3) = _parts(W, p, mu)
    q = 3 * p * p * mu2 * mu2
    f2 = c2 * s4 + c3 * (3 * s2 * s2 - 3 * s4)
    f4 = c2 * s2 - 3 * c3 * s2
    f6 = c1 - c2 + 2 * c3
    # G = 2 dA/dM - dB/dM = M o (r - M2 o (4 f_4 + 6 f_6 M2)), r the row coefficients; then the diagonal
    H = M2 * (6 * f6)
    H += (4 * f4)[:, None]
    H *= M2
    np.subtract((4 * q * D - 2 * f2)[:, None], H, out=H)
    H *= M
    H[np.diag_indices_from(H)] += 2 * (3 * p * mu4 * D * D + q * (s2 - 3 * D * D))
    return 2 * A - B, W @ (H + H.T)


def rescale(W: np.ndarray, p: float, mu) -> tuple[np.ndarray, float]:
    """``(cW, A^2/B)`` at the best ``c`` (``c^6 = A/B``); ``(0 W, 0)`` when ``A <= 0``."""
    *_, A, B, _ = _parts(W, p, mu)
    if A <= 0 or B <= 0:
        return 0.0 * W, 0.0
    return W * (A / B) ** (1.0 / (2 * M_POWER)), A * A / B


def block_diagonal(*Ws) -> np.ndarray:
    """``diag(W_1, W_2, ...)``: ``(sum d_k, sum n_k)``; its ``Ltilde`` is the sum of theirs (module docstring)."""
    d = sum(w.shape[0] for w in Ws)
    n = sum(w.shape[1] for w in Ws)
    out = np.zeros((d, n))
    r = c = 0
    for w in Ws:
        out[r : r + w.shape[0], c : c + w.shape[1]] = w
        r += w.shape[0]
        c += w.shape[1]
    return out


@dataclass
class SearchRun:
    """One L-BFGS ascent: its start (``"random"``, ``"unsuperposed"``, ``"warm"``, ``"block"``), the number of
    features ``n``, the value reached (after the best rescaling), ``n_iter`` and scipy's ``status``."""

    start: str
    n: int
    value: float
    n_iter: int
    status: str

    def as_dict(self) -> dict:
        return {"start": self.start, "n": self.n, "value": self.value, "n_iter": self.n_iter, "status": self.status}


def ascend(W0: np.ndarray, p: float, mu, *, max_iter: int = 500, tol: float = 1e-12):
    """L-BFGS-B (scipy) ascent of ``Ltilde`` from ``W0``, then the best rescaling.

    The objective is divided by ``p mu_4^2 / mu_6`` (a feature's best isolated gain) so that
    ``tol`` (scipy's ``ftol``; ``gtol = tol``) means the same at every ``p``. Returns
    ``(W, value, n_iter, status)``.
    """
    from scipy.optimize import minimize

    d, n = W0.shape
    scale = p * mu[1] ** 2 / mu[2]

    def fun(w):
        v, g = ltilde3_grad(w.reshape(d, n), p, mu)
        return -v / scale, -g.ravel() / scale

    res = minimize(fun, W0.ravel(), jac=True, method="L-BFGS-B",
                   options={"maxiter": int(max_iter), "ftol": tol, "gtol": tol, "maxcor": 30})
    W, val = rescale(res.x.reshape(d, n), p, mu)
    status = "optimal" if res.status == 0 else ("iteration_limit" if res.status == 1 else "line_search")
    return W, val, int(res.nit), status


@dataclass
class SearchResult:
    """The best of many ascents at one ``(d, p, law)``: ``W`` (at its best scale), ``value``, every run."""

    d: int
    p: float
    law: str
    W: np.ndarray
    value: float
    runs: list = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.W.shape[1])

    def as_dict(self) -> dict:
        vals = np.array([r.value for r in self.runs])
        best_start = max(self.runs, key=lambda r: r.value).start if self.runs else None
        return {"d": self.d, "p": self.p, "law": self.law, "value": self.value, "n": self.n,
                "n_runs": len(self.runs), "best_start": best_start,
                "n_within_1pct": int(np.sum(vals >= 0.99 * self.value)),
                "n_iteration_limit": sum(r.status == "iteration_limit" for r in self.runs),
                "runs": [r.as_dict() for r in self.runs]}


def _random_start(d: int, n: int, rng) -> np.ndarray:
    return rng.standard_normal((d, n)) / np.sqrt(d)


def _unsuperposed_start(d: int, mu, rng) -> np.ndarray:
    """``n = d`` features on the coordinate axes at the best isolated norm (``||w||^6 = mu_4/mu_6``), plus 1e-3 noise."""
    return np.eye(d) * (mu[1] / mu[2]) ** (1.0 / 6) + 1e-3 * rng.standard_normal((d, d))


def search(d: int, p: float, xi="rademacher", *, ns=(None,), restarts: int = 4, warm=(), max_iter: int = 500,
           tol: float = 1e-12, seed: int = 0) -> SearchResult:
    """Best ``Ltilde`` found at ``(d, p, xi)``, ``m = 3``: L-BFGS ascents from many starts.

    Parameters
    ----------
    d : hidden dimensions.
    p, xi : feature probability and law (as in :func:`widelimit.lab.superposition.ltilde`).
    ns : feature counts ``n`` of the random starts.
    restarts : random starts per ``n``: an int, or a callable ``n -> int`` (more where ascents are cheap).
    warm : ``(label, W0)`` pairs started as well (``W0`` of shape ``(d, n)`` for any ``n``), e.g. the best
        ``W`` of a neighbouring ``p`` (``"warm"``) or a block-diagonal assembly of smaller ``d`` (``"block"``).
    max_iter, tol : L-BFGS iteration budget and tolerance per ascent (:func:`ascend`).
    seed : seeds the random starts.

    One start is always the unsuperposed optimum (``n = d``, axes, plus ``1e-3`` noise), a local maximum
    (docs/superposition.md), so the result is never below ``d p mu_4^2/mu_6``.
    """
    p = sp.check_p(p)
    law = sp.get_law(xi)
    mu = law_moments(law)
    rng = np.random.default_rng(seed)
    starts = [("unsuperposed", _unsuperposed_start(d, mu, rng))]
    per_n = restarts if callable(restarts) else (lambda n: restarts)
    starts += [("random", _random_start(d, int(n), rng)) for n in ns for _ in range(int(per_n(n)))]
    starts += list(warm)
    best = SearchResult(d, p, law.name, np.zeros((d, 1)), -np.inf)
    for label, W0 in starts:
        W0, _ = rescale(np.asarray(W0, dtype=np.float64), p, mu)
        if not np.any(W0):
            W0 = _random_start(d, W0.shape[1], rng)
        W, val, nit, status = ascend(W0, p, mu, max_iter=max_iter, tol=tol)
        best.runs.append(SearchRun(label, W.shape[1], val, nit, status))
        if val > best.value:
            best.W, best.value = W, val
    return best


def certify(W, p: float, xi="rademacher", *, n_samples: int = 200_000, seed: int = 0) -> dict:
    """Evidence that ``W`` reaches its value: the pairing formula, the cumulant code and Monte Carlo.

    Returns ``value`` (pairing formula, :func:`ltilde3`), ``value_cumulant`` (the cumulant recursion of
    :func:`widelimit.lab.superposition.ltilde`, a separate derivation), their relative difference,
    the Monte Carlo mean and standard error over ``n_samples`` fresh inputs and its ``z`` score
    ``(mc - value) / stderr``, and the relative gradient norm ``||grad|| ||W|| / |value|`` (0 at a
    stationary point).
    """
    W = sp.check_W(W)
    mu = law_moments(xi)
    v, _, _ = ltilde3(W, p, xi)
    vc = sp.ltilde(W, p, M_POWER, xi).value
    mc = sp.ltilde_mc(W, p, M_POWER, xi, n_samples=n_samples, seed=seed, device="cpu")
    _, g = ltilde3_grad(W, p, mu)
    return {"value": v, "value_cumulant": vc, "rel_diff_cumulant": abs(v - vc) / max(abs(v), 1e-300),
            "mc": mc.value, "mc_stderr": mc.stderr, "mc_z": (mc.value - v) / mc.stderr if mc.stderr > 0 else 0.0,
            "n_samples": mc.n_samples,
            "grad_rel": float(np.linalg.norm(g) * np.linalg.norm(W) / max(abs(v), 1e-300))}
