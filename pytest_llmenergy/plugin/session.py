"""The session's own lines and outcomes, shared by every feature: header lines fitted to
the terminal, and a session failed with its reason counted on pytest's last line (a gate
that failed, a file not written)."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

import pytest

from ..tables import terminal_width, wrap

PREFIX = "llmenergy: "
ERROR = "ERROR: "  # what pytest writes before a usage error's message


def header_lines(config: pytest.Config, lines: list[str]) -> list[str]:
    """Header lines fitted to the terminal: a long line continues, indented, below."""
    width = config.get_terminal_writer().fullwidth
    return [part for line in lines for part in fitted(line, width=width)]


def fitted(line: str, prefix: str = PREFIX, width: int | None = None) -> list[str]:
    """``prefix + line`` in lines that fit ``width`` (the terminal's, or pytest's 80 where
    none is known), continued indented past the prefix."""
    width = width or terminal_width(default=80)
    return wrap(prefix + line, width, indent=" " * (len(prefix) + 2))


def fitted_usage_error(exc: pytest.UsageError) -> pytest.UsageError:
    """The package's usage error with its message wrapped to the terminal, continued
    below pytest's ``ERROR: `` as header lines are below ``llmenergy: ``; another
    plugin's, or pytest's own, as it was."""
    if not _raised_here(exc.__traceback__) or len(exc.args) != 1:
        return exc
    lines = fitted(str(exc.args[0]), prefix=ERROR)
    return pytest.UsageError("\n".join(lines)[len(ERROR) :])


def _raised_here(tb: TracebackType | None) -> bool:
    """Whether the innermost frame of ``tb`` is this package's."""
    module = ""
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    return module.split(".")[0] == "pytest_llmenergy"


def fail_session(session: pytest.Session, why: str, outcome: str) -> None:
    """Exit 1 and say why on the last lines a user reads, where pytest says it: ``why`` on
    the red ``!!!`` line above pytest's last one (``session.shouldfail``, as ``-x`` says
    "stopping after 1 failures"), and ``outcome`` counted on that last line beside the
    tests' outcomes (``2 passed, 1 energy gate failed``), as plugins that add an outcome
    do (pytest-rerunfailures' ``rerun``).  Tests that passed still say ``passed``."""
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not session.shouldfail:
        session.shouldfail = PREFIX + why
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.stats.setdefault(outcome, []).append(SessionOutcome(why))


# What pytest's last line counts files that could not be written as: one, or several.
NOT_WRITTEN = ("file not written", "files not written")


def fail_writes(session: pytest.Session, count: int) -> None:
    """Exit 1 with ``count`` more files counted as not written on pytest's last line
    (``2 passed, 3 files not written``): one count however many features failed to
    write (the run file, --energy-json, the exports, the report)."""
    if count <= 0:
        return
    fail_session(session, "a file was not written; see above", NOT_WRITTEN[0])
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    entries = [e for key in NOT_WRITTEN for e in reporter.stats.pop(key, [])]
    entries += [SessionOutcome("a file was not written")] * (count - 1)
    reporter.stats[NOT_WRITTEN[len(entries) > 1]] = entries


@dataclass(frozen=True)
class SessionOutcome:
    """An entry of the terminal's outcome counts that is no test's report: plugins that
    read every entry (hypothesis's) find a plain object with a ``nodeid``."""

    why: str
    nodeid: str = ""
    count_towards_summary: bool = True
