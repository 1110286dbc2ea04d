"""How much the finite-width node bounds lose, against how much the objective itself rises, near an optimum.

The branch and bound of docs/theory.md §7 prunes a node when its certified lower bound reaches the
incumbent. Around a stationary dictionary ``W*`` (the best of the search's multistart, polished), with
every atom's cap of angle ``theta`` centred on ``W*``, this script measures side by side:

* the cone bound's loss ``(L* - bound) / L*`` (docs/theory.md §7.2-§7.3, first order in ``theta``);
* the second-order bound's loss (docs/theory.md §7.6, ``O(theta^2)`` at a stationary point);
* the objective's own rise ``(V(W) - L*) / L*`` at dictionaries tilted by ``theta`` in random tangent
  directions (median and minimum of ``--tilts``), ``V(W)`` the exact optimum over codes and bias;
* at the same tilts, the value ``q(u(W))`` of the second-order bound's dual point itself (built
  explicitly, as in tests/finite/test_taylor.py, with every point that is not on ``n`` atoms carrying):
  the largest loss ``(L* - q(u(W))) / L*`` over the tilts where ``u(W)`` is feasible. The gap between
  this and the bound's loss is what the bound's norm estimates give away;
* the robust affine dual bound of docs/theory.md §7.7 (``--no-affine`` skips it): the best dual point
  ``u_i(W) = p_i + sum_j B_ij (w_j - c_j)`` that is feasible for *every* dictionary of the caps, found by
  cvxpy + Clarabel and evaluated exactly afterwards (its seconds per node are reported too). It asks
  whether a dual point that follows the atoms can prune the coarse levels, where the second-order bound
  does not apply.

A bound prunes the nodes at distance ``d`` from ``W*`` only once its loss is below the rise there, so
the ratio of loss to rise sets how many nodes a level of the search keeps (docs/benchmarks.md).

Run:  PYTHONPATH=. python3 benchmarks/finite_bound_loss.py [--dim 3] [--width 3] [--points 40] [--no-affine]
Writes benchmarks/results/finite_bound_loss_<dim>d_k<width>.{json,md}.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

import widelimit as wl  # noqa: E402
from widelimit.finite import _taylor as T  # noqa: E402
from widelimit.coding.fixed_dictionary import fixed_dictionary_optimum  # noqa: E402
from widelimit.finite.bnb import _polish, node_lower_bound  # noqa: E402

THETAS = (0.3, 0.1, 0.05, 0.03, 0.02, 0.01, 0.005, 0.002, 0.001)
AFFINE_THETAS = (0.3, 0.1, 0.05, 0.02, 0.01)  # the affine bound takes about a second a node
PRUNE_THETAS = (0.3, 0.2, 0.1, 0.05, 0.02)


def cap_support(g, c, theta):
    """``max <w - c, g>`` over the unit ``w`` within angle ``theta`` of the unit ``c`` (closed form).

    With ``w = cos(phi) c + sin(phi) t``, ``t`` a unit vector orthogonal to ``c``, the value is
    ``max_{phi <= theta} |g| cos(phi - psi) - <c, g>`` (``psi`` the angle of ``g`` from ``c``).
    """
    gc = float(c @ g)
    gp = float(np.linalg.norm(g - gc * c))
    r = math.hypot(gc, gp)
    psi = math.atan2(gp, gc)
    return (r if psi <= theta else r * math.cos(psi - theta)) - gc


def _cap_parts(C, theta):
    """``rho_j = 1 - cos(theta_j)``, ``s_j = sin(theta_j)`` and the projectors on ``c_j``'s orthogonal complement.

    Every ``w_j`` of cap ``j`` is ``c_j + Delta_j`` with ``Delta_j = r_j c_j + s'_j t_j``, ``t_j`` a unit vector
    orthogonal to ``c_j``, ``|r_j| <= rho_j`` and ``|s'_j| <= s_j`` (caps narrower than pi/2).
    """
    theta = np.asarray(theta, dtype=np.float64)
    perp = np.eye(C.shape[1])[None] - C[:, :, None] * C[:, None, :]
    return 1.0 - np.cos(theta), np.sin(theta), perp


def affine_dual_value(X, lam, C, theta, P, B):
    """The bound of docs/theory.md §7.7 at given ``(p, B)``, made feasible for every dictionary of the caps.

    ``P`` (N, n) with ``sum_i p_i = 0`` and ``B`` (N, k, n, n) with ``sum_i B_ij = 0``. The worst value of
    ``<w_l, u_i(W)>`` over the caps is bounded by the linear parts' exact cap supports plus, for each bilinear
    part ``<Delta_l, B_ij Delta_j>``, ``beta_lj(B_ij)`` of docs/theory.md §7.7 (the radial and tangential parts
    of the tilts apart); ``(p, B)`` is scaled by ``lam / max(lam, worst)``, which keeps both sums at zero.
    Returns ``(bound, worst - lam before the scaling)``.
    """
    N, n = X.shape
    k = C.shape[0]
    rho, sn, perp = _cap_parts(C, theta)

    def beta(Bm, l, j):
        return (rho[l] * rho[j] * abs(C[l] @ Bm @ C[j]) + rho[l] * sn[j] * np.linalg.norm(perp[j] @ (Bm.T @ C[l]))
                + sn[l] * rho[j] * np.linalg.norm(perp[l] @ (Bm @ C[j]))
                + sn[l] * sn[j] * np.linalg.norm(perp[l] @ Bm @ perp[j], ord=2))

    worst = -np.inf
    for i in range(N):
        for l in range(k):
            val = float(C[l] @ P[i])
            for j in range(k):
                g = B[i, j].T @ C[l] + (P[i] if j == l else 0.0)
                val += cap_support(g, C[j], theta[j]) + beta(B[i, j], l, j)
            worst = max(worst, val)
    alpha = 1.0 if worst <= lam else lam / worst  # every term is positively homogeneous in (p, B)
    P, B = alpha * P, alpha * B
    q = float(np.mean(2.0 * np.sum(X * P, axis=1) - np.sum(P * P, axis=1)))
    lin = sum(cap_support(-np.einsum("iab,ia->b", B[:, j], X - P), C[j], theta[j]) for j in range(k))
    move = [sum(rho[j] * np.linalg.norm(B[i, j] @ C[j]) + sn[j] * np.linalg.norm(B[i, j] @ perp[j], ord=2)
                for j in range(k)) for i in range(N)]  # >= ||sum_j B_ij Delta_j||
    return q - (2.0 * lin + float(np.sum(np.square(move)))) / N, worst - lam


def affine_dual_bound(X, lam, C, theta, U0, drop=()):
    """The best robust affine dual point of docs/theory.md §7.7 (cvxpy + Clarabel), valued exactly.

    ``U0`` is a dual point feasible at the centres ``C``; the program optimises ``p = U0 + V`` and ``B``
    (Clarabel, or SCS where Clarabel stops short).
    The bilinear term ``sum_i B_ij^T (x_i - p_i)`` of the objective is taken at ``V = 0`` and the matrix norms
    of ``beta`` are Frobenius norms (both only make the program's solution less than the best);
    :func:`affine_dual_value` then values that solution exactly. ``drop`` may name ``"constraints"`` and / or
    ``"objective"``: their second-order terms are left out, and the program's value is then *not* a bound
    (it measures what those terms cost). Returns ``(bound, seconds of the whole solve, seconds inside
    Clarabel, worst violation of the program's solution before the scaling)``; with ``drop``, the program's
    value instead of the bound and ``nan`` for the violation.
    """
    import cvxpy as cp

    N, n = X.shape
    k = C.shape[0]
    rho, sn, perp = _cap_parts(C, theta)
    V = cp.Variable((N, n))
    Bv = [[cp.Variable((n, n)) for _ in range(k)] for _ in range(N)]
    P = U0 + V

    def support(g, j):  # max over the cap's convex hull of <w - c_j, g> = min_mu ||g + mu c|| - mu cos(theta) - <c, g>
        mu = cp.Variable(nonneg=True)
        return cp.norm(g + mu * C[j]) - mu * math.cos(theta[j]) - C[j] @ g

    def beta(Bm, l, j):
        return (rho[l] * rho[j] * cp.abs(C[l] @ Bm @ C[j]) + rho[l] * sn[j] * cp.norm(perp[j] @ (Bm.T @ C[l]))
                + sn[l] * rho[j] * cp.norm(perp[l] @ (Bm @ C[j])) + sn[l] * sn[j] * cp.norm(perp[l] @ Bm @ perp[j], "fro"))

    cons = [cp.sum(V, axis=0) == 0] + [sum(Bv[i][j] for i in range(N)) == 0 for j in range(k)]
    for i in range(N):
        for l in range(k):
            worst = C[l] @ P[i]
            for j in range(k):
                worst = worst + support(Bv[i][j].T @ C[l] + (P[i] if j == l else 0), j)
                if "constraints" not in drop:
                    worst = worst + beta(Bv[i][j], l, j)
            cons.append(worst <= lam)
    obj = (2 * cp.sum(cp.multiply(X, P)) - cp.sum_squares(P)) / N
    for j in range(k):
        obj = obj - (2.0 / N) * support(-sum(Bv[i][j].T @ (X[i] - U0[i]) for i in range(N)), j)
    if "objective" not in drop:
        move = [sum(rho[j] * cp.norm(Bv[i][j] @ C[j]) + sn[j] * cp.norm(Bv[i][j] @ perp[j], "fro") for j in range(k))
                for i in range(N)]
        obj = obj - cp.sum_squares(cp.hstack(move)) / N
    t0 = time.perf_counter()
    prob = cp.Problem(cp.Maximize(obj), cons)
    try:
        prob.solve(solver=cp.CLARABEL)
    except cp.error.SolverError:  # Clarabel stops short on some nodes; any (p, B) is valued exactly below
        prob.solve(solver=cp.SCS, eps=1e-9, max_iter=200000)
    seconds = time.perf_counter() - t0
    inner = float(prob.solver_stats.solve_time or float("nan"))
    if drop:
        return float(prob.value), seconds, inner, float("nan")
    Bval = np.array([[Bv[i][j].value for j in range(k)] for i in range(N)])
    Pval = U0 + V.value
    Pval -= Pval.mean(axis=0)
    Bval -= Bval.mean(axis=0)
    bound, viol = affine_dual_value(X, lam, C, theta, Pval, Bval)
    return bound, seconds, inner, viol


def value_at(X, lam, W):
    """Exact optimum over codes and bias at a fixed dictionary (coordinate descent to 1e-15)."""
    b = np.zeros(X.shape[1])
    Z = np.zeros((X.shape[0], W.shape[0]))
    return float(fixed_dictionary_optimum(X, lam, W, b, Z, 200000, 1e-15)), Z, b


def construction_value(X, lam, C, Z0, b0, W):
    """``q(u(W))`` of docs/theory.md §7.6's dual point at one dictionary ``W``, or None if ``u(W)`` is infeasible.

    Every pair with a code or no slack is held, and every point not on ``n`` atoms carries.
    """
    U, lev = T._prepare(X, lam, C, np.zeros(C.shape[0]), Z0, b0)[:2]
    act = (Z0 > 0) | (lam - lev <= 1e-12 * lam)
    dprime, v = T.dual_point(U, C, W, act, act.sum(axis=1) < X.shape[1])
    u = U + dprime + v
    if (u @ W.T).max() > lam * (1 + 1e-12):
        return None
    return float(np.mean(2 * np.sum(X * u, axis=1) - np.sum(u * u, axis=1)))


def centre_dual(X, lam, C):
    """The fixed-dictionary optimum at ``C`` and its negated residual, recentred and scaled to be feasible at ``C``."""
    val, Z, b = value_at(X, lam, C)
    U = X - b - Z @ C
    U -= U.mean(axis=0)
    return val, U * min(1.0, lam / float((U @ C.T).max()))


def pruning(X, lam, W, v0, tilts):
    """At each cap angle: nodes centred at every atom of ``W`` tilted by ``m`` times the angle (random tangent
    directions), and how many of them each bound prunes (bound >= ``v0``, the optimum)."""
    rng = np.random.default_rng(2)  # its own stream: the first table's tilts stay those of earlier runs
    rows = []
    for th in PRUNE_THETAS:
        for m in (2, 3, 4):
            got = {"cone": 0, "second_order": 0, "affine": 0}
            rise = []
            for _ in range(tilts):
                D = rng.standard_normal(W.shape)
                D -= (D * W).sum(axis=1, keepdims=True) * W
                D *= np.tan(m * th) / np.linalg.norm(D, axis=1, keepdims=True)
                C = W + D
                C /= np.linalg.norm(C, axis=1, keepdims=True)
                vc, U0 = centre_dual(X, lam, C)
                _, Zc, bc = value_at(X, lam, C)
                ths = np.full(W.shape[0], th)
                rise.append((vc - v0) / v0)
                got["cone"] += node_lower_bound(X, lam, [(c, th) for c in C])[0] >= v0
                got["second_order"] += T.second_order_bound(X, lam, C, ths, Zc, bc) >= v0
                got["affine"] += affine_dual_bound(X, lam, C, ths, U0)[0] >= v0
            rows.append({"theta": th, "distance_in_caps": m, "tilts": tilts, "centre_rise_median": float(np.median(rise)),
                         **{f"pruned_{name}": int(v) for name, v in got.items()}})
            print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--width", type=int, default=3)
    ap.add_argument("--points", type=int, default=40)
    ap.add_argument("--lam", type=float, default=0.3)
    ap.add_argument("--tilts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-affine", action="store_true", help="skip the robust affine dual bound (cvxpy)")
    ap.add_argument("--prune-tilts", type=int, default=5, help="random off-centre nodes per cap angle and distance")
    args = ap.parse_args()
    X = np.random.default_rng(args.seed).standard_normal((args.points, args.dim)) * 2.0
    lam = args.lam
    # the search's incumbent (found by its multistart in the first second), polished to stationarity
    start = wl.solve(X, lam=lam, width=args.width, time_limit=1.0)
    _, W, _, _ = _polish(X, lam, start.dictionary, start.bias, 5000)
    v0, Z0, b0 = value_at(X, lam, W)
    rng = np.random.default_rng(1)
    rows = []
    for th in THETAS:
        cone, _ = node_lower_bound(X, lam, [(w, th) for w in W])
        second = T.second_order_bound(X, lam, W, np.full(W.shape[0], th), Z0, b0)
        rises, own = [], []
        for _ in range(args.tilts):
            D = rng.standard_normal(W.shape)
            D -= (D * W).sum(axis=1, keepdims=True) * W
            D *= np.tan(th) / np.linalg.norm(D, axis=1, keepdims=True)  # each atom tilted by exactly theta
            W2 = W + D
            W2 /= np.linalg.norm(W2, axis=1, keepdims=True)
            rises.append((value_at(X, lam, W2)[0] - v0) / v0)
            qv = construction_value(X, lam, W, Z0, b0, W2)
            if qv is not None:
                own.append((v0 - qv) / v0)
        affine = (None,) * 4
        parts = {}
        if not args.no_affine and th in AFFINE_THETAS:
            ths, U0 = np.full(W.shape[0], th), centre_dual(X, lam, W)[1]
            affine = affine_dual_bound(X, lam, W, ths, U0)
            if th in (0.1, 0.05):  # what the second-order terms cost (the program's values, not bounds)
                for drop in (("constraints",), ("objective",), ("constraints", "objective")):
                    parts["without_" + "_and_".join(drop)] = (v0 - affine_dual_bound(X, lam, W, ths, U0, drop)[0]) / v0
            if affine[0] > v0 * (1 + min(rises)) + 1e-9 * v0:  # a lower bound above a dictionary of the caps
                raise AssertionError(f"the affine bound {affine[0]!r} exceeds a sampled value at theta {th}")
        rows.append({"theta": th, "cone_loss": (v0 - cone) / v0,
                     "affine_loss": None if affine[0] is None else (v0 - affine[0]) / v0,
                     "affine_seconds": affine[1], "affine_clarabel_seconds": affine[2],
                     "affine_violation_before_scaling": affine[3], "affine_program_loss_parts": parts,
                     "dual_point_loss_max": max(own) if own else None, "dual_point_feasible": len(own),
                     "second_order_loss": (v0 - second) / v0 if np.isfinite(second) else None,
                     "rise_median": float(np.median(rises)), "rise_min": float(np.min(rises))})
        print(rows[-1], flush=True)
    prune = [] if args.no_affine else pruning(X, lam, W, v0, args.prune_tilts)
    md = [f"# Node-bound losses near the optimum: {args.points} Gaussian points x 2 in {args.dim}-D, width "
          f"{args.width}, lam {lam}", "", f"Optimum (stationary incumbent): {v0:.10g}", "",
          "| cap angle (rad) | cone bound loss | second-order bound loss | its dual point's loss (max over tilts) "
          "| robust affine bound loss (s per node) | objective rise, median | min |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        so = "does not apply" if r["second_order_loss"] is None else f"{r['second_order_loss']:.1e}"
        dp = ("infeasible" if r["dual_point_loss_max"] is None else
              f"{r['dual_point_loss_max']:.1e} ({r['dual_point_feasible']}/{args.tilts} feasible)")
        af = ("" if r["affine_loss"] is None else
              f"{r['affine_loss']:.1e} ({r['affine_seconds']:.1f} s, {r['affine_clarabel_seconds']:.2f} s in Clarabel)")
        md.append(f"| {r['theta']:g} | {r['cone_loss']:.1e} | {so} | {dp} | {af} | {r['rise_median']:.1e} | "
                  f"{r['rise_min']:.1e} |")
    parts = [r for r in rows if r["affine_program_loss_parts"]]
    if parts:
        md += ["", "What the affine program's second-order terms cost (its loss with them left out: not bounds)", "",
               "| cap angle (rad) | bound | without the constraints' bilinear parts | without the objective's | without both |",
               "|---|---|---|---|---|"]
        for r in parts:
            pr = r["affine_program_loss_parts"]
            md.append(f"| {r['theta']:g} | {r['affine_loss']:.1e} | {pr['without_constraints']:.1e} | "
                      f"{pr['without_objective']:.1e} | {pr['without_constraints_and_objective']:.1e} |")
    if prune:
        md += ["", f"Nodes whose centre is every atom of the optimum tilted by m cap angles ({args.prune_tilts} random "
               "directions each): how many each bound prunes (bound >= the optimum)", "",
               "| cap angle (rad) | m | centre's rise, median | cone | second-order | robust affine |",
               "|---|---|---|---|---|---|"]
        for r in prune:
            md.append(f"| {r['theta']:g} | {r['distance_in_caps']} | {r['centre_rise_median']:.1e} | "
                      f"{r['pruned_cone']} | {r['pruned_second_order']} | {r['pruned_affine']} |")
    write(f"finite_bound_loss_{args.dim}d_k{args.width}",
          {"args": vars(args), "optimum": v0, "dictionary": W.tolist(), "rows": rows, "pruning": prune},
          "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
