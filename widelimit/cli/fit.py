"""``widelimit fit`` and ``widelimit frontier``: the gradient solver at finite width."""

from __future__ import annotations

import sys
from pathlib import Path


from .._json import dumps as _dumps
from .._runtime import trace
from ._common import (_console, _fmt, atomic_outputs, certificate_table, check_device, check_out_dir, in_memory,
                      load_data, moved, no_duplicates, nonneg_float, nonneg_int, only_with, positive_float, positive_int,
                      print_json, split_list)
from ..exact.certificate import verify
from ..learn.crossval import best_fit
from ..sae.formats import save_saelens
from ..learn.frontier import frontier

#: Encoders that train by Adam (``--lr``); ``none`` (free codes) has no learning rate.
_AMORTISED = ("standard", "jumprelu", "topk")
#: ``fit_dictionary``'s learning rate when ``--lr`` is not given.
_DEFAULT_LR = 1e-3
#: ``frontier``'s time limit per width for ``--exact`` when ``--exact-time-limit`` is not given.
_DEFAULT_EXACT_TIME_LIMIT = 600.0
#: ``frontier``'s budget for the gradient fits of all widths together, seconds.
_DEFAULT_FRONTIER_TIME_LIMIT = 3600.0


# --------------------------------------------------------------------------------------
# fit / frontier (gradient solver)
# --------------------------------------------------------------------------------------


def _add_fit_options(p, per_run_time: bool = True):
    p.add_argument("data", help="data file (.npy .npz .csv .safetensors .pt) or a built-in dataset name")
    p.add_argument("--lam", type=positive_float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="array name inside .npz / .safetensors / .pt")
    p.add_argument("--header", action="store_true", help="text tables: the first row is a header")
    p.add_argument("--encoder", default="none", choices=["none", "standard", "jumprelu", "topk"],
                   help="free codes (dictionary learning) or an amortised SAE encoder")
    p.add_argument("--topk", type=positive_int, default=None,
                   help="active features per point; required with --encoder topk, used only there")
    p.add_argument("--init", default="rays", choices=["rays", "data", "random"], help="initial atoms")
    p.add_argument("--restarts", type=positive_int, default=1, help="independent runs; the best is kept")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed (an integer >= 0)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--max-iter", type=positive_int, default=None, help="step budget")
    if per_run_time:  # frontier has its own --time-limit, for all widths together (each run is capped by it)
        p.add_argument("--time-limit", type=positive_float, default=None, help="time budget per run, seconds")
    p.add_argument("--rtol", type=nonneg_float, default=1e-8, help="stop when the relative improvement per step is below this")
    p.add_argument("--batch-size", type=positive_int, default=None, help="minibatch size (default: full batch for free codes, 4096 for "
                        "the encoders); at least N uses all the data")
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"Adam learning rate, with --encoder standard, jumprelu or topk (default {_DEFAULT_LR:g})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _lam_of(args, lam0):
    lam = args.lam if args.lam is not None else lam0
    if lam is None:
        raise ValueError("--lam is required for data files")
    return lam


def _check_fit_flags(args, widths) -> None:
    """Refuse, before any data is read, flags the chosen encoder does not use and a top-k encoder without its k."""
    if args.encoder == "topk" and args.topk is None:
        raise ValueError("--encoder topk needs --topk K (the number of active features per point)")
    if args.topk is not None and args.encoder == "topk" and args.topk > min(widths):
        where = f"--width {widths[0]}" if len(widths) == 1 else f"the smallest of --widths, {min(widths)}"
        raise ValueError(f"--topk must be at most {where} (k active features among the atoms), got --topk {args.topk}")
    with_encoder = f" with --encoder {args.encoder}"
    only_with({"--topk": args.topk}, args.encoder == "topk", "--encoder topk", context=with_encoder)
    only_with({"--lr": args.lr}, args.encoder in _AMORTISED,
              f"--encoder {', '.join(_AMORTISED[:-1])} or {_AMORTISED[-1]}", why=" (free codes have no learning rate)",
              context=with_encoder)
    check_device(args.device)


def _fit_kwargs(args, per_run_time: bool = True):
    kw = {"encoder": args.encoder, "device": args.device, "max_iter": args.max_iter,
          **({"time_limit": args.time_limit} if per_run_time else {}), "rtol": args.rtol, "batch_size": args.batch_size, "lr": _DEFAULT_LR if args.lr is None else args.lr}
    if args.topk is not None:
        kw["topk"] = args.topk
    return kw


def _batch(args, N: int) -> tuple[int, bool, str]:
    """``(points per step, whether that is all N points, a line saying so)`` for the table and JSON."""
    bs = args.batch_size
    if bs is None and args.encoder == "none":
        return N, True, "full batch (the default for free codes)"
    src = f"--batch-size {bs}" if bs is not None else "the encoders' default batch 4096"
    bs = 4096 if bs is None else bs  # fit_dictionary's default for the encoders
    if bs >= N:
        return N, True, f"{src} >= N = {N}: every step uses all the data"
    return bs, False, f"{src}: a random minibatch per step"


class _Progress:
    """A rich progress display on stderr (stdout stays clean for --json).

    ``say`` updates the live line (terminals only); ``line`` reports a finished unit of work (a width of
    ``frontier``): on a terminal as the live line, elsewhere (a log, a pipe, ``--json`` runs) as one plain
    line on stderr, so that long work shows progress wherever its output goes.
    """

    def __init__(self, enabled=True, prefix: str = "widelimit"):
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.live = enabled and console.is_terminal
        self.prefix = prefix
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=console, disable=not self.live, transient=True)
        self.task = None

    def line(self, text):
        if self.live:
            self.say(text)
        else:
            print(f"{self.prefix}: {text}", file=sys.stderr, flush=True)

    def __enter__(self):
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def say(self, text):
        self.progress.update(self.task, description=text)


def _frontier_status(ev) -> str:
    """One line per frontier event: the best value, and the certified bound of an exact width's search."""
    if ev.lower_bound is None:
        return f"{ev.stage}: {ev.value:.8g}"
    return f"{ev.stage}: {ev.value:.8g}, certified bound {ev.lower_bound:.8g} ({ev.rows_done} nodes)"


def _add_fit(sub):
    p = sub.add_parser("fit", help="gradient dictionary learning at a given width, compared with the certified bound")
    _add_fit_options(p)
    p.add_argument("--width", type=positive_int, required=True, help="number of atoms k >= 1")
    p.add_argument("--out", type=Path, default=None,
                   help="write the SAE as a SAELens folder (cfg.json + sae_weights.safetensors, read by "
                        "widelimit certify and sae_lens.SAE.load_from_disk), fit_codes.npz and fit.json here")


def _run_fit(args) -> int:
    import scipy.sparse as sp

    _check_fit_flags(args, [args.width])
    check_out_dir(args.out)
    X, lam0, label = load_data(args.data, args.key, header=args.header or None)
    X = in_memory(X)
    lam = _lam_of(args, lam0)
    with _Progress(enabled=True) as prog:
        run = {"i": 0}

        def cb(ev):
            if not run.get("computing"):  # the first step is done: the solver runs
                trace("computing")
                run["computing"] = True
            prog.say(f"run {run['i'] + 1}/{args.restarts}: step {ev.rows_done}  objective {ev.value:.8g}")

        kw = _fit_kwargs(args)
        kw["progress"] = cb
        fits = []
        for i in range(max(1, args.restarts)):
            run["i"] = i
            best, _ = best_fit(X, lam=lam, width=args.width, n_restarts=1, seed=args.seed + i, inits=(args.init,), **kw)
            fits.append(best)
        prog.say("certifying")
        fit = min(fits, key=lambda f: f.value)
        cert = verify(X, fit.dictionary, fit.codes, fit.bias, lam=lam, tol=1e-4)
    d = fit.as_dict()
    d.update({"data": label, "value": cert.value, "lower_bound": cert.lower_bound, "gap": cert.gap,
              "rel_gap": cert.rel_gap, "certified": cert.certified, "width": fit.width,
              "restart_values": [f.value for f in fits], "bias": fit.bias, "certificate": cert.as_dict()})
    batch, full_batch, batch_how = _batch(args, cert.n_points)
    d.update({"batch_size": batch, "full_batch": full_batch})
    files = []
    if args.out:

        with atomic_outputs(args.out) as tmp:
            sae = fit.to_sae()
            save_saelens(sae, tmp)
            cz = tmp / "fit_codes.npz"
            sp.save_npz(cz, sp.csr_matrix(fit.codes))
            js = tmp / "fit.json"
            js.write_text(_dumps({**d, "history": fit.history, "sae_warnings": sae.warnings}, indent=2))
            files = moved([tmp / "cfg.json", tmp / "sae_weights.safetensors", cz, js], tmp, args.out)
        for note in sae.warnings:
            print(f"widelimit fit: note: {args.out}: {note}", file=sys.stderr)
    d["files"] = [str(f) for f in files]
    if args.json:
        print_json(d)
        return 0
    rows = [
        ("points N x dims n", f"{cert.n_points} x {cert.dim}", "data size"),
        ("lam", lam, "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("width", fit.width, f"atoms ({fit.live_atoms} used)"),
        ("encoder", fit.encoder if fit.encoder != "topk" else f"topk (k = {d['encoder_k']})",
         "none = free codes (dictionary learning)"),
        ("batch", "full data" if full_batch else batch, batch_how),
        ("value", cert.value, "objective of the learned (W, Z, b), float64"),
        ("lower bound", cert.lower_bound, "certified wide-limit bound: no width does better"),
        ("gap", cert.gap, "value - lower bound"),
        ("relative gap", cert.rel_gap, "0 once the width reaches the number of rays"),
        ("coding gap", fit.coding_gap, "certified gap of the codes for this dictionary"),
    ]
    if fit.encoder_value is not None:
        rows.append(("encoder value", fit.encoder_value, "objective of the encoder's own codes"))
    rows += [("steps", fit.n_iter, f"stopped by {fit.stop_reason}"), ("time (s)", round(fit.time_s, 3), fit.device),
             ("certified", cert.certified, "relative gap <= 1e-4")]
    con = _console()
    con.print(certificate_table(f"widelimit fit: {label}", rows))
    for f in files:
        con.print(f"wrote {f}")
    return 0


def _add_frontier(sub):
    p = sub.add_parser("frontier", help="best gradient objective per width vs the wide-limit bound (PNG + JSON)")
    _add_fit_options(p, per_run_time=False)
    p.add_argument("--widths", required=True, help="comma-separated widths, each once, e.g. 1,2,4,8")
    p.add_argument("--out", type=Path, default=Path("widelimit-frontier"), help="folder for frontier.png/json")
    p.add_argument("--exact", action="store_true", help="also the certified optimum per width (small data)")
    p.add_argument("--exact-time-limit", type=nonneg_float, default=None,
                   help=f"with --exact: seconds per width (default {_DEFAULT_EXACT_TIME_LIMIT:g})")
    p.add_argument("--time-limit", type=positive_float, default=_DEFAULT_FRONTIER_TIME_LIMIT,
                   help="seconds for the gradient fits of all widths together; widths not reached are listed as "
                        f"skipped (default {_DEFAULT_FRONTIER_TIME_LIMIT:g})")


def _parse_widths(spec: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: integers >= 1, each once; a one-line error naming ``--widths`` otherwise."""
    try:
        widths = [int(w) for w in split_list(spec, "--widths")]
    except ValueError as e:
        if str(e).startswith("--widths"):
            raise
        raise ValueError(f"--widths must be comma-separated integers, got {spec!r}") from None
    if min(widths) < 1:
        raise ValueError(f"--widths must be integers >= 1, got {spec!r}")
    no_duplicates(widths, spec, "--widths")
    return widths


def _run_frontier(args) -> int:

    widths = _parse_widths(args.widths)
    only_with({"--exact-time-limit": args.exact_time_limit}, args.exact, "--exact", context=" without --exact")
    _check_fit_flags(args, widths)
    check_out_dir(args.out)
    X, lam0, label = load_data(args.data, args.key, header=args.header or None)
    X = in_memory(X)
    lam = _lam_of(args, lam0)
    if max(widths) > X.shape[0]:
        raise ValueError(f"--widths {max(widths)} exceeds the number of points N = {X.shape[0]}")
    inits = (args.init,) if args.init != "rays" else ("rays", "data")
    time_limit = _DEFAULT_EXACT_TIME_LIMIT if args.exact_time_limit is None else args.exact_time_limit
    with atomic_outputs(args.out) as tmp:
        with _Progress(prefix="widelimit frontier") as prog:

            def cb(ev):
                prog.say(_frontier_status(ev))
                if ev.stage.startswith("width "):  # a width done: a line even under --json or in a log
                    prog.line(f"{ev.stage} done ({ev.rows_done}/{ev.rows_total}): best value {ev.value:.8g}")

            fr = frontier(X, lam=lam, widths=widths, n_restarts=max(1, args.restarts), seed=args.seed, inits=inits,
                          out=tmp / "frontier.png", progress=cb, exact_widths=args.exact, exact_time_limit=time_limit,
                          time_limit=args.time_limit, **_fit_kwargs(args, per_run_time=False))
        d = fr.as_dict()
        # the plot's path once moved into --out, not the temporary folder it was drawn in
        d["plot"] = str(moved([fr.plot], tmp, args.out)[0])
        d["data"] = label
        (tmp / "frontier.json").write_text(_dumps(d, indent=2))
    if fr.skipped_widths:
        print(f"widelimit frontier: warning: --time-limit {args.time_limit:g} s ran out: widths "
              f"{', '.join(map(str, fr.skipped_widths))} were not fitted", file=sys.stderr)
    if args.json:
        print_json(d)
        return 0
    from rich.table import Table

    t = Table(title=f"widelimit frontier: {label}, lam = {lam:g}")
    for c in ("width", "best value", "relative gap to bound"):
        t.add_column(c, justify="right")
    if fr.exact_values is not None:
        t.add_column("exact search at width k", justify="right")
    for i, (w, v, g) in enumerate(zip(fr.widths, fr.values, d["rel_gaps"])):
        extra = [] if fr.exact_values is None else [
            f"{fr.exact_values[i]:.10g}" + (" (certified optimum)" if fr.exact_certified[i] else
                                            f" (not certified: optimum >= {fr.exact_lower_bounds[i]:.10g})")]
        t.add_row(str(w), f"{v:.10g}", f"{g:.3e}", *extra)
    con = _console()
    con.print(t)
    con.print(f"bound {fr.lower_bound:.10g}; rays {fr.n_rays}; saturation width {fr.saturation_width}; "
              f"all runs above the bound: {_fmt(fr.respects_bound)}")
    con.print(f"wrote {d['plot']} and {args.out / 'frontier.json'}")
    return 0
