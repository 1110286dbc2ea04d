"""``widelimit relax-bench``: generate relaxation-benchmark instances with known optimum, and export them.

Registered in :data:`widelimit.cli.COMMANDS` as ``_add_relax_bench`` / ``_run_relax_bench``. Errors in the input are
``ValueError`` with a one-line message (the CLI prints it, exit status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..relax.export import EXPORT_CONES, FORMATS, export_instances
from ..relax.families import FAMILIES, FAMILY_PARAMS, MIN_N, check_params, make_bench_instance
from ._common import _console, atomic_outputs, check_out_dir, no_duplicates, nonneg_int, only_with, print_json, split_list

__all__ = ["_add_relax_bench", "_run_relax_bench", "parse_N", "parse_params", "MAX_N", "MAX_DIM"]

#: Largest ``N`` relax-bench generates: the exported SDP has ``N(N+1)/2`` variables, and its export
#: takes about 300 N^2 bytes of memory (1.2 GB and a 150 MB SDPA file at N = 2000; 2.7 GB and
#: about 340 MB at N = 3000). First-order solvers are documented up to N = 2000 (docs/relaxations.md).
MAX_N = 3000
#: Largest dimension (``--param dim``): ``n(n+1)/2`` variables for ``T`` and an ``N + n`` PSD block.
MAX_DIM = 1000


def _add_relax_bench(sub) -> None:
    p = sub.add_parser(
        "relax-bench",
        help="relaxation benchmark: instance families with known optimum; export as SDPA or CBF files",
        description="Generate instances of the Q-problem (CP / DNN relaxation) whose optimal value is known "
                    "exactly, print them, or export them for any conic solver (docs/relaxation_benchmark.md).",
    )
    p.add_argument("--family", default="all",
                   help="comma-separated families (random, rays, collinear, inside, ties, scaled) or 'all'")
    p.add_argument("--N", default="10",
                   help=f"comma-separated numbers of points, e.g. 6,10,50 (default 10; at most {MAX_N})")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed, an integer >= 0 (default 0)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="family parameter, e.g. n_rays=2, frac_inside=0.8, decades=6, "
                        f"dim=3 (at most {MAX_DIM}) (repeatable)")
    p.add_argument("--export", type=Path, default=None, metavar="DIR",
                   help="write one problem file per instance, an .npy of X each, and DIR/instances.json "
                        "(DIR must be new or empty)")
    p.add_argument("--format", default=None, help="with --export: sdpa (.dat-s) or cbf (default sdpa)")
    p.add_argument("--cone", default=None, help="with --export: dnn or nonneg (same optimum; default dnn)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def parse_N(spec: str) -> list[int]:
    """``"6,10"`` -> ``[6, 10]``; a one-line ``ValueError`` naming ``--N`` otherwise."""
    out = []
    for tok in split_list(spec, "--N"):
        try:
            out.append(int(tok))
        except ValueError:
            raise ValueError(f"--N must be comma-separated integers, got {spec!r}") from None
    no_duplicates(out, spec, "--N")
    big = next((N for N in out if N > MAX_N), None)
    if big is not None:
        raise ValueError(f"--N must be at most {MAX_N} (the exported SDP has N(N+1)/2 variables; at N = {MAX_N} "
                         f"its export needs about 3 GB of memory), got {big}")
    return out


def parse_params(items) -> dict:
    """``["n_rays=2", "decades=6"]`` -> ``{"n_rays": 2, "decades": 6.0}``."""
    out, raw = {}, {}
    for it in items:
        key, sep, val = str(it).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--param must be KEY=VALUE, got {it!r}")
        try:
            num = int(val) if val.strip().lstrip("-").isdigit() else float(val)
        except ValueError:
            raise ValueError(f"--param {key}: value must be a number, got {val!r}") from None
        if key in out:
            raise ValueError(f"--param {key} is given twice ({raw[key]!r} and {str(it).strip()!r}): give it once")
        if key == "dim" and num > MAX_DIM:
            raise ValueError(f"--param dim must be at most {MAX_DIM}, got {val.strip()}")
        out[key], raw[key] = num, str(it).strip()
    return out


def _families(spec: str) -> list[str]:
    if spec.strip() == "all":
        return list(FAMILIES)
    fams = split_list(spec, "--family")
    for f in fams:
        if f not in FAMILIES:
            raise ValueError(f"unknown family {f!r}; choose from {', '.join(FAMILIES)} or all")
    no_duplicates(fams, spec, "--family")
    return fams


def _run_relax_bench(args: argparse.Namespace) -> int:
    fams = _families(args.family)
    Ns = parse_N(args.N)
    params = parse_params(args.param)
    fmt = "sdpa" if args.format is None else str(args.format).lower()
    cone = "dnn" if args.cone is None else str(args.cone).lower()
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {args.format!r}; choose from {', '.join(FORMATS)}")
    if cone not in EXPORT_CONES:
        raise ValueError(f"unknown cone {args.cone!r}; choose from {', '.join(EXPORT_CONES)}")
    only_with({"--format": args.format, "--cone": args.cone}, args.export is not None, "--export DIR",
              why=" (it chooses what the exported files hold)", context=" without --export")
    for f in fams:
        for N in Ns:
            if N < MIN_N[f]:
                raise ValueError(f"N = {N} is too small for family {f!r} (needs N >= {MIN_N[f]})")
    for key in params:
        if not any(key in FAMILY_PARAMS[f] for f in fams):
            raise ValueError(f"no selected family has the parameter {key!r}")
    for f in fams:
        for N in Ns:
            try:
                check_params(f, {k: v for k, v in params.items() if k in FAMILY_PARAMS[f]}, N)
            except ValueError as e:
                raise ValueError(f"--param {e}") from None
    out = check_out_dir(args.export, "--export")
    if out is not None and out.exists() and any(out.iterdir()):
        raise ValueError(f"--export folder {str(out)!r} exists and is not empty; choose a new folder")

    insts = [make_bench_instance(f, N, seed=args.seed, **{k: v for k, v in params.items() if k in FAMILY_PARAMS[f]})
             for f in fams for N in Ns]
    records = None
    if out is not None:  # written in a temporary folder, renamed at the end: never half-written
        with atomic_outputs(out, "--export") as tmp:
            records = export_instances(insts, tmp, fmt=fmt, cone=cone)
    rows = [{"family": i.family, "N": i.N, "n": i.n, "lam": i.lam, "optimum": i.optimum,
             "certified_gap": i.certified_gap, "width": i.truth["width"], "n_within_lam": i.truth["n_within_lam"],
             "params": i.params} for i in insts]
    if records is not None:
        for r, rec in zip(rows, records):
            r.update(file=rec["file"], bytes=rec["bytes"], n_vars=rec["n_vars"])
    if args.json:
        print_json({"instances": rows, "export": None if out is None else str(out),
                    "format": fmt if out is not None else None, "cone": cone if out is not None else None})
        return 0
    from rich.table import Table

    t = Table(title="widelimit relax-bench" + (f": exported to {out} ({fmt}, cone {cone})" if out else ""))
    for col in ("family", "N", "n", "lam", "optimum", "width", "within lam") + (("file", "bytes") if out else ()):
        t.add_column(col, justify="left" if col in ("family", "file") else "right")
    for r in rows:
        cells = [r["family"], str(r["N"]), str(r["n"]), f"{r['lam']:.6g}", f"{r['optimum']:.15g}",
                 str(r["width"]), str(r["n_within_lam"])]
        if out:
            cells += [r["file"], str(r["bytes"])]
        t.add_row(*cells)
    _console().print(t)
    return 0
