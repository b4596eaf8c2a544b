"""What the command modules share: argument types that fail in one line, the runs
named on the command line, and the width of a table on this terminal."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError, one_line
from ..storage.runfile import Run
from ..storage.store import Storage
from ..tables import line_width

DATA_FORMATS = ("csv", "json")


class TwoOrMore(argparse.Action):
    """``nargs="+"`` wanting two, so that one run is a usage error before any file is read."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if len(values) < 2:
            command = parser.prog.split()[-1]
            why = {"compare": ": the baseline first, then the others"}
            raise argparse.ArgumentError(
                self, f"{command} needs at least two runs{why.get(command, '')}"
            )
        setattr(namespace, self.dest, list(values))


def checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn our ConfigError into argparse's one-line usage error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (ConfigError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"bad value {text!r}") from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def gate_argument(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    """A repeatable gate flag (``--fail-on``, ``--gate``): parsed as every gate is, one
    line on a bad one (an unknown figure: the figures after it, see ``gates``); ``what``
    says what a failed gate does."""
    from ..compare import GATE_EXAMPLES

    parser.add_argument(
        flag,
        action="append",
        default=[],
        type=checked(gates),
        metavar="EXPR",
        help=f"{what}: {GATE_EXAMPLES}".replace("%", "%%"),
    )


def gates(text: str) -> tuple[Any, ...]:
    """``compare.parse_gates``, where an unknown figure names the figures a gate takes
    nearest first, the few nearest in one line: 43 names on a line of a thousand
    characters is no list anyone reads, and the one meant is among the first."""
    from ..compare import parse_gates
    from ..figures import ALIASES, FIGURES, REMOVED, per_trial_keys
    from ..values import words

    try:
        return parse_gates(text)
    except ConfigError as exc:
        for word in words(text, "gate", ""):
            name = word.partition(":")[0].strip().lower()
            if name and name not in FIGURES and name not in ALIASES and name not in REMOVED:
                raise ConfigError(_unknown_figure(word, name, per_trial_keys())) from None
        raise exc from None


# How many of the nearest figures an unknown one's message names (``llmenergy metrics``
# lists them all): the message stays one line a terminal shows whole.
NEAREST_SHOWN = 6


def _unknown_figure(word: str, name: str, choices: Sequence[str]) -> str:
    nearest = sorted(choices, key=lambda c: -difflib.SequenceMatcher(None, name, c).ratio())
    return (
        f"bad '{one_line(word, 80)}': unknown figure '{one_line(name, 80)}'; the nearest a "
        f"gate takes: {', '.join(nearest[:NEAREST_SHOWN])} (llmenergy metrics lists all "
        f"{len(choices)}: those marked gated)"
    )


def table_width(fmt: str) -> int | None:
    """Fit terminal tables to the terminal; text piped into a file keeps every column
    unless COLUMNS asks otherwise."""
    return line_width(sys.stdout) if fmt == "table" else None


def counted(runs: Sequence[Run]) -> str:
    """``2 runs, 4 cases``: the runs, and the distinct cases among them (a case measured
    in both runs is one case)."""
    cases = len({c.nodeid for run in runs for c in run.cases})
    return f"{_plural(len(runs), 'run')}, {_plural(cases, 'case')}"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# -- the command table --------------------------------------------------------------------
def runs_of(args: argparse.Namespace, storage: Storage) -> list[Run]:
    return [storage.load(spec) for spec in args.runs]
