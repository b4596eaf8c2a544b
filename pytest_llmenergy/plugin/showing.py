"""Showing: the session's measured cases and their energy-per-token tables.

Every finished case reaches ``CaseResults.add``, which passes it on to the listeners
(the keeper writes it to disk at once, so a crash keeps it) and prints the tables at the
end, fitted to the terminal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from ..conversions import G_PER_KWH, PRICE_PER_KWH
from ..report import case_tables
from ..results import CaseResult
from ..tables import render
from .measuring import header_lines
from .options import ReportSettings

SECTION = "llmenergy: energy per token"


class CaseResults:
    """Owns the results of the session's energy benchmark cases, in the order they ran."""

    def __init__(self, settings: ReportSettings, gated: Sequence[str] = ()) -> None:
        self.settings = settings
        self.gated = tuple(gated)  # figures a gate judges: always shown
        self.results: list[CaseResult] = []
        self.listeners: list[Callable[[list[CaseResult]], None]] = []

    @property
    def conversions(self) -> dict[str, float]:
        """The session's factors per kWh, kept with every case."""
        out: dict[str, float] = {}
        if self.settings.carbon is not None:
            out[G_PER_KWH] = self.settings.carbon.g_per_kwh
        if self.settings.price is not None:
            out[PRICE_PER_KWH] = self.settings.price.per_kwh
        return out

    def header(self) -> list[str]:
        s, lines = self.settings, []
        if s.carbon is not None:
            lines.append(f"carbon intensity {s.carbon.g_per_kwh:g} gCO2e/kWh: {s.carbon.source}")
        if s.price is not None:
            lines.append(
                f"electricity price {s.price.per_kwh:g} {s.price.currency} per kWh".replace(
                    "  ", " "
                )
            )
        return lines

    def add(self, result: CaseResult) -> None:
        conversions = self.conversions
        if conversions and not result.conversions:
            result = dataclasses.replace(result, conversions=conversions)
        self.results.append(result)
        for listener in self.listeners:
            listener(self.results)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.results:
            return
        s = self.settings
        terminalreporter.section(SECTION)
        shown = [*self.gated]
        if s.carbon is not None:
            shown.append("co2_g_per_1k_tokens")
        if s.price is not None:
            shown.append("cost_per_1k_tokens")
        tables = case_tables(
            self.results, columns=s.columns, group_by=s.group_by, sort=s.sort, gated=shown
        )
        width = terminalreporter.config.get_terminal_writer().fullwidth
        text = render(tables, "table", width=width, narrow_hint="choose with --energy-columns")
        for line in text.splitlines():
            terminalreporter.write_line(line)
        line = busy_line(self.results)
        if line:
            for part in header_lines(terminalreporter.config, [line]):
                terminalreporter.write_line(part, yellow=True)


def busy_line(results: Sequence[CaseResult]) -> str:
    """The session's one line about a busy machine, or nothing."""
    busy = [r for r in results if r.busy]
    if not busy:
        return ""
    trials = sum(len(r.busy_trials) for r in busy)
    share = max(r.max_background_cpu or 0.0 for r in busy)
    return (
        f"machine busy: other processes used up to {share:.0%} of the CPUs during {trials} "
        f"trial(s) of {len(busy)} case(s); those trials were repeated and left out of the "
        "figures, and no gate fails on these cases"
    )


CASE_RESULTS = pytest.StashKey[CaseResults]()
