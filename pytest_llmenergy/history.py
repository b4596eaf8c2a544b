"""What this hardware's saved runs know about the noise between sessions.

Runs of the same commit (clean work tree) with the same measuring options, saved on the
same hardware, differ only by the session: the spread of their cases' figures is the
between-session noise a single-session comparison must allow for (Bencher's thresholds
from a metric's history, applied per case).  Saving the baseline in three sessions
(``--energy-save=base`` three times) is enough to start.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .compare import (
    CompareOptions,
    Comparison,
    Delta,
    Gate,
    case_sessions,
    compare_cases,
    detectable,
    noise_key,
    other_hardware,
    session_speeds,
    speed_exponent,
    speed_offsets,
    unlike_meters,
)
from .errors import ConfigError
from .figures import figure
from .probes.reference import speed_drift
from .sessions import (
    DEFAULT_SESSION_NOISE,
    NoiseEstimate,
    SideSessions,
    noise_from_runs,
)
from .storage.pool import pool_runs
from .storage.runfile import COMPLETE, Run, RunFileError, load
from .storage.store import Storage

# Options that say how a run was kept, shown or compared, not how it was measured.
_NOT_MEASURING = frozenset(
    {
        "save",
        "autosave",
        "json",
        "storage",
        "compare",
        "compare_fail",
        "strict",
        "export",
        "seed",
        "columns",
        "group_by",
        "sort",
        "plots",
        "report",
        "route_workload",
        "route_by",
        "route_lambda",
        "frontier_json",
        "session_noise",
        "carbon_intensity",
        "price",
    }
)


def code_key(run: Run) -> str | None:
    """What two runs must share to be sessions of the same code and settings; None when
    the code is unknown (no commit, or uncommitted changes)."""
    commit = run.commit
    if not commit.get("id") or commit.get("dirty") is not False:
        return None
    measuring = {k: v for k, v in run.options.items() if k not in _NOT_MEASURING}
    return json.dumps([commit["id"], measuring], sort_keys=True, default=str)


def run_sessions(
    run: Run, metrics: Iterable[str], normalize: bool = True
) -> dict[str, SideSessions]:
    """Each case's sessions, normalized by the machine's speed as a comparison would."""
    out: dict[str, SideSessions] = {}
    figures = [figure(m, per_trial=True, warn=False) for m in metrics]
    measured = [case for case in run.cases if case.measured]
    speeds = session_speeds(measured) if normalize else {}
    for case in measured:
        for f in figures:
            offsets = speed_offsets(case, speeds, speed_exponent(f, case), 0.0)
            side = case_sessions(f, case, offsets)
            if side is not None:
                out[noise_key(case.nodeid, f.key)] = side
    return out


def learned_noise(runs: Sequence[Run], metrics: Iterable[str]) -> dict[str, NoiseEstimate]:
    """Between-session noise per case and figure from groups of runs of the same code."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = code_key(run)
        if key is not None and run.status == COMPLETE:
            groups.setdefault(key, []).append(run)
    metrics = list(metrics)
    kept = [group for group in groups.values() if len(group) > 1]
    return noise_from_runs(
        [[run_sessions(r, metrics) for r in group] for group in kept],
        [span_s(group) for group in kept],
    )


def span_s(runs: Sequence[Run]) -> float:
    """How long the runs' sessions spanned, first start to last (inf: a time unreadable,
    so nothing is assumed of it)."""
    try:
        times = [datetime.fromisoformat(r.created.replace("Z", "+00:00")) for r in runs]
    except (ValueError, AttributeError):
        return math.inf
    if any(t.tzinfo is None for t in times):
        return math.inf
    return (max(times) - min(times)).total_seconds()


def stored_noise(
    storage: Storage, hardware: str, metrics: Iterable[str], *, exclude: Sequence[Any] = ()
) -> tuple[dict[str, NoiseEstimate], int]:
    """The noise learned from every readable run saved for ``hardware``, and how many
    runs it came from (``exclude``: paths of runs not to count, e.g. this session's)."""
    runs = []
    skip = {str(p) for p in exclude}
    for stored in storage.runs(hardware):
        if str(stored.path) in skip:
            continue
        try:
            runs.append(load(stored.path))
        except RunFileError:
            continue  # `llmenergy list` names unreadable files; here they teach nothing
    noise = learned_noise(runs, metrics)
    used = sum(1 for r in runs if code_key(r) is not None)
    return noise, used if noise else 0


# -- a branch's history: a figure per commit, and where it changed --------------------------
DEFAULT_BRANCH = "main"
WORSE, BETTER = "worse", "better"


def run_speed_s(run: Run) -> float | None:
    """The reference workload's time at the run's start (runs since 0.2.0), if any."""
    value = run.machine.get("speed_reference_s")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def gate_runs(
    base: Run,
    run: Run,
    gates: Sequence[Gate],
    *,
    confidence: float,
    session_noise: float = DEFAULT_SESSION_NOISE,
    history: Mapping[str, NoiseEstimate] | None = None,
    base_label: str = "baseline",
    label: str = "current",
) -> Comparison:
    """``run`` against ``base`` as a gate judges two runs: the meters must measure
    alike, the machine's speed drift is allowed for, CPU-measured figures normalized
    on one hardware, paired runs tested pair by pair."""
    return compare_cases(
        base.cases,
        run.cases,
        CompareOptions(
            gates=gates,
            confidence=confidence,
            baseline_label=base_label,
            current_label=label,
            not_comparable=unlike_meters(
                base.meter_identity, run.meter_identity, current_label=label
            ),
            drift=speed_drift(run_speed_s(base), run_speed_s(run), None),
            session_noise=session_noise,
            history=history,
            # another machine's speed is part of what is compared, not noise to take out
            normalize=run.hardware == base.hardware,
            hardware_note=other_hardware(base.hardware, run.hardware),
            paired=base.paired_with(run),
        ),
    )


@dataclass(frozen=True)
class CommitPoint:
    """One commit's place in a branch's history: its clean runs pooled into one (each
    run a session of its own, as a pull request's base or head is pooled), or one run
    with uncommitted changes alone (its code is the commit's plus something unknown)."""

    commit: str
    label: str  # how the page names it: the short id, ``+`` for uncommitted changes
    time: str  # the commit's time (ISO 8601), else its first run's
    dirty: bool
    runs: tuple[str, ...]  # the labels of the runs it holds
    run: Run
    note: str = ""  # why its runs were not pooled, if they were not


@dataclass(frozen=True)
class Change:
    """A case whose figure changed beyond the gate from one point to the next."""

    nodeid: str
    name: str
    after: int  # the index of the point where it changed (the one before: after - 1)
    direction: str  # WORSE or BETTER
    delta: Delta  # the figure from the point before to this one
    p: float | None  # the gate's p of the change, adjusted for the many cases


@dataclass(frozen=True)
class BranchHistory:
    branch: str
    hardware: str
    gate: Gate
    confidence: float
    points: tuple[CommitPoint, ...]
    changes: tuple[Change, ...]
    notes: tuple[str, ...] = ()
    # Per point, the smallest worsening the gate could have seen from the point before
    # (the median case, ``compare.detectable``; NaN for the first point): where no mark
    # is, the reader learns what size of change could have hidden.
    detectable: tuple[float, ...] = ()


def _when(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def _order(run: Run) -> tuple[float, float]:
    """Commit time, then the run's own start: unknown times sort first."""
    commit, created = _when(run.commit.get("time")), _when(run.created)
    return (
        commit.timestamp() if commit else -math.inf,
        created.timestamp() if created else -math.inf,
    )


def _pooled(runs: Sequence[Run], name: str) -> tuple[Run, str]:
    """The runs of one commit as one run; where they cannot be pooled (another
    confidence level, a run given twice), the latest alone, and why."""
    if len(runs) == 1:
        return runs[0], ""
    try:
        return pool_runs(runs, name=name), ""
    except ConfigError as exc:
        latest = max(runs, key=_order)
        return latest, f"{name}: only {latest.label} is drawn, the runs were not pooled: {exc}"


def commit_points(runs: Sequence[Run], branch: str) -> tuple[list[CommitPoint], list[str]]:
    """The runs of ``branch`` (one hardware) as points in commit-time order, and what
    was left out."""
    notes: list[str] = []
    other = [r.label for r in runs if r.commit.get("branch") != branch]
    if other:
        notes.append(
            f"{len(other)} run(s) not on branch {branch} left out of its history: "
            + ", ".join(other[:5])
            + (", \u2026" if len(other) > 5 else "")
        )
    mine = sorted((r for r in runs if r.commit.get("branch") == branch), key=_order)
    unknown = [r.label for r in mine if not r.commit.get("id")]
    if unknown:
        notes.append(f"no commit recorded, left out: {', '.join(unknown)}")
    groups: dict[tuple[str, int], list[Run]] = {}
    for i, run in enumerate(r for r in mine if r.commit.get("id")):
        dirty = run.commit.get("dirty") is not False
        # a clean commit's runs are pooled; a run with uncommitted changes stands alone
        groups.setdefault((str(run.commit["id"]), i if dirty else -1), []).append(run)
    points: list[CommitPoint] = []
    taken: dict[str, int] = {}
    for (commit, alone), group in sorted(groups.items(), key=lambda kv: _order(kv[1][0])):
        short = str(group[0].commit.get("short_id") or commit)[:8]
        label = short + ("+" if alone >= 0 else "")
        taken[label] = taken.get(label, 0) + 1
        if taken[label] > 1:
            label += f"({taken[label]})"
        run, note = _pooled(group, label)
        if note:
            notes.append(note)
        points.append(
            CommitPoint(
                commit=commit,
                label=label,
                time=str(group[0].commit.get("time") or group[0].created),
                dirty=alone >= 0,
                runs=tuple(r.label for r in group),
                run=run,
                note=note,
            )
        )
    return points, notes


def step_changes(
    points: Sequence[CommitPoint],
    gate: Gate,
    *,
    confidence: float,
    session_noise: float = DEFAULT_SESSION_NOISE,
    history: Mapping[str, NoiseEstimate] | None = None,
) -> tuple[list[Change], list[str], list[float]]:
    """Each point against the one before, by the gate's own test: a worsening is the
    gate failing forward, an improvement the gate failing backward (the newer point
    the baseline of the older), each beyond the gate's threshold and significant with
    the many cases counted.  Also what each step could have seen (``detectable``)."""
    changes: list[Change] = []
    notes: list[str] = []
    seen = [math.nan]
    for i in range(1, len(points)):
        before, after = points[i - 1], points[i]
        judge = {
            "confidence": confidence,
            "session_noise": session_noise,
            "history": history,
        }
        forward = gate_runs(
            before.run, after.run, [gate], base_label=before.label, label=after.label, **judge
        )
        backward = gate_runs(
            after.run, before.run, [gate], base_label=after.label, label=before.label, **judge
        )
        seen.append(detectable(forward))
        if forward.not_comparable:
            notes.append(f"{before.label} to {after.label}: {forward.not_comparable}")
        worse = {d.nodeid: d for d in forward.deltas if d.failed}
        better = {d.nodeid: d for d in backward.deltas if d.failed}
        for d in forward.deltas:
            if d.nodeid in worse:
                changes.append(Change(d.nodeid, d.name, i, WORSE, d, d.shown_p))
            elif d.nodeid in better:
                changes.append(Change(d.nodeid, d.name, i, BETTER, d, better[d.nodeid].shown_p))
    return changes, notes, seen


def branch_history(
    runs: Sequence[Run],
    gate: Gate,
    *,
    branch: str = DEFAULT_BRANCH,
    confidence: float = 0.95,
    session_noise: float = DEFAULT_SESSION_NOISE,
) -> list[BranchHistory]:
    """The branch's history per hardware among ``runs``: a point per commit and the
    changes between consecutive points; a hardware with fewer than two points has none."""
    by_hardware: dict[str, list[Run]] = {}
    for run in runs:
        by_hardware.setdefault(run.hardware, []).append(run)
    out = []
    for hardware, theirs in by_hardware.items():
        points, notes = commit_points(theirs, branch)
        if len(points) < 2:
            continue
        mine = [r for r in theirs if r.commit.get("branch") == branch]
        changes, more, seen = step_changes(
            points,
            gate,
            confidence=confidence,
            session_noise=session_noise,
            history=learned_noise(mine, [gate.metric]),
        )
        out.append(
            BranchHistory(
                branch,
                hardware,
                gate,
                confidence,
                tuple(points),
                tuple(changes),
                (*notes, *more),
                tuple(seen),
            )
        )
    return out
