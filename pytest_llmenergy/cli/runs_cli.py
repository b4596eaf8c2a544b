"""``llmenergy list``, ``show``, ``merge``, ``export`` and ``metrics``: one saved run (or
several pooled) looked at, written out for other tools, and the figures explained."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import case_tables
from ..commandline import Command, Outcome
from ..errors import ConfigError
from ..export import EXPORT_FORMATS, export_text
from ..figures import (
    describe,
)
from ..frontier.slo import saved_limits, slo_tables, sweeps
from ..storage.pool import join_shards, pool_runs, shard_of, unfinished
from ..storage.runfile import COMPLETE, Run, RunFileError, dumps
from ..storage.store import (
    DERIVED_FILE,
    NEW_FILE,
    STORAGE_HELP,
    AtomicFile,
    Storage,
    check_run_name,
)
from ..tables import FORMATS, Raw, Table, printable, render, wrap
from .cli_args import DATA_FORMATS, checked, counted, runs_of, table_width


def _list_arguments(ls: argparse.ArgumentParser) -> None:
    ls.add_argument("--hardware", metavar="KEY", help="only this hardware folder")


def _show_arguments(show: argparse.ArgumentParser) -> None:
    show.add_argument("run", metavar="RUN", help="number, name, hardware/number, or a path")


def _merge_arguments(merge: argparse.ArgumentParser) -> None:
    merge.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="two or more runs to pool, or the parts of a split (one alone, with --partial, "
        "when the others are missing)",
    )
    merge.add_argument(
        "--out", required=True, metavar="FILE", help="the pooled run file (must not exist)"
    )
    merge.add_argument(
        "--name", default="pooled", type=checked(check_run_name), help="the pooled run's name"
    )
    merge.add_argument(
        "--partial",
        action="store_true",
        help="take what there is: shards (--llm-shard) join the parts there are when some "
        "are missing or ended early, runs pool as they are where some did not finish "
        "(killed, interrupted); the result is marked interrupted and the notes name them",
    )
    merge.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _export_arguments(export: argparse.ArgumentParser) -> None:
    export.add_argument("run", metavar="RUN", help="number, name, hardware/number, or a path")
    export.add_argument(  # a metavar: the choices in one word ran past an 80-column usage line
        "--format",
        choices=EXPORT_FORMATS,
        required=True,
        metavar="FORMAT",
        help=f"one of: {', '.join(EXPORT_FORMATS)}",
    )
    export.add_argument(
        "--out", metavar="FILE", help="write there (replacing an earlier export), not to stdout"
    )
    export.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _metrics_arguments(metrics: argparse.ArgumentParser) -> None:
    metrics.add_argument("--format", choices=FORMATS, default="table")


# -- reading what a run file does not check ------------------------------------------------
# machine, commit, meter and options are free-form objects in a run file: a hand-edited or
# foreign file may hold anything there, and showing it must not crash.
def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _commit_id(commit: Mapping[str, Any]) -> str:
    """12 characters of the commit, ``+`` when the tree had changes; empty when unknown."""
    ident = commit.get("id")
    if not isinstance(ident, str) or not ident:
        return ""
    return ident[:12] + ("+" if commit.get("dirty") is True else "")


# -- commands ---------------------------------------------------------------------------
def _list(storage: Storage, hardware: str | None, fmt: str) -> str:
    keys = ("run", "name", "created", "status", "commit", "cases", "backend")
    rows: list[tuple[Raw, ...]] = []
    problems: dict[int, str] = {}  # row: why its file is unreadable
    for stored in storage.runs(hardware):
        try:
            run = stored.load()
        except RunFileError as exc:
            problems[len(rows)] = f"{stored.ref}: {exc.problem}"
            rows.append(
                (stored.ref, stored.name, None, f"unreadable: {exc.problem}", None, None, None)
            )
            continue
        rows.append(
            (
                stored.ref,
                run.name,
                run.created,
                run.status,
                _commit_id(run.commit) or None,
                len(run.cases),
                run.backend or None,
            )
        )
    if not rows and fmt not in DATA_FORMATS:
        where = storage.root / hardware if hardware else storage.root
        known = sorted({r.hardware for r in storage.runs()}) if hardware else []
        also = f" (hardware with runs: {', '.join(known)})" if known else ""
        return f"no saved runs in {where}{also}"
    # On a terminal the status says "unreadable" and a note under the table says why: a
    # long reason in the cell would push the status column out of a narrow table.
    status = keys.index("status")
    cells = tuple(
        tuple(
            "—" if v is None else "unreadable" if i in problems and k == status else str(v)
            for k, v in enumerate(row)
        )
        for i, row in enumerate(rows)
    )
    table = Table(
        "saved runs",
        keys,
        keys,
        tuple(rows),
        cells,
        notes=tuple(problems.values()),
        priorities=(0, 0, 2, 1, 2, 1, 3),
    )
    return render([table], fmt, width=table_width(fmt))


def _run_header(run: Run) -> list[str]:
    machine = _mapping(run.machine)
    cpu = _mapping(machine.get("cpu"))
    gpus = machine.get("gpus")
    gpu_text = ", ".join(_gpu_text(_mapping(g)) for g in (gpus if isinstance(gpus, list) else []))
    cores = cpu.get("logical_cores")
    cpu_text = f"{cpu.get('model') or 'unknown'}" + (
        f" ({cores} logical cores)" if isinstance(cores, int) else ""
    )
    commit = _mapping(run.commit)
    ident = commit.get("id")
    commit_text = "unknown"
    if isinstance(ident, str) and ident:
        commit_text = ident[:12]
        if commit.get("dirty") is True:
            commit_text += " (uncommitted changes)"
        if commit.get("branch"):
            commit_text += f" on {commit['branch']}"
    meter = _mapping(run.meter)
    lines = [
        f"run {run.label}: {run.status}, {len(run.cases)} case(s), started {run.created}",
        f"hardware {run.hardware}: CPU {cpu_text}, GPUs {gpu_text or 'none'}",
        f"commit {commit_text}",
        f"meter {meter.get('description') or run.backend or 'unknown'}",
    ]
    idle = {str(d): _number(w) for d, w in _mapping(meter.get("idle_power_w")).items()}
    if any(w is not None for w in idle.values()):
        shown = ", ".join(f"{d} {w:.2f} W" for d, w in idle.items() if w is not None)
        lines.append(f"idle power {shown}")
    if run.status != COMPLETE:
        lines.append(
            f"note: this run did not finish ({run.status}); it holds the cases it completed"
        )
    return lines


def _gpu_text(gpu: Mapping[str, Any]) -> str:
    details = [
        f"{gpu['power_limit_w']} W limit" if _number(gpu.get("power_limit_w")) else "",
        f"driver {gpu['driver']}" if gpu.get("driver") else "",
    ]
    extra = ", ".join(d for d in details if d)
    return f"{gpu.get('name') or 'unknown GPU'}" + (f" ({extra})" if extra else "")


def _show(run: Run, args: argparse.Namespace) -> str:
    tables = case_tables.case_tables(
        run.cases, columns=args.columns, group_by=args.group_by, sort=args.sort
    )
    body = render(
        tables, args.format, width=table_width(args.format), narrow_hint="choose with --columns"
    )
    if args.format in DATA_FORMATS:
        return body
    header = _run_header(run)
    if args.format == "markdown":  # one line each, not one paragraph
        header = [f"- {printable(line)}" for line in header]
    else:
        header = [part for line in header for part in wrap(line, table_width(args.format))]
    return "\n".join([*header, "", body or "no cases in this run", *_best_configuration(run, args)])


def _best_configuration(run: Run, args: argparse.Namespace) -> list[str]:
    """The front over each sweep's configurations and the choice under the run's
    ``--llm-slo``, computed from the saved cases as the session showed them."""
    limits, note = saved_limits(_mapping(run.options))
    found = sweeps(run.cases, limits)
    if not found:
        return []
    text = render(slo_tables(found), args.format, width=table_width(args.format))
    return ["", text, *([note] if note else [])]


# The option sections whose values change what is measured: the shards of one grid must
# agree on all of them (outputs, names and the order's seed may differ).
MEASURING_SECTIONS = ("measure", "meter", "controller", "llm", "gpu")


def _measuring_options() -> set[str]:
    from ..plugin.options import SECTIONS

    return {
        o.name
        for section in SECTIONS
        if section.name in MEASURING_SECTIONS
        for o in section.options
        if not o.writes
    }


def _merge(runs: list[Run], args: argparse.Namespace) -> Outcome:
    """Write the pooled (or, for shards, joined) run and say what it holds."""
    notes: list[str] = []
    if len(runs) == 1 and shard_of(runs[0]) is None:
        raise ConfigError("merge needs at least two runs to pool")
    if any(shard_of(run) is not None for run in runs):
        merged, notes = join_shards(
            runs, measuring=_measuring_options(), name=args.name, partial=args.partial
        )
        how = f"the shards of one grid joined into one run, {len(merged.cases)} cases"
    else:
        notes = unfinished(runs, args.partial)  # refused without --partial
        merged = pool_runs(runs, name=args.name)
        how = "pooled into one run"
    target = Path(args.out)  # checked by the front end (the command's ``writes``)
    try:
        AtomicFile(target).write(dumps(merged))
    except FileExistsError:
        raise ConfigError(f"{target} already exists; runs are never overwritten") from None
    trials = sum(len(c.trials) for c in merged.cases)
    wrote = f"wrote {target} ({counted(runs)}, {trials} trials, {how})"
    return Outcome(wrote, notes=notes)


def _export(run: Run, args: argparse.Namespace) -> str:
    """The export on stdout (data, for pipes), or written to --out and said so."""
    text = export_text(run.cases, args.format)
    if not args.out:
        return text
    target = Path(args.out)  # checked by the front end: never a saved run
    AtomicFile(target, derived=True).write(text)  # an export is made again at will
    return f"wrote {target} ({len(run.cases)} case(s) of {run.label} as {args.format})"


def _metrics(fmt: str) -> str:
    records = describe()
    keys = tuple(records[0])
    rows = tuple(tuple(r[k] for k in keys) for r in records)
    width = table_width(fmt)

    def cell(v: object) -> str:
        return "yes" if v is True else "" if v is False else str(v)

    cells = tuple(tuple(cell(v) for v in row) for row in rows)
    headers = (
        "key",
        "label",
        "unit",
        "meaning",
        "better",
        "per trial",
        "gated",
        "phases",
        "default",
        "old names",
    )
    table = Table(
        "figures: columns (--columns), gates and compare (gated), CI targets (tested)",
        keys,
        headers,
        rows,
        cells,
        notes=(
            "gated: tested: a value per trial, comparable between runs session by session "
            "(or pair by pair), so usable in gates (--fail-on, --energy-compare-fail) and CI "
            "targets (--energy-ci-target); exact: counted once per case "
            "(--energy-count-work), the same in every session, so a gate compares it "
            "exactly, and it is no CI target; phases: needs the prefill | decode split",
        ),
        hidden=("per_trial",),
        priorities=(0, 1, 1, 0, 2, 2, 2, 3, 3, 4),
        # a sentence per figure: folded on a terminal, so that it fits beside the key
        wraps=(("meaning", 30, 0),),
    )
    return render([table], fmt, width=width)


COMMANDS: tuple[Command, ...] = (
    Command(
        "list",
        "the saved runs, per hardware",
        _list_arguments,
        lambda args, storage: Outcome(_list(storage, args.hardware, args.format)),
        common=True,
    ),
    Command(
        "show",
        "one run's energy tables",
        _show_arguments,
        lambda args, storage: Outcome(_show(storage.load(args.run), args)),
        common=True,
        like_options=(
            ("--columns", "--energy-columns"),
            ("--group-by", "--energy-group-by"),
            ("--sort", "--energy-sort"),
        ),
    ),
    Command(
        "merge",
        "pool runs of the same cases on the same hardware into one run (e.g. a pull "
        "request's base measured twice, alternating with its head), to compare or gate; "
        "or join the shards of one grid (--llm-shard=I/N) into one run",
        _merge_arguments,
        lambda args, storage: _merge(runs_of(args, storage), args),
        writes=(("out", NEW_FILE),),
    ),
    Command(
        "export",
        "one run's figures for other tools: github-action-benchmark's JSON "
        "(customSmallerIsBetter) or Bencher's BMF JSON for CI dashboards, or CSV",
        _export_arguments,
        lambda args, storage: Outcome(_export(storage.load(args.run), args)),
        writes=(("out", DERIVED_FILE),),
    ),
    Command(
        "metrics",
        "every figure: its key (for --columns, gates, CI targets), unit and meaning",
        _metrics_arguments,
        lambda args, storage: Outcome(_metrics(args.format)),
    ),
)
