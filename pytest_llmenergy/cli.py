"""``llmenergy``: list, show and compare saved runs; gate CI on them.

Exit codes: 0 fine, 1 an energy gate failed, 2 bad input (one line on stderr, no
traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__, report
from .compare import (
    DEFAULT_METRICS,
    GATE_EXAMPLES,
    METRICS,
    Lineup,
    compare_cases,
    comparison_table,
    metric,
    parse_gates,
    side_by_side,
    verdict_line,
)
from .errors import ConfigError, LLMEnergyError
from .report import Table, render
from .storage.runfile import Run, RunFileError
from .storage.store import DEFAULT_STORAGE, Storage

EXIT_OK, EXIT_GATE, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmenergy",
        description="Saved pytest-llmenergy runs: list them, show one, compare several.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        metavar="DIR",
        help=f"storage folder of saved runs (default: {DEFAULT_STORAGE})",
    )
    formats = argparse.ArgumentParser(add_help=False)
    formats.add_argument("--format", choices=report.FORMATS, default="table")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser("list", parents=[formats], help="the saved runs, per hardware")
    ls.add_argument("--hardware", metavar="KEY", help="only this hardware folder")

    show = sub.add_parser("show", parents=[formats], help="one run's energy tables")
    show.add_argument("run", metavar="RUN", help="number, name, hardware/number, or a path")
    show.add_argument("--columns", type=_checked(report.parse_columns), metavar="LIST")
    show.add_argument(
        "--group-by", type=_checked(report.parse_group_by), default=report.DEFAULT_GROUP_BY
    )
    show.add_argument("--sort", type=_checked(report.parse_sort), default=report.DEFAULT_SORT)

    cmp_ = sub.add_parser(
        "compare",
        parents=[formats],
        help="runs side by side (across hardware too), with ratios to the first",
    )
    cmp_.add_argument(
        "runs", nargs="+", metavar="RUN", help="two or more runs; the first is the baseline"
    )
    cmp_.add_argument(
        "--metric",
        action="append",
        type=_checked(lambda text: metric(text).key),
        help=f"metric to put side by side, repeatable (default: {DEFAULT_METRICS[0]}); "
        f"one of {', '.join(METRICS)}",
    )
    cmp_.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="EXPR",
        help=f"exit 1 when a run regresses against the first beyond a gate, significantly: "
        f"{GATE_EXAMPLES}".replace("%", "%%"),
    )
    cmp_.add_argument(
        "--confidence",
        type=_checked(_confidence),
        default=None,
        help="confidence of the significance test (default: the baseline run's, else 0.95)",
    )
    return parser


def _confidence(text: str) -> float:
    value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    if not 0 < value < 1:
        raise ValueError(text)
    return value


def _checked(parse):  # type: ignore[no-untyped-def]
    """Turn our ConfigError into argparse's one-line usage error."""

    def convert(text: str):  # type: ignore[no-untyped-def]
        try:
            return parse(text)
        except (ConfigError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"bad value {text!r}") from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


# -- commands ---------------------------------------------------------------------------
def _list(storage: Storage, hardware: str | None, fmt: str) -> str:
    keys = ("run", "name", "created", "status", "commit", "cases", "backend")
    rows: list[tuple[object, ...]] = []
    for stored in storage.runs(hardware):
        try:
            run = stored.load()
        except RunFileError as exc:
            rows.append(
                (stored.ref, stored.name, None, f"unreadable: {exc.problem}", None, None, None)
            )
            continue
        commit = str(run.commit.get("id", ""))[:12] + ("+" if run.commit.get("dirty") else "")
        rows.append(
            (
                stored.ref,
                run.name,
                run.created,
                run.status,
                commit or None,
                len(run.cases),
                run.backend,
            )
        )
    if not rows:
        where = storage.root / hardware if hardware else storage.root
        return f"no saved runs in {where}"
    cells = tuple(tuple("—" if v is None else str(v) for v in row) for row in rows)
    table = Table("saved runs", keys, keys, tuple(rows), cells, ())
    return render([table], fmt)


def _run_header(run: Run) -> list[str]:
    machine = run.machine
    cpu = machine.get("cpu") or {}
    gpus = machine.get("gpus") or []
    gpu_text = (
        ", ".join(
            f"{g.get('name')} ({g.get('power_limit_w')} W limit, driver {g.get('driver')})"
            for g in gpus
        )
        or "none"
    )
    commit = run.commit
    commit_text = (
        f"{commit.get('id', '')[:12]}{' (uncommitted changes)' if commit.get('dirty') else ''}"
        f" on {commit.get('branch')}"
        if commit.get("id")
        else "unknown"
    )
    lines = [
        f"run {run.label}: {run.status}, {len(run.cases)} case(s), started {run.created}",
        f"hardware {run.hardware}: CPU {cpu.get('model')} ({cpu.get('logical_cores')} "
        f"logical cores), GPUs {gpu_text}",
        f"commit {commit_text}",
        f"meter {run.meter.get('description', run.backend)}",
    ]
    if run.meter.get("idle_power_w"):
        idle = ", ".join(f"{d} {w:.2f} W" for d, w in run.meter["idle_power_w"].items())
        lines.append(f"idle power {idle}")
    if run.status != "complete":
        lines.append(
            f"note: this run did not finish ({run.status}); it holds the cases it completed"
        )
    return lines


def _show(run: Run, args: argparse.Namespace) -> str:
    tables = report.case_tables(
        run.cases, columns=args.columns, group_by=args.group_by, sort=args.sort
    )
    body = render(tables, args.format)
    if args.format in ("csv", "json"):
        return body
    return "\n".join([*_run_header(run), "", body])


def _compare(runs: list[Run], args: argparse.Namespace) -> tuple[str, bool]:
    confidence = args.confidence
    if confidence is None:
        confidence = float(runs[0].options.get("controller", {}).get("confidence", 0.95))
    gates = parse_gates(args.fail_on) if args.fail_on else ()
    lineup = Lineup(
        labels=_labels(runs),
        cases=tuple(run.cases for run in runs),
    )
    tables: list[Table] = [
        side_by_side(lineup, key, confidence=confidence)
        for key in (args.metric or DEFAULT_METRICS[:1])
    ]
    verdicts: list[str] = []
    failed = False
    for label, run in zip(lineup.labels[1:], runs[1:]):
        comparison = compare_cases(
            runs[0].cases,
            run.cases,
            gates=gates,
            confidence=confidence,
            baseline_label=lineup.labels[0],
            current_label=label,
        )
        if gates:
            tables.append(comparison_table(comparison))
            verdicts.append(f"{label}: {verdict_line(comparison)}")
            failed = failed or comparison.failed
    text = render(tables, args.format)
    if verdicts and args.format not in ("csv", "json"):
        text += "\n" + "\n".join(verdicts)
    return text, failed


def _labels(runs: Sequence[Run]) -> tuple[str, ...]:
    """Run labels, made distinct: runs from two machines may share ``0001_baseline``."""
    labels = [run.label for run in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{run.hardware}/{run.label}" for run in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{i + 1}:{label}" for i, label in enumerate(labels)]
    return tuple(labels)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    storage = Storage(args.storage)
    try:
        if args.command == "list":
            out, failed = _list(storage, args.hardware, args.format), False
        elif args.command == "show":
            out, failed = _show(storage.load(args.run), args), False
        else:
            if len(args.runs) < 2:
                parser.error("compare needs at least two runs: the baseline first")
            runs = [storage.load(spec) for spec in args.runs]
            out, failed = _compare(runs, args)
    except (RunFileError, ConfigError, LLMEnergyError) as exc:
        print(f"llmenergy: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(out)
    return EXIT_GATE if failed else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
