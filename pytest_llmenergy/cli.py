"""``llmenergy``: list, show and compare saved runs; gate CI on them; route queries
between systems and plot what that saves.

Exit codes: 0 fine, 1 an energy gate failed, 2 bad input (one line on stderr, no
traceback).  ``--format csv`` and ``json`` print data only, so they can be piped into
another program; what people need besides (a gate's verdict) goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import __version__, report, values
from .commandline import ROUTING_LIKE_OPTIONS, Command, Outcome, check_commands
from .compare import (
    GATE_EXAMPLES,
    Comparison,
    Gate,
    Lineup,
    compare_cases,
    comparison_table,
    parse_gates,
    side_by_side,
    unlike_meters,
    verdict_lines,
)
from .errors import ConfigError, LLMEnergyError
from .export import EXPORT_FORMATS, export_text
from .figures import (
    DEFAULT_GATE_METRIC,
    DeprecatedName,
    describe,
    figure,
    per_trial_keys,
)
from .frontier import at_best_settings, frontier_cli
from .meters.reference import speed_drift
from .plotting import FORMATS as PLOT_FORMATS
from .plugin.options import plugin_option
from .predict.predict_cli import COMMANDS as PREDICT_COMMANDS
from .routing.decide import DEFAULT_LAMBDA_STEPS, Routed, RouteSettings, route
from .routing.optimize import BOUNDARY_CHOICES, CAPACITY_EXAMPLES, TOKENS, parse_capacity
from .routing.policy import write_policies
from .routing.profile import Profile, profiles_from_run, read_profile_csv
from .routing.route_tables import ROUTE_FORMATS, render_routed
from .routing.workload import alpaca
from .sessions import DEFAULT_SESSION_NOISE
from .storage.pool import pool_runs
from .storage.recorder import check_json_target
from .storage.research import COMMANDS as IMPORT_COMMANDS
from .storage.runfile import COMPLETE, Run, RunFileError, dumps
from .storage.store import DEFAULT_STORAGE, STORAGE_HELP, AtomicFile, Storage, check_run_name
from .tables import FORMATS, Raw, Table, render, terminal_width, wrap

EXIT_OK, EXIT_GATE, EXIT_USAGE = 0, 1, 2
DEFAULT_CONFIDENCE = 0.95
_DATA_FORMATS = ("csv", "json")
# Keys of the side-by-side table (and csv's first column) that a run label must not shadow.
_RESERVED_LABELS = frozenset({"group", "case", "nodeid", "tokens_in", "tokens_out"})


def _parser() -> argparse.ArgumentParser:
    """The parser, built from the command table: one subparser per record."""
    parser = argparse.ArgumentParser(
        prog="llmenergy",
        description="Saved pytest-llmenergy runs: list them, show one, compare several.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--storage", default=DEFAULT_STORAGE, metavar="DIR", help=STORAGE_HELP)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--format", choices=FORMATS, default="table")
    # Also after the command (``llmenergy list --storage DIR``); SUPPRESS keeps the global
    # value when it is not given here.
    common.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        parents = [common] if command.common else []
        command_parser = sub.add_parser(command.name, parents=parents, help=command.help)
        command.arguments(command_parser)
        for flag, option_flag in command.like_options:
            like_plugin_option(command_parser, flag, option_flag)
    return parser


def like_plugin_option(parser: argparse.ArgumentParser, flag: str, option_flag: str) -> None:
    """A flag that means what a pytest option means, built from that option's row (its
    parser, default, metavar and help): ``--session-noise`` is ``--energy-session-noise``."""
    row = plugin_option(option_flag)
    parser.add_argument(
        flag,
        dest=row.field_name,
        type=_checked(row.parse),
        default=row.default,
        metavar=row.metavar,
        help=f"{row.full_help()}; the pytest option {row.flag}".replace("%", "%%"),
    )


def _list_arguments(ls: argparse.ArgumentParser) -> None:
    ls.add_argument("--hardware", metavar="KEY", help="only this hardware folder")


def _show_arguments(show: argparse.ArgumentParser) -> None:
    show.add_argument("run", metavar="RUN", help="number, name, hardware/number, or a path")


def _compare_arguments(cmp_: argparse.ArgumentParser) -> None:
    cmp_.add_argument(
        "runs",
        nargs="+",
        action=_TwoOrMore,
        metavar="RUN",
        help="two or more runs; the first is the baseline",
    )
    cmp_.add_argument(
        "--metric",
        action="append",
        type=_checked(lambda text: figure(text, per_trial=True).key),
        metavar="FIGURE",
        help=f"figure to put side by side, repeatable (default: {DEFAULT_GATE_METRIC}); "
        f"one of {', '.join(per_trial_keys())} (llmenergy metrics explains them)",
    )
    cmp_.add_argument(
        "--fail-on",
        action="append",
        default=[],
        type=_checked(parse_gates),
        metavar="EXPR",
        help=f"exit 1 when a run regresses against the first beyond a gate, significantly: "
        f"{GATE_EXAMPLES}".replace("%", "%%"),
    )
    cmp_.add_argument(
        "--strict",
        action="store_true",
        help="also exit 1 when a gate is inconclusive: a case looks worse but the machine "
        "was busy, or the runs' meters differ (energies not comparable)",
    )
    cmp_.add_argument(
        "--confidence",
        type=_checked(values.confidence),
        default=None,
        help="confidence of the significance test, 0.95 or 95%% "
        f"(default: the baseline run's, else {DEFAULT_CONFIDENCE})",
    )


def _report_arguments(rep: argparse.ArgumentParser) -> None:
    rep.add_argument(
        "runs", nargs="+", metavar="RUN", help="one or more runs; the first is the baseline"
    )
    rep.add_argument(
        "--out", required=True, metavar="FILE", help="the HTML file (an existing one is replaced)"
    )
    rep.add_argument(
        "--gate",
        action="append",
        default=[],
        type=_checked(parse_gates),
        metavar="EXPR",
        help=f"show each case's verdict under these gates: {GATE_EXAMPLES} (the report "
        "never fails; llmenergy compare --fail-on does)".replace("%", "%%"),
    )
    rep.add_argument(
        "--confidence",
        type=_checked(values.confidence),
        default=None,
        help="confidence of intervals and tests, 0.95 or 95%% "
        f"(default: the baseline run's, else {DEFAULT_CONFIDENCE})",
    )
    rep.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _scale_arguments(scale: argparse.ArgumentParser) -> None:
    scale.add_argument(
        "runs", nargs="+", action=_TwoOrMore, metavar="RUN", help="two or more runs, any order"
    )
    scale.add_argument(
        "--plot", metavar="DIR", help="also draw the figure into DIR (scale.png; needs plots)"
    )


def _merge_arguments(merge: argparse.ArgumentParser) -> None:
    merge.add_argument(
        "runs", nargs="+", action=_TwoOrMore, metavar="RUN", help="two or more runs to pool"
    )
    merge.add_argument(
        "--out", required=True, metavar="FILE", help="the pooled run file (must not exist)"
    )
    merge.add_argument(
        "--name", default="pooled", type=_checked(check_run_name), help="the pooled run's name"
    )
    merge.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _export_arguments(export: argparse.ArgumentParser) -> None:
    export.add_argument("run", metavar="RUN", help="number, name, hardware/number, or a path")
    export.add_argument("--format", choices=EXPORT_FORMATS, required=True)
    export.add_argument(
        "--out", metavar="FILE", help="write there (replacing an earlier export), not to stdout"
    )
    export.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _metrics_arguments(metrics: argparse.ArgumentParser) -> None:
    metrics.add_argument("--format", choices=FORMATS, default="table")


def _route_arguments(route: argparse.ArgumentParser) -> None:
    _routing_arguments(route)
    route.add_argument("--format", choices=ROUTE_FORMATS, default="table")
    route.add_argument(
        "--policy-out",
        metavar="FILE",
        help="write the policy as JSON for a router (one object, or a list for several "
        "models); an existing file is left alone",
    )


def _plot_arguments(plot: argparse.ArgumentParser) -> None:
    _routing_arguments(plot)
    plot.add_argument("--out", default="llmenergy-plots", metavar="DIR", help="folder")
    plot.add_argument(
        "--image-format",
        action="append",
        choices=PLOT_FORMATS,
        help="png or svg, repeatable (default: png)",
    )


def _gatecheck_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument("--out", required=True, metavar="DIR", help="folder for the sessions")
    check.add_argument(
        "--rounds", type=int, default=3, help="rounds of A, each size, A (default: 3)"
    )
    check.add_argument(
        "--inject",
        default="10%,25%,50%",
        metavar="LIST",
        help="injected regressions (--llm-inject-regression) (default: 10%%,25%%,50%%)",
    )
    check.add_argument(
        "--gate",
        default="j_per_token:5%",
        metavar="EXPR",
        help="the gate (default: j_per_token:5%%)",
    )
    check.add_argument("--confidence", type=_checked(values.confidence), default=0.95)
    check.add_argument(
        "--judge-only", action="store_true", help="judge the sessions already in --out"
    )
    check.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="divide CPU-measured figures by each session's machine speed, as comparisons "
        "do (default: on; --no-normalize judges without)",
    )
    check.add_argument("--format", choices=FORMATS, default="table")
    check.add_argument(
        "pytest_args",
        nargs="*",
        metavar="PYTEST_ARG",
        help="each session's pytest arguments, after -- (default: benchmarks/ "
        "--llm-grid=quick -p no:randomly)",
    )


def _routing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        action="append",
        required=True,
        metavar="FILE",
        help="measurements: a CSV of system,model,input_tokens,output_tokens,seconds,joules "
        "(one row per trial), or a saved run (number, name, hardware/number, or a path); "
        "repeatable",
    )
    parser.add_argument(
        "--system",
        action="append",
        default=[],
        metavar="NAME",
        help="route between these systems only, repeatable (default: every one profiled)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="route this model, repeatable (default: every model measured on every system; "
        "'all' pools each system's models)",
    )
    parser.add_argument(
        "--p-ref",
        type=_checked(values.watts),
        default=None,
        metavar="W",
        help="watts that price a second of runtime (default: the largest average power "
        "among the systems)",
    )
    parser.add_argument(
        "--capacity",
        action="append",
        default=[],
        type=_checked(parse_capacity),
        metavar="SYS=LIMIT",
        help=f"most a system may take: {CAPACITY_EXAMPLES}; repeatable".replace("%", "%%"),
    )
    parser.add_argument(
        "--boundaries",
        choices=BOUNDARY_CHOICES,
        default=TOKENS,
        help="thresholds at any token count (default), or at measured sizes only",
    )
    parser.add_argument(
        "--lambda-steps",
        type=_checked(_steps),
        default=DEFAULT_LAMBDA_STEPS,
        metavar="N",
        help=f"lambdas from 0 to 1 for the Pareto front (default {DEFAULT_LAMBDA_STEPS}; "
        "0 for none)",
    )
    parser.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _steps(text: str) -> int:
    value = values.integer(0, 1001)(text)
    if value == 1:
        raise ConfigError("expected 0 (no sweep) or 2 to 1001 steps, got '1'")
    return value


class _TwoOrMore(argparse.Action):
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
            why = {"compare": ": the baseline first, then the others", "merge": " to pool"}
            raise argparse.ArgumentError(
                self, f"{command} needs at least two runs{why.get(command, '')}"
            )
        setattr(namespace, self.dest, list(values))


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn our ConfigError into argparse's one-line usage error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (ConfigError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"bad value {text!r}") from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


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


def _run_confidence(run: Run) -> float:
    """The confidence the baseline was measured at, if its file says so sensibly."""
    value = run.confidence
    return value if value is not None else DEFAULT_CONFIDENCE


# -- commands ---------------------------------------------------------------------------
def _list(storage: Storage, hardware: str | None, fmt: str) -> str:
    keys = ("run", "name", "created", "status", "commit", "cases", "backend")
    rows: list[tuple[Raw, ...]] = []
    for stored in storage.runs(hardware):
        try:
            run = stored.load()
        except RunFileError as exc:
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
    if not rows and fmt not in _DATA_FORMATS:
        where = storage.root / hardware if hardware else storage.root
        known = sorted({r.hardware for r in storage.runs()}) if hardware else []
        also = f" (hardware with runs: {', '.join(known)})" if known else ""
        return f"no saved runs in {where}{also}"
    cells = tuple(tuple("—" if v is None else str(v) for v in row) for row in rows)
    table = Table(
        "saved runs", keys, keys, tuple(rows), cells, (), priorities=(0, 0, 2, 1, 2, 1, 3)
    )
    return render([table], fmt, width=_width(fmt))


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
    tables = report.case_tables(
        run.cases, columns=args.columns, group_by=args.group_by, sort=args.sort
    )
    body = render(
        tables, args.format, width=_width(args.format), narrow_hint="choose with --columns"
    )
    if args.format in _DATA_FORMATS:
        return body
    header = _run_header(run)
    if args.format == "markdown":  # one line each, not one paragraph
        header = [f"- {line}" for line in header]
    else:
        header = [part for line in header for part in wrap(line, _width(args.format))]
    return "\n".join([*header, "", body or "no cases in this run"])


def _compare(
    runs: list[Run], args: argparse.Namespace, storage: Storage
) -> tuple[str, list[str], bool]:
    """The tables, the gates' verdict lines, and whether a gate failed."""
    confidence = args.confidence if args.confidence is not None else _run_confidence(runs[0])
    gates: tuple[Gate, ...] = tuple(g for given in args.fail_on for g in given)
    lineup = Lineup(labels=_labels(runs), cases=tuple(run.cases for run in runs))
    keys = list(dict.fromkeys(args.metric or [DEFAULT_GATE_METRIC]))  # a repeat adds nothing
    tables: list[Table] = [side_by_side(lineup, key, confidence=confidence) for key in keys]
    verdicts: list[str] = []
    failed = False
    if gates:
        for comparison in _comparisons(
            runs,
            lineup.labels,
            gates,
            confidence,
            session_noise=args.session_noise,
            storage=storage,
        ):
            tables.append(comparison_table(comparison))
            label = comparison.current_label
            verdicts += [f"{label}: {line}" for line in verdict_lines(comparison)]
            failed = failed or comparison.failed or (args.strict and comparison.unsure)
    return render(tables, args.format, width=_width(args.format)), verdicts, failed


def _gatecheck(args: argparse.Namespace) -> tuple[str, list[str]]:
    from . import gatecheck

    gates = parse_gates(args.gate)
    shares = [values.fraction(x, "an injected regression") for x in values.items(args.inject)]
    if args.rounds < 1 or not shares or min(shares) <= 0:
        raise ConfigError(
            "gatecheck needs --rounds of 1 or more and regressions above 0 in --inject"
        )
    out = Path(args.out)
    if args.judge_only:
        sessions = gatecheck.read_sessions(out)
    else:
        if out.exists() and any(out.iterdir()):
            raise ConfigError(f"--out {out} is not empty; give a new folder (or --judge-only)")
        pytest_args = args.pytest_args or ["benchmarks/", "--llm-grid=quick", "-p", "no:randomly"]
        sessions = gatecheck.run_sessions_now(
            pytest_args,
            args.rounds,
            shares,
            out,
            log=lambda line: print(f"llmenergy: {line}", file=sys.stderr, flush=True),
        )
    noise = args.session_noise
    outcomes, times = gatecheck.judge(
        sessions, gates, confidence=args.confidence, session_noise=noise, normalize=args.normalize
    )
    real = gatecheck.realized(sessions, gates[0].metric)
    table = gatecheck.quality_table(outcomes, times, real)
    notes = [
        f"{len(sessions)} sessions in {out}; gate {gates[0]}; assumed session noise {noise:.0%}"
        + ("" if args.normalize else "; not normalized by the machine's speed")
    ]
    return render([table], args.format, width=_width(args.format)), notes


def _history(
    storage: Storage, runs: Sequence[Run], gates: Sequence[Gate], exclude: Run
) -> dict[str, Any]:
    """Noise learned from the storage's runs of the same code on the baseline's hardware,
    as the in-session gate learns it (the judged run left out)."""
    from .history import stored_noise

    try:
        noise, _ = stored_noise(
            storage, runs[0].hardware, [g.metric for g in gates], exclude=[exclude.path]
        )
    except (ConfigError, OSError):
        return {}
    return noise


def _comparisons(
    runs: Sequence[Run],
    labels: Sequence[str],
    gates: Sequence[Gate],
    confidence: float,
    *,
    session_noise: float = DEFAULT_SESSION_NOISE,
    storage: Storage | None = None,
) -> list[Comparison]:
    """Each later run against the first, gated (or, without gates, the default figures),
    with the noise the storage's runs of the same code teach (as the in-session gate)."""
    return [
        compare_cases(
            runs[0].cases,
            run.cases,
            gates=gates,
            confidence=confidence,
            baseline_label=labels[0],
            current_label=label,
            not_comparable=unlike_meters(
                runs[0].meter_identity, run.meter_identity, current_label=label
            ),
            drift=speed_drift(_speed(runs[0]), _speed(run), None),
            session_noise=session_noise,
            history=_history(storage, runs, gates, exclude=run) if storage and gates else None,
            # another machine's speed is part of what is compared, not noise to take out
            normalize=run.hardware == runs[0].hardware,
        )
        for label, run in zip(labels[1:], runs[1:])
    ]


def _report(runs: list[Run], args: argparse.Namespace, storage: Storage) -> tuple[str, list[str]]:
    """Write the HTML report; stdout gets its path (for scripts), stderr what it holds."""
    from .html import write_report

    labels = _labels(runs)
    confidence = args.confidence if args.confidence is not None else _run_confidence(runs[0])
    gates: tuple[Gate, ...] = tuple(g for given in args.gate for g in given)
    comparisons = (
        _comparisons(
            runs, labels, gates, confidence, session_noise=args.session_noise, storage=storage
        )
        if len(runs) > 1
        else []
    )
    target = write_report(args.out, runs, labels, comparisons)
    size_mb = target.stat().st_size / 1e6
    cases = sum(len(r.cases) for r in runs)
    notes = [f"wrote {target}: {len(runs)} run(s), {cases} case(s), {size_mb:.2f} MB"]
    notes += [
        f"{c.current_label}: {line}" for c in comparisons if gates for line in verdict_lines(c)
    ]
    return str(target), notes


def _speed(run: Run) -> float | None:
    """The reference workload's time at the run's start (runs since 0.2.0), if any."""
    value = run.machine.get("speed_reference_s")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _labels(runs: Sequence[Run]) -> tuple[str, ...]:
    """Run labels, made distinct: two machines may both have ``0001_baseline``, two
    ``--energy-json`` files may both be ``run``; and a label must not shadow a column key,
    or csv and json would lose that run's figures."""
    namings: tuple[Callable[[Run], str], ...] = (
        lambda r: r.label,
        lambda r: f"{r.hardware}/{r.label}",
        lambda r: str(r.path) if r.path is not None else f"{r.hardware}/{r.label}",
    )
    labels: list[str] = []
    for naming in namings:
        labels = [naming(run) for run in runs]
        if len(set(labels)) == len(labels):
            break
    else:  # the same run given twice
        labels = [f"{i + 1}:{label}" for i, label in enumerate(labels)]
    return tuple(f"run {label}" if label in _RESERVED_LABELS else label for label in labels)


def _merge(runs: list[Run], args: argparse.Namespace) -> tuple[str, list[str]]:
    """Write the pooled run; stdout gets its path (for scripts), stderr what was pooled."""
    pooled = pool_runs(runs, name=args.name)
    target = check_json_target(args.out)
    try:
        AtomicFile(target).write(dumps(pooled))
    except FileExistsError:
        raise ConfigError(f"{target} already exists; runs are never overwritten") from None
    trials = sum(len(c.trials) for c in pooled.cases)
    note = f"pooled {len(runs)} runs into {target}: {len(pooled.cases)} case(s), {trials} trials"
    return str(target), [note]


def _export(run: Run, args: argparse.Namespace) -> tuple[str, list[str]]:
    text = export_text(run.cases, args.format)
    if not args.out:
        return text, []
    target = check_json_target(args.out, derived=True)
    AtomicFile(target, derived=True).write(text)  # an export is made again at will
    return str(target), [f"exported {len(run.cases)} case(s) of {run.label} as {args.format}"]


def _metrics(fmt: str) -> str:
    records = describe()
    keys = tuple(records[0])
    rows = tuple(tuple(r[k] for k in keys) for r in records)
    meaning = keys.index("meaning")
    width = _width(fmt)

    def cell(i: int, v: object) -> str:
        text = "yes" if v is True else "" if v is False else str(v)
        # a sentence per figure: wrapped on a terminal, so that it fits beside the key
        return textwrap.fill(text, 44) if i == meaning and width is not None else text

    cells = tuple(tuple(cell(i, v) for i, v in enumerate(row)) for row in rows)
    headers = (
        "key",
        "label",
        "unit",
        "meaning",
        "better",
        "per trial",
        "phases",
        "default",
        "old names",
    )
    table = Table(
        "figures: columns (--columns), gates and compare (per trial), CI targets (per trial)",
        keys,
        headers,
        rows,
        cells,
        notes=(
            "per trial: comparable with Welch's t-test, so usable in gates (--fail-on, "
            "--energy-compare-fail) and CI targets (--energy-ci-target); phases: needs the "
            "prefill | decode split",
        ),
        priorities=(0, 1, 1, 0, 2, 2, 3, 3, 4),
    )
    return render([table], fmt, width=width)


def _width(fmt: str) -> int | None:
    """Fit terminal tables to the terminal; text piped into a file keeps every column
    unless COLUMNS asks otherwise."""
    if fmt != "table" or not (sys.stdout.isatty() or "COLUMNS" in os.environ):
        return None
    return terminal_width()


def _profiles(specs: Sequence[str], storage: Storage, lam: float = 1.0) -> list[Profile]:
    """A ``.csv`` is read as a profile CSV; anything else names a saved run (whose cases
    measured over GPU settings count at their best setting for ``lam``)."""
    profiles: list[Profile] = []
    for spec in specs:
        if spec.lower().endswith(".csv"):
            profiles += read_profile_csv(spec)
        else:
            profiles += profiles_from_run(storage.load(spec), pick=at_best_settings(lam))
    return profiles


def _route_settings(args: argparse.Namespace) -> RouteSettings:
    return RouteSettings(
        by=args.by,
        lam=args.lam,
        p_ref_w=args.p_ref,
        capacities=tuple(args.capacity),
        boundaries=args.boundaries,
        lambda_steps=args.lambda_steps,
        systems=tuple(args.system),
        models=tuple(args.model),
    )


def _routed(args: argparse.Namespace, storage: Storage) -> list[Routed]:
    profiles = _profiles(args.profile, storage, args.lam)
    return route(profiles, args.workload or alpaca(), _route_settings(args))


def _route(args: argparse.Namespace, storage: Storage) -> tuple[str, list[str]]:
    routed = _routed(args, storage)
    notes = []
    if args.policy_out:
        path = write_policies(args.policy_out, [r.decision.policy for r in routed])
        notes.append(f"policy written to {path}")
    return render_routed(routed, args.format, width=_width(args.format)), notes


def _plot(args: argparse.Namespace, storage: Storage) -> tuple[str, list[str]]:
    from .routing.fit import build_model
    from .routing.route_plots import write_profile_plots, write_routing_plots

    profiles = _profiles(args.profile, storage, args.lam)
    formats = tuple(dict.fromkeys(args.image_format or ["png"]))
    out = Path(args.out)
    systems = {p.system for p in profiles if not args.system or p.system in args.system}
    written: list[Path] = []
    if len(systems) < 2:  # one system: its curves, nothing to route
        chosen = [p for p in profiles if p.system in systems]
        written += write_profile_plots([build_model(p) for p in chosen], out, formats)
    else:
        routed = _routed(args, storage)
        for r in routed:
            written += write_profile_plots(r.router.models, out, formats)
            lams = [d.policy.lam for d in r.sweep] or [r.decision.policy.lam]
            written += write_routing_plots(
                r.router, out, formats, lams=lams, capacities=tuple(args.capacity)
            )
    return "\n".join(str(p) for p in written), []


def _scale(runs: list[Run], args: argparse.Namespace) -> tuple[str, list[str]]:
    from .scale import scale_rows, scale_table, write_scale_plot

    rows = scale_rows(runs, _labels(runs))
    notes: list[str] = []
    if args.plot:
        from .plotting import PlotError

        try:
            notes.append(f"wrote {write_scale_plot(rows, Path(args.plot))}")
        except PlotError as exc:
            raise ConfigError(str(exc)) from None
    return render([scale_table(rows)], args.format, width=_width(args.format)), notes


# -- the command table --------------------------------------------------------------------
def _runs(args: argparse.Namespace, storage: Storage) -> list[Run]:
    return [storage.load(spec) for spec in args.runs]


def _compare_outcome(args: argparse.Namespace, storage: Storage) -> Outcome:
    out, verdicts, failed = _compare(_runs(args, storage), args, storage)
    return Outcome(out, verdicts=verdicts, failed=failed)


_HERE: tuple[Command, ...] = (
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
        "compare",
        "runs side by side (across hardware too), with ratios to the first",
        _compare_arguments,
        _compare_outcome,
        common=True,
        like_options=(("--session-noise", "--energy-session-noise"),),
    ),
    Command(
        "report",
        "one self-contained HTML page of runs: headers, charts, every figure per case "
        "(sortable), and each later run compared with the first",
        _report_arguments,
        lambda args, storage: Outcome(*_report(_runs(args, storage), args, storage)),
        like_options=(("--session-noise", "--energy-session-noise"),),
    ),
    Command(
        "scale",
        "the same cases at different scales (1 process, N ranks, M nodes): J/token, "
        "speed-up, parallel efficiency, extra J/token",
        _scale_arguments,
        lambda args, storage: Outcome(*_scale(_runs(args, storage), args)),
        common=True,
    ),
    Command(
        "merge",
        "pool runs of the same cases on the same hardware into one run (e.g. a pull "
        "request's base measured twice, alternating with its head), to compare or gate",
        _merge_arguments,
        lambda args, storage: Outcome(*_merge(_runs(args, storage), args)),
    ),
    Command(
        "export",
        "one run's figures for other tools: github-action-benchmark's JSON "
        "(customSmallerIsBetter) for CI dashboards, or CSV",
        _export_arguments,
        lambda args, storage: Outcome(*_export(storage.load(args.run), args)),
    ),
    Command(
        "metrics",
        "every figure: its key (for --columns, gates, CI targets), unit and meaning",
        _metrics_arguments,
        lambda args, storage: Outcome(_metrics(args.format)),
    ),
    Command(
        "route",
        "which queries go to which system (thresholds), and what that saves",
        _route_arguments,
        lambda args, storage: Outcome(*_route(args, storage)),
        like_options=ROUTING_LIKE_OPTIONS,
    ),
    Command(
        "plot",
        "figures: energy per token and runtime per system; workload totals against the "
        "threshold; the energy-runtime Pareto front",
        _plot_arguments,
        lambda args, storage: Outcome(*_plot(args, storage)),
        like_options=ROUTING_LIKE_OPTIONS,
    ),
    Command(
        "gatecheck",
        "measure what this runner's energy gate can see: A/A sessions and sessions with a "
        "known regression injected, judged by each gating procedure",
        _gatecheck_arguments,
        lambda args, storage: Outcome(*_gatecheck(args)),
        like_options=(("--session-noise", "--energy-session-noise"),),
    ),
)
# Every command, in the order ``llmenergy --help`` lists them; each package contributes its own.
COMMANDS: dict[str, Command] = check_commands(
    (*_HERE, *frontier_cli.COMMANDS, *PREDICT_COMMANDS, *IMPORT_COMMANDS)
)


# -- output ------------------------------------------------------------------------------
def _emit(text: str) -> None:
    """Print ``text``; a closed pipe (``| head``) or a console that cannot show ``—`` or
    ``±`` must not end in a traceback."""
    out = sys.stdout
    if not text.endswith("\n"):
        text += "\n"
    try:
        try:
            out.write(text)
        except UnicodeEncodeError:
            encoding = out.encoding or "ascii"
            out.write(text.encode(encoding, "replace").decode(encoding))
        out.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at devnull so that is quiet too.
        with contextlib.suppress(OSError, ValueError):  # a stdout without a descriptor
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)


def _error(message: str) -> int:
    text = " ".join(message.splitlines())
    print(f"llmenergy: error: {text}", file=sys.stderr)
    return EXIT_USAGE


def _glue_descending_sort(argv: Sequence[str]) -> list[str]:
    """``--sort -joules`` reads to argparse as an unknown option ``-joules``; make it
    ``--sort=-joules``, which it takes as the value."""
    out: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            return [*out, arg, *rest]
        if arg == "--sort" and rest and rest[0].startswith("-") and not rest[0].startswith("--"):
            arg = f"--sort={rest.pop(0)}"
        out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecatedName)
        try:
            return _main(argv)
        finally:  # also when argparse exits on a usage error
            for warning in caught:
                if issubclass(warning.category, DeprecatedName):  # an old name: one line
                    print(f"llmenergy: warning: {warning.message}", file=sys.stderr)
                else:  # anything else goes where it would have gone
                    warnings.showwarning(
                        warning.message, warning.category, warning.filename, warning.lineno
                    )


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(_glue_descending_sort(sys.argv[1:] if argv is None else argv))
    storage = Storage(args.storage)
    try:
        outcome = COMMANDS[args.command].run(args, storage)
    except LLMEnergyError as exc:  # RunFileError, ConfigError: they name what is wrong
        return _error(str(exc))
    except OSError as exc:  # a storage folder that cannot be listed
        where = f"{exc.filename}: " if exc.filename else ""
        return _error(f"{where}{exc.strerror or exc}")
    out, verdicts = outcome.out, outcome.verdicts
    if verdicts and args.format not in _DATA_FORMATS:
        out = out.rstrip("\n") + "\n" + "\n".join(verdicts)
    _emit(out)
    for line in outcome.notes:  # what was written where: stderr, so stdout stays data
        print(f"llmenergy: {line}", file=sys.stderr)
    if verdicts and args.format in _DATA_FORMATS:
        for line in verdicts:  # stdout stays data; CI logs still say why it failed
            print(line, file=sys.stderr)
    return EXIT_GATE if outcome.failed else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
