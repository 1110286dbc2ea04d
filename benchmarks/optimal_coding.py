"""Benchmark: certified optimal coding for SAE-sized dictionaries vs scikit-learn's SparseCoder, and whole-SAE
certification throughput.

Problem (the issue's size): d_sae = 4096 unit atoms in d_in = 384 dimensions
(random directions), tokens ``x = b + sum of 20 atoms with Exp(1) codes + 0.05 N(0, I)``,
lam = 0.2 (the optimal codes have about 20 atoms per token: the SAE regime),
target duality gap 1e-6 (relative per token, ``gap_i <= 1e-6 max(P_i, lam^2)``).

Contenders, side by side in one run, all on the CPU:

* widelimit ``optimal_codes_working_set`` (what ``certify_sae`` uses);
* widelimit ``optimal_codes`` (full-dictionary FISTA) on a subset;
* scikit-learn ``SparseCoder(positive_code=True, transform_algorithm="lasso_cd",
  transform_alpha=lam)`` on ``X - b`` (its objective ``0.5||x - zD||^2 + alpha||z||_1``
  per token has the same minimiser for ``alpha = lam``), on a subset; its
  codes are certified with the same duality-gap formula afterwards.

The two are timed in interleaved repetitions on disjoint tokens (the machine is
shared, so its load changes between measurements); the ratio reported is the
median of the per-repetition ratios. scikit-learn's subset is timed per token
and extrapolated (stated in the output). Then a
whole ``certify_sae`` run (own encoder, optimal coding warm-started from it,
diagnostics, wide-limit bound) on an SAE with this decoder gives tokens/second.

Run:  PYTHONPATH=. python3 benchmarks/optimal_coding.py [--tokens 100000] [--sk-tokens 300] [--full-tokens 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def make_problem(N, k=4096, n=384, active=20, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((k, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    b = 0.1 * rng.standard_normal(n)
    X = np.empty((N, n), dtype=np.float32)
    r = np.random.default_rng(seed + 1)
    for s in range(0, N, 2000):
        m = min(N, s + 2000) - s
        idx = np.argsort(r.random((m, k)), axis=1)[:, :active]
        vals = r.exponential(1.0, (m, active))
        X[s : s + m] = np.einsum("ma,man->mn", vals, U[idx]) + b + noise * r.standard_normal((m, n))
    return X, U, b


def certified_gap(X, U, b, Z, lam):
    """Per-token (P, gap) of codes Z with the duality-gap certificate of widelimit.coding.lasso."""
    import torch

    from widelimit.coding.lasso import point_gaps

    P, g, _ = point_gaps(torch.as_tensor(np.asarray(X, np.float64) - b), torch.as_tensor(U), torch.as_tensor(Z), lam)
    return P.numpy(), g.numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000, help="tokens for widelimit's working-set solver")
    ap.add_argument("--sk-tokens", type=int, default=300, help="tokens timed for scikit-learn (extrapolated)")
    ap.add_argument("--full-tokens", type=int, default=200, help="tokens timed for full-dictionary FISTA")
    ap.add_argument("--cert-tokens", type=int, default=20_000, help="tokens for the whole certify_sae run")
    ap.add_argument("--lam", type=float, default=0.2)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (median reported)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()

    import torch
    from sklearn.decomposition import SparseCoder

    from widelimit.coding.fista import fista_codes as optimal_codes
    from widelimit.sae.model import SAE
    from widelimit.sae.certify import certify_sae
    from widelimit.coding.working_set import optimal_codes_working_set

    lam, tol = args.lam, args.tol
    N = max(args.tokens, args.sk_tokens, args.full_tokens, args.cert_tokens)
    t0 = time.perf_counter()
    X, U, b = make_problem(N)
    print(f"problem: {N} tokens x d_in 384, d_sae 4096 ({time.perf_counter() - t0:.1f}s to generate)", flush=True)

    # interleaved repetitions (the machine is shared: load changes by the minute), disjoint tokens per repetition
    R = max(1, args.reps)
    nw, ns = args.tokens // R, max(1, args.sk_tokens // R)
    rates_ws, rates_sk, rel_ws_all, rel_sk_all, gs_all, Ps_all, ws_vals, nnz = [], [], [], [], [], [], [], 0
    ws_gap_sum = 0.0
    for rep in range(R):
        Xw = X[rep * nw : (rep + 1) * nw]
        t = time.perf_counter()
        ws = optimal_codes_working_set(Xw, U, b, lam=lam, tol=tol, device="cpu")
        dt = time.perf_counter() - t
        rates_ws.append(nw / dt)
        rel_ws_all.append(ws.point_gaps / np.maximum(ws.point_values, lam * lam))
        ws_gap_sum += ws.gap * nw
        nnz += ws.codes.nnz
        Xs = X[rep * nw : rep * nw + ns]  # the first tokens of the same block, so the objectives can be compared
        t = time.perf_counter()
        sc = SparseCoder(dictionary=U, transform_algorithm="lasso_cd", transform_alpha=lam, positive_code=True,
                         transform_max_iter=10_000)
        Zs = sc.transform(np.asarray(Xs, np.float64) - b)
        dt_sk = time.perf_counter() - t
        rates_sk.append(ns / dt_sk)
        Ps, gs = certified_gap(Xs, U, b, Zs, lam)
        rel_sk_all.append(gs / np.maximum(Ps, lam * lam))
        gs_all.append(gs)
        Ps_all.append(Ps)
        ws_vals.append(ws.point_values[:ns])
        print(f"rep {rep + 1}/{R}: widelimit working set {nw / dt:.1f} tok/s ({nw} tokens), "
              f"sklearn {ns / dt_sk:.2f} tok/s ({ns} tokens), ratio {(nw / dt) / (ns / dt_sk):.1f}x", flush=True)
    rel_ws = np.concatenate(rel_ws_all)
    rel_sk = np.concatenate(rel_sk_all)
    gs = np.concatenate(gs_all)
    Ps = np.concatenate(Ps_all)
    ratios = [a / c for a, c in zip(rates_ws, rates_sk)]
    t_ws = args.tokens / float(np.median(rates_ws))
    t_sk = args.sk_tokens / float(np.median(rates_sk))
    m = args.sk_tokens
    mf = args.full_tokens
    t = time.perf_counter()
    full = optimal_codes(X[:mf], U, b, lam=lam, tol=tol, device="cpu")
    t_full = time.perf_counter() - t
    print(f"widelimit full FISTA: {mf} tokens in {t_full:.1f}s = {mf / t_full:.2f} tok/s", flush=True)

    agree = float(np.max(np.abs(np.concatenate(ws_vals) - Ps) / np.maximum(Ps, lam * lam)))

    mc = args.cert_tokens
    sae = SAE(W_dec=U.astype(np.float32), b_dec=b.astype(np.float32), W_enc=U.T.astype(np.float32),
              b_enc=np.full(U.shape[0], -lam, np.float32))
    t = time.perf_counter()
    cert = certify_sae(X[:mc], sae, lam=lam, device="cpu", coding_tol=tol)
    t_cert = time.perf_counter() - t
    print(f"certify_sae: {mc} tokens in {t_cert:.1f}s = {mc / t_cert:.1f} tok/s; encoder gap {cert.encoder_gap:.4g}, "
          f"global gap {cert.global_gap:.4g}", flush=True)

    res = {
        "problem": {"d_sae": 4096, "d_in": 384, "active_per_token": 20, "lam": lam, "tol": tol,
                    "tokens": args.tokens},
        "widelimit_working_set": {"tokens": args.tokens, "tokens_per_second": float(np.median(rates_ws)),
                                  "tokens_per_second_per_rep": rates_ws,
                                  "mean_gap": ws_gap_sum / (nw * R), "max_rel_gap": float(rel_ws.max()),
                                  "l0": nnz / (nw * R)},
        "widelimit_full_fista": {"tokens": mf, "seconds": t_full, "tokens_per_second": mf / t_full,
                                 "max_rel_gap": float((full.point_gaps / np.maximum(full.point_values, lam * lam)).max()),
                                 "extrapolated": mf < args.tokens},
        "sklearn_sparsecoder_lasso_cd": {"tokens": m, "tokens_per_second": float(np.median(rates_sk)),
                                         "tokens_per_second_per_rep": rates_sk,
                                         "max_rel_gap": float(rel_sk.max()), "mean_gap": float(gs.mean()),
                                         "extrapolated": m < args.tokens},
        "ratio_working_set_vs_sklearn": float(np.median(ratios)),
        "ratio_per_rep": ratios,
        "ratio_full_fista_vs_sklearn": (mf / t_full) / (m / t_sk),
        "objective_agreement_max_rel": agree,
        "certify_sae": {"tokens": mc, "seconds": t_cert, "tokens_per_second": mc / t_cert,
                        "encoder_gap": cert.encoder_gap, "global_gap": cert.global_gap},
        "machine": {"platform": platform.platform(), "torch_threads": torch.get_num_threads(), "device": "cpu"},
        "command": "PYTHONPATH=. python3 benchmarks/optimal_coding.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "optimal_coding.json").write_text(json.dumps(res, indent=2))
    md = [
        "# Optimal coding benchmark (CPU)",
        "",
        f"d_sae 4096, d_in 384, lam {lam}, target relative duality gap {tol:g} per token; command: `{res['command']}`",
        "",
        "| solver | tokens timed | tokens/s | max relative gap | ratio vs sklearn |",
        "|---|---|---|---|---|",
        f"| widelimit working set | {args.tokens} | {args.tokens / t_ws:.1f} | {rel_ws.max():.1e} | "
        f"{res['ratio_working_set_vs_sklearn']:.1f}x (per repetition: {', '.join(f'{r:.1f}' for r in ratios)}) |",
        f"| widelimit full FISTA | {mf} (extrapolated) | {mf / t_full:.2f} | "
        f"{res['widelimit_full_fista']['max_rel_gap']:.1e} | {res['ratio_full_fista_vs_sklearn']:.2f}x |",
        f"| scikit-learn SparseCoder lasso_cd | {m} (extrapolated) | {m / t_sk:.2f} | {rel_sk.max():.1e} | 1x |",
        "",
        f"tokens/s are medians over {R} interleaved repetitions on disjoint tokens (shared machine);",
        "the ratio is the median of the per-repetition ratios.",
        "",
        f"Whole certification (`certify_sae`, own encoder + optimal codes + diagnostics + wide-limit bound): "
        f"{mc / t_cert:.1f} tokens/s on {mc} tokens.",
        f"Objectives of widelimit and sklearn agree to {agree:.1e} (relative) on the common tokens.",
    ]
    (args.out / "optimal_coding.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
