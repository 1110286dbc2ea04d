"""``widelimit experiment``: list or run the phenomena-lab experiments."""

from __future__ import annotations

from pathlib import Path


from ._common import _console, atomic_outputs, check_out_dir, print_json
from ..lab import experiments


# --------------------------------------------------------------------------------------
# experiment
# --------------------------------------------------------------------------------------


def _add_experiment(sub):
    p = sub.add_parser("experiment", help="run a named experiment (writes PNG plots and JSON)")
    p.add_argument("name", nargs="?", default=None, help="experiment name; omit to list them")
    p.add_argument("--out", type=Path, default=None, help="folder for plots and JSON (default: ./experiments/NAME)")
    p.add_argument("--quick", action="store_true", help="small sizes (as in the test suite)")
    p.add_argument("--json", action="store_true", help="print the numbers as one JSON object")


def _retarget(obj, tmp: str, out: str):
    """``obj`` (an experiment's result) with the paths under the temporary folder ``tmp`` moved to ``out``."""
    if isinstance(obj, dict):
        return {k: _retarget(v, tmp, out) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_retarget(v, tmp, out) for v in obj)
    if isinstance(obj, str) and (obj == tmp or obj.startswith(tmp + "/")):
        return out + obj[len(tmp):]
    return obj


def _run_experiment(args) -> int:

    if args.name is None:
        for name, doc in experiments.names().items():
            print(f"{name:28s} {doc}")
        return 0
    fn = experiments.get(args.name)
    out = args.out if args.out is not None else Path("experiments") / args.name
    check_out_dir(out)
    with atomic_outputs(out) as tmp:  # all files of one run appear together, or none
        result = _retarget(fn(tmp, quick=args.quick), str(tmp), str(out))
    if args.json:
        print_json(result)
    else:
        _console().print(f"experiment {args.name}: results in {out}")
    return 0
