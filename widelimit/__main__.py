"""``python -m widelimit`` and the ``widelimit`` console script.

Everything, the imports included, runs inside one handler: Ctrl-C at any moment prints one
line and exits with status 130, never a traceback."""

import os
import sys

from ._runtime import interrupted, track_interrupts


def entry() -> None:
    """Run the command line and exit with its status (0 ok, 2 error, 130 interrupted)."""
    track_interrupts()
    try:
        from .cli import main  # inside the handler: importing the solvers takes a second

        status = main()
    except BaseException as e:  # noqa: BLE001 - Ctrl-C while starting up or between the command's handlers
        if not (isinstance(e, KeyboardInterrupt) or interrupted()):
            raise
        sys.stderr.write("widelimit: interrupted\n")
        status = 130
    if status == 130:
        # An interrupt that passed through C code running Python (PyRun_String, e.g. inside an
        # extension's import) leaves CPython's "unhandled KeyboardInterrupt" flag set, and the
        # interpreter would then kill itself with SIGINT at exit even though the interrupt was
        # handled. Outputs are written atomically, so exiting now loses nothing.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe must not turn 130 into a traceback
                pass
        os._exit(130)
    sys.exit(status)


if __name__ == "__main__":
    entry()
