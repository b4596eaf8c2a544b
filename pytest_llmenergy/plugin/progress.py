"""What a running case says while it runs: each trial with ``-v``; on a terminal, the
latest trial after the test's dot (erased when the case ends); in a log (CI), a line now
and then for a case that runs long, naming it, how far it is and why it waits, so a job
that sits on one case for minutes says so without cluttering a normal run."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

import pytest

from ..controller.rule import ControllerSettings
from ..meters.readings import duration_text
from .session import PREFIX, fitted

# A case in a log says where it is once it has run this long, then each time its time
# doubles (1, 2, 4, 8 minutes ...): a few lines for a case that runs long, none for most.
LONG_CASE_S = 60.0


def progress_writer(
    request: pytest.FixtureRequest, controller: ControllerSettings
) -> Callable[[str], None] | None:
    """The ``energy_benchmark``'s progress callback for this test, by where output goes."""
    config = request.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return None
    uncaptured = (
        capture.global_and_fixture_disabled if capture is not None else contextlib.nullcontext
    )
    if config.get_verbosity() >= 1:
        name = request.node.name

        def write(line: str) -> None:
            if line:  # an empty line means the case is done
                with uncaptured():
                    reporter.write_line(f"    {name}: {line}")

        return write
    with uncaptured():  # under capture, the output is a file, not the terminal
        interactive = _interactive(reporter)
    if not interactive:

        def note(line: str) -> None:
            width = reporter._tw.fullwidth  # fitted as every other line of the session
            with uncaptured():
                for part in fitted(line.removeprefix(PREFIX), width=width):
                    reporter.write_line(part)

        return LongCaseNotes(note, request.node.nodeid, limits_text(controller))
    tw = reporter._tw
    # what is left of the terminal's line, so the status never wraps (and can be erased)
    return LiveStatus(uncaptured, room=lambda: tw.fullwidth - tw.width_of_current_line - 1)


def _interactive(reporter: pytest.TerminalReporter) -> bool:
    file = getattr(reporter._tw, "_file", None)  # the terminal pytest writes to
    isatty = getattr(file, "isatty", None)
    return bool(isatty and isatty() and os.environ.get("TERM") != "dumb")


def limits_text(options: ControllerSettings) -> str:
    """Where a case stops at the latest: its trial limit and measured-time budget."""
    text = f"stops by {options.max_trials} trials"
    if options.max_time:
        text += f" or {options.max_time:g} s measured"
    return text


class LongCaseNotes:
    """Lines for a log: nothing for a case shorter than ``after_s``; then the latest
    trial's line (its figures, their intervals against the targets, and why a trial was
    repeated) with the case's name, its time so far and its limits, each time the case's
    time has doubled since the last line."""

    def __init__(
        self,
        write: Callable[[str], None],
        nodeid: str,
        limits: str,
        after_s: float | None = None,  # None: LONG_CASE_S
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._nodeid = nodeid
        self._limits = limits
        self._clock = clock
        self._start = clock()
        self._next_s = LONG_CASE_S if after_s is None else after_s
        self.lines = 0

    def __call__(self, line: str) -> None:
        if not line:
            return  # the case is done: its result says the rest
        elapsed_s = self._clock() - self._start
        if elapsed_s < self._next_s:
            return
        self._write(
            f"llmenergy: {self._nodeid} still running after {duration_text(elapsed_s)}: "
            f"{line}; {self._limits}"
        )
        self.lines += 1
        self._next_s = 2 * elapsed_s


class LiveStatus:
    """The latest trial's line, written after the test's dot and erased (backspaces, so
    the terminal reporter's own line is left as it was); shown once a case has run for
    ``after_s``, so short cases never flicker."""

    def __init__(
        self,
        uncaptured: Callable[[], contextlib.AbstractContextManager[object]],
        after_s: float = 2.0,
        room: Callable[[], int] = lambda: 60,
    ) -> None:
        self._uncaptured = uncaptured
        self._room = room
        self._start = time.monotonic()
        self._after_s = after_s
        self._shown = 0

    def __call__(self, line: str) -> None:
        if not line:
            self._show("")
        elif time.monotonic() - self._start >= self._after_s:
            text, room = f" {line}", max(self._room(), 2)
            self._show(text if len(text) <= room else text[: room - 1] + "…")

    def _show(self, text: str) -> None:
        if not text and not self._shown:
            return
        erase = "\b" * self._shown + " " * self._shown + "\b" * self._shown
        with self._uncaptured():
            sys.stdout.write(erase + text)
            sys.stdout.flush()
        self._shown = len(text)
