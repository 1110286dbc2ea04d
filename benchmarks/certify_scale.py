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
(``spams-bin``), scikit-learn (``sparse_encode`` LARS, and its coordinate descent, on a precomputed Gram) and
celer on the same lasso (``pip install -e .[bench]``; :func:`peer_lam`), each tightened to ``certify_sae``'s
certified gap, its codes certified by widelimit's own gap, and ``certify_sae`` rerun at each peer's gap
(:func:`compare_peers`; ``--peer-runs`` picks the peers).

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
#: lam per optimal-code L0 target on these data (amplitudes U(1, 3), decoder noise 0.1), measured (ScreenedCoder on
#: 60-100 tokens; the optimal L0 it gives in brackets): the same lam gives a larger optimal L0 on wider dictionaries
#: (1.3: 108 at 768 x 16,384, 176 at 768 x 65,536, 224 at 768 x 131,072), so the cells of d_in 768 wider than 16,384
#: have their own (:data:`LAM_CELL`). At d_in 2,304 the target-100 cells stay at 81-88 for lam 1.15-1.3.
LAM = {30: 0.9, 100: 1.3, 300: 1.6}
LAM_CELL = {(768, 65536, 100): 1.7,  # [105]
            (768, 131072, 100): 1.9,  # [100]
            (768, 65536, 300): 2.1,  # [292]
            (768, 131072, 300): 2.3,  # [293]
            (2304, 16384, 300): 1.1,  # [301]
            (2304, 65536, 300): 1.45}  # [352 at 1.3, 256 at 1.6]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


#: Tolerance ladders of the peers, loosest first: each is tightened until the certified gap of its codes is at
#: or below that of ``certify_sae`` (SPAMS's LARS-homotopy and scikit-learn's LARS have none: exact up to
#: rounding). ``sparse_encode(algorithm="lasso_cd")`` fixes ``tol=1e-8`` (``max_iter`` does not tighten it: it
#: stops at its own gap test), so the coordinate descent runs as ``sparse_encode`` runs it, ``Lasso`` with the
#: precomputed Gram, with ``tol`` from this ladder (``max_iter`` :data:`SKLEARN_CD_MAX_ITER`).
SKLEARN_CD_TOL = (1e-8, 1e-10, 1e-12, 1e-14)
SKLEARN_CD_MAX_ITER = 10000
CELER_TOL = (1e-6, 1e-8, 1e-10, 1e-12)
#: A peer's ladder stops after a run longer than this (seconds): the next setting would only be slower.
PEER_BUDGET_S = 300.0


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


def peer_lam(lam: float, d_in: int) -> dict:
    r"""The peers' penalty for widelimit's lasso ``min_{y>=0} ||xt - y U||^2 + 2 lam ||y||_1`` (theory.md §1).

    SPAMS ``lasso(mode=2)`` minimises ``0.5 ||x - D a||^2 + lambda1 ||a||_1``: ``lambda1 = lam``.
    scikit-learn ``sparse_encode`` (``lasso_lars`` / ``lasso_cd``) minimises ``0.5 ||x - a D||^2 + alpha ||a||_1``
    (it divides ``alpha`` by ``n_features`` itself before calling ``Lasso``): ``alpha = lam``. scikit-learn's and
    celer's ``Lasso`` minimise ``(1 / (2 n_samples)) ||y - X w||^2 + alpha ||w||_1`` with ``n_samples = d_in``
    here: ``lasso_alpha = celer_alpha = lam / d_in``. Each objective is widelimit's divided by 2 (by ``2 d_in``
    for ``Lasso``).
    """
    return {"spams_lambda1": float(lam), "sklearn_alpha": float(lam), "lasso_alpha": float(lam) / d_in,
            "celer_alpha": float(lam) / d_in}


def certified(U, xt, Y, lam) -> dict:
    """Mean objective, mean and max certified gap of codes ``Y`` (m, k) >= 0 on unit atoms ``U``.

    The gap of :func:`widelimit.coding.lasso.point_gaps` (the residual scaled to a feasible dual point), the
    per-token gap whose mean ``certify_sae`` reports as ``coding_gap`` and ``optimal_code_objective``.
    """
    from widelimit.coding.lasso import point_gaps

    P, gap, _ = point_gaps(xt, U, np.maximum(np.asarray(Y, dtype=np.float64), 0.0), lam)
    return {"objective": float(P.mean()), "gap": float(gap.mean()), "max_gap": float(gap.max())}


def run_spams(U, xt, lam):
    """SPAMS LARS-homotopy (``mode=2``, ``pos=True``, one thread; its own Gram): dense codes (m, k)."""
    import spams

    A = spams.lasso(np.asfortranarray(xt.T), D=np.asfortranarray(U.T), lambda1=peer_lam(lam, U.shape[1])[
        "spams_lambda1"], mode=2, pos=True, numThreads=1)
    return A.T.toarray()


def run_sklearn(U, xt, lam, algorithm="lasso_lars", max_iter=1000, gram=None):
    """scikit-learn ``sparse_encode`` with the precomputed Gram ``U U^T`` (computed here when not given)."""
    from sklearn.decomposition import sparse_encode

    G = U @ U.T if gram is None else gram
    return sparse_encode(xt, U, gram=G, algorithm=algorithm, alpha=peer_lam(lam, U.shape[1])["sklearn_alpha"],
                         positive=True, max_iter=max_iter)


def run_sklearn_cd(U, xt, lam, tol=1e-8, gram=None, max_iter=SKLEARN_CD_MAX_ITER):
    """scikit-learn ``Lasso`` (coordinate descent) on the precomputed Gram, as ``sparse_encode(algorithm="lasso_cd")``
    runs it but with ``tol`` exposed (``alpha = lam / d_in``, :func:`peer_lam`): dense codes (m, k)."""
    from sklearn.linear_model import Lasso

    G = U @ U.T if gram is None else gram
    clf = Lasso(alpha=peer_lam(lam, U.shape[1])["lasso_alpha"], fit_intercept=False, precompute=G, tol=tol,
                max_iter=max_iter, positive=True)
    clf.fit(U.T, xt.T, check_input=False)
    return np.atleast_2d(clf.coef_)


def run_celer(U, xt, lam, tol=1e-6):
    """celer ``Lasso`` (working sets + extrapolated dual), one fit per token: dense codes (m, k)."""
    from celer import Lasso

    X = np.asfortranarray(U.T)
    alpha = peer_lam(lam, U.shape[1])["celer_alpha"]
    Y = np.zeros((xt.shape[0], U.shape[0]))
    for i, x in enumerate(xt):
        Y[i] = Lasso(alpha=alpha, positive=True, fit_intercept=False, tol=tol).fit(X, x).coef_
    return Y


def _timed(f, *a, **kw):
    t = time.perf_counter()
    out = f(*a, **kw)
    return out, time.perf_counter() - t


#: The peer runs of :func:`peers` (``--peer-runs`` picks some).
PEER_RUNS = ("spams", "sklearn_lars", "sklearn_cd", "celer")


def peers(U, b, X, lam, gap_target, runs=PEER_RUNS) -> dict:
    """SPAMS, scikit-learn (precomputed Gram) and celer on the same lasso, each at the certified gap ``gap_target``.

    Per peer (``spams``, ``sklearn_lars``, ``sklearn_cd``, ``celer``; ``sklearn`` the faster of the two
    scikit-learn runs that reach the gap): ``{peer}_s`` (seconds, Gram included), ``{peer}_objective``,
    ``{peer}_gap`` and ``{peer}_max_gap`` (:func:`certified`), ``{peer}_setting`` and ``{peer}_reached``
    (its gap <= ``gap_target``). A peer with a tolerance runs its ladder (:data:`SKLEARN_CD_TOL`,
    :data:`CELER_TOL`) until it reaches the gap, or :data:`PEER_BUDGET_S` is spent; ``None`` when not
    installed.
    ``runs``: which of :data:`PEER_RUNS` to run.
    """
    xt = np.asarray(X, dtype=np.float64) - b
    out = {}

    def record(name, Y, sec, setting):
        c = certified(U, xt, Y, lam)
        out.update({f"{name}_s": sec, f"{name}_objective": c["objective"], f"{name}_gap": c["gap"],
                    f"{name}_max_gap": c["max_gap"], f"{name}_setting": setting,
                    f"{name}_reached": bool(c["gap"] <= gap_target)})
        print(f"  peer {name} [{setting}]: {sec:.3g} s, objective {c['objective']:.10g}, gap {c['gap']:.3g} "
              f"(max {c['max_gap']:.3g})", flush=True)
        return out[f"{name}_reached"]

    def ladder(name, f, settings, label):
        for v in settings:
            Y, sec = _timed(f, v)
            if record(name, Y, sec, f"{label}={v:g}") or sec > PEER_BUDGET_S:
                return

    try:
        import spams  # noqa: F401

        if "spams" in runs:
            record("spams", *_timed(run_spams, U, xt, lam), "exact (LARS homotopy)")
    except ImportError:
        out["spams_s"] = None
    try:
        import sklearn  # noqa: F401

        if not {"sklearn_lars", "sklearn_cd"} & set(runs):
            raise ImportError  # not asked for
        G, t_gram = _timed(lambda: U @ U.T)
        out["sklearn_gram_s"] = t_gram
        if "sklearn_lars" in runs:
            Y, sec = _timed(run_sklearn, U, xt, lam, "lasso_lars", 1000, G)
            record("sklearn_lars", Y, sec + t_gram, "exact (LARS)")
        if "sklearn_cd" in runs:
            ladder("sklearn_cd", lambda tol: run_sklearn_cd(U, xt, lam, tol, G), SKLEARN_CD_TOL, "tol")
        if out.get("sklearn_cd_s") is not None:
            out["sklearn_cd_s"] += t_gram
        del G
        ran = [p for p in ("sklearn_lars", "sklearn_cd") if out.get(f"{p}_s") is not None]
        ok = [p for p in ran if out[f"{p}_reached"]]
        best = min(ok or ran, key=lambda p: out[f"{p}_s"])
        out["sklearn_best"] = best
        for key in ("s", "objective", "gap", "max_gap", "setting", "reached"):
            out[f"sklearn_{key}"] = out[f"{best}_{key}"]
    except ImportError:
        out["sklearn_s"] = None
    try:
        import celer  # noqa: F401

        if "celer" in runs:
            ladder("celer", lambda tol: run_celer(U, xt, lam, tol), CELER_TOL, "tol")
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


#: ``coding_tol`` ladder of ``certify_sae`` when a peer's codes reach a smaller certified gap than the default's.
OUR_CODING_TOL = (1e-8, 1e-10, 1e-12)


def compare_peers(X, sae, lam, device, row, runs=PEER_RUNS) -> dict:
    """The peers at ``certify_sae``'s certified coding gap, and ``certify_sae`` at each peer's gap.

    Each peer is tightened until its codes' certified gap is at or below ``row["coding_gap"]`` (:func:`peers`);
    where a peer's gap is smaller still, ``certify_sae`` is rerun with a smaller ``coding_tol``
    (:data:`OUR_CODING_TOL`) until its ``coding_gap`` is at or below the peer's. Per peer:
    ``speedup_vs_{peer}`` and ``coding_speedup_vs_{peer}``: the peer's seconds over the default ``certify_sae``'s
    (whole, coding alone), the same certified gap where ``{peer}_reached``; ``ours_s_at_{peer}``,
    ``ours_coding_s_at_{peer}`` and ``speedup_at_{peer}_gap``, ``coding_speedup_at_{peer}_gap``: the same with
    ``certify_sae`` at a gap at most the peer's (``ours_coding_tol_at_{peer}`` None: not reached).
    """
    U = sae.unit_dictionary()
    out = peers(U, np.asarray(sae.b_dec, dtype=np.float64), X, lam, row["coding_gap"], runs)
    runs = [(1e-6, row["certify_s"], row["coding_s"], row["coding_gap"])]

    def ours_at(gap):
        for r in runs:
            if r[3] <= gap:
                return r
        for tol in OUR_CODING_TOL:
            if tol >= runs[-1][0]:
                continue
            t_cert, timers, cert = certify_timed(X, sae, lam, device, coding_tol=tol)
            runs.append((tol, t_cert, timers["coding_s"], cert.coding_gap))
            print(f"  certify_sae coding_tol={tol:g}: {t_cert:.3g} s (coding {timers['coding_s']:.3g} s), "
                  f"coding_gap {cert.coding_gap:.3g}", flush=True)
            if cert.coding_gap <= gap:
                return runs[-1]
        return None

    for name in ("spams", "sklearn", "celer"):
        if out.get(f"{name}_s") is None:
            continue
        out[f"speedup_vs_{name}"] = out[f"{name}_s"] / row["certify_s"]
        out[f"coding_speedup_vs_{name}"] = out[f"{name}_s"] / row["coding_s"]
        r = ours_at(out[f"{name}_gap"])
        out[f"ours_coding_tol_at_{name}"] = None if r is None else r[0]
        if r is not None:
            out.update({f"ours_s_at_{name}": r[1], f"ours_coding_s_at_{name}": r[2], f"ours_gap_at_{name}": r[3],
                        f"speedup_at_{name}_gap": out[f"{name}_s"] / r[1],
                        f"coding_speedup_at_{name}_gap": out[f"{name}_s"] / r[2]})
    out["ours_runs"] = [dict(zip(("coding_tol", "certify_s", "coding_s", "coding_gap"), r)) for r in runs]
    return out


def certify_timed(X, sae, lam, device, **kw):
    """``certify_sae`` with its stages timed (:data:`TIMED`): ``(seconds, {column: seconds}, certificate)``."""
    from widelimit import certify_sae

    timers = _Timers()
    try:
        t, c = time.perf_counter(), time.process_time()
        cert = certify_sae(X, sae, lam=lam, device=device, **kw)
        t_cert, c_cert = time.perf_counter() - t, time.process_time() - c
    finally:
        timers.close()
    # wall seconds per column, and the process CPU seconds (one thread: what other jobs' load does not change)
    timed = {**timers.s, **{col[:-2] + "_cpu_s": v for col, v in timers.c.items()}, "certify_cpu_s": c_cert}
    return t_cert, timed, cert


def cell(n, k, L, N, device, with_peers):
    D = dictionary(n, k)
    X = tokens(D, N, L)
    w = sae_weights(D, X[: min(N, 500)], L)
    lam = LAM_CELL.get((n, k, L), LAM.get(L, 0.7))
    sae = to_sae(w, lam)
    del D
    forward_metrics(w, X[:64], device=device)  # warm-up (first torch call)
    # certify_sae warm too (numba compiles its kernels on the first call of a fresh checkout, then caches them: the
    # first cell of a fresh worktree measured 21x for 7.7x warm); and the peers' runs are warm (imported, compiled)
    certify_timed(X[:16], sae, lam, device)
    rss0 = _reset_peak()
    t, c = time.perf_counter(), time.process_time()
    fm = forward_metrics(w, X, device=device)
    t_fwd, c_fwd = time.perf_counter() - t, time.process_time() - c
    t_cert, timed, cert = certify_timed(X, sae, lam, device)
    c_cert = timed["certify_cpu_s"]
    t, c = time.perf_counter(), time.process_time()  # the forward pass again: its load may differ
    forward_metrics(w, X, device=device)
    t_fwd, c_fwd = min(t_fwd, time.perf_counter() - t), min(c_fwd, time.process_time() - c)
    one_off = sum(timed[c] for c in ONE_OFF)
    tc = {col: timed[col[:-2] + "_cpu_s"] for _, _, col in TIMED}
    one_off_c = sum(tc[c] for c in ONE_OFF)
    # CPU-time ratios (process_time; one thread): what other jobs on a shared machine do not change
    cpu = {"forward_metrics_cpu_s": c_fwd, "ratio_cpu": c_cert / c_fwd,
           "ratio_per_token_cpu": (c_cert - one_off_c) / c_fwd, "coding_ratio_cpu": tc["coding_s"] / c_fwd,
           "ratio_without_l0_bracket_cpu": (c_cert - tc["pair_search_s"] - tc["spectral_norm_s"]
                                            - tc["sparsity_part_s"]) / c_fwd}
    row = {"d_in": n, "d_sae": k, "target_l0": L, "tokens": N, "lam": lam, "sae_l0": fm["l0"],
           "optimal_l0": cert.metrics["optimal_l0"], "forward_metrics_s": t_fwd, "certify_s": t_cert,
           "ratio": t_cert / t_fwd, **timed, "one_off_s": one_off,
           "ratio_without_pair_search": (t_cert - timed["pair_search_s"]) / t_fwd,
           "ratio_per_token": (t_cert - one_off) / t_fwd, "coding_ratio": timed["coding_s"] / t_fwd,
           # without the one-off costs and the L0 bracket (SparsityPart.update holds the Babel call)
           "ratio_without_l0_bracket": (t_cert - timed["pair_search_s"] - timed["spectral_norm_s"]
                                        - timed["sparsity_part_s"]) / t_fwd,
           "tokens_per_s": N / t_cert, "coding_gap": cert.coding_gap,
           "optimal_code_objective": cert.optimal_code_objective, "coding_certified": cert.coding_certified,
           "coding_iterations": cert.metrics["coding_iterations"], "peak_rss_growth_mb": _peak_mb() - rss0,
           "peak_rss_mb": _peak_mb(), **cpu}
    if with_peers:
        print(f"  certify_sae: {t_cert:.3g} s (coding {timed['coding_s']:.3g} s), optimal L0 "
              f"{row['optimal_l0']:.4g}, objective {row['optimal_code_objective']:.10g}, "
              f"coding_gap {cert.coding_gap:.3g}",
              flush=True)
        row.update(compare_peers(X, sae, lam, device, row, with_peers))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=None, help="comma-separated d_inxd_saexL0 (default: the whole grid)")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--peer-runs", default=",".join(PEER_RUNS),
                    help=f"with --peers: comma-separated subset of {','.join(PEER_RUNS)}")
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
        row = cell(n, k, L, N, args.device, tuple(args.peer_runs.split(",")) if args.peers else ())
        rows.append(row)
        print(" ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()),
              flush=True)
    name = args.name + ("_dry" if args.dry_run else "")
    if args.merge and (HERE / "results" / f"{name}.json").exists():
        import json

        new = {(r["d_in"], r["d_sae"], r["target_l0"]) for r in rows}
        old = json.loads((HERE / "results" / f"{name}.json").read_text())["rows"]
        rows = [r for r in old if (r["d_in"], r["d_sae"], r["target_l0"]) not in new] + rows
    write(name, {"environment": environment(), "device": args.device, "rows": rows},
          table(rows, PEER_COLS if args.peers else None))


COLS = ["d_in", "d_sae", "optimal_l0", "tokens", "tokens_per_s", "ratio", "ratio_per_token", "ratio_without_l0_bracket",
        "coding_ratio", "ratio_cpu", "ratio_per_token_cpu", "ratio_without_l0_bracket_cpu", "coding_ratio_cpu", "pair_search_s", "babel_s", "spectral_norm_s", "one_off_s", "sparsity_part_s", "encoder_part_s",
        "peak_rss_growth_mb", "peak_rss_mb", "coding_gap", "speedup_vs_spams", "speedup_vs_sklearn", "speedup_vs_celer"]


#: Columns of the ``--peers`` table: per peer its seconds (Gram included), its codes' mean certified gap, its
#: setting, whether it reached ``certify_sae``'s gap, the speedups of the whole ``certify_sae`` and of its coding
#: (default settings), and ``certify_sae`` tightened to the peer's gap (:func:`compare_peers`).
PEER_COLS = ["d_in", "d_sae", "optimal_l0", "tokens", "certify_s", "coding_s", "coding_gap"] + [
    c.format(p) for p in ("spams", "sklearn", "celer") for c in (
        "{}_setting", "{}_s", "{}_gap", "{}_reached", "speedup_vs_{}", "coding_speedup_vs_{}", "ours_gap_at_{}",
        "speedup_at_{}_gap")]


def table(rows, cols=None) -> str:
    """The markdown table of the result rows (``cols``, default :data:`COLS`)."""
    cols = COLS if cols is None else cols
    fmt = (lambda v: "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
    md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return md + "".join("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |\n" for r in rows)


if __name__ == "__main__":
    main()
