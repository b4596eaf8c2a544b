"""Routing: with a baseline from other hardware, which queries should go where; figures.

Runs after the keeper has compared (it needs the baseline); a routing question without
an answer (no model in common, one size only) is a note, never a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .. import values
from ..errors import LLMEnergyError
from ..results import CaseResult
from ..routing import BY_CHOICES, INPUT
from ..storage.store import FOLDER
from ..tables import render
from .keeping import Keeper
from .option_rows import Option, Section
from .session import header_lines

if TYPE_CHECKING:
    from ..routing.decide import Routed
    from ..routing.workload import Workload


@dataclass(frozen=True)
class RouteSectionSettings:
    """The routing section and the figures at the end of a session."""

    workload: Workload | None = None  # None: Alpaca, read when first needed
    by: str = INPUT
    lam: float = 1.0
    plots_dir: str | None = None


SECTION = "llmenergy: routing between this run's and the baseline's hardware"


class RoutingSection:
    """Owns the routing decision and the figures written at the end of a session."""

    def __init__(self, settings: RouteSectionSettings, keeper: Keeper, results: list[CaseResult]):
        self.settings = settings
        self.keeper = keeper
        self.results = results
        self.routed: list[Routed] = []
        self.note = ""
        self.plots: list[Path] = []
        self.plots_note = ""

    # -- hooks ---------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.settings.plots_dir:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise pytest.UsageError(
                    "--energy-plots: matplotlib is not installed: "
                    "pip install 'pytest-llmenergy[plots]'"
                ) from None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        baseline = self.keeper.baseline
        if baseline is not None and self.results and baseline.hardware != self.keeper.hardware:
            self._route()
        if self.settings.plots_dir and self.results:
            self._plot()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        write = terminalreporter.write_line
        config = terminalreporter.config
        if self.routed or self.note:
            terminalreporter.section(
                "llmenergy: routing between this run's and the baseline's hardware"
            )
        if self.routed:
            from ..routing.route_tables import routed_tables

            width = config.get_terminal_writer().fullwidth
            tables = [t for r in self.routed for t in routed_tables(r)]
            for line in render(tables, "table", width=width).splitlines():
                write(line)
        if self.note:
            for line in header_lines(config, [self.note]):
                write(line, yellow=True)
        if self.plots:
            where = f"{len(self.plots)} figure(s) written to {self.plots[0].parent}"
            for line in header_lines(config, [where]):
                write(line)
        if self.plots_note:
            for line in header_lines(config, [self.plots_note]):
                write(line, yellow=True)

    # -- the decision --------------------------------------------------------------
    def _route(self) -> None:
        from ..frontier import at_best_settings
        from ..routing.decide import RouteSettings, route
        from ..routing.profile import profiles_from_cases, profiles_from_run
        from ..routing.workload import alpaca

        baseline = self.keeper.baseline
        assert baseline is not None
        hardware = self.keeper.hardware
        try:
            lam = self.settings.lam
            pick = at_best_settings(lam)
            profiles = profiles_from_run(baseline, pick=pick) + profiles_from_cases(
                self.results, hardware, "this run", pick
            )
            self.routed = route(
                profiles,
                self.settings.workload or alpaca(),
                RouteSettings(
                    by=self.settings.by,
                    lam=self.settings.lam,
                    systems=(hardware, baseline.hardware),
                ),
            )
        except LLMEnergyError as exc:
            self.note = f"routing skipped: {exc}"

    def _plot(self) -> None:
        from ..frontier import at_best_settings
        from ..routing.fit import build_model
        from ..routing.profile import profiles_from_cases
        from ..routing.route_plots import write_profile_plots, write_routing_plots

        out = Path(self.settings.plots_dir or ".")
        try:
            if self.routed:
                for r in self.routed:
                    self.plots += write_profile_plots(r.router.models, out)
                    self.plots += write_routing_plots(
                        r.router, out, lams=[d.policy.lam for d in r.sweep]
                    )
            else:
                hardware = self.keeper.hardware or "this run"
                pick = at_best_settings(self.settings.lam)
                profiles = profiles_from_cases(self.results, hardware, "", pick)
                self.plots += write_profile_plots([build_model(p) for p in profiles], out)
        except LLMEnergyError as exc:
            self.plots_note = f"figures not (all) written: {exc}"


ROUTING = pytest.StashKey[RoutingSection]()


# -- options -----------------------------------------------------------------------------
def _workload(text: str) -> Workload:
    """Read now, so a bad row stops the session at start, not after the measurements."""
    from ..routing.workload import load_workload

    return load_workload(text.strip())


ROUTE_OPTIONS = Section(
    "route",
    "Routing",
    RouteSectionSettings,
    (
        Option(
            "--energy-route-workload",
            "workload",
            _workload,
            "SPEC",
            "workload of the routing section (shown when the session compares with a run from "
            "other hardware): alpaca, alpaca-paper, or a CSV / JSONL file of "
            "input_tokens,output_tokens",
            default_text="alpaca",
            record=lambda w: None if w is None else w.name,
        ),
        Option(
            "--energy-route-by",
            "by",
            values.choice(BY_CHOICES),
            "AXIS",
            "route on these tokens: {choices}",
            choices=lambda: BY_CHOICES,
        ),
        Option(
            "--energy-route-lambda",
            "lam",
            lambda text: values.fraction(text, "a weight of energy"),
            "L",
            "weight of energy against time when routing: 1 energy only, 0 time only",
        ),
        Option(
            "--energy-plots",
            "plots_dir",
            values.text,
            "DIR",
            "write figures (PNG) to DIR at the end: energy per token and runtime per model; "
            "with a run from other hardware, workload totals against the threshold and the "
            "Pareto front (needs matplotlib)",
            writes=FOLDER,
        ),
    ),
)
