"""Objective + gradient of Ltilde (m = 3) for L-BFGS: hand-written numpy vs torch autograd, and BLAS threads.

(1) One evaluation of ``(Ltilde, dLtilde/dW)`` by ``widelimit.lab.sup_ltilde.ltilde3_grad`` (numpy, the
gradient written out) against torch autograd through ``superposition.ltilde_exact_torch`` (the cumulant
code the training path uses), float64, one thread each; both values and gradients are checked to agree.
(2) The same fixed L-BFGS ascent (``sup_ltilde.ascend``, ``max_iter`` iterations, so equal work) with the
BLAS pool at one thread and at its default: on a shared machine OpenBLAS's spinning workers make the many
small products of L-BFGS much slower, which is why the sup-ltilde experiment runs under ``limit_threads(1)``.

    python benchmarks/sup_ltilde_objective.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from _common import timed, write
from widelimit._runtime import limit_threads
from widelimit.lab import sup_ltilde as sl
from widelimit.lab.superposition import ltilde_exact_torch


def _torch_eval(Wt, p, law):
    Wt.grad = None
    v = ltilde_exact_torch(Wt, p, 3, law)[0]
    v.backward()
    return float(v.detach()), Wt.grad


def main():
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    rows = []
    with limit_threads(1):
        for d, n in [(5, 40), (10, 80), (20, 160), (35, 280), (50, 200), (50, 400)]:
            W = np.random.default_rng(0).standard_normal((d, n)) / np.sqrt(d)
            mu = sl.law_moments("laplace")
            t_np, (v_np, g_np) = timed(sl.ltilde3_grad, W, 0.1, mu, repeat=a.repeat)
            Wt = torch.tensor(W, dtype=torch.float64, requires_grad=True)
            t_t, (v_t, g_t) = timed(_torch_eval, Wt, 0.1, "laplace", repeat=a.repeat)
            g_t = g_t.numpy()
            assert abs(v_np - v_t) <= 1e-10 * abs(v_t) and np.max(np.abs(g_np - g_t)) <= 1e-9 * np.max(np.abs(g_t))
            rows.append({"d": d, "n": n, "numpy_ms": 1e3 * t_np, "torch_ms": 1e3 * t_t, "speedup": t_t / t_np})
    spin = []
    for d, n in [(20, 160), (50, 400)]:
        W0 = np.random.default_rng(1).standard_normal((d, n)) / np.sqrt(d)
        mu = sl.law_moments("rademacher")
        out = {}
        sl.ascend(sl.rescale(W0, 0.01, mu)[0], 0.01, mu, max_iter=2)  # imports scipy.optimize outside the timing
        for label, threads in (("one", 1), ("default", os.cpu_count())):
            with limit_threads(threads):
                out[label] = timed(sl.ascend, sl.rescale(W0, 0.01, mu)[0], 0.01, mu, max_iter=100, tol=0.0,
                                      repeat=2)[0]
        spin.append({"d": d, "n": n, "one_thread_s": out["one"], "default_threads_s": out["default"],
                     "default_over_one": out["default"] / out["one"], "threads_default": os.cpu_count()})
    md = ["Ltilde (m = 3) value + gradient, one evaluation, float64, one thread: numpy by hand vs torch autograd.", "",
          "| d | n | numpy (ms) | torch autograd (ms) | torch / numpy |", "|---|---|---|---|---|"]
    md += [f"| {r['d']} | {r['n']} | {r['numpy_ms']:.3g} | {r['torch_ms']:.3g} | {r['speedup']:.1f} |" for r in rows]
    md += ["", "100 L-BFGS iterations (scipy L-BFGS-B), BLAS at one thread vs its default.", "",
           "| d | n | one thread (s) | default threads (s) | default / one |", "|---|---|---|---|---|"]
    md += [f"| {r['d']} | {r['n']} | {r['one_thread_s']:.3g} | {r['default_threads_s']:.3g} | "
           f"{r['default_over_one']:.2f} |" for r in spin]
    write("sup_ltilde_objective", {"rows": rows, "threads": spin}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
