"""Pooling runs: several runs of the same cases on the same machine, as one run.

A pull request's gate measures the base commit and the head alternately (base, head,
base, head) so that drift on the machine (temperature, clocks, neighbours) falls on both
sides alike; each side's runs are then pooled, case by case, into one run whose trials
are all of that side's trials, and the pooled runs are compared as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..errors import ConfigError
from ..results import CONVERGED, LIMIT, OOM, ROUNDS, CaseResult
from .recorder import utc_now
from .runfile import COMPLETE, Run

# How a pooled case ended: the least settled of its parts.
_STATUS_ORDER = (OOM, LIMIT, ROUNDS, CONVERGED)


def pool_cases(cases: Sequence[CaseResult]) -> CaseResult:
    """One case from the same case measured in several runs: every trial, re-numbered."""
    first = cases[0]
    trials = [t for case in cases for t in case.trials]
    statuses = {case.status for case in cases}
    status = next((s for s in _STATUS_ORDER if s in statuses), first.status)
    return replace(
        first,
        trials=tuple(replace(t, index=i) for i, t in enumerate(trials, start=1)),
        status=status,
        reason="; ".join(dict.fromkeys(c.reason for c in cases if c.reason)),
    )


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
    by_id: dict[str, list[CaseResult]] = {}
    for run in runs:
        for case in run.cases:
            by_id.setdefault(case.nodeid, []).append(case)
    first = runs[0]
    return replace(
        first,
        run_id="",
        name=name,
        created=min(run.created for run in runs),
        finished=utc_now(),
        status=next((run.status for run in runs if run.status != COMPLETE), COMPLETE),
        exit_status=max((run.exit_status or 0) for run in runs),
        cases=tuple(pool_cases(cases) for cases in by_id.values()),
        command=("llmenergy", "merge", *(run.label for run in runs)),
        path=None,
    )
