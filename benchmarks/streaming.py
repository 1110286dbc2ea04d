"""Out-of-core benchmark: the certified wide-limit bound streamed from disk, single process vs Dask.

Writes ``N x n`` float32 activations as ``.npy`` shards, then, each stage in a
fresh process (so that its peak resident memory is its own):

* ``read``   -- a plain sequential read of the same files (``readinto`` a reused
  buffer, same chunk size): the bandwidth baseline, cold (files evicted from
  the page cache with ``posix_fadvise(DONTNEED)``) and warm;
* ``stream`` -- ``huber_median(ActivationSource.open(dir), lam)`` in this process:
  passes, time per pass (from the progress callback), peak RSS;
* ``dask``   -- the same on a ``LocalCluster`` of ``--workers`` processes
  (``from_source``; blocks re-read every pass, not persisted, so memory stays
  bounded like the single process): time, peak RSS of every worker.

Results go to ``benchmarks/results/streaming.json`` and ``.md``; the shards are
deleted afterwards (``--keep`` keeps them).

    PYTHONPATH=. python3 benchmarks/streaming.py --N 10000000 --n 128
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _maxrss_mb() -> float:
    """Peak resident memory of this process (VmHWM; ru_maxrss would include the parent's, inherited over exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("shard_*.npy"), key=lambda p: int(p.stem.split("_")[1]))


def _evict(d: Path) -> None:
    """Drop these files (only) from the page cache, so the next read comes from the disk."""
    for f in _files(d):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def generate(d: Path, N: int, n: int, shards: int, seed: int) -> dict:
    """Activations on ``n_rays`` rays around a centre, plus a core within ``lam``, with noise."""
    d.mkdir(parents=True, exist_ok=True)
    meta = d / "bench.json"
    want = {"N": N, "n": n, "shards": shards, "seed": seed}
    if meta.exists() and json.loads(meta.read_text()) == want and len(_files(d)) == shards:
        return {"seconds": 0.0, "reused": True}
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal(n).astype(np.float32)
    U = rng.standard_normal((64, n)).astype(np.float32)
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    edges = np.linspace(0, N, shards + 1).astype(np.int64)
    t0 = time.perf_counter()
    for i in range(shards):
        rows = int(edges[i + 1] - edges[i])
        r = np.random.default_rng([seed, i])
        out = np.lib.format.open_memmap(d / f"shard_{i}.npy", mode="w+", dtype=np.float32, shape=(rows, n))
        step = 1 << 18
        for s in range(0, rows, step):
            m = min(step, rows - s)
            lab = r.integers(0, 64, m)
            rad = r.exponential(2.0, m).astype(np.float32) * (r.random(m) > 0.2)
            blk = U[lab] * rad[:, None] + 0.1 * r.standard_normal((m, n), dtype=np.float32)
            out[s : s + m] = blk + centre
        out.flush()
        del out
    meta.write_text(json.dumps(want))
    return {"seconds": time.perf_counter() - t0}


def stage_read(d: Path, rows: int) -> dict:
    files = _files(d)
    n = np.load(files[0], mmap_mode="r").shape[1]
    buf = bytearray(rows * n * 4)
    res = {}
    for label in ("cold", "warm"):
        if label == "cold":
            _evict(d)
        t0 = time.perf_counter()
        total = 0
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while True:
                    k = fh.readinto(buf)
                    if not k:
                        break
                    total += k
        res[f"{label}_seconds"] = time.perf_counter() - t0
        res[f"{label}_GBps"] = total / res[f"{label}_seconds"] / 1e9
    res["bytes"] = total
    res["peak_rss_MB"] = _maxrss_mb()
    return res


def _timed_median(X, lam):
    import widelimit as wl

    marks = []
    t0 = time.perf_counter()

    def cb(ev):  # the end of each pass (the engine's event; the solver's own events repeat the index)
        if ev.done and (not marks or marks[-1][0] != ev.pass_index):
            marks.append((ev.pass_index, ev.stage, time.perf_counter() - t0))

    c0 = time.process_time()
    res = wl.huber_median(X, lam=lam, progress=cb)
    total = time.perf_counter() - t0
    return res, total, marks, time.process_time() - c0


def stage_stream(d: Path, lam: float) -> dict:
    from widelimit.data.source import ActivationSource

    S = ActivationSource.open(d)
    _evict(d)
    res, total, marks, cpu = _timed_median(S, lam)
    times = np.diff([0.0] + [m[2] for m in marks])
    return {
        "seconds": total, "cpu_seconds": cpu, "n_passes": res.n_passes, "n_iter": res.n_iter, "converged": bool(res.certified),
        "rel_gap": res.rel_gap, "lower_bound": res.lower_bound, "value": res.value, "bias": res.point.tolist(),
        "pass_seconds": times.tolist(), "pass_stages": [m[1] for m in marks],
        "first_pass_seconds": float(times[0]), "median_pass_seconds": float(np.median(times)),
        "min_pass_seconds": float(times.min()), "peak_rss_MB": _maxrss_mb(),
    }


def stage_dask(d: Path, lam: float, workers: int) -> dict:
    from distributed import Client, LocalCluster

    import widelimit.engine.dask_engine as wdb
    from widelimit.data.source import ActivationSource

    wdb.PERSIST = False  # stream from the files every pass: memory bounded like the single process
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        X = wdb.from_source(ActivationSource.open(d))
        client.run(lambda: None)
        _evict(d)
        wcpu0 = client.run(time.process_time)
        res, total, marks, cpu = _timed_median(X, lam)
        wcpu1 = client.run(time.process_time)
        rss = client.run(_maxrss_mb)
    times = np.diff([0.0] + [m[2] for m in marks])
    return {
        "seconds": total, "client_cpu_seconds": cpu,
        "worker_cpu_seconds": sum(wcpu1[k] - wcpu0[k] for k in wcpu1 if k in wcpu0),
        "n_passes": res.n_passes, "converged": bool(res.certified), "rel_gap": res.rel_gap,
        "lower_bound": res.lower_bound, "value": res.value, "bias": res.point.tolist(),
        "pass_seconds": times.tolist(), "median_pass_seconds": float(np.median(times)),
        "min_pass_seconds": float(times.min()), "workers": workers, "blocks": len(X.chunks[0]),
        "worker_peak_rss_MB": sorted(rss.values()), "client_peak_rss_MB": _maxrss_mb(),
    }


def _child(stage: str, args) -> dict:
    cmd = [sys.executable, __file__, "--stage", stage, "--dir", str(args.dir), "--lam", str(args.lam),
           "--workers", str(args.workers), "--rows", str(args.rows)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # one BLAS thread, as Dask workers use by default: on a shared 2-core machine a threaded
    # OpenBLAS spins and made a 128 x 128 eigh 100x slower; the comparison stays like for like
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=20_000_000, help="rows (the issue's target: 2e7)")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=0, help="read-baseline chunk rows (default: the streaming chunk)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/widelimit-stream-bench"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--keep", action="store_true", help="keep the generated shards")
    ap.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.stage:  # a child process
        if args.stage == "read":
            r = stage_read(args.dir, args.rows)
        elif args.stage == "stream":
            r = stage_stream(args.dir, args.lam)
        else:
            r = stage_dask(args.dir, args.lam, args.workers)
        print(json.dumps(r))
        return

    from widelimit.engine.local import chunk_rows

    args.rows = args.rows or chunk_rows(args.n) * 2  # float32 rows in the same bytes as a float64 chunk
    gen = generate(args.dir, args.N, args.n, args.shards, args.seed)
    print(f"generated {args.N} x {args.n} float32 in {args.shards} shards ({gen['seconds']:.0f} s)", flush=True)
    try:
        read = _child("read", args)
        print("read", json.dumps(read), flush=True)
        stream = _child("stream", args)
        print("stream", json.dumps({k: v for k, v in stream.items() if k != "bias"}), flush=True)
        dask = _child("dask", args)
        print("dask", json.dumps({k: v for k, v in dask.items() if k != "bias"}), flush=True)
        read2 = _child("read", args)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    warm = min(read["warm_seconds"], read2["warm_seconds"])
    cold = min(read["cold_seconds"], read2["cold_seconds"])
    b1, b2 = np.array(stream["bias"]), np.array(dask["bias"])
    result = {
        "N": args.N, "n": args.n, "GB": read["bytes"] / 1e9, "shards": args.shards, "lam": args.lam,
        "cpu_count": os.cpu_count(),
        "read_cold_seconds": cold, "read_warm_seconds": warm,
        "read_cold_GBps": read["bytes"] / cold / 1e9, "read_warm_GBps": read["bytes"] / warm / 1e9,
        "stream": {k: v for k, v in stream.items() if k != "bias"},
        "dask": {k: v for k, v in dask.items() if k != "bias"},
        "pass_over_warm_read": stream["median_pass_seconds"] / warm,
        "first_pass_over_cold_read": stream["first_pass_seconds"] / cold,
        "dask_over_single_time": dask["seconds"] / stream["seconds"],
        "dask_over_single_cpu": (dask["worker_cpu_seconds"] + dask["client_cpu_seconds"]) / stream["cpu_seconds"],
        "dask_vs_single_bias_rel": float(np.abs(b1 - b2).max() / max(np.abs(b1).max(), 1e-300)),
        "dask_vs_single_value_rel": abs(dask["value"] - stream["value"]) / abs(stream["value"]),
        "command": "PYTHONPATH=. python3 benchmarks/streaming.py " + " ".join(sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "streaming.json").write_text(json.dumps(result, indent=2))
    s, k = result["stream"], result["dask"]
    md = [
        f"# Streaming benchmark: N = {args.N:,}, n = {args.n}, float32 ({result['GB']:.2f} GB, {args.shards} .npy shards)",
        "",
        f"Machine: {os.cpu_count()} cores (shared). Command: `{result['command']}`",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| plain sequential read, cold / warm page cache | {cold:.1f} s ({result['read_cold_GBps']:.2f} GB/s) / {warm:.1f} s ({result['read_warm_GBps']:.2f} GB/s) |",
        f"| single process: passes, total | {s['n_passes']} passes, {s['seconds']:.1f} s (converged: {s['converged']}, rel gap {s['rel_gap']:.1e}) |",
        f"| single process: throughput (data bytes per pass time, median pass) | {result['GB'] / s['median_pass_seconds']:.2f} GB/s |",
        f"| single process: median pass / warm read | {s['median_pass_seconds']:.2f} s / {warm:.2f} s = **{result['pass_over_warm_read']:.2f}x** |",
        f"| single process: first (cold) pass / cold read | {s['first_pass_seconds']:.2f} s / {cold:.2f} s = **{result['first_pass_over_cold_read']:.2f}x** |",
        f"| single process: peak RSS | **{s['peak_rss_MB']:.0f} MB** |",
        f"| Dask LocalCluster ({k['workers']} workers, {k['blocks']} blocks): total, median pass | {k['seconds']:.1f} s, {k['median_pass_seconds']:.2f} s |",
        f"| Dask / single-process time | **{result['dask_over_single_time']:.2f}x** |",
        f"| CPU seconds: single process / Dask workers + client | {s['cpu_seconds']:.0f} / {k['worker_cpu_seconds']:.0f} + {k['client_cpu_seconds']:.0f} (ratio {result['dask_over_single_cpu']:.2f}) |",
        f"| Dask peak RSS: workers / client | {', '.join(f'{v:.0f}' for v in k['worker_peak_rss_MB'])} MB / {k['client_peak_rss_MB']:.0f} MB |",
        f"| Dask vs single process: bias, value (relative) | {result['dask_vs_single_bias_rel']:.1e}, {result['dask_vs_single_value_rel']:.1e} |",
        "",
    ]
    (args.out / "streaming.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
