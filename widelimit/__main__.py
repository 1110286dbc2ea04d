"""``python -m widelimit`` and the ``widelimit`` console script.

The Ctrl-C handler is installed before anything else is imported: from then on, Ctrl-C at any moment
prints one line, ``widelimit SUBCOMMAND: interrupted`` (the subcommand named as soon as the command
line has one), and exits with status 130, never a traceback. ``WIDELIMIT_TRACE=1`` prints the start-up
stages on stderr (:func:`widelimit._runtime.trace`). The process ends by :func:`widelimit._runtime.exit_now`
right after the command, so no interpreter shutdown is left for a Ctrl-C to land in."""

import sys

from ._runtime import exit_interrupted, exit_now, interrupted, trace, track_interrupts

#: the subcommands, known before the solvers are imported (tests/cli/test_interrupt.py checks this
#: against widelimit.cli.COMMANDS)
SUBCOMMANDS = ("solve", "demo", "experiment", "bound", "certify", "fit", "frontier", "relax", "relax-bench")


def label(argv) -> str:
    """``widelimit SUBCOMMAND`` where the command line starts with a subcommand, else ``widelimit``."""
    return f"widelimit {argv[0]}" if argv and argv[0] in SUBCOMMANDS else "widelimit"


def entry() -> None:
    """Run the command line and exit with its status (0 ok, 2 error, 130 interrupted)."""
    prefix = label(sys.argv[1:])
    track_interrupts(prefix)
    trace("handler")
    try:
        from .cli import main  # importing the solvers takes a second

        trace("imported")
        status = main()
        if status == 130:
            exit_interrupted()  # the line is written; past CPython's unhandled-interrupt flag
        exit_now(status)  # no interpreter shutdown left for a Ctrl-C to land in (Python resets SIGINT there)
    except BaseException as e:  # noqa: BLE001 - an interrupt that escaped the command's own handler
        if not (isinstance(e, KeyboardInterrupt) or interrupted()):
            raise
        exit_interrupted(f"{prefix}: interrupted")


if __name__ == "__main__":
    entry()
