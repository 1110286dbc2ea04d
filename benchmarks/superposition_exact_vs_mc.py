"""Exact Ltilde (cumulant formula) vs batched Monte Carlo (the usual way: sample inputs) at equal accuracy.

For each (d, n, m, p) a random W at its optimal scale is evaluated (i) exactly and (ii) by
torch Monte Carlo on the CPU. A pilot MC run of ``--pilot`` samples gives the per-sample
standard deviation and time; the MC time to reach a standard error of ``--rel`` x |Ltilde|
is the pilot time scaled to the needed sample count (reported with the pilot numbers). The
exact value must lie within 4 pilot standard errors of the MC estimate (checked).

    python benchmarks/superposition_exact_vs_mc.py [--rel 1e-3] [--pilot 200000]
"""

from __future__ import annotations

import argparse

import numpy as np

from _common import timed, write
from widelimit.lab import superposition as sp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rel", type=float, default=1e-3)
    ap.add_argument("--pilot", type=int, default=200_000)
    a = ap.parse_args()
    cases = [(8, 32, 3, 0.05), (16, 128, 3, 0.02), (32, 512, 3, 0.01), (32, 512, 5, 0.01), (64, 2048, 3, 0.005)]
    rows = []
    for d, n, m, p in cases:
        W = sp.optimal_scale(np.random.default_rng(0).standard_normal((d, n)) / np.sqrt(d), p, m).W
        t_ex, ex = timed(sp.ltilde, W, p, m, repeat=3)
        t_mc, mc = timed(sp.ltilde, W, p, m, method="mc", n_samples=a.pilot, batch_size=20_000, device="cpu")
        z = (mc.value - ex.value) / mc.stderr
        assert abs(z) <= 4, (d, n, m, p, z)
        sd = mc.stderr * np.sqrt(a.pilot)
        need = (sd / (a.rel * abs(ex.value))) ** 2
        t_need = t_mc * need / a.pilot
        rows.append({"d": d, "n": n, "m": m, "p": p, "value": ex.value, "exact_s": t_ex, "mc_pilot_samples": a.pilot,
                     "mc_pilot_s": t_mc, "mc_pilot_z": z, "mc_samples_needed": need, "mc_s_needed": t_need,
                     "ratio": t_need / t_ex})
    md = [f"Exact Ltilde vs torch Monte Carlo (CPU) to a standard error of {a.rel:g} x |Ltilde|.", "",
          "| d | n | m | p | Ltilde | exact (s) | MC pilot (s, samples, z) | MC samples needed | MC time needed (s) | MC / exact |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['d']} | {r['n']} | {r['m']} | {r['p']} | {r['value']:.4g} | {r['exact_s']:.3g} | "
                  f"{r['mc_pilot_s']:.3g}, {r['mc_pilot_samples']}, {r['mc_pilot_z']:+.2f} | {r['mc_samples_needed']:.3g} | "
                  f"{r['mc_s_needed']:.3g} | {r['ratio']:.3g} |")
    write("superposition_exact_vs_mc", {"rel": a.rel, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
