"""CPU vs CUDA speed of the same torch code path: fit_dictionary and optimal_codes.

Default size (issue 4): N = 1e5 points, n = 256 dims, width 1024. Both devices run a fixed
number of outer steps (no early stop) from the same initial dictionary, so the time ratio
is the speed-up per step; the final objectives are reported too. Without CUDA the script
says so and writes nothing.

Usage::

    PYTHONPATH=. python3 benchmarks/gradient_gpu.py [--N 100000] [--n 256] [--width 1024] [--steps 20]
    PYTHONPATH=. python3 benchmarks/gradient_gpu.py --devices cpu --quick   # checks the script without a GPU

Results: benchmarks/results/gradient_gpu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main():
    import torch

    import widelimit as wl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=100_000)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lam", type=float, default=0.3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--devices", default="cuda,cpu", help="devices to run (cpu alone checks the script without a GPU)")
    ap.add_argument("--quick", action="store_true", help="N = 2000, n = 32, width 64, 5 steps")
    args = ap.parse_args()
    if args.quick:
        args.N, args.n, args.width, args.steps = 2000, 32, 64, 5
    devices = [d for d in args.devices.split(",") if d]
    if any(d.startswith("cuda") for d in devices) and not torch.cuda.is_available():
        print("no CUDA device: nothing to compare (use --devices cpu to check the script)")
        return
    rng = np.random.default_rng(0)
    D = rng.standard_normal((2 * args.width, args.n))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    S = np.zeros((args.N, D.shape[0]), dtype=np.float32)
    for i in range(args.N):
        idx = rng.choice(D.shape[0], 8, replace=False)
        S[i, idx] = rng.exponential(1.0, 8) + 0.5
    X = (S @ D + 0.05 * rng.standard_normal((args.N, args.n))).astype(np.float32)
    W0 = D[rng.choice(D.shape[0], args.width, replace=False)]
    res = {}
    for dev in devices:
        t = time.perf_counter()
        fit = wl.fit_dictionary(X, lam=args.lam, width=args.width, init=W0, device=dev, max_iter=args.steps, rtol=0)
        if dev == "cuda":
            torch.cuda.synchronize()
        res[dev] = {"fit_time_s": time.perf_counter() - t, "value": fit.value, "steps": fit.n_iter}
        t = time.perf_counter()
        oc = wl.optimal_codes(X, fit.dictionary, fit.bias, lam=args.lam, device=dev, return_codes=False)
        res[dev].update({"coding_time_s": time.perf_counter() - t, "coding_value": oc.value, "coding_gap": oc.gap})
        print(dev, res[dev], flush=True)
    if "cuda" not in res or "cpu" not in res:  # a one-device check run: no ratio
        print(json.dumps(res))
        return
    out = {"config": vars(args) | {"out": str(args.out)}, "device": torch.cuda.get_device_name(0), "results": res,
           "fit_speedup": res["cpu"]["fit_time_s"] / res["cuda"]["fit_time_s"],
           "coding_speedup": res["cpu"]["coding_time_s"] / res["cuda"]["coding_time_s"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gradient_gpu.json").write_text(json.dumps(out, indent=2))
    md = ["| task | CPU (s) | CUDA (s) | speed-up |", "|---|---|---|---|",
          f"| fit_dictionary, {args.steps} steps | {res['cpu']['fit_time_s']:.1f} | {res['cuda']['fit_time_s']:.1f} "
          f"| {out['fit_speedup']:.1f}x |",
          f"| optimal_codes | {res['cpu']['coding_time_s']:.1f} | {res['cuda']['coding_time_s']:.1f} "
          f"| {out['coding_speedup']:.1f}x |"]
    (args.out / "gradient_gpu.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
