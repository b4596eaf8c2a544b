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
from datetime import datetime
from typing import Any

from .compare import case_sessions, noise_key, session_speeds, speed_exponent, speed_offsets
from .figures import figure
from .sessions import SEEN_ENOUGH_S, NoiseEstimate, SideSessions, noise_from_runs
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


def history_note(noise: Mapping[str, NoiseEstimate]) -> str:
    if not noise:
        return ""
    df = max(n.df for n in noise.values())
    text = f"between-session noise learned from saved runs of the same code ({df:g} df per case)"
    if all(n.seen_s < SEEN_ENOUGH_S for n in noise.values()):
        text += (
            "; they were saved within an hour of each other, so it is not trusted below "
            "the assumed noise (--energy-session-noise)"
        )
    return text
