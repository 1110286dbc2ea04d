"""The ``widelimit`` command line: one module per subcommand.

Each subcommand module defines ``_add_<name>(subparsers)`` and ``_run_<name>(args)``,
listed in :data:`COMMANDS`. Solvers never print; these modules do. Errors in the
input become one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from ._common import load_data  # noqa: F401
from .bound import _add_bound, _run_bound
from .certify import _add_certify, _run_certify
from .demo import _add_demo, _run_demo
from .experiment import _add_experiment, _run_experiment
from .fit import _add_fit, _add_frontier, _run_fit, _run_frontier
from .relax import _add_relax, _run_relax
from .relax_bench import _add_relax_bench, _run_relax_bench
from .solve import _add_solve, _run_solve

__all__ = ["main", "build_parser", "COMMANDS"]

#: (name, add-parser function, run function) for every subcommand.
COMMANDS = [
    ("solve", _add_solve, _run_solve),
    ("demo", _add_demo, _run_demo),
    ("experiment", _add_experiment, _run_experiment),
    ("bound", _add_bound, _run_bound),
    ("certify", _add_certify, _run_certify),
    ("fit", _add_fit, _run_fit),
    ("frontier", _add_frontier, _run_frontier),
    ("relax", _add_relax, _run_relax),
    ("relax-bench", _add_relax_bench, _run_relax_bench),
]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="widelimit",
        description="Exact, certified wide-limit sparse dictionary learning and SAE certification.",
    )
    parser.add_argument("--version", action="version", version=f"widelimit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for _, add, _ in COMMANDS:
        add(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = {name: fn for name, _, fn in COMMANDS}[args.command]
    try:
        return int(run(args) or 0)
    except (ValueError, MemoryError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"widelimit {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
