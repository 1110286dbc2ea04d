"""``widelimit relax-bench``: generate relaxation-benchmark instances with known optimum, and export them.

Registered in :data:`widelimit.cli.COMMANDS` as ``_add_relax_bench`` / ``_run_relax_bench``. Errors in the input are
``ValueError`` with a one-line message (the CLI prints it, exit status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..relax.export import EXPORT_CONES, FORMATS, export_instances
from ..relax.families import FAMILIES, FAMILY_PARAMS, MIN_N, make_bench_instance
from ._common import _console, print_json

__all__ = ["_add_relax_bench", "_run_relax_bench", "parse_N", "parse_params"]


def _add_relax_bench(sub) -> None:
    p = sub.add_parser(
        "relax-bench",
        help="relaxation benchmark: instance families with known optimum; export as SDPA or CBF files",
        description="Generate instances of the Q-problem (CP / DNN relaxation) whose optimal value is known "
                    "exactly, print them, or export them for any conic solver (docs/relaxation_benchmark.md).",
    )
    p.add_argument("--family", default="all",
                   help="comma-separated families (random, rays, collinear, inside, ties, scaled) or 'all'")
    p.add_argument("--N", default="10", help="comma-separated numbers of points, e.g. 6,10,50 (default 10)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="family parameter, e.g. n_rays=2, frac_inside=0.8, decades=6, dim=3 (repeatable)")
    p.add_argument("--export", type=Path, default=None, metavar="DIR",
                   help="write one problem file per instance, an .npy of X each, and DIR/instances.json "
                        "(DIR must be new or empty)")
    p.add_argument("--format", default="sdpa", help="export format: sdpa (.dat-s) or cbf (default sdpa)")
    p.add_argument("--cone", default="dnn", help="exported relaxation: dnn or nonneg (same optimum; default dnn)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def parse_N(spec: str) -> list[int]:
    """``"6,10"`` -> ``[6, 10]``; a one-line ``ValueError`` otherwise."""
    out = []
    for tok in str(spec).split(","):
        tok = tok.strip()
        try:
            out.append(int(tok))
        except ValueError:
            raise ValueError(f"--N must be comma-separated integers, got {spec!r}") from None
    return out


def parse_params(items) -> dict:
    """``["n_rays=2", "decades=6"]`` -> ``{"n_rays": 2, "decades": 6.0}``."""
    out = {}
    for it in items:
        key, sep, val = str(it).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param must be KEY=VALUE, got {it!r}")
        try:
            num = int(val) if val.strip().lstrip("-").isdigit() else float(val)
        except ValueError:
            raise ValueError(f"--param {key.strip()}: value must be a number, got {val!r}") from None
        out[key.strip()] = num
    return out


def _families(spec: str) -> list[str]:
    if spec.strip() == "all":
        return list(FAMILIES)
    fams = [f.strip() for f in spec.split(",") if f.strip()]
    for f in fams:
        if f not in FAMILIES:
            raise ValueError(f"unknown family {f!r}; choose from {', '.join(FAMILIES)} or all")
    if not fams:
        raise ValueError("--family is empty")
    return fams


def _run_relax_bench(args: argparse.Namespace) -> int:
    fams = _families(args.family)
    Ns = parse_N(args.N)
    params = parse_params(args.param)
    fmt, cone = str(args.format).lower(), str(args.cone).lower()
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {args.format!r}; choose from {', '.join(FORMATS)}")
    if cone not in EXPORT_CONES:
        raise ValueError(f"unknown cone {args.cone!r}; choose from {', '.join(EXPORT_CONES)}")
    for f in fams:
        for N in Ns:
            if N < MIN_N[f]:
                raise ValueError(f"N = {N} is too small for family {f!r} (needs N >= {MIN_N[f]})")
    for key in params:
        if not any(key in FAMILY_PARAMS[f] for f in fams):
            raise ValueError(f"no selected family has the parameter {key!r}")
    out = args.export
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"export folder {str(out)!r} exists and is not empty; choose a new folder")

    insts = [make_bench_instance(f, N, seed=args.seed, **{k: v for k, v in params.items() if k in FAMILY_PARAMS[f]})
             for f in fams for N in Ns]
    records = None
    if out is not None:
        records = export_instances(insts, out, fmt=fmt, cone=cone)
    rows = [{"family": i.family, "N": i.N, "n": i.n, "lam": i.lam, "optimum": i.optimum,
             "certified_gap": i.certified_gap, "width": i.truth["width"], "n_within_lam": i.truth["n_within_lam"],
             "params": i.params} for i in insts]
    if records is not None:
        for r, rec in zip(rows, records):
            r.update(file=rec["file"], bytes=rec["bytes"], n_vars=rec["n_vars"])
    if args.json:
        print_json({"instances": rows, "export": None if out is None else str(out),
                    "format": fmt if out is not None else None, "cone": cone})
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
