import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while starting up: one line, like everywhere else
    sys.stderr.write("widelimit: interrupted\n")
    sys.exit(130)
sys.exit(main())
