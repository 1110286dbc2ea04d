"""Streaming 10^6 tokens through certify_sae: throughput over time, peak memory against tokens (issue 31 item 5).

Each run is a fresh child process (its peak memory is its own), one thread for everything (the machine is
shared), reading the activations from disk:

* **Activations** (d_in 384): the all-MiniLM-L6-v2 layer-3 activations of the text scikit-learn ships
  (5,667 tokens, ``benchmarks/certify_speed.py``'s ``activations``) **tiled** to 10^6 rows (and 10^5 rows),
  written once to ``--data`` (default ``$TMPDIR/widelimit-certify-streaming``, never the repository) twice:
  a ``.npy`` opened as ``np.load(mmap_mode="r")`` (the memory-mapped file) and a folder of ``.npy`` shards
  of 100,000 rows opened by ``widelimit.open_activations`` (the shard folder).
  Tiling keeps every token's coding cost the cost of a real activation, so a change of rate along the
  stream can only come from the streaming itself.
* **SAE**: the d_sae 4,096 ReLU SAE of ``benchmarks/certify_speed.py`` (trained there on the same
  activations, ``lam = 0.5``; cached in ``--cache``).
* **certify**: ``certify_sae(acts, sae, lam=0.5, threads=1, progress=cb)``; the callback records, every
  ``--every`` tokens of the certify pass, the event's ``time_s``, ``rows_per_s`` and ``time_left_s``, the rate
  over the last interval (wall and per CPU second of the process: the machine is shared, CPU seconds
  do not count the time other jobs took), and the process's resident memory (``VmRSS``: ``RssAnon``
  heap + ``RssFile`` mapped file pages) and its peak (``VmHWM``; ``ru_maxrss`` would include the
  parent's, inherited over ``exec``). The same at 10^5 tokens: the peaks compared.
* **forward**: the SAE's forward pass + standard metrics (``certify_speed.forward_metrics``, float32 torch,
  one thread) over the same memory-mapped tokens: the ratio of the certify pass to it.
* **wide cell**: d_in 768 x d_sae 16,384, optimal-code L0 ~30 (``benchmarks/_scale_data.py`` as
  ``certify_scale.py`` builds it, ``lam = 0.9``) over ``--wide-tokens`` streamed tokens from a
  memory-mapped ``.npy`` (and ``--wide-small``, at least one batch of 2,048 tokens, for the memory comparison).

Usage::

    PYTHONPATH=. python3 benchmarks/certify_streaming.py       # 10^6 and 10^5 tokens, 20,000 at d_sae 16,384
    PYTHONPATH=. python3 benchmarks/certify_streaming.py --tokens 200000 --small 20000 --every 20000 \
        --wide-tokens 4000 --parallel 3                            # what fitted a loaded shared machine
    PYTHONPATH=. python3 benchmarks/certify_streaming.py --tokens 200000 --small 20000 --every 20000 \
        --wide-tokens 8192 --wide-small 2048 --only-wide --parallel 3  # the wide cell again, over full batches

On one free core the default run takes about 40 minutes for the d_in 384 cell (10^6 tokens at about
1,000-1,500 tokens per CPU second, twice) and a few minutes for the wide cell (about 200 tokens per CPU
second: 10^6 tokens there would be 1.4 hours).

Writes ``benchmarks/results/certify_streaming.json`` and ``.md`` (rewritten after every run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import environment  # noqa: E402

RESULTS = HERE / "results"
SHARD_ROWS = 100_000


def _status() -> dict:
    """Resident memory of this process in MB: VmRSS, RssAnon, RssFile, VmHWM (its peak)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(line.split()[1]) / 1024.0
    return out


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------------------
# data (in --data, outside the repository)
# --------------------------------------------------------------------------------------


def tiled(X: np.ndarray, N: int, d: Path) -> tuple[Path, Path]:
    """``N`` rows of ``X`` tiled, as ``acts_N.npy`` and as the folder ``shards_N`` of SHARD_ROWS-row shards."""
    d.mkdir(parents=True, exist_ok=True)
    npy, folder = d / f"acts_{N}.npy", d / f"shards_{N}"
    if not npy.exists():
        mm = np.lib.format.open_memmap(str(npy) + ".part", mode="w+", dtype=np.float32, shape=(N, X.shape[1]))
        for s in range(0, N, X.shape[0]):
            e = min(N, s + X.shape[0])
            mm[s:e] = X[: e - s]
        mm.flush()
        del mm
        os.replace(str(npy) + ".part", npy)
    if not folder.exists():
        src = np.load(npy, mmap_mode="r")
        tmp = d / f"shards_{N}.part"
        tmp.mkdir(exist_ok=True)
        for i, s in enumerate(range(0, N, SHARD_ROWS)):
            np.save(tmp / f"shard_{i}.npy", np.asarray(src[s : s + SHARD_ROWS]))
        os.replace(tmp, folder)
    return npy, folder


def wide_cell(N: int, d: Path, n: int = 768, k: int = 16384, L: int = 30) -> tuple[Path, Path, float]:
    """``certify_scale.py``'s cell n x k x L: ``N`` tokens as a ``.npy``, the SAE as ``.npz``, and its lam."""
    from _scale_data import dictionary, sae_weights, tokens
    from certify_scale import LAM

    d.mkdir(parents=True, exist_ok=True)
    npy, sae = d / f"wide_{n}x{k}x{L}_{N}.npy", d / f"wide_{n}x{k}x{L}_sae.npz"
    if not npy.exists() or not sae.exists():
        D = dictionary(n, k)
        X = tokens(D, N, L)
        np.save(npy, X)
        if not sae.exists():
            np.savez(sae, **sae_weights(D, X[: min(N, 500)], L))
    return npy, sae, LAM[L]


# --------------------------------------------------------------------------------------
# one run, in a child process
# --------------------------------------------------------------------------------------


def _child(args) -> None:
    import torch  # noqa: F401  (loaded before the baseline)

    import widelimit as wl
    from certify_speed import forward_metrics
    from widelimit._runtime import limit_threads
    from widelimit.sae.model import SAE

    w = {k: np.asarray(v, dtype=np.float32) for k, v in np.load(args.sae).items()}
    sae = SAE(W_dec=w["W_dec"], b_dec=w["b_dec"], W_enc=w["W_enc"], b_enc=w["b_enc"], architecture="standard",
              l1_coefficient=2 * args.lam)
    acts = wl.open_activations(args.acts) if args.kind == "shards" else np.load(args.acts, mmap_mode="r")
    N = int(acts.shape[0])
    if args.side == "certify":  # compile the kernels before the baseline
        wl.certify_sae(np.asarray(acts[:64]), sae, lam=args.lam, threads=1)
    else:
        with limit_threads(1):
            forward_metrics(w, np.asarray(acts[:64]))
    base = _status()
    marks = []
    t0, c0 = time.perf_counter(), _cpu_s()
    if args.side == "forward":
        with limit_threads(1):
            m = forward_metrics(w, acts)
        dt, dc = time.perf_counter() - t0, _cpu_s() - c0
        extra = {"l0": m["l0"], "mse": m["mse"]}
    else:
        nxt = [args.every]
        last = {"rows": 0, "time_s": 0.0, "cpu": c0}

        def cb(ev):
            if ev.stage != "certify" or (ev.rows_done < nxt[0] and not ev.done):
                return
            while nxt[0] <= ev.rows_done:
                nxt[0] += args.every
            c = _cpu_s()
            dr = ev.rows_done - last["rows"]
            marks.append({"tokens": ev.rows_done, "time_s": ev.time_s, "rows_per_s": ev.rows_per_s,
                          "time_left_s": ev.time_left_s,
                          "interval_tokens_per_s": dr / max(1e-9, ev.time_s - last["time_s"]),
                          "interval_tokens_per_cpu_s": dr / max(1e-9, c - last["cpu"]),
                          **{k + "_mb": v for k, v in _status().items()}})
            last.update(rows=ev.rows_done, time_s=ev.time_s, cpu=c)
            print(json.dumps(marks[-1]), file=sys.stderr, flush=True)

        cert = wl.certify_sae(acts, sae, lam=args.lam, threads=1, progress=cb)
        dt, dc = time.perf_counter() - t0, _cpu_s() - c0
        ends = [mk for mk in marks if mk["tokens"] == N]
        extra = {"certify_pass_s": ends[-1]["time_s"] if ends else None,
                 "certify_pass_tokens_per_s": N / ends[-1]["time_s"] if ends else None,
                 "coding_gap": cert.coding_gap, "coding_max_gap": cert.coding_max_gap,
                 "coding_certified": cert.coding_certified, "sae_objective": cert.sae_objective,
                 "optimal_code_objective": cert.optimal_code_objective, "global_gap": cert.global_gap,
                 "optimal_l0": cert.metrics["optimal_l0"], "l0": cert.metrics["l0"], "marks": marks}
    end = _status()
    print(json.dumps({"side": args.side, "kind": args.kind, "tokens": N, "seconds": dt, "cpu_s": dc,
                      "tokens_per_s": N / dt, "tokens_per_cpu_s": N / dc,
                      "baseline_rss_mb": base["VmRSS"], "peak_rss_mb": end["VmHWM"],
                      "peak_above_baseline_mb": end["VmHWM"] - base["VmRSS"],
                      "end_rss_anon_mb": end["RssAnon"], "end_rss_file_mb": end["RssFile"], **extra}))


def run(side: str, kind: str, acts: Path, sae: Path, lam: float, every: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child", side, "--child-kind", kind, "--child-acts", str(acts),
           "--child-sae", str(sae), "--child-lam", str(lam), "--every", str(every)]
    print("running", side, kind, acts.name, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"{side} {kind} {acts} failed with status {r.returncode}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print({k: v for k, v in out.items() if k != "marks"}, flush=True)
    return out


# --------------------------------------------------------------------------------------


def table(res: dict) -> str:
    fmt = (lambda v: "-" if v is None else (f"{v:,.4g}" if isinstance(v, float) else str(v)))
    cols = ["cell", "side", "kind", "tokens", "seconds", "tokens_per_s", "tokens_per_cpu_s", "certify_pass_tokens_per_s",
            "peak_rss_mb", "peak_above_baseline_mb", "end_rss_file_mb", "coding_gap", "coding_certified"]
    md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    md += "".join("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |\n" for r in res["runs"])
    for r in res["runs"]:
        if r.get("marks") and r["tokens"] >= 10 * res["every"]:
            md += (f"\n{r['cell']} {r['side']} {r['kind']} {r['tokens']:,} tokens: every {res['every']:,} tokens "
                   "(tokens/s over the interval, per CPU second, VmRSS / RssFile MB)\n\n")
            md += "| tokens | tokens/s | tokens/cpu-s | time left s | VmRSS | RssAnon | RssFile |\n|---|---|---|---|---|---|---|\n"
            md += "".join(f"| {m['tokens']:,} | {m['interval_tokens_per_s']:,.0f} | {m['interval_tokens_per_cpu_s']:,.0f} | "
                          f"{m['time_left_s']:,.0f} | {m['VmRSS_mb']:,.0f} | {m['RssAnon_mb']:,.0f} | "
                          f"{m['RssFile_mb']:,.0f} |\n" for m in r["marks"])
    for k, v in res.get("summary", {}).items():
        md += f"\n- {k}: {fmt(v) if not isinstance(v, str) else v}"
    return md + "\n"


def save(res: dict, name: str) -> None:
    from widelimit._json import to_jsonable

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(to_jsonable(res), indent=2))
    (RESULTS / f"{name}.md").write_text(table(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000, help="the second run, for the peak-memory comparison")
    ap.add_argument("--every", type=int, default=50_000, help="tokens between two marks of the certify pass")
    ap.add_argument("--wide-tokens", type=int, default=20_000, help="tokens of the 768 x 16,384 cell (0: skip it)")
    ap.add_argument("--wide-small", type=int, default=2048,
                    help="the wide cell's second run (memory comparison): at least one batch (2,048 tokens at d_sae 16,384)")
    ap.add_argument("--only-wide", action="store_true",
                    help="run the wide cell only, replacing its runs in the results file")
    ap.add_argument("--kinds", default="mmap,shards")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (each one thread, its own process)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "widelimit-certify-speed")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "widelimit-certify-streaming")
    ap.add_argument("--name", default="certify_streaming")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-kind", default="mmap", help=argparse.SUPPRESS)
    ap.add_argument("--child-acts", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-sae", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-lam", type=float, default=0.5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.side, args.kind, args.acts, args.sae, args.lam = (args.child, args.child_kind, args.child_acts,
                                                               args.child_sae, args.child_lam)
        return _child(args)
    import certify_speed as cs

    X = cs.activations(args.cache)
    w = cs.sae_weights(X, args.cache, 4096, 600)
    sae = args.data / "sae_4096.npz"
    args.data.mkdir(parents=True, exist_ok=True)
    np.savez(sae, **w)
    kinds = args.kinds.split(",")
    res = {"command": "PYTHONPATH=. python3 benchmarks/" + " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
           "activations": f"all-MiniLM-L6-v2 layer 3 of the shipped text ({X.shape[0]} tokens, d_in {X.shape[1]}) "
                          "tiled to the number of tokens", "sae": "certify_speed.py's ReLU SAE, d_sae 4096, lam 0.5",
           "threads": 1, "parallel": args.parallel, "every": args.every, "environment": environment(), "runs": [],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    jobs = []  # (cell, side, kind, acts, sae, lam, every): the long runs first
    if args.only_wide:
        old = json.loads((RESULTS / f"{args.name}.json").read_text())
        res["runs"] = [r for r in old["runs"] if r["cell"] == "384x4096"]
        res["command"] = old["command"] + "; " + res["command"]
    else:
        big, small = tiled(X, args.tokens, args.data), tiled(X, args.small, args.data)
        for kind in kinds:
            jobs.append(("384x4096", "certify", kind, big[kind == "shards"], sae, cs.LAM, args.every))
        jobs.append(("384x4096", "forward", "mmap", big[0], sae, cs.LAM, args.every))
        for kind in kinds:
            jobs.append(("384x4096", "certify", kind, small[kind == "shards"], sae, cs.LAM, args.every))
    if args.wide_tokens:
        for N in (args.wide_tokens, args.wide_small):
            npy, wsae, lam = wide_cell(N, args.data)
            for side in ("certify", "forward"):
                jobs.append(("768x16384 L0~30", side, "mmap", npy, wsae, lam, 1024))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futs = [pool.submit(run, *job[1:]) for job in jobs]
        for job, fut in zip(jobs, futs):
            res["runs"].append(dict(fut.result(), cell=job[0]))
            save(res, args.name)
    res["summary"] = summary(res, args)
    save(res, args.name)
    print(table(res))


def summary(res: dict, args) -> dict:
    """Ratios and peak-memory comparisons of the runs."""
    out = {}
    by = {(r["cell"], r["side"], r["kind"], r["tokens"]): r for r in res["runs"]}
    big, small = args.tokens, args.small
    fwd = by.get(("384x4096", "forward", "mmap", big))
    for kind in args.kinds.split(","):
        a, b = by.get(("384x4096", "certify", kind, big)), by.get(("384x4096", "certify", kind, small))
        if a and b:
            out[f"{kind}: peak RSS above baseline, {big:,} vs {small:,} tokens (MB)"] = \
                f"{a['peak_above_baseline_mb']:,.0f} vs {b['peak_above_baseline_mb']:,.0f}"
            marks = a["marks"]
            rates = [m["interval_tokens_per_cpu_s"] for m in marks[1:-1]] or [0.0]
            out[f"{kind}: tokens per CPU second over the intervals, min / median / max"] = \
                f"{min(rates):,.0f} / {float(np.median(rates)):,.0f} / {max(rates):,.0f}"
        if a and fwd:
            out[f"{kind}: certify / forward+metrics, whole call (wall; per CPU second)"] = \
                f"{a['seconds'] / fwd['seconds']:.2f}; {a['cpu_s'] / fwd['cpu_s']:.2f}"
    n = args.wide_tokens
    wa, wb = by.get(("768x16384 L0~30", "certify", "mmap", n)), by.get(("768x16384 L0~30", "certify", "mmap",
                                                                        args.wide_small))
    wf = by.get(("768x16384 L0~30", "forward", "mmap", n))
    if wa and wb:
        out[f"768x16384: peak RSS above baseline, {n:,} vs {args.wide_small:,} tokens (MB)"] = \
            f"{wa['peak_above_baseline_mb']:,.0f} vs {wb['peak_above_baseline_mb']:,.0f}"
        rate = wa["certify_pass_tokens_per_s"]
        out["768x16384: hours for 10^6 tokens at the certify pass's rate"] = f"{1e6 / rate / 3600:.1f}"
    if wa and wf:
        out["768x16384: certify / forward+metrics (wall; per CPU second)"] = \
            f"{wa['seconds'] / wf['seconds']:.2f}; {wa['cpu_s'] / wf['cpu_s']:.2f}"
    return out


if __name__ == "__main__":
    main()
