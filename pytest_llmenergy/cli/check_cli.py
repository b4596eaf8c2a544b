"""``llmenergy check``: which meters work on this machine, how well, and what a gate can
see here, in about a minute (``check.py`` measures; this file shows it)."""

from __future__ import annotations

import argparse
import json
import math
import sys

from .. import values
from ..check import Report, run_check
from ..commandline import Command, Outcome
from ..controller.rule import DEFAULT_MAX_BACKGROUND
from ..errors import ConfigError
from ..tables import Table, fmt_number, render
from .cli_args import checked, table_width

# docs/exit-codes.md: the measurement could not finish on this machine (as ``llmenergy ab``
# on a machine too busy to pair), not bad input (2)
EXIT_BUSY = 3


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sessions",
        type=int,
        default=2,
        metavar="N",
        help="short sessions of the small case (tiny Llama, 32 + 32 tokens) to read the "
        "noise between sessions from; 0 checks the meters only (default: 2)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="check this backend only, repeatable (default: every built-in one)",
    )
    parser.add_argument(
        "--max-background",
        type=checked(values.background_share),
        default=DEFAULT_MAX_BACKGROUND,
        metavar="SHARE",
        help="a session's trial during which other processes used more than SHARE of the "
        "CPUs is disturbed and repeated, as --energy-max-background; off reads the noise "
        "with that work running, on a runner you share (default: "
        f"{DEFAULT_MAX_BACKGROUND * 100:g} %%)",
    )


def _run(args: argparse.Namespace, storage: object) -> Outcome:
    if args.sessions < 0 or args.sessions == 1:
        raise ConfigError(
            f"--sessions {args.sessions}: give 0 (meters only) or 2 or more (a noise "
            "needs two sessions)"
        )
    say = lambda line: print(f"llmenergy check: {line}", file=sys.stderr, flush=True)  # noqa: E731
    report = run_check(
        sessions=args.sessions,
        backends=args.backend,
        log=say,
        max_background=args.max_background,
    )
    exit_code = EXIT_BUSY if report.busy else None
    if args.format == "json":
        out = json.dumps(report.record(), indent=2, allow_nan=False, default=_nan)
        return Outcome(out, notes=report.busy, exit_code=exit_code)
    tables = [meters_table(report)]
    if report.noise is not None:
        tables.append(sessions_table(report))
    text = render(tables, args.format, width=table_width(args.format))
    return Outcome(text, notes=[*summary(report), *report.busy], exit_code=exit_code)


def _nan(value: object) -> object:
    return None


def meters_table(report: Report) -> Table:
    rows, cells = [], []
    for m in report.meters:
        rows.append((m.backend, m.available, m.why, m.resolution_s, m.idle_w))
        cells.append(
            (
                m.backend + (" (auto)" if m.backend in report.auto.split("+") else ""),
                "yes" if m.available else "no",
                m.why,
                "—" if m.resolution_s is None else f"{fmt_number(m.resolution_s * 1e3)} ms",
                "—" if m.idle_w is None else f"{'~' if m.estimated else ''}{fmt_number(m.idle_w)}",
            )
        )
    return Table(
        title="meters on this machine",
        keys=("backend", "available", "reads_or_why_not", "resolution_s", "idle_w"),
        headers=("backend", "opens", "what it reads, or why not", "resolution", "idle W"),
        rows=tuple(rows),
        cells=tuple(cells),
        notes=(
            f"auto picks: {report.auto}; idle W over a quiet second (~: estimated, it "
            "follows CPU time, not power)",
        ),
        priorities=(0, 0, 0, 1, 1),
        # the reasons are prose: folded before the figures beside them are left out
        wraps=(("reads_or_why_not", 30, 1),),
    )


def sessions_table(report: Report) -> Table:
    noise = report.noise
    assert noise is not None
    rows, cells = [], []
    for i, (j, ci, wall) in enumerate(zip(noise.j_per_token, noise.within, noise.seconds), 1):
        rows.append((i, j, None if math.isnan(ci) else ci, wall))
        cells.append(
            (
                str(i),
                fmt_number(j),
                "—" if math.isnan(ci) else f"±{ci:.1%}",
                f"{wall:.0f} s",
            )
        )
    return Table(
        title=f"two short sessions of the small case ({noise.backend})",
        keys=("session", "j_per_token", "ci_relative", "wall_s"),
        headers=("session", "J/token", "CI", "wall"),
        rows=tuple(rows),
        cells=tuple(cells),
    )


def summary(report: Report) -> list[str]:
    lines = list(report.notes)
    noise = report.noise
    if noise is not None:
        lines.append(
            f"the sessions' energy per token differed by {noise.between:.1%}, while each "
            f"session's own interval was ±{max(noise.within):.1%} at most: trust a "
            "difference between two sessions only beyond the former"
        )
        lines.append(
            f"a one-session gate against one baseline detects >= {noise.detectable():.0%} "
            "here (80 % power; from this difference or the assumed 15 % session noise, "
            "whichever is larger); llmenergy ab, pairing trials side by side, sees far "
            "less (docs/guides/paired.md; llmenergy gatecheck --paired measures it)"
        )
    return lines


COMMANDS = (
    Command(
        "check",
        "on a new machine, in about a minute: which meters work here and why not the "
        "others, their resolution and idle power, the noise between two short sessions, "
        "and the smallest regression a gate can see here",
        _arguments,
        _run,
        common=True,
    ),
)
