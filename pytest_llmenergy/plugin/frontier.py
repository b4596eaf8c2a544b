"""The time-energy front over a sweep's configurations (batch sizes, concurrent
requests, GPU settings) and, under ``--llm-slo``, the minimum-energy configuration that
meets the latency limits (``frontier.slo``), in the terminal summary.  The limits are
kept in the run file's options (``slo``), so ``llmenergy show`` and the HTML report
choose the same from the saved cases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from ..frontier.slo import SLO_EXAMPLE, Limit, parse_slo, slo_tables, slo_text, sweeps
from ..results import CaseResult
from ..tables import render, wrap
from .option_rows import Option, Section

SECTION = "llmenergy: the best configuration under a latency limit"


@dataclass(frozen=True)
class SloSettings:
    limits: tuple[Limit, ...] = ()  # empty: the front is shown, nothing is chosen


class BestConfiguration:
    """Owns the section: the front of every sweep of two configurations or more, and the
    choice under the limits."""

    def __init__(self, settings: SloSettings, results: Sequence[CaseResult]) -> None:
        self.settings = settings
        self.results = results  # the session's cases, as they are added

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        limits = self.settings.limits
        found = sweeps(self.results, limits)
        if not found and not (limits and self.results):
            return
        terminalreporter.section(SECTION)
        width = terminalreporter.config.get_terminal_writer().fullwidth
        if not found:
            line = (
                f"--llm-slo={slo_text(limits)}: no case was measured in two configurations "
                "or more (--llm-concurrency, --llm-batch-sizes or GPU settings); nothing to "
                "choose between"
            )
            for part in wrap(line, width):
                terminalreporter.write_line(part)
            return
        for line in render(slo_tables(found), "table", width=width).splitlines():
            terminalreporter.write_line(line)


BEST_CONFIGURATION = pytest.StashKey[BestConfiguration]()


# -- options -----------------------------------------------------------------------------
SLO_OPTIONS = Section(
    "slo",
    "The best configuration under a latency limit",
    SloSettings,
    (
        Option(
            "--llm-slo",
            "limits",
            parse_slo,
            "LIMITS",
            "latency limits, e.g. "
            + SLO_EXAMPLE
            + " (itl: inter-token latency, ttft: time to first token; ms or s): of each "
            "case measured in several configurations (--llm-concurrency, --llm-batch-sizes, "
            "GPU settings), the configuration with the least energy per output token that "
            "meets every limit, shown beside the time-energy front and kept in the run",
            default_text="none: the front is shown, nothing is chosen",
            record=lambda limits: slo_text(limits) or None,
        ),
    ),
)
