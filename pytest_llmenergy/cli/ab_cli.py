"""``llmenergy ab BASE HEAD -- [pytest args]``: a paired A/B gate in one run.

Each side is a pytest session started in its own checkout, with its own Python when
``--base-python``/``--head-python`` say so.  The coordinator (``pairing/coordinator.py``)
lets one side run at a time and alternates their trials case by case; the verdict tests
each case on its pairs of trials.  Why not pytest-xdist's ``--dist each`` with two
``--tx popen//chdir=DIR//python=PY`` nodes: xdist requires both nodes to collect the
same tests, runs them at once (both would measure together), and its controller merges
both nodes' reports under one node id; the turns would need a coordinator anyway.
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import values
from ..commandline import Command, Outcome
from ..compare import CompareOptions, Comparison, compare_cases, first_process_pair, parse_gates
from ..comparison_text import comparison_table
from ..comparison_text import verdict_lines as gate_verdict_lines
from ..errors import ConfigError
from ..figures import FIGURES
from ..pairing.channel import BASE, HEAD, SIDES
from ..pairing.coordinator import Coordinator
from ..pairing.cpus import DEFAULT_SIDE_CPUS, cpus_text, parse_side_cpus, side_cpus
from ..pairing.supervision import PassEnded, Side, run_pass
from ..pairing.turns import MIN_CONFIRM_PAIRS, MIN_PAIRS, PASS_LEVEL, GateRule
from ..results import CaseResult
from ..sessions import plan_processes
from ..storage.pool import pool_cases
from ..storage.store import DERIVED_FILE, Storage, check_run_name
from ..tables import render
from .cli_args import checked, gate_argument, table_width

DEFAULT_GATE = "j_per_token:5%"
# Process pairs a case is measured in (``--processes``): ``auto`` measures one, and a
# second for every case where the first shows processes differing beyond their pairs'
# noise, else for the cases whose verdict an offset could change
# (``sessions.plan_processes``); and the pairs of trials a case measures in each: a
# process's offset does not average out over its own trials, so more pairs in one
# process buy little (docs/evidence.md).
AUTO = "auto"
DEFAULT_PROCESSES = AUTO
PAIRS_PER_PROCESS = 4


def _arguments(ab: argparse.ArgumentParser) -> None:
    ab.add_argument("base", metavar="BASE", help="the base checkout (a folder)")
    ab.add_argument("head", metavar="HEAD", help="the head checkout (a folder)")
    ab.usage = "llmenergy ab BASE HEAD [options] -- [PYTEST_ARGS ...]"
    ab.epilog = "after --: what each side runs, e.g. -- benchmarks/ --llm-grid=quick"
    ab.set_defaults(pytest_args=[])
    gate_argument(
        ab,
        "--gate",
        f"repeatable; exit 1 when head is worse than base beyond it, significantly "
        f"(default {DEFAULT_GATE})",
    )
    ab.add_argument("--base-python", metavar="PY", help="the base side's Python (default: this)")
    ab.add_argument("--head-python", metavar="PY", help="the head side's Python (default: this)")
    ab.add_argument(
        "--base-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a pytest argument for the base side only (repeatable; write --base-arg=--x)",
    )
    ab.add_argument(
        "--head-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a pytest argument for the head side only, e.g. "
        "--head-arg=--llm-inject-regression=10%% to see the gate find a known regression",
    )
    ab.add_argument(
        "--confidence",
        type=checked(values.confidence),
        default=0.95,
        metavar="LEVEL",
        help="confidence of the verdict (default 0.95)",
    )
    ab.add_argument("--seed", type=int, help="the order's seed (default: a new one, printed)")
    ab.add_argument(
        "--save",
        type=checked(check_run_name),
        metavar="NAME",
        help="save both sides in the storage folder as NAME-base and NAME-head",
    )
    ab.add_argument(
        "--processes",
        type=checked(_processes),
        default=DEFAULT_PROCESSES,
        metavar="N|auto",
        help="measure every case in N process pairs, one pair after the other, each side "
        "in a fresh process each time, and test each case on the processes, not the trials: "
        "a process has an offset of its own that its pairs cannot cancel (default auto: a "
        "second process pair where the first shows processes differing beyond their pairs' "
        "noise, else only for the cases whose verdict such an offset could change)",
    )
    ab.add_argument(
        "--confirm",
        choices=("on", "off"),
        default=None,
        help="with --processes 1: measure the cases that FAIL again in fresh processes of "
        "both sides, and fail only those that fail again (default on there)",
    )
    ab.add_argument(
        "--side-cpus",
        type=checked(parse_side_cpus),
        default=DEFAULT_SIDE_CPUS,
        metavar="CPUS",
        help="the CPUs both sides run on: one (default: one CPU they share, as they take "
        "turns), all (where the OS puts them), or a list such as 0-3; sides on different "
        "CPUs read the CPUs' speeds apart (Linux; elsewhere, where the OS puts them)",
    )
    ab.add_argument("--report", metavar="PATH", help="write the pair's HTML report to PATH")
    ab.add_argument(
        "--strict",
        action="store_true",
        help="also exit 1 when a case ran on one side only, or a gate is inconclusive",
    )


def _processes(text: str) -> int | str:
    """``--processes``: auto, or a whole number of process pairs from 1 to 9."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return values.integer(1, 9)(text)
    except ConfigError:
        raise ConfigError(
            f"expected auto or a whole number from 1 to 9, got {text[:40]!r}"
        ) from None


def _sides(
    args: argparse.Namespace, storage: Storage, prefix: str, count: bool = False
) -> list[Side]:
    pytest_args = list(args.pytest_args)
    refused = {"-n", "--numprocesses", "--dist", "--energy-interleave", "--llm-serve"}
    for arg in pytest_args + args.base_arg + args.head_arg:
        flag = arg.split("=", 1)[0]
        if flag in refused or (flag.startswith("-n") and flag[2:].isdigit()):
            raise ConfigError(
                f"llmenergy ab: {arg} cannot take turns with the other side; leave it out "
                "(the two sides take turns, one process each)"
            )
    sides = []
    for name, folder, python, extra in (
        (BASE, args.base, args.base_python, args.base_arg),
        (HEAD, args.head, args.head_python, args.head_arg),
    ):
        path = Path(folder)
        if not path.is_dir():
            raise ConfigError(f"{name} checkout {folder!r} is not a folder")
        exe = python or sys.executable
        if shutil.which(exe) is None and not Path(exe).is_file():
            raise ConfigError(f"--{name}-python={exe}: no such Python")
        save = []
        if args.save:
            save = [
                f"--energy-storage={storage.root.resolve()}",
                f"--energy-save={args.save}-{prefix}{name}",
            ]
        # counted work in the first process pair only: the same code counts the same
        # work in every process, so one count a side names a FAIL's cause (more work, or
        # slower) for a few per cent of one pass; later pairs and confirming passes skip
        # it (an option after -- still decides)
        quiet = [] if count else ["--energy-count-work=off"]
        sides.append(Side(name, path.resolve(), exe, [*quiet, *pytest_args, *extra, *save]))
    return sides


def _rules(gates: Sequence[Any]) -> list[GateRule]:
    return [
        GateRule(g.metric, g.threshold, g.relative, FIGURES[g.metric].lower_is_better is not False)
        for g in gates
    ]


def _say(line: str) -> None:
    print(f"llmenergy ab: {line}", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, storage: Storage) -> Outcome:
    gates = tuple(g for group in (args.gate or [parse_gates(DEFAULT_GATE)]) for g in group)
    counted = [str(g) for g in gates if g.figure.exact]
    if counted:  # the pairs are of trials, and the work is counted apart from them
        raise ConfigError(
            f"--gate {', '.join(counted)}: counted work cannot gate a paired run (its pairs "
            "are of trials); gate it in one session (--energy-count-work "
            "--energy-compare-fail=...), where it is exact; with --energy-count-work after "
            "--, a paired run's sides count it for the explanation of a failed case"
        )
    if args.report and not args.save:
        raise ConfigError("--report needs both sides saved: add --save NAME")
    if args.confirm is not None and args.processes != 1:
        raise ConfigError(
            f"--confirm works with --processes 1 only: with --processes {args.processes} "
            "each case is tested on its processes, and a FAIL needs no confirming pass"
        )
    _sides(args, storage, "")  # a bad argument says so before anything runs
    side_cpus(args.side_cpus)
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    if args.processes == 1:
        return _one_process_pair(args, storage, gates, seed)
    if args.processes == AUTO:
        return _auto_process_pairs(args, storage, gates, seed)
    passes = []
    for number in range(1, args.processes + 1):
        _say(f"process pair {number} of {args.processes}")
        passes.append(
            _pass(
                args,
                storage,
                gates,
                seed + number - 1,
                only=_paired_cases(passes[0]) if passes else None,
                prefix=f"p{number}-" if number > 1 else "",
                pair_limit=PAIRS_PER_PROCESS,
                count=number == 1,
            )
        )
    comparison = _compare_processes(passes, gates, args.confidence)
    return _outcome(args, passes, comparison)


def _auto_process_pairs(
    args: argparse.Namespace, storage: Storage, gates: Sequence[Any], seed: int
) -> Outcome:
    """``--processes auto``: one process pair; then a second for every case where the
    first shows processes differing beyond their pairs' noise, else for the cases whose
    verdict such an offset could change; each case tested on the processes it has."""
    _say("process pair 1 (a second where processes differ beyond their pairs' noise)")
    first = _pass(args, storage, gates, seed, pair_limit=PAIRS_PER_PROCESS, count=True)
    found = first_process_pair(
        list(first.results[BASE].values()),
        list(first.results[HEAD].values()),
        _options(gates, args.confidence, 1),
    )
    plan = plan_processes(
        {key: case for key, (_, case) in found.items()},
        pass_level=min(args.confidence, PASS_LEVEL),
        fail_alpha=1.0 - args.confidence,
    )
    _say(plan.line())
    passes = [first]
    second = {found[key][0] for key in plan.second}
    if second:
        again = [i for i in _paired_cases(first) if i in second]
        _say(f"process pair 2: {len(again)} of {len(_paired_cases(first))} case(s)")
        passes.append(
            _pass(
                args,
                storage,
                gates,
                seed + 1,
                only=again,
                prefix="p2-",
                pair_limit=PAIRS_PER_PROCESS,
            )
        )
    comparison = _compare_processes(passes, gates, args.confidence, plan.offset_variance)
    return _outcome(args, passes, comparison)


def _one_process_pair(
    args: argparse.Namespace, storage: Storage, gates: Sequence[Any], seed: int
) -> Outcome:
    """``--processes 1``: one process pair tested on its pairs of trials; with
    ``--confirm`` (on by default) its FAILs measured again in fresh processes."""
    coordinator = _pass(args, storage, gates, seed, count=True)
    comparison = _compare(coordinator, gates, args.confidence)
    failed = sorted({d.nodeid for d in comparison.failures})
    passes = [coordinator]
    if failed and args.confirm != "off":
        _say(
            f"{len(failed)} case(s) FAILED; measuring them again in fresh processes of both "
            "sides (each process has an offset of its own that its pairs cannot cancel)"
        )
        confirm = _pass(
            args, storage, gates, seed + 1, only=failed, prefix="confirm-", confirming=True
        )
        passes.append(confirm)
        repeated = {d.nodeid for d in _compare(confirm, gates, args.confidence).failures}
        comparison = dataclasses.replace(
            comparison,
            deltas=tuple(
                dataclasses.replace(d, unconfirmed=True)
                if d.failed and d.nodeid not in repeated
                else d
                for d in comparison.deltas
            ),
        )
    return _outcome(args, passes, comparison)


def _paired_cases(coordinator: Coordinator) -> list[str]:
    """The cases a process pair measured on both sides: the next pairs measure these."""
    return [i for i in coordinator.order if all(i in coordinator.results[s] for s in SIDES)]


def _pass(
    args: argparse.Namespace,
    storage: Storage,
    gates: Sequence[Any],
    seed: int,
    only: Sequence[str] | None = None,
    *,
    prefix: str = "",
    pair_limit: int | None = None,
    confirming: bool = False,
    count: bool = False,
) -> Coordinator:
    """One paired pass: both sides started in fresh processes, served until they end,
    stopped.  ``only``: its cases (a later process pair, or the cases that failed);
    ``prefix`` names its saved runs (NAME-PREFIXbase, NAME-PREFIXhead)."""
    sides = _sides(args, storage, prefix, count)
    pairing_id = secrets.token_hex(8)
    coordinator = Coordinator(
        _rules(gates),
        confidence=args.confidence,
        seed=seed,
        log=_say,
        only_cases=only,
        pair_limit=pair_limit,
        min_pairs=MIN_CONFIRM_PAIRS if confirming else MIN_PAIRS,
    )
    cpus = side_cpus(args.side_cpus)
    workdir = Path(tempfile.mkdtemp(prefix="llmenergy-ab-"))
    _say(
        f"order seed {seed} (repeat with --seed={seed}); sides on {cpus_text(cpus)}; "
        f"side logs in {workdir}"
    )
    run_pass(sides, coordinator, pairing_id, workdir, cpus)
    return coordinator


def _options(
    gates: Sequence[Any],
    confidence: float,
    processes: int = 0,
    offset: float | None = None,
) -> CompareOptions:
    return CompareOptions(
        gates=gates,
        confidence=confidence,
        baseline_label="base",
        current_label="head",
        normalize=False,
        paired=True,
        processes=processes,
        process_offset=offset,
    )


def _compare(coordinator: Coordinator, gates: Sequence[Any], confidence: float) -> Comparison:
    """One process pair, each case tested on its pairs of trials."""
    comparison = compare_cases(
        list(coordinator.results[BASE].values()),
        list(coordinator.results[HEAD].values()),
        _options(gates, confidence),
    )
    return _undecided(comparison, coordinator.too_wide())


def _compare_processes(
    passes: Sequence[Coordinator],
    gates: Sequence[Any],
    confidence: float,
    offset: float | None = None,
) -> Comparison:
    """Several process pairs, each case tested on its process pairs' means (each a mean
    of its pairs of trials), paired process by process (``sessions.paired_rounds``).
    ``offset``: the processes' offset variance the first process pair measured, allowed
    for in the cases measured in it alone (``--processes auto``)."""
    sides = [_by_process(passes, side) for side in SIDES]
    comparison = compare_cases(*sides, _options(gates, confidence, len(passes), offset))
    return _undecided(comparison, set().union(*(p.too_wide() for p in passes)))


def _by_process(passes: Sequence[Coordinator], side: str) -> list[CaseResult]:
    """One side's cases over the process pairs: each pair's paired trials, numbered as
    session N for the Nth process pair (its unpaired trials left out: the pairs' mean
    is what cancels the machine's drift)."""
    found: dict[str, list[tuple[int, CaseResult]]] = {}
    for number, coordinator in enumerate(passes):
        for nodeid, case in coordinator.results[side].items():
            paired = tuple(t for t in case.trials if t.pair)
            if paired:
                kept = dataclasses.replace(case, trials=paired)
                found.setdefault(nodeid, []).append((number, kept))
    return [pool_cases([c for _, c in each], [n for n, _ in each]) for each in found.values()]


def _undecided(comparison: Comparison, wide: set[tuple[str, str]]) -> Comparison:
    """Cases that stopped with their own pairs too wide to pass on: undecided."""
    return dataclasses.replace(
        comparison,
        deltas=tuple(
            dataclasses.replace(d, undecided=True) if (d.nodeid, d.metric) in wide else d
            for d in comparison.deltas
        ),
    )


def _outcome(
    args: argparse.Namespace, passes: Sequence[Coordinator], comparison: Comparison
) -> Outcome:
    """The table, the verdict and where each process pair's sides were saved."""
    first = passes[0]
    one_sided = [f"only on the {s}: {', '.join(first.only[s])}" for s in SIDES if first.only[s]]
    table = comparison_table(comparison)
    out = render([table], args.format, width=table_width(args.format))
    verdicts = [*gate_verdict_lines(comparison), *one_sided]
    busy = busy_line({s: {k: v for p in passes for k, v in p.results[s].items()} for s in SIDES})
    if busy:
        verdicts.append(busy)
    # a gate that compared nothing fails (Comparison.failed); --strict: a case on one
    # side only, or one the gate could not judge, fails too
    failed = comparison.fails(args.strict) or (args.strict and bool(one_sided))
    notes = []
    for number, coordinator in enumerate(passes, start=1):
        label = "" if number == 1 else " (again)" if args.processes == 1 else f" ({number})"
        notes += [f"{s}{label}: {coordinator.runs[s]}" for s in SIDES if coordinator.runs.get(s)]
    if args.report:
        notes.append(_write_report(args.report, first, comparison))
    return Outcome(out=out, notes=notes, verdicts=verdicts, failed=failed)


def busy_line(results: Mapping[str, Mapping[str, CaseResult]]) -> str:
    """How busy the rest of the machine was, when it was ('' when it was not)."""
    judged = [
        case.options.disturbed(t.background_cpu)
        for side in results.values()
        for case in side.values()
        for t in (*case.trials, *case.disturbed)
        if t.background_cpu is not None
    ]
    if not any(judged):
        return ""
    return (
        f"the machine was busy with other work in {sum(judged) / len(judged):.0%} of the "
        "trials (beyond --energy-max-background): left out of the pairs and repeated. "
        "A busy machine costs a paired run pairs; stop the other work for a quicker verdict"
    )


def _write_report(path: str, coordinator: Coordinator, comparison: Comparison) -> str:
    from ..html import write_report
    from ..storage.runfile import load

    runs = [load(coordinator.runs[s]) for s in SIDES if coordinator.runs.get(s)]
    if len(runs) < len(SIDES):
        return "no report: a side saved no run"
    target = write_report(path, runs, ["base", "head"], [comparison])
    return f"wrote the pair's report to {target}"


def run_ab(args: argparse.Namespace, storage: Storage) -> Outcome:
    try:
        return _run(args, storage)
    except PassEnded as exc:
        _say(str(exc))
        return Outcome(out="", failed=True, exit_code=exc.code)


COMMANDS = (
    Command(
        "ab",
        "measure two checkouts side by side, trials alternating, and gate head against base",
        _arguments,
        run_ab,
        common=True,
        writes=(("report", DERIVED_FILE),),
    ),
)
