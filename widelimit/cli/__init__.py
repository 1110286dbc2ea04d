"""The ``widelimit`` command line: one module per subcommand.

Each subcommand module defines ``_add_<name>(subparsers)`` and ``_run_<name>(args)``,
listed in :data:`COMMANDS`. Solvers never print; these modules do. Errors in the
input become one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import sys
import warnings

from ._common import Parser, load_data  # noqa: F401
from .bound import _add_bound, _run_bound
from .certify import _add_certify, _run_certify
from .demo import _add_demo, _run_demo
from .experiment import _add_experiment, _run_experiment
from .fit import _add_fit, _add_frontier, _run_fit, _run_frontier
from .relax import _add_relax, _run_relax
from .relax_bench import _add_relax_bench, _run_relax_bench
from .solve import _add_solve, _run_solve
from .. import __version__
from .._memory import ENV, parse_bytes
from .._runtime import interrupted, trace, unwinding_interrupts

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

    parser = Parser(
        prog="widelimit",
        description="Exact, certified wide-limit sparse dictionary learning and SAE certification.",
    )
    parser.add_argument("--version", action="version", version=f"widelimit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for _, add, _ in COMMANDS:
        add(sub)
    for p in sub.choices.values():  # one memory budget for every command (widelimit._memory)
        p.add_argument("--memory-budget", type=memory_size, default=None, metavar="BYTES",
                       help=f"refuse work whose estimated memory is above this (e.g. 4G; default ${ENV} or half "
                            "of this machine's memory)")
    return parser


def memory_size(text: str) -> str:
    """argparse type for ``--memory-budget``: bytes with an optional K/M/G/T suffix, kept as given."""
    try:
        parse_bytes(text, "--memory-budget")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--memory-budget ")) from None
    return text


@contextlib.contextmanager
def _budget_env(value: str | None):
    """``$WIDELIMIT_MEMORY_BUDGET`` set to ``value`` while a command runs (its worker processes inherit it)."""
    saved = os.environ.get(ENV)
    if value is not None:
        os.environ[ENV] = value
    try:
        yield
    finally:
        if value is not None:
            if saved is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = saved


def _flags_of(parser, command: str | None) -> dict[str, str]:
    """``{dest: "--flag"}`` of a subcommand's options."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sp = subs[0].choices.get(command) if subs and command else None
    out = {}
    for act in (sp._actions if sp is not None else []):
        longs = [o for o in act.option_strings if o.startswith("--")]
        if longs and act.dest not in ("help",):
            out[act.dest] = longs[0]
    return out


def flagify(msg: str, flags: dict[str, str]) -> str:
    """Name the CLI flag where a library message names the parameter: ``key=`` -> ``--key``."""
    for dest, flag in flags.items():
        # a Python literal value (solver='SCS') becomes a shell word (--solver SCS), quoted only where the shell needs it
        msg = re.sub(rf"(?<![\w.\-/]){re.escape(dest)}=(['\"])([^'\"]*)\1",
                     lambda m, f=flag: f"{f} {shlex.quote(m.group(2))}", msg)
        msg = re.sub(rf"(?<![\w.\-/]){re.escape(dest)}=(?:\.\.\.)?(?=(\S?))",
                     lambda m, f=flag: f + (" " if m.group(1) else ""), msg)
        if "_" in dest:  # a parameter name with an underscore is unambiguous even without "="
            msg = re.sub(rf"(?<![\w.\-'\"/]){re.escape(dest)}(?![\w'\"/])", flag, msg)
    return msg


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) if str(e).strip() else ""
    if not isinstance(e, (ValueError, OSError, MemoryError, ArithmeticError)) or not text:
        text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text[:2000]


def main(argv=None) -> int:
    """Run the command line; return the exit status (0 ok, 2 error, 130 interrupted).

    Every error is one line on stderr (``widelimit <command>: error: ...``), never a
    traceback; set ``WIDELIMIT_DEBUG=1`` to see the traceback of an unexpected error.
    Ctrl-C prints one line and returns 130; outputs are written atomically, so nothing
    is left half-written.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except KeyboardInterrupt:
        print("widelimit: interrupted", file=sys.stderr)
        return 130
    trace("parsed")
    run = {name: fn for name, _, fn in COMMANDS}[args.command]
    prefix = f"widelimit {args.command}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # recorded, printed once each below
        try:
            trace("running")
            # Ctrl-C unwinds the command: its temporary outputs are removed
            with unwinding_interrupts(), _budget_env(getattr(args, "memory_budget", None)):
                status = int(run(args) or 0)
        except KeyboardInterrupt:
            print(f"{prefix}: interrupted", file=sys.stderr)
            return 130
        except SystemExit as e:  # a library calling sys.exit: keep its status, one line
            code = e.code if isinstance(e.code, int) else 2
            if code and not isinstance(e.code, int):
                print(f"{prefix}: error: {e.code}", file=sys.stderr)
            return code
        except Exception as e:  # noqa: BLE001 - one line for every error, expected or not
            if interrupted():  # Ctrl-C inside a C extension's import surfaces as an ImportError
                print(f"{prefix}: interrupted", file=sys.stderr)
                return 130
            if os.environ.get("WIDELIMIT_DEBUG"):
                raise
            # the error says what went wrong; warnings on the way there would only add lines
            print(f"{prefix}: error: {flagify(_one_line(e), _flags_of(parser, args.command))}", file=sys.stderr)
            return 2
    seen = set()
    for w in caught:  # library warnings of a successful run: one line each
        text = " ".join(str(w.message).split())[:500]
        if text not in seen:
            seen.add(text)
            print(f"{prefix}: warning: {text}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
