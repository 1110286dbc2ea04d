"""How much the finite-width node bounds lose, against how much the objective itself rises, near an optimum.

The branch and bound of docs/theory.md §7 prunes a node when its certified lower bound reaches the
incumbent. Around a stationary dictionary ``W*`` (the best of the search's multistart, polished), with
every atom's cap of angle ``theta`` centred on ``W*``, this script measures side by side:

* the cone bound's loss ``(L* - bound) / L*`` (docs/theory.md §7.2-§7.3, first order in ``theta``);
* the second-order bound's loss (docs/theory.md §7.6, ``O(theta^2)`` at a stationary point);
* the objective's own rise ``(V(W) - L*) / L*`` at dictionaries tilted by ``theta`` in random tangent
  directions (median and minimum of ``--tilts``), ``V(W)`` the exact optimum over codes and bias;
* at the same tilts, the value ``q(u(W))`` of the second-order bound's dual point itself (built
  explicitly, as in tests/test_finite_taylor.py, with every point that is not on ``n`` atoms carrying):
  the largest loss ``(L* - q(u(W))) / L*`` over the tilts where ``u(W)`` is feasible. The gap between
  this and the bound's loss is what the bound's norm estimates give away.

A bound prunes the nodes at distance ``d`` from ``W*`` only once its loss is below the rise there, so
the ratio of loss to rise sets how many nodes a level of the search keeps (docs/benchmarks.md).

Run:  PYTHONPATH=. python3 benchmarks/finite_bound_loss.py [--dim 3] [--width 3] [--points 40]
Writes benchmarks/results/finite_bound_loss_<dim>d_k<width>.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

import widelimit as wl  # noqa: E402
from widelimit.finite import _taylor as T  # noqa: E402
from widelimit.finite.bnb import _polish, node_lower_bound  # noqa: E402

THETAS = (0.3, 0.1, 0.05, 0.03, 0.02, 0.01, 0.005, 0.002, 0.001)


def value_at(X, lam, W):
    """Exact optimum over codes and bias at a fixed dictionary (coordinate descent to 1e-15)."""
    b = np.zeros(X.shape[1])
    Z = np.zeros((X.shape[0], W.shape[0]))
    return float(T.fixed_dictionary(X, lam, W, b, Z, 200000, 1e-15)), Z, b


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--width", type=int, default=3)
    ap.add_argument("--points", type=int, default=40)
    ap.add_argument("--lam", type=float, default=0.3)
    ap.add_argument("--tilts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
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
        rows.append({"theta": th, "cone_loss": (v0 - cone) / v0,
                     "dual_point_loss_max": max(own) if own else None, "dual_point_feasible": len(own),
                     "second_order_loss": (v0 - second) / v0 if np.isfinite(second) else None,
                     "rise_median": float(np.median(rises)), "rise_min": float(np.min(rises))})
        print(rows[-1], flush=True)
    md = [f"# Node-bound losses near the optimum: {args.points} Gaussian points x 2 in {args.dim}-D, width "
          f"{args.width}, lam {lam}", "", f"Optimum (stationary incumbent): {v0:.10g}", "",
          "| cap angle (rad) | cone bound loss | second-order bound loss | its dual point's loss (max over tilts) "
          "| objective rise, median | min |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        so = "does not apply" if r["second_order_loss"] is None else f"{r['second_order_loss']:.1e}"
        dp = ("infeasible" if r["dual_point_loss_max"] is None else
              f"{r['dual_point_loss_max']:.1e} ({r['dual_point_feasible']}/{args.tilts} feasible)")
        md.append(f"| {r['theta']:g} | {r['cone_loss']:.1e} | {so} | {dp} | {r['rise_median']:.1e} | "
                  f"{r['rise_min']:.1e} |")
    write(f"finite_bound_loss_{args.dim}d_k{args.width}",
          {"args": vars(args), "optimum": v0, "dictionary": W.tolist(), "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
