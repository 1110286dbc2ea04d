"""widelimit.fit_dictionary vs scikit-learn's DictionaryLearning on the same objective, side by side.

scikit-learn minimises ``0.5 ||X - U V||_F^2 + alpha ||U||_1`` over ``U >= 0``
(``positive_code=True``) and atoms ``||v_d|| <= 1``, with no bias: the same
minimisers as theory.md §1 with ``b = 0`` fixed and ``alpha = lam``. Both are run
on the same data, width and thread count; each final objective is evaluated by
``widelimit.sae_objective`` in float64 (atom norms folded in). The ratio is

    speed-up = (scikit-learn's total fit time) / (time widelimit needs to reach
               scikit-learn's final objective),

read from widelimit's history (the objective of its running iterate, summed in
float64; the final value is re-evaluated in float64 with certified optimal codes).
Dictionary learning is nonconvex and which local minimum a run ends in depends on
the initialisation, so widelimit runs with several seeds (``--seeds``) and the
headline speed-up uses the median time over the seeds (a seed that never reaches
scikit-learn's value within scikit-learn's own time counts as infinitely slow);
every seed is in the JSON. scikit-learn's initialisation (an SVD of X) is
deterministic. widelimit is also run with its bias learned (seed 0), the objective
it is built for.

Usage::

    PYTHONPATH=. python3 benchmarks/gradient_vs_sklearn.py [--sizes 2000,20000] [--threads 1] [--seeds 0,1,2,3,4]

Results: benchmarks/results/gradient_vs_sklearn.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np


def make_data(N, n=64, n_atoms=96, active=3, noise=0.05, seed=0):
    """Sparse nonnegative combinations of random unit atoms plus noise (no offset: sklearn has no bias)."""
    rng = np.random.default_rng(seed)
    D = rng.standard_normal((n_atoms, n))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    S = np.zeros((N, n_atoms))
    for i in range(N):
        idx = rng.choice(n_atoms, active, replace=False)
        S[i, idx] = rng.exponential(1.0, active) + 0.5
    return S @ D + noise * rng.standard_normal((N, n))


def run_sklearn(X, lam, width, max_iter, seed):
    from sklearn.decomposition import DictionaryLearning

    from widelimit import sae_objective

    dl = DictionaryLearning(n_components=width, alpha=lam, positive_code=True, fit_algorithm="cd",
                            transform_algorithm="lasso_cd", transform_alpha=lam, max_iter=max_iter, tol=1e-8,
                            random_state=seed)
    t = time.perf_counter()
    U = dl.fit_transform(X)
    el = time.perf_counter() - t
    V = dl.components_
    val = sae_objective(X, V, U, np.zeros(X.shape[1]), lam=lam).value
    return {"time_s": el, "value": val, "n_iter": int(dl.n_iter_), "max_iter": max_iter}


def run_widelimit(X, lam, width, seed, learn_bias, time_limit):
    import widelimit as wl

    n = X.shape[1]
    kw = {} if learn_bias else {"bias": np.zeros(n), "learn_bias": False}
    fit = wl.fit_dictionary(X, lam=lam, width=width, device="cpu", seed=seed, time_limit=time_limit, **kw)
    return fit


def time_to_reach(fit, target):
    for h in fit.history:
        if h["value"] <= target:
            return h["time_s"]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000,20000")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--lam", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=1, help="BLAS / torch threads for both libraries")
    ap.add_argument("--sklearn-iters", default="30,15", help="DictionaryLearning max_iter per size")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="widelimit seeds (the speed-up uses their median time)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    iters = [int(s) for s in args.sklearn_iters.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with threadpool_limits(args.threads):
        for N, it in zip(sizes, iters):
            X = make_data(N)
            sk = run_sklearn(X, args.lam, args.width, it, seed=0)
            per_seed = []
            for seed in seeds:
                fit = run_widelimit(X, args.lam, args.width, seed, learn_bias=False, time_limit=sk["time_s"])
                t_reach = time_to_reach(fit, sk["value"])
                per_seed.append({"seed": seed, "time_to_sklearn_value_s": t_reach,
                                 "speedup": None if t_reach is None else sk["time_s"] / max(t_reach, 1e-9),
                                 "final_value": fit.value, "total_time_s": fit.time_s, "steps": fit.n_iter,
                                 "stop": fit.stop_reason})
            times = [math.inf if s["time_to_sklearn_value_s"] is None else s["time_to_sklearn_value_s"]
                     for s in per_seed]
            t_med = float(np.median(times))
            finals = [s["final_value"] for s in per_seed]
            fitb = run_widelimit(X, args.lam, args.width, seeds[0], learn_bias=True, time_limit=sk["time_s"] / 2)
            row = {
                "N": N, "n": X.shape[1], "width": args.width, "lam": args.lam,
                "sklearn_max_iter": it, "sklearn_n_iter": sk["n_iter"],
                "sklearn_time_s": sk["time_s"], "sklearn_value": sk["value"],
                "seeds": seeds,
                "widelimit_median_time_to_sklearn_value_s": None if math.isinf(t_med) else t_med,
                "speedup_median": None if math.isinf(t_med) else sk["time_s"] / max(t_med, 1e-9),
                "seeds_reaching": int(sum(math.isfinite(t) for t in times)),
                "widelimit_final_value_median": float(np.median(finals)),
                "widelimit_final_value_min": min(finals), "widelimit_final_value_max": max(finals),
                "per_seed": per_seed,
                "widelimit_with_bias_value": fitb.value, "widelimit_with_bias_time_s": fitb.time_s,
                "load_average": os.getloadavg(),
            }
            rows.append(row)
            print(json.dumps(row))
    meta = {"threads": args.threads, "machine": platform.platform(), "processor": platform.processor(),
            "python": platform.python_version(), "torch": torch.__version__,
            "sklearn": __import__("sklearn").__version__,
            "command": f"PYTHONPATH=. python3 benchmarks/gradient_vs_sklearn.py --sizes {args.sizes} "
                       f"--width {args.width} --lam {args.lam} --threads {args.threads} "
                       f"--sklearn-iters {args.sklearn_iters} --seeds {args.seeds}",
            "data": "make_data(N): 3-sparse nonnegative combinations of 96 random unit atoms in R^64, noise 0.05"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gradient_vs_sklearn.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    md = ["| N | n | width | sklearn iters | sklearn time (s) | sklearn objective | widelimit median time to that "
          "objective (s) | median speed-up | seeds reaching it | per-seed speed-ups | widelimit final objective "
          "(b = 0; median, min-max over seeds) | widelimit objective with learned bias | load average |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["widelimit_median_time_to_sklearn_value_s"]
        reach = "not reached" if t is None else f"{t:.3f}"
        speed = "-" if r["speedup_median"] is None else f"{r['speedup_median']:.1f}x"
        each = ", ".join("-" if s["speedup"] is None else f"{s['speedup']:.0f}x" for s in r["per_seed"])
        md.append(f"| {r['N']} | {r['n']} | {r['width']} | {r['sklearn_n_iter']} | {r['sklearn_time_s']:.2f} | "
                  f"{r['sklearn_value']:.6f} | {reach} | {speed} | {r['seeds_reaching']}/{len(r['seeds'])} | {each} | "
                  f"{r['widelimit_final_value_median']:.6f} ({r['widelimit_final_value_min']:.6f}-"
                  f"{r['widelimit_final_value_max']:.6f}) | {r['widelimit_with_bias_value']:.6f} | "
                  f"{' '.join(f'{v:.2f}' for v in r['load_average'])} |")
    md.append("")
    md.append(f"Command: `{meta['command']}` ({args.threads} thread(s) for both; {meta['machine']}).")
    (args.out / "gradient_vs_sklearn.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
