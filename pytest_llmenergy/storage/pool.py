"""Pooling runs: several runs of the same cases on the same machine, as one run.

A pull request's gate measures the base commit and the head alternately (base, head,
base, head) so that drift on the machine (temperature, clocks, neighbours) falls on both
sides alike; each side's runs are then pooled, case by case, into one run whose trials
are all of that side's trials, and the pooled runs are compared as usual.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import replace

from ..errors import ConfigError
from ..results import CONVERGED, LIMIT, OOM, ROUNDS, CaseResult, Trial
from .recorder import utc_now
from .runfile import ABANDONED, COMPLETE, INTERRUPTED, RUNNING, Run

# How a pooled case ended: the least settled of its parts.
_STATUS_ORDER = (OOM, LIMIT, ROUNDS, CONVERGED)


def sessions_of(case: CaseResult) -> list[int]:
    """The sessions a case's trials came from (one, 0, for a run that was not pooled)."""
    return sorted({t.session for t in (*case.trials, *case.disturbed)}) or [0]


def pool_cases(cases: Sequence[CaseResult], offsets: Sequence[int] | None = None) -> CaseResult:
    """One case from the same case measured in several runs: every trial, re-numbered,
    and marked with the session that measured it (the run, counted from 1 after
    ``offsets[i]`` sessions of the runs before it), so that a comparison can tell the
    sessions apart (sessions.py); a run that was itself pooled keeps its sessions."""
    first = cases[0]
    if offsets is None:
        offsets, total = [], 0
        for case in cases:
            offsets.append(total)
            total += len(sessions_of(case))
    trials: list[Trial] = []
    passes: list[Trial] = []
    disturbed: list[Trial] = []
    for case, offset in zip(cases, offsets):
        number = {s: offset + i for i, s in enumerate(sessions_of(case), start=1)}
        trials += _marked(case.trials, number, offset + 1, case.reference_s)
        passes += _marked(case.prefill_passes, number, offset + 1, case.reference_s)
        disturbed += _marked(case.disturbed, number, offset + 1, case.reference_s)
    statuses = {case.status for case in cases}
    status = next((s for s in _STATUS_ORDER if s in statuses), first.status)
    return replace(
        first,
        trials=tuple(replace(t, index=i) for i, t in enumerate(trials, start=1)),
        prefill_passes=tuple(passes),
        disturbed=tuple(disturbed),
        status=status,
        reason="; ".join(dict.fromkeys(c.reason for c in cases if c.reason)),
        # counted work is the same in every session of the same code: the first counted
        work=next((c.work for c in cases if c.work is not None), None),
    )


def _marked(
    trials: Sequence[Trial], number: dict[int, int], default: int, reference_s: float | None
) -> list[Trial]:
    """Trials marked with their session, and with their case's speed reference where a
    run older than per-trial references has it on the case only."""
    return [
        replace(
            t,
            session=number.get(t.session, default),
            reference_s=t.reference_s if t.reference_s is not None else reference_s,
        )
        for t in trials
    ]


def pool_runs(runs: Sequence[Run], name: str = "pooled") -> Run:
    """The runs as one: cases matched by node id, in the first run's order, then the
    others'.  Runs from different hardware, or measured at different confidence levels,
    are refused: their trials are not samples of one thing."""
    if len(runs) < 2:
        raise ConfigError("pooling needs at least two runs")
    hardware = {run.hardware for run in runs}
    if len(hardware) > 1:
        raise ConfigError(
            f"runs from different hardware cannot be pooled ({', '.join(sorted(hardware))}); "
            "compare them side by side with llmenergy compare instead"
        )
    levels = {case.options.confidence for run in runs for case in run.cases}
    if len(levels) > 1:
        shown = ", ".join(f"{c:g}" for c in sorted(levels))
        raise ConfigError(
            f"runs measured at different confidence levels ({shown}) cannot be pooled"
        )
    check_distinct(runs)
    by_id: dict[str, list[CaseResult]] = {}
    offsets: dict[str, list[int]] = {}
    total = 0  # sessions of the runs before: numbered alike in every case
    for run in runs:
        for case in run.cases:
            by_id.setdefault(case.nodeid, []).append(case)
            offsets.setdefault(case.nodeid, []).append(total)
        total += max((len(sessions_of(c)) for c in run.cases), default=1)
    first = runs[0]
    return replace(
        first,
        run_id="",
        name=name,
        created=min(run.created for run in runs),
        finished=utc_now(),
        status=COMPLETE if all(run.status == COMPLETE for run in runs) else INTERRUPTED,
        exit_status=_exit_status(runs),
        cases=tuple(pool_cases(cases, offsets[k]) for k, cases in by_id.items()),
        command=("llmenergy", "merge", *(run.label for run in runs)),
        path=None,
        writer={},  # written whole, once: no process is still writing it
    )


def _exit_status(runs: Sequence[Run]) -> int | None:
    """The worst of the parts' exit statuses; None (unknown) where a part never ended
    with one (a session killed outright)."""
    statuses = [run.exit_status for run in runs]
    return None if None in statuses else max(s for s in statuses if s is not None)


def unfinished(runs: Sequence[Run], partial: bool, verb: str = "pooled") -> list[str]:
    """The notes on parts that did not finish (killed, interrupted, still being
    written), which ``partial`` takes as they are; refused, in one line, without it: a
    run's trials end where its session stopped, and a pool should not hide that."""
    lacking = [
        f"{_unfinished(run)} ({len(run.cases)} case(s) saved)"
        for run in runs
        if run.status != COMPLETE
    ]
    if lacking and not partial:
        raise ConfigError(
            f"{'; '.join(lacking)}: {'they' if len(lacking) > 1 else 'it'} did not finish; "
            f"give finished runs, or take what there is with --partial (the result is marked "
            "interrupted)"
        )
    return [f"{text}: its cases are {verb} as they are" for text in lacking]


def _same_file(a: Run, b: Run) -> bool:
    if a.path is None or b.path is None:
        return False
    try:
        return os.path.samefile(a.path, b.path)
    except OSError:  # gone since it was read: then its name decides
        return os.path.abspath(a.path) == os.path.abspath(b.path)


# A run's trials as measured, by case: (seconds, joules, net joules, tokens in, out).
_Measured = dict[str, Counter[tuple[float, ...]]]


def _measured(run: Run) -> _Measured:
    """Each case's trials as what was measured (the session and number a pool gives a
    trial set aside), by node id."""
    return {
        case.nodeid: Counter(
            (t.seconds, t.joules, t.net_joules, t.input_tokens, t.output_tokens)
            for t in (*case.trials, *case.disturbed, *case.prefill_passes)
        )
        for case in run.cases
    }


def _within(part: _Measured, whole: _Measured) -> bool:
    """Is every trial of ``part`` among ``whole``'s, case by case?  Measured durations
    never repeat across sessions: only a copy or a pool holds another run's trials."""
    return any(part.values()) and all(
        trials <= whole.get(nodeid, Counter()) for nodeid, trials in part.items()
    )


def check_distinct(runs: Sequence[Run]) -> None:
    """Refuse a run given twice (one file by two names: ``0001`` and ``base``), or a run
    whose every trial another holds (a copy of its file, a pool it is already in):
    pooled, those trials would count twice and the gate would see a false precision."""
    measured = [_measured(run) for run in runs]
    for i, a in enumerate(runs):
        for j in range(i):
            b = runs[j]
            if _same_file(a, b):
                raise ConfigError(
                    f"{b.label} is given twice ({a.path}); pool runs of distinct sessions"
                )
            for part, whole in ((i, j), (j, i)):
                if _within(measured[part], measured[whole]):
                    inner, outer = runs[part].label, runs[whole].label
                    raise ConfigError(
                        f"every trial of {inner} is already in {outer} (a copy of it, or a "
                        "pool that holds it): pooled, they would count twice; pool runs of "
                        "distinct sessions"
                    )


# -- shards: the parts of one grid, run on several machines (--llm-shard=I/N) -----------
def shard_of(run: Run) -> tuple[int, int] | None:
    """The part of a split this run measured, as its options record it (None: all)."""
    value = run.options.get("shard")
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 1 <= value[0] <= value[1]
    ):
        return int(value[0]), int(value[1])
    return None


def join_shards(
    runs: Sequence[Run],
    *,
    measuring: Collection[str],
    name: str = "joined",
    partial: bool = False,
) -> tuple[Run, list[str]]:
    """The shards of one grid as one run, and what it lacks.  Refused, in one line each:
    a run that is no shard, parts of different splits, another hardware, other values
    of the ``measuring`` options, a part given twice, a case in two parts, and (unless
    ``partial``) a missing part."""
    parts = _one_split(runs, measuring)
    total = parts[0][1]
    seen = _parts_by_index(runs, parts, total)
    missing = _missing(sorted(seen), total)
    unfinished = [
        f"shard {i}/{total} ended early ({_unfinished(run)}; {len(run.cases)} case(s) saved)"
        for i, run in sorted(seen.items())
        if run.status != COMPLETE
    ]
    lacking = [f"shard {missing} missing"] * bool(missing) + unfinished
    if lacking and not partial:
        have = ", ".join(f"{i}/{total}" for i in sorted(seen))
        raise ConfigError(
            f"{'; '.join(lacking)} (have {have}); run {'them' if len(lacking) > 1 else 'it'} "
            "again, or join what there is with --partial"
        )
    notes = [f"shard {missing} missing: the joined run lacks its cases"] * bool(missing)
    notes += [f"{text}: its finished cases are joined" for text in unfinished]
    ordered = [seen[i] for i in sorted(seen)]
    first = runs[0]
    options = {**first.options, "shard": None, "shards": {"of": total, "joined": sorted(seen)}}
    joined = replace(
        first,
        run_id="",
        name=name,
        created=min(run.created for run in runs),
        finished=utc_now(),
        status=COMPLETE if not lacking else INTERRUPTED,
        exit_status=_exit_status(runs),
        options=options,
        cases=tuple(case for run in ordered for case in run.cases),
        command=("llmenergy", "merge", *(run.label for run in runs)),
        path=None,
        writer={},
    )
    return joined, notes


def _missing(have: Sequence[int], total: int, shown: int = 10) -> str:
    """The parts of ``1..total`` not in ``have`` (sorted), as ranges: ``2/3``, ``2/9 to
    5/9``; the first ``shown`` ranges and a count of the rest.  Built from the parts
    there are, never from the count a file claims (a hand-edited one can say 10**12)."""
    ranges: list[str] = []
    count = 0
    for low, high in zip([0, *have], [*have, total + 1]):
        if high - low < 2:
            continue
        first, last = low + 1, high - 1
        count += 1
        if len(ranges) < shown:
            same = first == last
            ranges.append(f"{first}/{total}" if same else f"{first}/{total} to {last}/{total}")
    more = count - len(ranges)
    return ", ".join(ranges) + (f" and {more} more ranges" if more else "")


def _one_split(runs: Sequence[Run], measuring: Collection[str]) -> list[tuple[int, int]]:
    """Each run's (part, of how many) in the one split ``runs`` belong to; refused where
    a run is no shard, or they differ in split, hardware or measuring options."""
    parts = []
    for run in runs:
        found = shard_of(run)
        if found is None:
            raise ConfigError(
                f"{run.label} is no shard (it ran without --llm-shard); join only the parts "
                "of one split, or pool whole runs of the same cases without shards"
            )
        parts.append(found)
    totals = sorted({n for _, n in parts})
    if len(totals) > 1:
        raise ConfigError(f"these runs are parts of different splits (of {totals}); join one split")
    hardware = sorted({run.hardware for run in runs})
    if len(hardware) > 1:
        raise ConfigError(
            f"the shards ran on different hardware ({', '.join(hardware)}): a join is one "
            "hardware's grid; compare the hardware side by side with llmenergy compare"
        )
    first = runs[0]
    for run in runs[1:]:
        differ = sorted(
            k for k in measuring if k != "shard" and run.options.get(k) != first.options.get(k)
        )
        if differ:
            k = differ[0]
            raise ConfigError(
                f"{run.label} was measured with other options than {first.label}: {k} "
                f"{run.options.get(k)!r} against {first.options.get(k)!r}"
                + (f" (and {len(differ) - 1} more)" if len(differ) > 1 else "")
            )
    return parts


def _parts_by_index(
    runs: Sequence[Run], parts: Sequence[tuple[int, int]], total: int
) -> dict[int, Run]:
    """Each shard's run by its index; refused where a part is given twice or a case is
    in two parts."""
    seen: dict[int, Run] = {}
    owner: dict[str, Run] = {}
    for run, (i, _) in zip(runs, parts):
        if i in seen:
            raise ConfigError(f"shard {i}/{total} is given twice: {seen[i].label} and {run.label}")
        seen[i] = run
        for case in run.cases:
            if case.nodeid in owner:
                raise ConfigError(
                    f"{case.nodeid} is in two shards ({owner[case.nodeid].label} and "
                    f"{run.label}); a split puts every case in one"
                )
            owner[case.nodeid] = run
    return seen


def _unfinished(run: Run) -> str:
    """How a part ended before its end, as its run file says: a session killed outright
    (``scancel``, a time limit, an out-of-memory kill) leaves its last write, ``running``."""
    if run.status in (RUNNING, ABANDONED):  # abandoned: its writer is known to be gone
        return f"{run.label} still says running: killed or cancelled"
    return f"{run.label} is {run.status}"
