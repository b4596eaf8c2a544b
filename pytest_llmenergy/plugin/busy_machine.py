"""The session's busy-machine feature: one watch over every trial, one early line.

The watch (``controller/busy.py``) judges the machine trial by trial; this object owns it,
says the first time the machine turns busy, at once, in one line, and makes a case that
measured nothing a skip, or a failure under ``--energy-strict``.  Under pytest-xdist each
worker watches its own trials; the controller then says it when the first busy case's
result arrives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import NoReturn

import pytest

from ..controller.busy import BUSY_STREAK, BusyWatch, busy_announcement
from ..results import CaseResult
from .session import header_lines


class BusyMachine:
    """Owns the session's ``BusyWatch``; ``say`` is None on an xdist worker (its lines
    would be captured), where the controller speaks from the results instead."""

    def __init__(self, policy: str, strict: bool, say: Callable[[str], None] | None) -> None:
        self.strict = strict
        self._say = say
        self.said = False
        self.watch = BusyWatch(policy, announce=self._announce if say is not None else None)

    def _announce(self, line: str) -> None:
        if self.said or self._say is None:
            return
        self.said = True
        self._say(line)

    def on_case(self, cases: Sequence[CaseResult]) -> None:
        """A case's result arrived (a worker's too): the first busy one, if the watch
        has not spoken yet, says the machine is busy."""
        case = cases[-1] if cases else None
        if case is None or self.said:
            return
        # the CPUs' other users only: a GPU shared with others is said by its own line
        cpu = [t for t in case.busy_trials if t.gpu is None or not t.gpu.neighbours]
        busy = case.busy_counted or (cpu if len(cpu) >= BUSY_STREAK else ())
        if not busy:
            return
        share = max(t.background_cpu or 0.0 for t in busy)
        self._announce(busy_announcement(share, len(busy), self.watch.policy))

    def not_measured(self, reason: str) -> NoReturn:
        """A case with no counted trial: skipped, or failed under --energy-strict."""
        if self.strict:
            pytest.fail(f"{reason} (--energy-strict)", pytrace=False)
        pytest.skip(reason)


def terminal_say(config: pytest.Config) -> Callable[[str], None]:
    """Lines to the terminal at once, between a test's dot and the next, fitted to its
    width (the reporter is looked up when a line is said: it registers after this
    plugin configures); nothing where there is no terminal reporter."""

    def say(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capture = config.pluginmanager.get_plugin("capturemanager")
        uncaptured = (
            capture.global_and_fixture_disabled if capture is not None else contextlib.nullcontext
        )
        with uncaptured():
            reporter.ensure_newline()
            if reporter._tw.width_of_current_line:  # xdist's dots: not seen by the above
                reporter._tw.line()
            for part in header_lines(config, [line]):
                reporter.write_line(part, yellow=True)

    return say


BUSY_MACHINE = pytest.StashKey[BusyMachine]()
