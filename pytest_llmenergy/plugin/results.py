"""Showing: the session's measured cases and their energy-per-token tables.

Every finished case reaches ``CaseResults.add``, which passes it on to the listeners
(the keeper writes it to disk at once, so a crash keeps it) and prints the tables at the
end, fitted to the terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from ..report import case_tables
from ..results import CaseResult
from ..tables import render
from .options import ReportSettings

SECTION = "llmenergy: energy per token"


class CaseResults:
    """Owns the results of the session's energy benchmark cases, in the order they ran."""

    def __init__(self, settings: ReportSettings, gated: Sequence[str] = ()) -> None:
        self.settings = settings
        self.gated = tuple(gated)  # figures a gate judges: always shown
        self.results: list[CaseResult] = []
        self.listeners: list[Callable[[list[CaseResult]], None]] = []

    def add(self, result: CaseResult) -> None:
        self.results.append(result)
        for listener in self.listeners:
            listener(self.results)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.results:
            return
        s = self.settings
        terminalreporter.section(SECTION)
        tables = case_tables(
            self.results, columns=s.columns, group_by=s.group_by, sort=s.sort, gated=self.gated
        )
        width = terminalreporter.config.get_terminal_writer().fullwidth
        text = render(tables, "table", width=width, narrow_hint="choose with --energy-columns")
        for line in text.splitlines():
            terminalreporter.write_line(line)


CASE_RESULTS = pytest.StashKey[CaseResults]()
