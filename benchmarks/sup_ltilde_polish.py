"""How far from converged are the sup-ltilde experiment's best weights? Continue L-BFGS from the stored W.

The experiment gives each ascent 300 L-BFGS iterations (``max_iter``). This script takes the stored best ``W``
of a few cells (``docs/experiments/sup_ltilde/sup-ltilde-weights.npz``), continues the ascent for up to
``--max-iter`` more iterations (``widelimit.lab.sup_ltilde.ascend``, tolerance 1e-15) and reports the
relative gain: how much the reported values understate what the same basin reaches.

    python benchmarks/sup_ltilde_polish.py [--max-iter 3000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from _common import timed, write
from widelimit._runtime import limit_threads
from widelimit.lab import sup_ltilde as sl

CELLS = [("rademacher", 20, 0.03), ("gaussian", 20, 0.03), ("laplace", 20, 0.1), ("rademacher", 50, 0.03),
         ("gaussian", 50, 0.1), ("laplace", 50, 1.0)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-iter", type=int, default=3000)
    ap.add_argument("--weights", default=str(Path(__file__).resolve().parents[1] / "docs" / "experiments" / "sup_ltilde"
                                             / "sup-ltilde-weights.npz"))
    a = ap.parse_args()
    Z = np.load(a.weights)
    rows = []
    with limit_threads(1):
        for law, d, p in CELLS:
            W = Z[f"{law}_d{d}_p{p:g}"].astype(np.float64)
            v0 = sl.ltilde3(W, p, law)[0]
            t, (_, v, nit, status) = timed(sl.ascend, W, p, sl.law_moments(law), max_iter=a.max_iter, tol=1e-15)
            rows.append({"law": law, "d": d, "p": p, "n": W.shape[1], "value": v0, "polished": v,
                         "rel_gain": (v - v0) / v0, "n_iter": nit, "status": status, "time_s": t})
    md = [f"Continuing L-BFGS from the sup-ltilde experiment's stored best W (up to {a.max_iter} iterations).", "",
          "| law | d | p | n | value (stored W) | after polishing | relative gain | n_iter | status |",
          "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['law']} | {r['d']} | {r['p']:g} | {r['n']} | {r['value']:.6g} | {r['polished']:.6g} | "
           f"{r['rel_gain']:.2e} | {r['n_iter']} | {r['status']} |" for r in rows]
    write("sup_ltilde_polish", {"max_iter": a.max_iter, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
