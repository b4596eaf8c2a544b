"""SIGTERM ends a session as Ctrl-C does: exit 2, the measured cases saved ``interrupted``.

pytest turns Ctrl-C (SIGINT) into a KeyboardInterrupt and still runs the session's end,
where the run file gets its final status; SIGTERM (``timeout``, a cancelled CI job,
``kill``) would end the process on the spot, leaving the run ``running`` and no export
written.  From configure to unconfigure SIGTERM raises that KeyboardInterrupt too.  Once
the session's end has begun (or after the first SIGTERM), a further SIGTERM interrupts
nothing: the run file and the exports are being written, and are written whole.

A handler that is already there (a program that runs pytest inside itself, or SIGTERM
ignored by the parent) is left alone.  Features that need SIGTERM first (restoring GPU
settings, stopping a server, torchrun) install theirs over this one and end the same way.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Generator
from typing import Any

import pytest

SIGTERM_MESSAGE = "SIGTERM: session stopped; the cases measured so far are kept"


class SigtermStop:
    """Installs the SIGTERM handler for one session (the controller's process only)."""

    def __init__(self) -> None:
        self.finishing = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is not signal.SIG_DFL:  # ignored, or someone else's: theirs to keep
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.finishing:
            sys.stderr.write(
                "\nllmenergy: SIGTERM again: the run is being saved; finishing that first\n"
            )
            return
        self.finishing = True  # the next one must not cut the saving short
        raise KeyboardInterrupt(SIGTERM_MESSAGE)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self) -> Generator[None, None, None]:
        self.finishing = True
        return (yield)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if not self._installed:
            return
        self._installed = False
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous)


SIGTERM_STOP = pytest.StashKey[SigtermStop]()
