"""The session's measured cases and their energy-per-token tables.

Every finished case reaches ``CaseResults.add``, which passes it on to the listeners
(the keeper writes it to disk at once, so a crash keeps it) and prints the tables at the
end, fitted to the terminal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from ..case_tables import (
    DEFAULT_GROUP_BY,
    DEFAULT_SORT,
    GROUP_CHOICES,
    case_tables,
    parse_columns,
    parse_group_by,
    parse_sort,
)
from ..controller.busy import BUSY_EFFECT
from ..conversions import (
    G_PER_KWH,
    PRICE_PER_KWH,
    Intensity,
    Price,
    parse_intensity,
    parse_price,
)
from ..figures import FIGURES
from ..results import CaseResult
from ..tables import render
from .option_rows import Option, Section
from .session import header_lines

SECTION = "llmenergy: energy per token"


@dataclass(frozen=True)
class ReportSettings:
    columns: tuple[str, ...] | None = None  # None: the default columns, empty ones dropped
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    sort: str = DEFAULT_SORT
    carbon: Intensity | None = None  # gCO2e per kWh, for the co2 figures
    price: Price | None = None  # money per kWh, for the cost figures

    @property
    def conversions(self) -> dict[str, float]:
        """The session's factors per kWh (``CaseResult.conversions``): the co2_g and cost
        figures' factors, for a case's table row, its CI targets and a paired run's gates."""
        out: dict[str, float] = {}
        if self.carbon is not None:
            out[G_PER_KWH] = self.carbon.g_per_kwh
        if self.price is not None:
            out[PRICE_PER_KWH] = self.price.per_kwh
        return out


class CaseResults:
    """Owns the results of the session's energy benchmark cases, in the order they ran."""

    def __init__(self, settings: ReportSettings, gated: Sequence[str] = ()) -> None:
        self.settings = settings
        self.gated = tuple(gated)  # figures a gate judges: always shown
        self.results: list[CaseResult] = []
        self.listeners: list[Callable[[list[CaseResult]], None]] = []

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
        conversions = self.settings.conversions
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
    """The session's one line about a busy machine, or nothing: the trials it repeated
    and left out, and the ones it counted anyway (with how far they may be off)."""
    busy = [r for r in results if r.busy]
    if not busy:
        return ""
    parts = [*_repeated_parts(busy), *_counted_parts(busy)]
    return f"machine busy in {len(busy)} case(s): {'; '.join(parts)}; no gate fails on these cases"


def _repeated_parts(busy: Sequence[CaseResult]) -> list[str]:
    """The trials left out and repeated: by the CPUs' other users, by a GPU's."""
    trials = sum(len(r.busy_trials) for r in busy)
    shared = [t.gpu for r in busy for t in r.busy_trials if t.gpu and t.gpu.neighbours]
    shares = [t.background_cpu or 0.0 for r in busy for t in r.busy_trials]
    parts = []
    if trials > len(shared):
        parts.append(
            f"other processes used up to {max(shares, default=0.0):.0%} of the CPUs during "
            f"{trials - len(shared)} trial(s), repeated and left out of the figures "
            "(--energy-max-background=SHARE|off sets the limit)"
        )
    if shared:
        who = ", ".join(dict.fromkeys(n.describe() for g in shared for n in g.neighbours))
        parts.append(
            f"other processes shared the measured GPUs ({who}) in {len(shared)} trial(s), "
            "repeated and left out of the figures"
        )
    return parts


def _counted_parts(busy: Sequence[CaseResult]) -> list[str]:
    """The trials counted anyway, the machine being busy throughout."""
    counted = [r for r in busy if r.busy_counted]
    if not counted:
        return []
    share = max(r.busy_share for r in counted)
    trials = sum(len(r.busy_counted) for r in counted)
    return [
        f"{trials} trial(s) of {len(counted)} case(s) were measured anyway beside other "
        f"processes using up to {share:.0%} of the CPUs, so their figures {BUSY_EFFECT} "
        "(--energy-busy=repeat leaves them out)"
    ]


CASE_RESULTS = pytest.StashKey[CaseResults]()


# -- options -----------------------------------------------------------------------------
REPORT_OPTIONS = Section(
    "report",
    "Tables",
    ReportSettings,
    (
        Option(
            "--energy-columns",
            "columns",
            parse_columns,
            "LIST",
            "columns of the energy tables, comma-separated, from: {choices}",
            choices=lambda: list(FIGURES),
            default_text="the default columns that have values, narrowed to the terminal",
        ),
        Option(
            "--energy-group-by",
            "group_by",
            parse_group_by,
            "KEYS",
            "one energy table per: {choices} (comma-separated)",
            choices=lambda: GROUP_CHOICES,
        ),
        Option(
            "--energy-sort",
            "sort",
            parse_sort,
            "COLUMN",
            "row order of the energy tables: tokens, name or a figure; -FIGURE sorts descending",
        ),
        Option(
            "--energy-carbon-intensity",
            "carbon",
            parse_intensity,
            "G_OR_CODE",
            "grid carbon intensity for the gCO2e figures: gCO2e/kWh (e.g. 120) or a country "
            "(ISO alpha-3, e.g. FRA) or cloud region (e.g. gcp:europe-west1) from the shipped "
            "table (CodeCarbon's data)",
            record=lambda v: None if v is None else {"g_per_kwh": v.g_per_kwh, "source": v.source},
        ),
        Option(
            "--energy-price",
            "price",
            parse_price,
            "PRICE",
            "electricity price per kWh for the cost figures, e.g. 0.30 or 0.30EUR",
            record=lambda v: None if v is None else {"per_kwh": v.per_kwh, "currency": v.currency},
        ),
    ),
)
