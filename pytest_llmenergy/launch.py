"""The ``llmenergy`` command's entry point: Ctrl-C while it starts is one line too.

The command imports most of the package (pytest, numpy, the meters) before it runs: a
second or more in which Ctrl-C printed a KeyboardInterrupt traceback.  This module and
the package's ``__init__`` import nothing heavy, so it is already running, and catching
Ctrl-C, when those imports begin; ``cli.main`` catches it from then on.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # cli's: 128 + SIGINT (not imported from there: that is the wait)


def main() -> int:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        print("llmenergy: interrupted while starting; nothing was done", file=sys.stderr)
        return EXIT_INTERRUPTED
    return run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
