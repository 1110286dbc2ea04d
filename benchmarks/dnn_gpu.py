"""DNN relaxation solver (widelimit.relax.dnn.solve_dnn) on the CPU and on CUDA: time and certified gap.

Standard normal points (``widelimit.data.datasets.gaussian(N, dim)``, ``lam = 0.5``: the "random"
family of the relaxation benchmark); the same
tolerance on each device; the wide-limit optimum (``widelimit.solve``) is the reference the
relaxation bounds from below.

Usage::

    PYTHONPATH=. python3 benchmarks/dnn_gpu.py [--devices cpu,cuda] [--sizes 100,200,400] [--quick]

``--quick``: N = 20 only (seconds on a CPU). Devices that are not available are skipped (and said so).
Results: ``<out>/dnn_gpu.json`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main():
    import torch

    import widelimit as wl
    from widelimit.data.datasets import gaussian
    from widelimit.relax.dnn import solve_dnn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--sizes", default="100,200,400")
    ap.add_argument("--dim", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    sizes = [20] if args.quick else [int(s) for s in args.sizes.split(",")]
    devices = [d for d in args.devices.split(",") if d]
    rows, skipped = [], []
    for dev in devices:
        if dev.startswith("cuda") and not torch.cuda.is_available():
            skipped.append(dev)
            print(f"{dev}: not available, skipped", flush=True)
            continue
        for N in sizes:
            X, _ = gaussian(N, args.dim, seed=0)
            lam = 0.5
            exact = wl.solve(X, lam=lam).value
            t = time.perf_counter()
            r = solve_dnn(X, lam=lam, tol=args.tol, time_limit=args.time_limit, device=dev)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            row = {"device": dev, "N": N, "dim": args.dim, "time_s": time.perf_counter() - t, "value": r.value,
                   "lower_bound": r.lower_bound, "exact_value": exact, "iterations": r.n_iter,
                   "certified_rel_gap": (r.value - r.lower_bound) / max(abs(r.value), 1e-300)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "dnn_gpu_quick.json" if args.quick else "dnn_gpu.json"
    (args.out / name).write_text(json.dumps({"rows": rows, "skipped_devices": skipped, "config": vars(args) | {
        "out": str(args.out)}}, indent=2, default=float))
    print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
