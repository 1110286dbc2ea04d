r"""A first-order solver for the Q-problem over the doubly nonnegative cone (torch, CPU or GPU).

Problem (theory.md §2, relaxed to DNN):

.. math::

    \min_{Q \succeq 0,\ Q \ge 0,\ b}\ f(Q, b) = \frac{\lambda}{N}\Big(
        \operatorname{tr}\big(\tilde X^\top P^{-1}\tilde X\big) + \mathbf 1^\top Q\mathbf 1\Big),
    \qquad P = Q + \lambda I,\ \tilde X = X - \mathbf 1 b^\top .

**Eliminating b.** For fixed ``Q`` the objective is a quadratic in ``b`` with
minimiser ``b(Q) = X^T P^{-1} 1 / (1^T P^{-1} 1)``; ``g(Q) = min_b f(Q, b)``
is convex and smooth with ``grad g(Q) = grad_Q f(Q, b(Q))`` (Danskin):

.. math:: \nabla g(Q) = \frac{\lambda}{N}\mathbf 1\mathbf 1^\top - \frac{1}{N\lambda} R R^\top,
          \qquad R = \lambda P^{-1}\tilde X \ \text{(the residuals of the optimal dictionary)} .

**Splitting.** ``g + i_PSD + i_{>=0}`` is minimised by three-operator splitting
(Davis & Yin 2017) in the form with a dual variable ``u`` and a backtracking
step size (Pedregosa & Gidel, "Adaptive three operator splitting", ICML 2018):

.. math::

    Q_A &= \max\big(Q_B - \gamma (u + \nabla g(Q_B)),\ 0\big) \quad\text{(step accepted when }
          g(Q_A) \le g(Q_B) + \langle\nabla g(Q_B), Q_A - Q_B\rangle + \tfrac{1}{2\gamma}\|Q_A - Q_B\|^2),\\
    Q_B &\leftarrow \Pi_{\mathrm{PSD}}(Q_A + \gamma u), \qquad u \leftarrow u + (Q_A - Q_B)/\gamma .

``(Q_B, u)`` is the state: pass them back to warm-start.

**Momentum.** The gradient step is taken from ``Y = Q_B + ((t_k - 1)/t_{k+1}) (Q_B - Q_B^{prev})``
(Nesterov's sequence ``t_{k+1} = (1 + sqrt(1 + 4 t_k^2))/2``) instead of ``Q_B``, with the
backtracking test at ``Y``; the momentum restarts (``t = 1``) whenever ``g(Q_B)`` did not decrease
(O'Donoghue & Candes 2015, function restart), and, while the PSD projections are identities,
whenever ``Y`` is not PSD (its step would cost an eigendecomposition). First-order
methods slow down with the conditioning of ``g``, which follows the data's spread of scales: on
anisotropic or multi-scale data the momentum cuts the iterations 3-15x. The certificate below does
not depend on how the iterates were found.

**Cost per iteration.** Two or three Cholesky factorisations of ``N x N``
matrices (``g`` at ``Q_A`` for each backtracking trial, ``g`` and its gradient at
``Q_B``, or at ``Y`` after a PSD test of ``Y`` with the momentum; ``g(Q_B)`` is reused from
``g(Q_A)`` when the projection keeps ``Q_A``) and one more that tests whether ``Q_A + gamma u`` is already positive
definite (after removing its exactly-zero rows and columns, see
``_Problem.is_psd``): then its PSD projection is itself, and the eigendecomposition (about
25 times the flops of a Cholesky factorisation) is skipped. For this objective
the PSD constraint is inactive at the optimum whenever ``Q*`` is positive
definite (every point farther than ``lam`` from ``b*``: theory.md §3-4), and
the iterates start in the positive definite cone, at the best multiple of the
identity ``c I``, ``c = max(0, ||X - 1 xbar^T||_F / sqrt(N) - lam)``
(the minimiser of ``g(cI)``), with the step size ``1/L`` of the local
Lipschitz constant there. On the random family the eigendecomposition is then
needed in only a handful of iterations, or none.

**Duality gap.** For any ``S`` in the dual cone ``DNN* = PSD + NN`` the
Lagrangian gives ``min f >= min_{P > 0, b} f - <S, Q>``. Taking
``S = (lam/N) 1 1^T - C`` with ``C = alpha^2 R_c R_c^T / (N lam)``, ``R_c`` the
centred residuals (``1^T R_c = 0``, which removes ``b``) and ``alpha`` small
enough that every ``||alpha r_i|| <= lam`` (so ``S >= 0`` entrywise by
Cauchy-Schwarz), the inner minimum over ``P`` is
``2 sqrt(lam/N) ||C^{1/2} X||_* - lam tr C``, i.e.

.. math:: d(\alpha, R_c) = \frac1N\big(2\alpha\,\|R_c^\top X\|_* - \alpha^2\|R_c\|_F^2\big),

a rigorous lower bound on the DNN optimum (and on the CP optimum, and on the
nonnegative relaxation, since ``S >= 0``). Residual matrices are tried at
each check: ``R`` at the iterate and at the feasible points below, and the rows ``x_i - b`` shortened to
length ``lam`` (the per-point dual of theory.md §4.1 at the current bias); the
largest bound is kept. Before the final centring and scaling, each is moved
towards the set {centred, rows of length <= lam} by three rounds of
alternating projection (clip rows, centre), which keeps ``alpha`` close to 1. The upper bound is ``g`` at a
feasible point: ``Q_B + t 1 1^T`` (``t`` = its most negative entry), and
``Q_A`` when a Cholesky factorisation shows it is PSD, else
``Q_A + s I`` (``s`` = its most negative eigenvalue); all are PSD and
nonnegative. The solver stops when ``upper - lower <= tol * upper``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .._memory import check_memory
from .._runtime import limit_threads, resolve_device
from ..engine.local import Progress
from .._params import (DEVICE, LAM, POSITIVE, POSITIVE_INT, PROGRESS, THREADS, TIME_LIMIT, ArrayLike, Boolean, Data,
                       validate_params)
from .._validation import check_lam, check_vector, to_numpy
from ..results import CertifiedResult, shared_dict

__all__ = ["DNNResult", "solve_dnn", "dnn_dual_bound", "dnn_bytes"]


def dnn_bytes(N: int) -> int:
    """Peak memory (bytes) :func:`solve_dnn` adds on the CPU for ``N`` points: ``1.25 (27 MiB + 142 N^2)``.

    About 18 float64 ``N x N`` matrices (iterates, gradients, the PSD projection's eigenvectors),
    fitted by ``benchmarks/memory_models.py`` at N = 500, 1000, 2000 (largest measured / fitted 1.17;
    docs/theory.md §9).
    """
    return int(1.25 * (27 * 2**20 + 142.0 * N * N))

#: Plain steps before the momentum starts (accelerate): the well-conditioned instances finish in a few
#: dozen iterations, where the extra PSD test of the extrapolated point would cost more than it saves.
_PLAIN_STEPS = 10


@dataclass(frozen=True)
class DNNResult(CertifiedResult):
    """Result of :func:`solve_dnn`.

    Attributes
    ----------
    value : float
        Objective at the returned feasible ``Q`` (an upper bound on the DNN optimum).
    lower_bound : float
        Certified lower bound (dual value) on the DNN, and on the CP, optimum.
    gap, rel_gap : float
        ``value - lower_bound`` and ``gap / value``.
    Q : ndarray (N, N)
        Feasible (PSD and entrywise nonnegative) matrix achieving ``value``.
    b : ndarray (n,)
        Optimal bias for ``Q`` (or the fixed bias).
    certified : bool
        ``rel_gap <= tol``.
    n_iter : int
    time_s : float
    step : float
        Final step size (pass back with ``Q0``/``u0`` to warm-start).
    u : ndarray (N, N)
        Final dual variable of the PSD constraint (for warm starts).
    device : str
    history : list of dict
        ``iter``, ``time_s``, ``value``, ``lower_bound``, ``rel_gap``, ``step`` and ``n_eigh``
        (eigendecompositions so far; the other PSD projections were identities) at each check.
    tol : float
        The relative gap asked for.
    status : str
        ``"optimal"`` (certified), ``"time_limit"`` or ``"iteration_limit"``.
    """

    value: float
    lower_bound: float
    gap: float
    rel_gap: float
    Q: np.ndarray
    b: np.ndarray
    certified: bool
    n_iter: int
    time_s: float
    step: float
    u: np.ndarray
    device: str
    history: list
    tol: float = 0.0
    status: str = "optimal"

    def as_dict(self) -> dict:
        return {**shared_dict(self), "step": self.step,
                "device": self.device, "b": [float(v) for v in self.b]}


class _Problem:
    """Objective, gradient and dual bound of the Q-problem in torch (float64)."""

    def __init__(self, X, lam, b_fixed, device):
        import torch

        self.torch = torch
        self.X = torch.tensor(np.asarray(X, dtype=np.float64), device=device)  # a copy: X may be a read-only mmap
        self.N, self.n = self.X.shape
        self.lam = float(lam)
        self.a = self.lam / self.N
        self.b_fixed = None if b_fixed is None else torch.as_tensor(b_fixed, dtype=torch.float64, device=device)
        self.ones = torch.ones(self.N, 1, dtype=torch.float64, device=device)
        self.I = torch.eye(self.N, dtype=torch.float64, device=device)

    def evaluate(self, Q, need_grad=True):
        """``(g(Q), grad, R, b)``; ``g = inf`` when ``Q + lam I`` is not positive definite."""
        torch = self.torch
        P = Q + self.lam * self.I
        L, info = torch.linalg.cholesky_ex(P)
        if int(info) != 0:
            return math.inf, None, None, None
        rhs = torch.cat([self.X, self.ones], dim=1)
        S = torch.cholesky_solve(rhs, L)
        Y, y1 = S[:, : self.n], S[:, self.n :]
        if self.b_fixed is None:
            b = (self.X.T @ y1).ravel() / y1.sum()
        else:
            b = self.b_fixed
        PinvXt = Y - y1 @ b[None, :]
        Xt = self.X - b[None, :]
        val = self.a * (float(torch.sum(Xt * PinvXt)) + float(Q.sum()))
        R = self.lam * PinvXt
        if not need_grad:
            return val, None, R, b
        G = self.a - (R @ R.T) / (self.N * self.lam)
        return val, G, R, b

    def dual_bound(self, R, b, sweeps: int = 0):
        """Lower bound ``d(alpha, R_c)`` from residuals ``R`` (module docstring).

        ``R`` is first moved towards the set {centred, every row of length <= lam}
        by ``sweeps`` rounds of alternating projection (row clipping, centring); the
        final centring and the scaling ``alpha`` make it exactly feasible.
        """
        torch = self.torch
        Rc = R
        for _ in range(sweeps):
            if self.b_fixed is None:
                Rc = Rc - Rc.mean(dim=0, keepdim=True)
            nr = torch.sqrt((Rc * Rc).sum(dim=1, keepdim=True))
            Rc = Rc * torch.clamp(self.lam / torch.clamp(nr, min=1e-300), max=1.0)
        if self.b_fixed is None:
            Rc = Rc - Rc.mean(dim=0, keepdim=True)
            M = Rc.T @ self.X
        else:
            M = Rc.T @ (self.X - b[None, :])
        nuc = float(torch.linalg.svdvals(M).sum())
        rr = float((Rc * Rc).sum())
        if rr == 0.0:
            return 0.0
        rmax = float(torch.sqrt((Rc * Rc).sum(dim=1).max()))
        amax = 1.0 if rmax <= self.lam else self.lam / rmax
        alpha = min(amax, nuc / rr)
        return (2.0 * alpha * nuc - alpha * alpha * rr) / self.N

    def is_psd(self, Z) -> bool:
        """Cholesky test: ``Z`` (symmetric) is positive definite once its zero rows and columns are removed.

        Zero rows are common: points within ``lam`` of the bias have ``Q*_ii = 0``, the nonnegativity step sets their rows to exactly 0, and such a ``Z`` is PSD
        but singular, so a plain Cholesky factorisation would fail on it.
        """
        torch = self.torch
        if int(torch.linalg.cholesky_ex(Z)[1]) == 0:
            return True
        live = Z.abs().amax(dim=1) > 0
        n_live = int(live.sum())
        if n_live == Z.shape[0]:
            return False
        if n_live == 0:
            return True
        return int(torch.linalg.cholesky_ex(Z[live][:, live])[1]) == 0

    def psd_project(self, Z):
        """Projection onto the PSD cone; ``(Pi(Z), identity)``.

        A Cholesky factorisation (``N^3/3`` flops) first tests whether ``Z`` is
        already PSD (:meth:`is_psd`), in which case ``Pi(Z) = Z``; only otherwise
        is the eigendecomposition (about ``9 N^3`` flops) computed.
        """
        torch = self.torch
        Zs = 0.5 * (Z + Z.T)
        if self.is_psd(Zs):
            return Zs, True
        w, V = torch.linalg.eigh(Zs)
        w = torch.clamp(w, min=0.0)
        out = (V * w) @ V.T
        return 0.5 * (out + out.T), False


def dnn_dual_bound(X, lam, Q, b=None, sweeps: int = 3) -> float:
    r"""Certified lower bound on the DNN (and CP) optimum from any ``Q`` with ``Q + lam I`` positive definite.

    Computes the residuals ``R = lam (Q + lam I)^{-1} (X - 1 b^T)`` at the optimal
    bias for ``Q`` (or at the fixed ``b``) and returns the dual value
    ``d(alpha, R_c)`` of the module docstring, after ``sweeps`` rounds of alternating
    projection of ``R`` towards {centred, rows of length <= lam}. Equal to the optimum at an optimal ``Q``.
    """
    import torch

    X = np.asarray(X, dtype=np.float64)
    lam = check_lam(lam)
    N, n = X.shape
    bf = None if b is None else check_vector(b, n, "b")
    Qa = np.asarray(to_numpy(Q, "Q"), dtype=np.float64)
    if Qa.shape != (N, N):
        raise ValueError(f"Q must have shape ({N}, {N}), got {Qa.shape}")
    prob = _Problem(X, lam, bf, torch.device("cpu"))
    val, _, R, bb = prob.evaluate(torch.as_tensor(0.5 * (Qa + Qa.T)), need_grad=False)
    if R is None:
        raise ValueError("Q + lam*I is not positive definite")
    return prob.dual_bound(R, bb, sweeps)


@validate_params({
    "X": Data(), "lam": LAM, "b": [ArrayLike(), None], "tol": POSITIVE, "max_iter": POSITIVE_INT, "time_limit": TIME_LIMIT,
    "Q0": [ArrayLike(), None], "u0": [ArrayLike(), None], "step0": [POSITIVE, None], "check_every": POSITIVE_INT,
    "device": DEVICE, "threads": THREADS, "accelerate": Boolean(), "progress": PROGRESS,
})
def solve_dnn(X, *, lam, b=None, tol: float = 1e-6, max_iter: int = 20_000, time_limit: float | None = None,
              Q0=None, u0=None, step0: float | None = None, check_every: int = 5, device: str = "auto",
              threads: int | None = None, accelerate: bool = True, progress=None) -> DNNResult:
    r"""Solve the DNN relaxation of the Q-problem to a certified relative gap.

    Parameters
    ----------
    X : array (N, n)
        Data (float32 / torch accepted; computed in float64).
    lam : float
    b : array (n,), optional
        Fixed bias; default: ``b`` optimised jointly (eliminated in closed form).
    tol : float
        Stop when ``(upper - lower) / upper <= tol`` (certified, see module docstring).
    max_iter : int
    time_limit : float, optional
        Seconds; stop (unconverged) after this.
    Q0, u0, step0 : warm start
        A previous result's ``Q``, ``u`` and ``step``.
    check_every : int
        Iterations between duality-gap checks (each costs two Cholesky factorisations, and an
        eigenvalue computation when ``Q_A`` is not positive definite).
    device : str
        ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda"``, ...
    threads : int, optional
        CPU threads during the solve (torch, numba and BLAS, as ``threads`` everywhere in widelimit:
        :class:`widelimit._runtime.limit_threads`; restored afterwards). Default: 1 for ``N <= 512``
        (thread start-up dominates small eigendecompositions, by an order of magnitude on a busy
        machine), else the caller's setting or :func:`widelimit._runtime.default_threads`.
    accelerate : bool
        Nesterov momentum with adaptive restart (module docstring); ``False`` runs the plain
        splitting. Measured in ``benchmarks/dnn_accel.py``: 1.2-5x faster on the benchmark families at
        N = 300-800, 3-11x (or certified where the plain splitting is not) on anisotropic or multi-scale
        data; the same, up to timer noise, on instances solved in a few dozen iterations.
    progress : callable(Progress), optional
        Receives a :class:`widelimit.Progress` event at each certificate check (``stage="dnn"``,
        ``rows_done`` = iteration of ``rows_total = max_iter``, ``value``, ``lower_bound``).

    Returns
    -------
    DNNResult
    """
    dev = resolve_device(device)
    if dev.type == "cpu":  # refused before any N x N matrix exists (GPU memory is the device's own)
        check_memory(dnn_bytes(X.shape[0]), f"solve_dnn on N = {X.shape[0]} points",
                     hint="use a smaller N, or a GPU (device='cuda')")
    if threads is None and X.shape[0] <= 512:
        threads = 1
    with limit_threads(threads):
        return _solve_dnn(X, lam, b, tol, max_iter, time_limit, Q0, u0, step0, check_every, dev, progress,
                          accelerate=accelerate)


def _solve_dnn(X, lam, b, tol, max_iter, time_limit, Q0, u0, step0, check_every, dev, progress,
               grow: float = 1.2, sweeps: int = 3, accelerate: bool = True) -> DNNResult:
    """The iterations of :func:`solve_dnn`: accelerated forward-backward steps on the nonnegative matrices, the
    PSD projection, and every ``check_every`` steps feasible points and dual bounds (:func:`_check`)."""
    import torch

    t0 = time.perf_counter()
    X = np.asarray(X, dtype=np.float64)
    prob = _Problem(X, lam, None if b is None else check_vector(b, X.shape[1], "b"), dev)
    QB, u, gamma = _start(prob, Q0, u0, step0)
    fB, G, R, bcur = prob.evaluate(QB)
    history = []
    best = (math.inf, None, None)  # (upper, Q, b)
    lower = -math.inf
    it = 0
    n_eigh = 0
    converged = False
    t_mom, Q_prev = 1.0, QB  # momentum (accelerate): Nesterov's sequence and the previous iterate
    identity = True  # the last PSD projection was the identity
    while it < max_iter:
        it += 1
        # the point of the gradient step: extrapolated along QB - Q_prev (accelerate), or QB
        Y = None
        if accelerate and t_mom > 1.0 and it > _PLAIN_STEPS:
            Y, fY, GY, t_mom = _extrapolate(prob, QB, Q_prev, t_mom, identity)
        if Y is None:
            if G is None:  # (the gradient at QB is computed only when the step starts there)
                fB, G, R, bcur = prob.evaluate(QB)
            Y, fY, GY = QB, fB, G
        QA, fA, RA, bA, gamma = _forward_backward(prob, Y, fY, GY, u, gamma)
        QB_new, identity = prob.psd_project(QA + gamma * u)
        n_eigh += not identity
        u = u + (QA - QB_new) / gamma
        fB_old = fB
        Q_prev, QB = QB, QB_new
        if identity and torch.equal(QB, QA):  # the projection kept QA (u = 0): its value is known
            fB, G, R, bcur = fA, None, RA, bA
        else:
            fB, G, R, bcur = prob.evaluate(QB)
            if fB == math.inf:  # cannot happen for a PSD QB; guard against rounding
                QB = QB + 1e-12 * prob.I
                fB, G, R, bcur = prob.evaluate(QB)
        # adaptive restart (O'Donoghue & Candes 2015): momentum only while the objective decreases
        t_mom = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t_mom * t_mom)) if accelerate and fB < fB_old else 1.0
        gamma *= grow
        if it % check_every == 0 or it == max_iter:
            best, lower = _check(prob, (fA, QA, RA, bA), (fB, QB, R, bcur), best, lower, sweeps)
            upper = best[0]
            rel = (upper - lower) / max(abs(upper), 1e-300)
            history.append({"iter": it, "time_s": time.perf_counter() - t0, "value": upper, "lower_bound": lower,
                            "rel_gap": rel, "step": gamma, "n_eigh": n_eigh})
            if rel <= tol:
                converged = True
                break
            if progress is not None:
                progress(Progress(stage="dnn", pass_index=it, rows_done=it, rows_total=max_iter, value=upper,
                                  lower_bound=lower))
            if time_limit is not None and time.perf_counter() - t0 > time_limit:
                break
    upper, Qbest, bbest = best
    if Qbest is None:
        Qbest, bbest, upper = QB, bcur, fB
    gap = upper - lower
    return DNNResult(
        value=float(upper), lower_bound=float(lower), gap=float(gap), rel_gap=float(gap / max(abs(upper), 1e-300)),
        Q=Qbest.cpu().numpy(), b=bbest.cpu().numpy().copy(), certified=converged, n_iter=it,
        time_s=time.perf_counter() - t0, step=gamma, u=u.cpu().numpy(), device=str(dev), history=history,
        tol=float(tol), status="optimal" if converged else ("iteration_limit" if it >= max_iter else "time_limit"),
    )


def _start(prob, Q0, u0, step0):
    """The first iterate ``QB`` (the best multiple of the identity, or ``Q0`` projected), the multiplier ``u``
    and the step (a local Lipschitz estimate of ``grad g`` at ``c I``, or ``step0``)."""
    import torch

    N = prob.X.shape[0]
    lam = prob.lam
    f64 = dict(dtype=torch.float64, device=prob.X.device)

    def as_matrix(A, name):
        A = np.asarray(to_numpy(A, name), dtype=np.float64)
        if A.shape != (N, N):
            raise ValueError(f"{name} must have shape ({N}, {N}), got {A.shape}")
        if not np.isfinite(A).all():
            raise ValueError(f"{name} has a non-finite value in row {int(np.flatnonzero(~np.isfinite(A).all(1))[0])}")
        return torch.as_tensor(0.5 * (A + A.T), **f64)

    Xt0 = prob.X - (prob.X.mean(dim=0, keepdim=True) if prob.b_fixed is None else prob.b_fixed[None, :])
    # the best multiple of the identity: g(cI) = (lam/N)(||Xt||_F^2/(c + lam) + N c)
    c = max(0.0, float(torch.linalg.norm(Xt0)) / math.sqrt(N) - lam)
    QB = c * prob.I if Q0 is None else prob.psd_project(as_matrix(Q0, "Q0"))[0]
    u = torch.zeros(N, N, **f64) if u0 is None else as_matrix(u0, "u0")
    if step0 is not None:
        return QB, u, float(step0)
    # local Lipschitz estimate of grad g at Q = cI (backtracking corrects it)
    s2 = float(torch.linalg.matrix_norm(Xt0, ord=2)) ** 2
    return QB, u, (lam + c) ** 3 / (2.0 * prob.a * max(s2, 1e-300))


def _extrapolate(prob, QB, Q_prev, t_mom, identity):
    """Nesterov's extrapolated point ``(Y, g(Y), grad g(Y), t)``; ``Y`` is None when it is not taken."""
    t_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t_mom * t_mom))
    Yx = QB + ((t_mom - 1.0) / t_next) * (QB - Q_prev)
    # while the PSD projections are identities, an extrapolated point outside the PSD cone would
    # cost an eigendecomposition (25 Cholesky factorisations): restart instead
    if not identity or prob.is_psd(Yx):
        fx, Gx, _, _ = prob.evaluate(Yx)
        if fx < math.inf:
            return Yx, fx, Gx, t_mom
        return None, None, None, t_mom
    return None, None, None, 1.0


def _forward_backward(prob, Y, fY, GY, u, gamma):
    """The forward-backward step onto the nonnegative matrices from ``Y``, with backtracking on ``g``:
    ``(QA, g(QA), its residuals, its bias, the step)``."""
    import torch

    for _ in range(60):
        QA = torch.clamp(Y - gamma * (u + GY), min=0.0)
        D = QA - Y
        fA, _, RA, bA = prob.evaluate(QA, need_grad=False)
        if fA <= fY + float(torch.sum(GY * D)) + float(torch.sum(D * D)) / (2 * gamma) + 1e-15 * abs(fY):
            break
        gamma *= 0.5
    return QA, fA, RA, bA, gamma


def _check(prob, A, B, best, lower, sweeps):
    """Feasible points from the iterates ``A = (g, QA, R, b)`` (nonnegative) and ``B`` (PSD) -- QA when it is
    PSD, else ``QA + s I``; ``QB + t 11^T`` -- and dual bounds from their residuals and from the per-point
    optimum at the current bias. Returns the updated ``(best, lower)``."""
    import torch

    fA, QA, RA, bA = A
    fB, QB, R, bcur = B
    if prob.is_psd(QA):
        cand = [(fA, QA, RA, bA)]
    else:
        smin = float(torch.linalg.eigvalsh(0.5 * (QA + QA.T))[0])
        Qc = QA + max(0.0, -smin) * prob.I
        v, _, Rc, bc = prob.evaluate(Qc, need_grad=False)
        cand = [(v, Qc, Rc, bc)]
    t = max(0.0, -float(QB.min()))
    if t > 0:
        Qc = QB + t
        v, _, Rc, bc = prob.evaluate(Qc, need_grad=False)
        cand.append((v, Qc, Rc, bc))
    else:
        cand.append((fB, QB, R, bcur))
    for v, Qc, Rc, bc in cand:
        if v < best[0]:
            best = (v, Qc, bc)
        if Rc is not None:
            lower = max(lower, prob.dual_bound(Rc, bc, sweeps))
    lower = max(lower, prob.dual_bound(R, bcur, sweeps))
    # second dual candidate: the residuals of the per-point optimum at the current bias
    # (x_i - b shortened to length lam), the dual point of theory.md §4.1
    Xt = prob.X - bcur[None, :]
    nr = torch.sqrt((Xt * Xt).sum(dim=1, keepdim=True))
    lower = max(lower, prob.dual_bound(Xt * torch.clamp(prob.lam / torch.clamp(nr, min=1e-300), max=1.0), bcur,
                                       sweeps))
    return best, lower
