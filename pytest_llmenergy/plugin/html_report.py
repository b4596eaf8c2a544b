"""The HTML report at the end of a session (``--energy-report``).

Written after every other feature's session end (a hook wrapper), so that it shows the
run as finally recorded: its status, a torchrun job's layout, the gates' comparison.  It
runs where the keeper runs: on xdist's controller and on torchrun's rank 0, never on a
worker, so a session writes one report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from pathlib import Path

import pytest

from ..errors import ConfigError, LLMEnergyError
from ..storage.recorder import utc_now
from ..storage.runfile import COMPLETE, INTERRUPTED, Run
from .keeping import Keeper
from .routing import RoutingSection
from .session import fail_writes, header_lines


class HtmlReporting:
    """Owns ``--energy-report``: checked at start, written last, announced in the summary."""

    def __init__(
        self, config: pytest.Config, path: str, keeper: Keeper, routing: RoutingSection
    ) -> None:
        self.config = config
        self.path = path
        self.keeper = keeper
        self.routing = routing  # its decision, shown as the session's terminal shows it
        self.written: Path | None = None
        self.error = ""

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """A missing library stops the session before anything is measured (the path
        was checked with every output option's, at configure)."""
        from ..html import check_available

        try:
            check_available()
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-report: {exc}") from None

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(
        self, session: pytest.Session, exitstatus: int
    ) -> Generator[None, None, None]:
        yield
        try:
            self._write(exitstatus)
        except KeyboardInterrupt:  # Ctrl-C while it is made: the run is saved already
            self.error = (
                f"the HTML report {self.path} was not written: interrupted (Ctrl-C) while it "
                "was made; `llmenergy report RUN --out PATH` makes it from the saved run"
            )
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        if self.error:
            fail_writes(session, 1)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        lines: list[tuple[str, bool]] = []
        if self.written is not None:
            size_mb = self.written.stat().st_size / 1e6
            cases = len(self.keeper.results)
            lines.append(
                (f"HTML report of {cases} case(s): {self.written} ({size_mb:.1f} MB)", False)
            )
        if self.error:
            lines.append((self.error, True))
        for text, red in lines:
            for part in header_lines(self.config, [text]):
                terminalreporter.write_line(part, red=red)

    def _run(self, exitstatus: int) -> Run | None:
        keeper = self.keeper
        if keeper.recorder is not None:
            return keeper.recorder.run
        if keeper.header_run is None:
            return None
        status = INTERRUPTED if exitstatus == pytest.ExitCode.INTERRUPTED else COMPLETE
        return dataclasses.replace(
            keeper.header_run, cases=tuple(keeper.results), status=status, finished=utc_now()
        )

    def _write(self, exitstatus: int) -> None:
        from ..html import write_report

        run = self._run(exitstatus)
        if run is None or not run.cases or self.config.option.collectonly:
            return
        keeper = self.keeper
        runs, labels, comparisons = [run], ["this run"], []
        if keeper.baseline is not None and keeper.comparison is not None:
            runs = [keeper.baseline, run]
            labels = [keeper.comparison.baseline_label, keeper.comparison.current_label]
            comparisons = [keeper.comparison]
        try:
            routed = self.routing.routed
            self.written = write_report(self.path, runs, labels, comparisons, routed)
        except (OSError, LLMEnergyError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.error = f"could not write the HTML report {self.path}: {why}"


HTML_REPORTING = pytest.StashKey[HtmlReporting]()
