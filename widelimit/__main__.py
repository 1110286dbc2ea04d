"""``python -m widelimit`` and the ``widelimit`` console script.

Everything, the imports included, runs inside one handler: Ctrl-C at any moment prints one
line and exits with status 130, never a traceback; the process ends by :func:`widelimit._runtime.exit_now`
right after the command, so no interpreter shutdown is left for a Ctrl-C to land in."""


from ._runtime import exit_interrupted, exit_now, interrupted, track_interrupts


def entry() -> None:
    """Run the command line and exit with its status (0 ok, 2 error, 130 interrupted)."""
    track_interrupts()
    try:
        from .cli import main  # inside the handler: importing the solvers takes a second

        status = main()
        if status == 130:
            exit_interrupted()  # the line is written; past CPython's unhandled-interrupt flag
        exit_now(status)  # inside the handler too: no interpreter shutdown for a Ctrl-C to land in
    except BaseException as e:  # noqa: BLE001 - Ctrl-C while starting up or between the command's handlers
        if not (isinstance(e, KeyboardInterrupt) or interrupted()):
            raise
        exit_interrupted("widelimit: interrupted")


if __name__ == "__main__":
    entry()
