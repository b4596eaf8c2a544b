"""A ``llmenergy`` command as a record: its name, help, arguments and what it runs.

Each package contributes the commands it owns (``frontier.frontier_cli.COMMANDS``,
``predict.predict_cli.COMMANDS``, ...); ``cli/__init__.py`` gathers them into one table and builds
the parser and the dispatch from it, so a new command is one record in its own package
and one name in that table, never a branch in a dispatcher.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """What a command printed and decided: ``out`` goes to stdout (data, for pipes),
    ``notes`` to stderr (what was written where), ``verdicts`` are a gate's lines, and
    ``failed`` makes the exit code 1."""

    out: str
    notes: Sequence[str] = ()
    verdicts: Sequence[str] = ()
    failed: bool = False
    exit_code: int | None = None  # another exit code than 0/1 (``llmenergy ab``: 3, 130)


@dataclass(frozen=True)
class Command:
    """One ``llmenergy`` command.  ``run`` gets the parsed arguments and the storage
    folder (a ``storage.store.Storage``, passed as Any so that this kind stays below the
    packages that contribute commands); ``common`` adds ``--format`` and ``--storage``
    after the command.

    ``like_options`` are this command's flags that mean what a pytest option means, as
    (flag, pytest option) pairs, e.g. ``("--lambda", "--energy-route-lambda")``: the
    front end builds them from that option's row (its parser, default, metavar and
    help; the value lands under the row's field name), so the two never drift apart and
    a package below the plugin can declare them without importing it.

    ``writes`` names the arguments that are paths this command writes, as (dest, kind)
    pairs with a kind from ``storage.store`` (NEW_FILE, DERIVED_FILE, FOLDER): the front
    end checks each given one before the command runs, so a path that cannot be written,
    or would replace a saved run, is one line before any work is done."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Any], Outcome]
    common: bool = False
    like_options: tuple[tuple[str, str], ...] = ()
    writes: tuple[tuple[str, str], ...] = ()


def check_commands(commands: Sequence[Command]) -> dict[str, Command]:
    """The commands by name; a name given twice is a programming error, found at import."""
    by_name: dict[str, Command] = {}
    for command in commands:
        if command.name in by_name:
            raise ValueError(f"llmenergy command {command.name!r} is declared twice")
        by_name[command.name] = command
    return by_name


# Flags that mean the routing section's pytest options, for every command that routes.
ROUTING_LIKE_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--workload", "--energy-route-workload"),
    ("--by", "--energy-route-by"),
    ("--lambda", "--energy-route-lambda"),
)
