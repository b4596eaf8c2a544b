"""``llmenergy compare``, ``report``, ``scale`` and ``gatecheck``: runs against a
baseline, as a table, a gate, an HTML page or a scaling table; and what this runner's
gate can see."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import values
from ..commandline import Command, Outcome
from ..compare import Comparison, Gate, parse_gates
from ..comparison_text import (
    Lineup,
    comparison_table,
    said_by_command,
    side_by_side,
    verdict_lines,
)
from ..errors import ConfigError
from ..figures import (
    DEFAULT_GATE_METRIC,
    figure,
    per_trial_keys,
)
from ..history import DEFAULT_BRANCH, WORSE
from ..sessions import DEFAULT_SESSION_NOISE
from ..storage.runfile import Run
from ..storage.store import DERIVED_FILE, FOLDER, STORAGE_HELP, Storage
from ..tables import FORMATS, Table, render
from .cli_args import TwoOrMore, checked, counted, gate_argument, runs_of, table_width

DEFAULT_CONFIDENCE = 0.95
DEFAULT_HISTORY_GATE = "j_per_token:5%"


# Keys of the side-by-side table (and csv's first column) that a run label must not shadow.
_RESERVED_LABELS = frozenset({"group", "case", "nodeid", "tokens_in", "tokens_out"})


def _compare_arguments(cmp_: argparse.ArgumentParser) -> None:
    cmp_.add_argument(
        "runs",
        nargs="+",
        action=TwoOrMore,
        metavar="RUN",
        help="two or more runs; the first is the baseline",
    )
    cmp_.add_argument(
        "--metric",
        action="append",
        type=checked(lambda text: figure(text, per_trial=True).key),
        metavar="FIGURE",
        help=f"figure to put side by side, repeatable (default: {DEFAULT_GATE_METRIC}); "
        f"one of {', '.join(per_trial_keys())} (llmenergy metrics explains them)",
    )
    gate_argument(
        cmp_,
        "--fail-on",
        "exit 1 when a run regresses against the first beyond a gate, significantly",
    )
    cmp_.add_argument(
        "--strict",
        action="store_true",
        help="also exit 1 when a gate could not judge everything: a case looks worse but the "
        "machine was busy, the runs' meters differ (energies not comparable), or a case is in "
        "one run only",
    )
    cmp_.add_argument(
        "--confidence",
        type=checked(values.confidence),
        default=None,
        help="confidence of the significance test, 0.95 or 95%% "
        f"(default: the baseline run's, else {DEFAULT_CONFIDENCE})",
    )

    cmp_.add_argument(
        "--explain",
        action="store_true",
        help="why each failed case got worse: its counted work per token by phase and "
        "operator class, the operators that moved most and, where both runs were profiled "
        "(--energy-profile-ops), the time per class and outside operators; without "
        "--fail-on, every case whose counted work changed",
    )


def _report_arguments(rep: argparse.ArgumentParser) -> None:
    rep.add_argument(
        "runs", nargs="+", metavar="RUN", help="one or more runs; the first is the baseline"
    )
    rep.add_argument(
        "--out", required=True, metavar="FILE", help="the HTML file (an existing one is replaced)"
    )
    gate_argument(
        rep,
        "--gate",
        "gate the later runs against the first, as compare --fail-on does: each case's "
        "verdict is on the page, and the command exits 1 when a gate fails",
    )
    rep.add_argument(
        "--confidence",
        type=checked(values.confidence),
        default=None,
        help="confidence of intervals and tests, 0.95 or 95%% "
        f"(default: the baseline run's, else {DEFAULT_CONFIDENCE})",
    )
    gate_argument(
        rep,
        "--history",
        "the figure a branch's history draws per commit, and the gate whose test marks a "
        f"change between consecutive commits (default: the --gate given, else "
        f"{DEFAULT_HISTORY_GATE}); drawn where the runs on the branch span two commits or more",
    )
    rep.add_argument(
        "--history-branch",
        default=DEFAULT_BRANCH,
        metavar="BRANCH",
        help=f"whose history: the runs saved on this branch (default: {DEFAULT_BRANCH})",
    )
    rep.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _scale_arguments(scale: argparse.ArgumentParser) -> None:
    scale.add_argument(
        "runs", nargs="+", action=TwoOrMore, metavar="RUN", help="two or more runs, any order"
    )
    scale.add_argument(
        "--plot", metavar="DIR", help="also draw the figure into DIR (scale.png; needs plots)"
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
    check.add_argument("--confidence", type=checked(values.confidence), default=0.95)
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
    check.add_argument(
        "--paired",
        action="store_true",
        help="also one paired run (llmenergy ab) per round and size, judged beside the others",
    )
    check.add_argument("--format", choices=FORMATS, default="table")
    check.add_argument(
        "pytest_args",
        nargs="*",
        metavar="PYTEST_ARG",
        help="each session's pytest arguments, after -- (default: benchmarks/ "
        "--llm-grid=quick -p no:randomly)",
    )


def _run_confidence(run: Run) -> float:
    """The confidence the baseline was measured at, if its file says so sensibly."""
    value = run.confidence
    return value if value is not None else DEFAULT_CONFIDENCE


def _default_metric(runs: list[Run]) -> str:
    """J/token, unless no case of the runs declared tokens (plain functions measured per
    call): then their joules per call."""
    tokens = any(c.input_tokens or c.output_tokens for run in runs for c in run.cases)
    return DEFAULT_GATE_METRIC if tokens else "energy_j"


def _compare(
    runs: list[Run], args: argparse.Namespace, storage: Storage
) -> tuple[str, list[str], bool]:
    """The tables, the gates' verdict lines, and whether a gate failed."""
    confidence = args.confidence if args.confidence is not None else _run_confidence(runs[0])
    gates: tuple[Gate, ...] = tuple(g for given in args.fail_on for g in given)
    lineup = Lineup(
        labels=_labels(runs),
        cases=tuple(run.cases for run in runs),
        machines=tuple(run.hardware for run in runs),
    )
    keys = list(dict.fromkeys(args.metric or [_default_metric(runs)]))  # a repeat adds nothing
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
            table = comparison_table(comparison)
            tables.append(replace(table, notes=tuple(map(said_by_command, table.notes))))
            label = comparison.current_label
            verdicts += [
                f"{label}: {said_by_command(line)}"
                for line in verdict_lines(comparison, args.strict)
            ]
            failed = failed or comparison.fails(args.strict)
            if args.explain:
                tables += [t for w in comparison.explanations for t in w.tables]
    elif args.explain:
        tables += _work_changes(runs, lineup.labels, verdicts)
    return render(tables, args.format, width=table_width(args.format)), verdicts, failed


def _work_changes(runs: Sequence[Run], labels: Sequence[str], notes: list[str]) -> list[Table]:
    """``--explain`` without a gate: the tables of every case whose counted work differs
    between the first run and a later one."""
    from ..explain import explain_tables, work_changed

    out: list[Table] = []
    before = {c.nodeid: c for c in runs[0].cases}
    for label, run in zip(labels[1:], runs[1:]):
        counted = changed = 0
        for case in run.cases:
            base = before.get(case.nodeid)
            if base is None or base.work is None or case.work is None:
                continue
            counted += 1
            if work_changed(base, case):
                changed += 1
                out += explain_tables(f"{label}: {case.name}", base, case)
        if not counted:
            notes.append(
                f"{label}: no case counted in both runs; run both with --energy-count-work"
            )
        else:
            notes.append(f"{label}: counted work changed in {changed} of {counted} case(s)")
    return out


def _gatecheck(args: argparse.Namespace) -> tuple[str, list[str]]:
    from .. import gatecheck

    gates = parse_gates(args.gate)
    shares = [values.fraction(x, "an injected regression") for x in values.items(args.inject)]
    if args.rounds < 1 or not shares or min(shares) <= 0:
        raise ConfigError(
            "gatecheck needs --rounds of 1 or more and regressions above 0 in --inject"
        )
    out = Path(args.out)
    paired: list[Any] = []
    say = lambda line: print(f"llmenergy: {line}", file=sys.stderr, flush=True)  # noqa: E731
    if args.judge_only:
        sessions = gatecheck.read_sessions(out)
        paired = gatecheck.read_paired(out)
    else:
        if out.exists() and any(out.iterdir()):
            raise ConfigError(f"--out {out} is not empty; give a new folder (or --judge-only)")
        pytest_args = args.pytest_args or ["benchmarks/", "--llm-grid=quick", "-p", "no:randomly"]
        sessions = gatecheck.run_sessions_now(pytest_args, args.rounds, shares, out, log=say)
        if args.paired:
            paired = gatecheck.run_paired_now(pytest_args, args.rounds, shares, out, log=say)
    noise = args.session_noise
    outcomes, times = gatecheck.judge(
        sessions,
        gates,
        confidence=args.confidence,
        session_noise=noise,
        normalize=args.normalize,
        paired=paired,
    )
    real = gatecheck.realized(sessions, gates[0].metric)
    table = gatecheck.quality_table(outcomes, times, real)
    notes = [
        f"{len(sessions)} sessions in {out}; gate {gates[0]}; assumed session noise {noise:.0%}"
        + ("" if args.normalize else "; not normalized by the machine's speed")
    ]
    return render([table], args.format, width=table_width(args.format)), notes


def _history(
    storage: Storage, runs: Sequence[Run], gates: Sequence[Gate], exclude: Run
) -> dict[str, Any]:
    """Noise learned from the storage's runs of the same code on the baseline's hardware,
    as the in-session gate learns it (the judged run left out)."""
    from ..history import stored_noise

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
    from ..history import gate_runs

    return [
        gate_runs(
            runs[0],
            run,
            gates,
            confidence=confidence,
            session_noise=session_noise,
            history=_history(storage, runs, gates, exclude=run) if storage and gates else None,
            base_label=labels[0],
            label=label,
        )
        for label, run in zip(labels[1:], runs[1:])
    ]


def _report(runs: list[Run], args: argparse.Namespace, storage: Storage) -> Outcome:
    """Write the HTML report and say what it holds; a failed gate fails the command, as
    compare --fail-on's does."""
    from ..html import write_report

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
    histories, notes = _histories(runs, args, gates, confidence)
    target = write_report(args.out, runs, labels, comparisons, histories=histories)
    size_mb = target.stat().st_size / 1e6
    wrote = f"wrote {target} ({counted(runs)}, {size_mb:.2f} MB)"
    verdicts = [
        f"{c.current_label}: {said_by_command(line)}"
        for c in comparisons
        if gates
        for line in verdict_lines(c)
    ]
    failed = any(c.failed for c in comparisons)
    return Outcome(wrote, notes=notes, verdicts=verdicts, failed=failed)


def _histories(
    runs: Sequence[Run], args: argparse.Namespace, gates: Sequence[Gate], confidence: float
) -> tuple[list[Any], list[str]]:
    """The branch's history per hardware and history gate, and a line on each (or on
    why there is none, when it was asked for)."""
    from ..history import branch_history

    asked: list[Gate] = [g for given in args.history for g in given]
    chosen = asked or list(gates) or list(parse_gates(DEFAULT_HISTORY_GATE))
    branch = args.history_branch
    found, notes = [], []
    for gate in dict.fromkeys(chosen):
        for h in branch_history(
            runs, gate, branch=branch, confidence=confidence, session_noise=args.session_noise
        ):
            found.append(h)
            worse = sum(1 for c in h.changes if c.direction == WORSE)
            notes.append(
                f"history of {branch} ({h.hardware}): {gate.metric} over {len(h.points)} "
                f"commits, {worse} change(s) worse and {len(h.changes) - worse} better "
                f"by the gate {gate}"
            )
    if asked and not found:
        notes.append(
            f"no history: the runs given span fewer than two commits on branch {branch} "
            "(--history-branch names another)"
        )
    return found, notes


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


def _scale(runs: list[Run], args: argparse.Namespace) -> tuple[str, list[str]]:
    from ..scale import scale_rows, scale_table, write_scale_plot

    rows = scale_rows(runs, _labels(runs))
    notes: list[str] = []
    if args.plot:
        from ..plotting import PlotError

        try:
            notes.append(f"wrote {write_scale_plot(rows, Path(args.plot))}")
        except PlotError as exc:
            raise ConfigError(str(exc)) from None
    return render([scale_table(rows)], args.format, width=table_width(args.format)), notes


def _compare_outcome(args: argparse.Namespace, storage: Storage) -> Outcome:
    out, verdicts, failed = _compare(runs_of(args, storage), args, storage)
    return Outcome(out, verdicts=verdicts, failed=failed)


COMMANDS: tuple[Command, ...] = (
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
        lambda args, storage: _report(runs_of(args, storage), args, storage),
        like_options=(("--session-noise", "--energy-session-noise"),),
        writes=(("out", DERIVED_FILE),),
    ),
    Command(
        "scale",
        "the same cases at different scales (1 process, N ranks, M nodes): J/token, "
        "speed-up, parallel efficiency, extra J/token",
        _scale_arguments,
        lambda args, storage: Outcome(*_scale(runs_of(args, storage), args)),
        common=True,
        writes=(("plot", FOLDER),),
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
