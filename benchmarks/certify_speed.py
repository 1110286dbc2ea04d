"""Certifying an SAE vs evaluating it: certify_sae against the SAE's forward pass + standard metrics.

Side by side in one run, on the same tokens and the same threads (issue 14, item 1):

* **Activations**: all-MiniLM-L6-v2 layer 3 on the text scikit-learn ships
  (:func:`widelimit.lab.lm.token_activations`, offline; 5,667 tokens, d_in 384).
* **SAEs**: two ReLU SAEs (d_sae 256 and 4096, SAELens loss with ``l1_coefficient = 2 lam``,
  ``lam = 0.5``) trained here by a short seeded torch loop (Adam, 600 steps of 1,024 tokens).
  Activations and SAEs are cached in ``--cache`` (default ``$TMPDIR/widelimit-certify-speed``;
  the d_sae 4096 SAE is 12 MB, too large for the repository) and regenerated when absent.
* **Evaluation** (the baseline people already run): the SAE's forward pass in float32 torch
  (``f = relu((x - b_dec) W_enc + b_enc)``, ``x_hat = f W_dec + b_dec``) plus MSE, explained
  variance, L0 and L1, in batches of 4,096 tokens.
* **Certification**: :func:`widelimit.certify_sae` with default settings (everything it reports:
  objective, certified optimal codes and coding gap, wide-limit bound, first-order diagnostics,
  feature flags, metrics).
* **Ratio** = certification time / evaluation time, medians of interleaved repeats.
* **Threads**: the d_sae 4096 comparison again with the other thread count for everything (torch,
  numba, BLAS): one thread when the default (:func:`widelimit._runtime.default_threads`) is the
  cores, the cores when the default is one thread (on a machine overloaded by other processes).
* **Streaming**: 100,000 tokens in a memory-mapped ``.npy`` made by **repeating the MiniLM
  activations** of the shipped text (18 copies, cut at 100,000 rows); each side runs in a fresh
  subprocess that reports tokens/s and its peak resident memory above the loaded baseline,
  also for 20,000 tokens to show the memory does not grow with N.

Usage::

    PYTHONPATH=. python3 benchmarks/certify_speed.py [--quick] [--stream-tokens 100000] [--stream-sae 4096]

``--coders 300``: only the coding algorithms of ``widelimit.optimal_codes`` ("cd", "working_set", "fista")
on 300 tokens of the d_sae 4096 SAE, warm-started from its codes (how the default was chosen).
``--quick`` (about a minute once the cache exists): a 1,000-token subset, one repeat, 10,000 streamed tokens.
Results: ``benchmarks/results/certify_speed.json`` and ``certify_speed.png`` (``_quick`` suffix with --quick).
The machine has 2 cores shared with other jobs: absolute times are noisy, the ratios of one
interleaved run are the measurement.
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
RESULTS = HERE / "results"
LAM = 0.5
BATCH = 4096


# --------------------------------------------------------------------------------------
# data and SAEs
# --------------------------------------------------------------------------------------


def activations(cache: Path) -> np.ndarray:
    """MiniLM layer-3 token activations of the shipped text (float32), cached."""
    p = cache / "minilm_layer3.npy"
    if not p.exists():
        from widelimit.lab.lm import shipped_text, token_activations

        a, _ = token_activations(shipped_text(), layer=3, device="cpu")
        cache.mkdir(parents=True, exist_ok=True)
        np.save(p, np.asarray(a, dtype=np.float32))
    return np.load(p)


def train_sae(X, lam: float, d_sae: int, *, steps: int = 600, batch: int = 1024, lr: float = 1e-3, seed: int = 0):
    """A ReLU SAE trained on the SAELens objective (``l1_coefficient = 2 lam``) by Adam; float32 arrays."""
    import torch

    g = torch.Generator().manual_seed(seed)
    X = torch.as_tensor(X, dtype=torch.float32)
    N, n = X.shape
    W_dec = torch.randn(d_sae, n, generator=g)
    W_dec = 0.5 * W_dec / W_dec.norm(dim=1, keepdim=True)
    W_enc = W_dec.T.clone()
    b_enc = torch.zeros(d_sae)
    b_dec = X.mean(0).clone()
    ps = [W_enc, b_enc, W_dec, b_dec]
    for p in ps:
        p.requires_grad_(True)
    opt = torch.optim.Adam(ps, lr=lr)
    for _ in range(steps):
        x = X[torch.randint(0, N, (batch,), generator=g)]
        f = torch.relu((x - b_dec) @ W_enc + b_enc)
        xh = f @ W_dec + b_dec
        loss = ((x - xh) ** 2).sum(1).mean() + 2 * lam * (f * W_dec.norm(dim=1)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: p.detach().numpy().copy() for k, p in zip(("W_enc", "b_enc", "W_dec", "b_dec"), ps)}


def sae_weights(X, cache: Path, d_sae: int, steps: int) -> dict:
    p = cache / f"sae_{d_sae}_lam{LAM}_steps{steps}_seed0.npz"
    if not p.exists():
        w = train_sae(X, LAM, d_sae, steps=steps)
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(p, **w)
    d = np.load(p)
    return {k: np.asarray(d[k], dtype=np.float32) for k in ("W_enc", "b_enc", "W_dec", "b_dec")}


def to_sae(w: dict):
    from widelimit.sae.model import SAE

    return SAE(W_dec=w["W_dec"], b_dec=w["b_dec"], W_enc=w["W_enc"], b_enc=w["b_enc"], architecture="standard",
               l1_coefficient=2 * LAM)


# --------------------------------------------------------------------------------------
# the two sides
# --------------------------------------------------------------------------------------


def forward_metrics(w: dict, acts, batch: int = BATCH, device: str = "cpu", forward=None) -> dict:
    """The SAE's forward pass (float32 torch) and the standard metrics, batch by batch.

    ``forward(x) -> (f, x_hat)``: the SAE's own forward pass on a float32 batch (e.g. a SAELens SAE's
    ``encode`` / ``decode``, for TopK); default the ReLU SAE of ``w``.

    The metrics are those SAELens' evals report and ``certify_sae`` reports too (widelimit.sae.metrics):
    MSE, explained variance, L0, L1, cosine similarity, l2 ratio, relative reconstruction bias and
    the fraction of features alive, computed the way ``sae_lens.evals`` does (float32, per token).
    """
    import torch

    W_enc, b_enc, W_dec, b_dec = (torch.as_tensor(w[k], device=device) for k in ("W_enc", "b_enc", "W_dec", "b_dec"))
    N, n = acts.shape
    se = l0 = l1 = sx2 = cos = ratio = xh2 = dot = 0.0
    sx = torch.zeros(n, dtype=torch.float64, device=device)
    alive = torch.zeros(W_enc.shape[1], dtype=torch.bool, device=device)
    with torch.no_grad():
        for s in range(0, N, batch):
            x = torch.as_tensor(np.asarray(acts[s : s + batch], dtype=np.float32), device=device)
            if forward is None:
                f = torch.relu((x - b_dec) @ W_enc + b_enc)
                xh = f @ W_dec + b_dec
            else:
                f, xh = forward(x)
            se += float(((x - xh) ** 2).sum())
            act = f > 0
            l0 += float(act.sum())
            l1 += float(f.sum())
            alive |= act.any(0)
            sx += x.sum(0, dtype=torch.float64)
            sx2 += float((x.double() ** 2).sum())
            nx, nh = torch.linalg.norm(x, dim=1), torch.linalg.norm(xh, dim=1)
            d = (x * xh).sum(1)
            cos += float((d / (nx * nh).clamp_min(1e-12)).sum())
            ratio += float((nh / torch.where(nx < 1e-4, torch.ones_like(nx), nx)).sum())
            xh2 += float((nh * nh).sum())
            dot += float(d.sum())
    mse = se / N
    var = sx2 / N - float((sx / N) @ (sx / N))
    return {"mse": mse, "explained_variance": 1 - mse / var, "l0": l0 / N, "l1": l1 / N, "cossim": cos / N,
            "l2_ratio": ratio / N, "relative_reconstruction_bias": xh2 / dot, "frac_alive": float(alive.float().mean())}


def certify(sae, acts, threads=None, device="cpu"):
    from widelimit import certify_sae

    return certify_sae(acts, sae, lam=LAM, device=device, threads=threads)


def side_by_side(w: dict, acts, *, repeat: int, threads=None, device: str = "cpu") -> dict:
    """Interleaved repeats of evaluation and certification on the same tokens and threads; medians."""
    from widelimit._runtime import default_threads, limit_threads

    sae = to_sae(w)
    certify(sae, acts[:64], threads=threads, device=device)  # load the compiled kernels
    t_fwd, t_cert = [], []
    cert = None
    # a small SAE's forward pass takes a few hundredths of a second, where timer and thread-pool noise
    # vary 3x between calls: at least 7 interleaved repeats then, so the medians mean something
    with limit_threads(threads):
        t0 = time.perf_counter()
        forward_metrics(w, acts, device=device)
        if time.perf_counter() - t0 < 0.5:
            repeat = max(repeat, 7)
    for _ in range(repeat):
        with limit_threads(threads):
            t0 = time.perf_counter()
            m = forward_metrics(w, acts, device=device)
            t_fwd.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cert = certify(sae, acts, threads=threads, device=device)
        t_cert.append(time.perf_counter() - t0)
    tf, tc = float(np.median(t_fwd)), float(np.median(t_cert))
    return {
        "d_sae": int(w["W_dec"].shape[0]), "tokens": int(acts.shape[0]), "device": device,
        "threads": int(threads or default_threads()), "forward_metrics_s": tf, "certify_s": tc, "ratio": tc / tf,
        "forward_s_all": t_fwd, "certify_s_all": t_cert,
        "certify_tokens_per_s": acts.shape[0] / tc, "forward_tokens_per_s": acts.shape[0] / tf,
        "metrics_forward": m,
        "metrics_certify": {k: cert.metrics[k] for k in m},
        "sae_objective": cert.sae_objective, "optimal_code_objective": cert.optimal_code_objective,
        "coding_gap": cert.coding_gap, "coding_max_gap": cert.coding_max_gap,
        "coding_certified": cert.coding_certified, "lower_bound": cert.lower_bound, "global_gap": cert.global_gap,
        "coding_rounds": cert.metrics["coding_iterations"],
    }


def coders(w: dict, acts, algorithms=("cd", "working_set", "fista")) -> list:
    """The coding algorithms of widelimit.optimal_codes on the same tokens, warm-started from the SAE's codes."""
    import widelimit as wl

    X = np.asarray(acts, dtype=np.float64)
    Z0 = np.maximum((X - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0.0)
    rows = []
    for alg in algorithms:
        kw = {"dtype": "float32"} if alg == "fista" else {}
        t0 = time.perf_counter()
        r = wl.optimal_codes(X, w["W_dec"], w["b_dec"], lam=LAM, algorithm=alg, device="cpu", Z0=Z0, tol=1e-6, **kw)
        dt = time.perf_counter() - t0
        rows.append({"algorithm": alg, "tokens": int(X.shape[0]), "seconds": dt, "tokens_per_s": X.shape[0] / dt,
                     "value": r.value, "gap": r.gap, "max_rel_gap": float(np.max(r.point_gaps / np.maximum(
                         r.point_values, LAM**2))), "converged": bool(r.certified)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


# --------------------------------------------------------------------------------------
# streaming (each side in a fresh process: peak memory)
# --------------------------------------------------------------------------------------


def _child(args) -> None:
    """Run one side on the memory-mapped file; print one JSON line."""
    acts = np.load(args.child_acts, mmap_mode="r")
    w = dict(np.load(args.child_sae))
    import torch  # (loaded before the baseline is taken)

    import widelimit  # noqa: F401,I001  (also loaded before the baseline)

    dev = args.child_device
    if args.child == "certify":  # load the compiled kernels before the baseline
        certify(to_sae(w), np.asarray(acts[:64]), device=dev)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if args.child == "certify":
        cert = certify(to_sae(w), acts, device=dev)
        extra = {"coding_gap": cert.coding_gap, "coding_certified": cert.coding_certified,
                 "sae_objective": cert.sae_objective}
    else:
        extra = forward_metrics(w, acts, device=dev)
    dt = time.perf_counter() - t0
    if dev.startswith("cuda"):
        extra["cuda_peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"side": args.child, "tokens": int(acts.shape[0]), "seconds": dt,
                      "tokens_per_s": acts.shape[0] / dt, "peak_rss_above_baseline_mb": (peak - base) / 1024,
                      "baseline_rss_mb": base / 1024, **extra}))


def stream(X, w: dict, tokens: int, tmp: Path, device: str = "cpu") -> dict:
    reps = -(-tokens // X.shape[0])
    path = tmp / f"acts_{tokens}.npy"
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(tokens, X.shape[1]))
    for r in range(reps):
        s = r * X.shape[0]
        e = min(tokens, s + X.shape[0])
        mm[s:e] = X[: e - s]
    mm.flush()
    del mm
    sae_path = tmp / "sae.npz"
    np.savez(sae_path, **w)
    out = {}
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for side in ("forward", "certify"):
        r = subprocess.run([sys.executable, __file__, "--child", side, "--child-acts", str(path),
                            "--child-sae", str(sae_path), "--child-device", device], capture_output=True, text=True, env=env)
        if r.returncode:
            raise RuntimeError(r.stderr[-3000:])
        out[side] = json.loads(r.stdout.strip().splitlines()[-1])
    out["ratio"] = out["certify"]["seconds"] / out["forward"]["seconds"]
    out["activations"] = f"{tokens} rows of a memory-mapped .npy: the {X.shape[0]} MiniLM tokens repeated"
    path.unlink()
    return out


# --------------------------------------------------------------------------------------


def plot(res: dict):
    from matplotlib.figure import Figure

    cases = [(f"d_sae {c['d_sae']}\n{c['tokens']} tok, {c['threads']} thr", c["ratio"]) for c in res["cases"]]
    for s in res.get("stream", []):
        cases.append((f"stream {s['d_sae']}\n{s['tokens']} tok", s["ratio"]))
    fig = Figure(figsize=(7.5, 3.8))
    ax = fig.subplots()
    ax.bar(range(len(cases)), [c[1] for c in cases], color="tab:blue")
    ax.axhline(10, color="tab:red", ls="--", label="target 10x")
    ax.set_xticks(range(len(cases)), [c[0] for c in cases], fontsize=7)
    ax.set_ylabel("certify time / (forward + metrics) time")
    ax.set_title("certify_sae vs the SAE's own evaluation (same tokens, same threads)")
    ax.legend()
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (benchmarks/gpu_check.sh runs the cuda side)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "widelimit-certify-speed")
    ap.add_argument("--steps", type=int, default=600, help="training steps of the SAEs")
    ap.add_argument("--stream-tokens", type=int, default=100_000)
    ap.add_argument("--stream-sae", type=int, default=4096, choices=[256, 4096])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--widths", default="256,4096")
    ap.add_argument("--coders", type=int, default=0, metavar="TOKENS",
                    help="only compare the coding algorithms on this many tokens (d_sae 4096), "
                         "results in certify_speed_coders.json")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-acts", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-sae", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-device", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    from widelimit._runtime import default_threads

    X = activations(args.cache)
    widths = [int(v) for v in args.widths.split(",")]
    saes = {d: sae_weights(X, args.cache, d, args.steps) for d in widths}
    if args.coders:
        rows = coders(saes[max(widths)], X[: args.coders])
        from widelimit._json import to_jsonable

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "certify_speed_coders.json").write_text(json.dumps(to_jsonable({
            "d_sae": max(widths), "lam": LAM, "threads": default_threads(), "rows": rows,
            "command": "PYTHONPATH=. python3 " + " ".join(sys.argv), "load_average": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}), indent=2))
        return
    Xb = X[:1000] if args.quick else X
    repeat = 1 if args.quick else args.repeat
    res = {"lam": LAM, "l1_coefficient": 2 * LAM, "d_in": int(X.shape[1]), "activations": "all-MiniLM-L6-v2 layer 3, "
           f"shipped text, {X.shape[0]} tokens", "default_threads": default_threads(), "quick": args.quick,
           "cases": [], "stream": [], "load_average_start": os.getloadavg()}
    t_start = time.time()
    for d in widths:
        res["cases"].append(side_by_side(saes[d], Xb, repeat=repeat, device=args.device))
        print(json.dumps({k: v for k, v in res["cases"][-1].items() if not k.endswith("_all")}), flush=True)
    if 4096 in saes and args.device == "cpu":  # the other thread count: 1 against the cores, or the cores against 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        other = 1 if default_threads() > 1 else min(8, cores)
        res["cases"].append(side_by_side(saes[4096], Xb, repeat=repeat, threads=other))
        print(json.dumps({k: v for k, v in res["cases"][-1].items() if not k.endswith("_all")}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        toks = [10_000] if args.quick else sorted({20_000, args.stream_tokens})
        for t in toks:
            s = stream(X, saes[args.stream_sae], t, Path(tmp), device=args.device)
            s.update(d_sae=args.stream_sae, tokens=t)
            res["stream"].append(s)
            print(json.dumps(s), flush=True)
    res["seconds"] = time.time() - t_start
    res["load_average_end"] = os.getloadavg()
    res["command"] = "PYTHONPATH=. python3 " + " ".join(sys.argv)
    res["device"] = args.device
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    name = "certify_speed" + ("" if args.device == "cpu" else "_" + args.device.replace(":", "")) + (
        "_quick" if args.quick else "")
    from widelimit._json import to_jsonable

    (out / f"{name}.json").write_text(json.dumps(to_jsonable(res), indent=2))
    plot(res).savefig(out / f"{name}.png", dpi=120)
    print(f"wrote {out / name}.json and .png")


if __name__ == "__main__":
    main()
