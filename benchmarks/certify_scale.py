"""certify_sae at the widths SAEs are trained at: the grid of issue 31, side by side with the forward pass.

Cells: d_in {768, 2304} x d_sae {16,384, 65,536, 131,072 (d_in 768 only)} x optimal-code L0 {~30, 100, 300}
on trained-looking SAEs (benchmarks/_scale_data.py: data from a sparse ground-truth dictionary, decoder a
perturbed copy, tied encoder with a realistic L0). Per cell, in one process and on the same tokens and
threads: the SAE's forward pass + standard metrics (benchmarks/certify_speed.py's ``forward_metrics``), then
``certify_sae`` with default settings; the ratio, tokens/s, the coding gap, the peak resident memory
(``peak_rss_mb``: ``VmHWM``, reset after making the data; ``peak_rss_growth_mb``: its growth during the
forward pass and ``certify_sae``) and the time of each stage (:data:`TIMED`): the per-SAE one-off
costs (decoder-pair search, ``d_sae^2 d_in / 2`` or its ``pair_budget``; Babel function; spectral norm),
reported apart as ``one_off_s`` with ``ratio_per_token`` the ratio without them, and the per-token parts
(coding, encoder, L0 bracket; ``ratio_without_l0_bracket`` leaves out the one-off costs and the bracket of
``widelimit.sae.sparsity``, ``sparsity=SparsityOptions(enabled=False)``). The forward pass runs before and
after ``certify_sae`` (the faster of the two counts); the ``*_cpu`` ratios divide process CPU seconds
(``time.process_time``, one thread), which the load of other jobs on a shared machine does not change as it
changes wall-clock time.
``--peers`` adds SPAMS
(``spams-bin``), scikit-learn ``sparse_encode`` with a precomputed Gram and celer on the same lasso
(``pip install -e .[bench]``), at the certified gap reached.

Usage::

    PYTHONPATH=. python3 benchmarks/certify_scale.py [--cells 768x16384x100,...] [--tokens 2000] [--device cpu]
    PYTHONPATH=. python3 benchmarks/certify_scale.py --dry-run      # one tiny cell: checks the script runs
    PYTHONPATH=. python3 benchmarks/certify_scale.py --cells 768x131072x30 --tokens 1000 --name NAME --merge
                                                         # one process per cell, rows gathered in NAME

Writes ``benchmarks/results/certify_scale.json`` and ``.md`` (``_dry`` suffix with --dry-run). The machine
is shared: ratios measured side by side in one run are the measurement, absolute times are not.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import environment, write  # noqa: E402
from _scale_data import dictionary, sae_weights, to_sae, tokens  # noqa: E402
from certify_speed import forward_metrics  # noqa: E402

GRID = [(n, k, L) for n in (768, 2304) for k in (16384, 65536, 131072) for L in (30, 100, 300)
        if not (n == 2304 and k == 131072)]
#: lam per optimal-code L0 target on these data (amplitudes U(1, 3), decoder noise 0.1): measured, not tuned per cell
LAM = {30: 0.9, 100: 0.7, 300: 0.5}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _proc_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            return next(float(line.split()[1]) / 1024.0 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


def _reset_peak() -> float:
    """Reset the peak resident memory (Linux ``clear_refs`` 5) and return the resident memory now (MB): the peak
    growth of the cell is then that of the SAE's forward pass and ``certify_sae``, not of making the data
    (which for 65,536 x 2,304 held more than the certification). Elsewhere ``ru_maxrss`` as it is."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_mb("VmRSS")
    except OSError:
        return _rss_mb()


def _peak_mb() -> float:
    return _proc_mb("VmHWM") or _rss_mb()


def peers(U, b, X, lam, gap_target) -> dict:
    """The same lasso (unit atoms) by SPAMS, scikit-learn (precomputed Gram) and celer, where installed."""
    out = {}
    xt = X - b
    try:
        import spams

        t = time.perf_counter()
        spams.lasso(np.asfortranarray(xt.T), D=np.asfortranarray(U.T), lambda1=2 * lam, mode=2, pos=True,
                    numThreads=-1)
        out["spams_s"] = time.perf_counter() - t
    except ImportError:
        out["spams_s"] = None
    try:
        from sklearn.decomposition import sparse_encode

        t = time.perf_counter()
        sparse_encode(xt, U, gram=U @ U.T, algorithm="lasso_cd", alpha=2 * lam / xt.shape[1], positive=True,
                      max_iter=1000)
        out["sklearn_s"] = time.perf_counter() - t
    except (ImportError, MemoryError):
        out["sklearn_s"] = None
    try:
        from celer import Lasso

        t = time.perf_counter()
        for x in xt:
            Lasso(alpha=2 * lam / xt.shape[1], positive=True, fit_intercept=False, tol=gap_target).fit(U.T, x)
        out["celer_s"] = time.perf_counter() - t
    except ImportError:
        out["celer_s"] = None
    return out


#: Functions timed inside ``certify_sae``: ``(module, attribute, column)``. The first three are per-SAE
#: one-off costs (properties of the decoder, independent of the tokens); the parts are per-token costs.
TIMED = [("widelimit.sae.certify", "decoder_pairs", "pair_search_s"),
         ("widelimit.sae.sparsity", "babel", "babel_s"),
         ("widelimit.sae.sparsity", "spectral_norm_sq", "spectral_norm_s"),
         ("widelimit.sae.parts", "CodingPart.update", "coding_s"),
         ("widelimit.sae.parts", "EncoderPart.update", "encoder_part_s"),
         ("widelimit.sae.sparsity", "SparsityPart.update", "sparsity_part_s")]
ONE_OFF = ("pair_search_s", "babel_s", "spectral_norm_s")


class _Timers:
    """Wrap the :data:`TIMED` functions; their summed seconds per column (nested calls counted once each)."""

    def __init__(self):
        import importlib

        self.s = {col: 0.0 for _, _, col in TIMED}
        self.c = {col: 0.0 for _, _, col in TIMED}  # process CPU seconds (one thread: immune to other jobs' load)
        self._undo = []
        for mod, attr, col in TIMED:
            owner = importlib.import_module(mod)
            *path, name = attr.split(".")
            for p in path:
                owner = getattr(owner, p)
            orig = getattr(owner, name)
            setattr(owner, name, self._wrap(orig, col))
            self._undo.append((owner, name, orig))

    def _wrap(self, f, col):
        def timed(*a, **kw):
            t, c = time.perf_counter(), time.process_time()
            try:
                return f(*a, **kw)
            finally:
                self.s[col] += time.perf_counter() - t
                self.c[col] += time.process_time() - c
        return timed

    def close(self):
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)


def cell(n, k, L, N, device, with_peers):
    from widelimit import certify_sae

    D = dictionary(n, k)
    X = tokens(D, N, L)
    w = sae_weights(D, X[: min(N, 500)], L)
    lam = LAM.get(L, 0.7)
    sae = to_sae(w, lam)
    del D
    forward_metrics(w, X[:64], device=device)  # warm-up (first torch call)
    rss0 = _reset_peak()
    timers = _Timers()
    try:
        t, c = time.perf_counter(), time.process_time()
        fm = forward_metrics(w, X, device=device)
        t_fwd, c_fwd = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        cert = certify_sae(X, sae, lam=lam, device=device)
        t_cert, c_cert = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()  # the forward pass again: its load may differ
        forward_metrics(w, X, device=device)
        t_fwd, c_fwd = min(t_fwd, time.perf_counter() - t), min(c_fwd, time.process_time() - c)
    finally:
        timers.close()
    one_off = sum(timers.s[c] for c in ONE_OFF)
    tc = timers.c
    one_off_c = sum(tc[c] for c in ONE_OFF)
    # CPU-time ratios (process_time; one thread): what other jobs on a shared machine do not change
    cpu = {"forward_metrics_cpu_s": c_fwd, "certify_cpu_s": c_cert, "ratio_cpu": c_cert / c_fwd,
           "ratio_per_token_cpu": (c_cert - one_off_c) / c_fwd, "coding_ratio_cpu": tc["coding_s"] / c_fwd,
           "ratio_without_l0_bracket_cpu": (c_cert - tc["pair_search_s"] - tc["spectral_norm_s"]
                                            - tc["sparsity_part_s"]) / c_fwd,
           **{col[:-2] + "_cpu_s": v for col, v in tc.items()}}
    row = {"d_in": n, "d_sae": k, "target_l0": L, "tokens": N, "lam": lam, "sae_l0": fm["l0"],
           "optimal_l0": cert.metrics["optimal_l0"], "forward_metrics_s": t_fwd, "certify_s": t_cert,
           "ratio": t_cert / t_fwd, **timers.s, "one_off_s": one_off,
           "ratio_without_pair_search": (t_cert - timers.s["pair_search_s"]) / t_fwd,
           "ratio_per_token": (t_cert - one_off) / t_fwd, "coding_ratio": timers.s["coding_s"] / t_fwd,
           # without the one-off costs and the L0 bracket (SparsityPart.update holds the Babel call)
           "ratio_without_l0_bracket": (t_cert - timers.s["pair_search_s"] - timers.s["spectral_norm_s"]
                                        - timers.s["sparsity_part_s"]) / t_fwd,
           "tokens_per_s": N / t_cert, "coding_gap": cert.coding_gap, "coding_certified": cert.coding_certified,
           "coding_iterations": cert.metrics["coding_iterations"], "peak_rss_growth_mb": _peak_mb() - rss0,
           "peak_rss_mb": _peak_mb(), **cpu}
    if with_peers:
        U = sae.unit_dictionary()
        p = peers(U, np.asarray(sae.b_dec, dtype=np.float64), X.astype(np.float64), lam, 1e-6)
        row.update(p)
        for name in ("spams", "sklearn", "celer"):
            if p.get(f"{name}_s"):
                row[f"speedup_vs_{name}"] = p[f"{name}_s"] / t_cert
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=None, help="comma-separated d_inxd_saexL0 (default: the whole grid)")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--name", default="certify_scale", help="results file name in benchmarks/results/")
    ap.add_argument("--dry-run", action="store_true", help="one tiny cell (64 x 1024 x 8, 200 tokens)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows already in results/NAME.json of other cells (one process per cell)")
    args = ap.parse_args()
    if args.dry_run:
        cells, N = [(64, 1024, 8)], 200
    elif args.cells:
        cells, N = [tuple(int(v) for v in c.split("x")) for c in args.cells.split(",")], args.tokens
    else:
        cells, N = GRID, args.tokens
    rows = []
    for n, k, L in cells:
        row = cell(n, k, L, N, args.device, args.peers)
        rows.append(row)
        print(" ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()),
              flush=True)
    name = args.name + ("_dry" if args.dry_run else "")
    if args.merge and (HERE / "results" / f"{name}.json").exists():
        import json

        new = {(r["d_in"], r["d_sae"], r["target_l0"]) for r in rows}
        old = json.loads((HERE / "results" / f"{name}.json").read_text())["rows"]
        rows = [r for r in old if (r["d_in"], r["d_sae"], r["target_l0"]) not in new] + rows
    write(name, {"environment": environment(), "device": args.device, "rows": rows}, table(rows))


COLS = ["d_in", "d_sae", "optimal_l0", "tokens", "tokens_per_s", "ratio", "ratio_per_token", "ratio_without_l0_bracket",
        "coding_ratio", "ratio_cpu", "ratio_per_token_cpu", "ratio_without_l0_bracket_cpu", "coding_ratio_cpu", "pair_search_s", "babel_s", "spectral_norm_s", "one_off_s", "sparsity_part_s", "encoder_part_s",
        "peak_rss_growth_mb", "peak_rss_mb", "coding_gap", "speedup_vs_spams", "speedup_vs_sklearn", "speedup_vs_celer"]


def table(rows) -> str:
    """The markdown table of the result rows (:data:`COLS`)."""
    fmt = (lambda v: "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
    md = "| " + " | ".join(COLS) + " |\n|" + "---|" * len(COLS) + "\n"
    return md + "".join("| " + " | ".join(fmt(r.get(c)) for c in COLS) + " |\n" for r in rows)


if __name__ == "__main__":
    main()
