"""What one more request costs a served batch: paired bursts with it and without it.

The attributed share (``serving/attribution.py``) splits a window's energy among the
requests that ran in it: each pays its part of every decode step it shared.  Routing one
more request asks another question: how much more does the server spend with it than
without?  A decode step's fixed cost (the weights' reads) is paid whether or not the
request joins the batch, so its marginal joules are its own work (its prompt, its
per-request part of each step) plus the steps it adds (when it keeps the engine running
after the others): below its share while the batch is busy, above it when it runs alone.

Measured the paired way (``turns``): the same burst replayed with the request and without
it, in randomized ABBA blocks so that a drifting machine cancels; each pair's difference
of the window's joules above idle power is one estimate of the marginal cost, and their
t interval says how sure it is.  Beside it, the request's attributed share in the bursts
that sent it, with its own interval.

This module is in ``pairing`` (a layer above ``serving``) because it reuses the paired
design; ``serving`` replays the bursts.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..meters.base import Meter
from ..serving.client import Endpoint
from ..serving.replay import DEFAULT_SLICE_S, PromptFor, WorkloadRun, run_workload
from ..serving.workload_plan import PlannedRequest, WorkloadPlan
from ..tables import Raw, Table, fmt_number
from .channel import BASE, HEAD
from .turns import Interval, block, block_pairs, paired_interval

WITHOUT, WITH = BASE, HEAD  # the paired design's base and head
DEFAULT_PAIRS = 8  # four ABBA blocks


@dataclass(frozen=True)
class Burst:
    """One replay's figures: the window's joules above idle power, and the added
    request's attributed share (None: not sent in this burst, or it failed)."""

    dynamic_j: float
    share_j: float | None = None
    idle_measured: bool = True


@dataclass(frozen=True)
class MarginalEnergy:
    """One more request's marginal joules (with - without, paired) and its share."""

    input_tokens: int
    output_tokens: int
    marginal: Interval  # joules, two-sided at ``level``
    share: Interval | None  # its attributed joules where sent (None: under two)
    level: float
    note: str = ""  # "": nothing to say; else what weakens the figure

    def text(self) -> str:
        """One line: the marginal joules beside the attributed share."""
        m = self.marginal
        line = (
            f"one more request of {self.input_tokens} input and {self.output_tokens} output "
            f"tokens: marginal {_j(m.mean)} {_span(m)} ({self.level:.0%}, {m.pairs} pairs)"
        )
        if self.share is not None:
            s = self.share
            line += f"; its attributed share {_j(s.mean)} {_span(s)}"
        return line + (f"; {self.note}" if self.note else "")


def _j(joules: float) -> str:
    return f"{fmt_number(joules, 3)} J"


def _span(interval: Interval) -> str:
    return f"[{fmt_number(interval.low, 3)}, {fmt_number(interval.high, 3)}]"


# -- the order and the pairs ---------------------------------------------------------------
def paired_turns(pairs: int, rng: random.Random) -> list[str]:
    """ABBA or BAAB blocks, each drawn at random, until they give ``pairs`` pairs."""
    turns: list[str] = []
    while len(turns) // 2 < pairs:
        turns += block(rng)
    return turns


def differences(turns: Sequence[str], bursts: Sequence[Burst]) -> list[float]:
    """Each pair's joules with the request minus without it, block by block."""
    diffs = []
    for start in range(0, len(turns) - len(turns) % 4, 4):
        sides, runs = turns[start : start + 4], bursts[start : start + 4]
        for i, j in block_pairs(sides):
            with_j = runs[i] if sides[i] == WITH else runs[j]
            without_j = runs[j] if sides[i] == WITH else runs[i]
            diffs.append(with_j.dynamic_j - without_j.dynamic_j)
    return diffs


def estimate(
    turns: Sequence[str],
    bursts: Sequence[Burst],
    request: PlannedRequest,
    level: float = 0.95,
) -> MarginalEnergy:
    """The marginal joules' interval from the pairs, beside the share's."""
    diffs = differences(turns, bursts)
    marginal = paired_interval(diffs, level)
    if marginal is None:
        raise ValueError(f"a marginal cost needs two pairs or more, got {len(diffs)}")
    shares = [b.share_j for b in bursts if b.share_j is not None]
    note = ""
    if any(not b.idle_measured for b in bursts):
        note = "idle power fitted from each window, not measured (--energy-idle): noisier"
    sent = sum(1 for t in turns if t == WITH)
    if len(shares) < sent:
        note = "; ".join(x for x in (note, f"it failed in {sent - len(shares)} bursts") if x)
    return MarginalEnergy(
        request.input_tokens,
        request.output_tokens,
        marginal,
        paired_interval(shares, level) if len(shares) >= 2 else _single(shares),
        level,
        note,
    )


def _single(shares: Sequence[float]) -> Interval | None:
    """One share has no interval: its value at both ends (None: no share)."""
    if not shares:
        return None
    mean = statistics.fmean(shares)
    return Interval(mean, mean, mean, len(shares))


def measure_marginal(
    run_burst: Callable[[bool], Burst],
    request: PlannedRequest,
    pairs: int = DEFAULT_PAIRS,
    level: float = 0.95,
    seed: int = 0,
) -> MarginalEnergy:
    """Run bursts with (``run_burst(True)``) and without the request in ABBA turns."""
    turns = paired_turns(pairs, random.Random(seed))
    bursts = [run_burst(turn == WITH) for turn in turns]
    return estimate(turns, bursts, request, level)


# -- the bursts, replayed --------------------------------------------------------------------
def with_request(plan: WorkloadPlan, request: PlannedRequest) -> tuple[WorkloadPlan, int]:
    """``plan`` with ``request`` added at its arrival (its index past the plan's, so its
    prompt is its own); and its place in the replay's order."""
    added = replace(request, index=len(plan.requests))
    requests = sorted([*plan.requests, added], key=lambda r: r.arrival_s)
    return replace(plan, requests=tuple(requests)), requests.index(added)


def burst_of(run: WorkloadRun, place: int | None) -> Burst:
    """A replay's joules above idle, and the added request's share when it completed."""
    split = run.attribution
    share = None
    if place is not None and not run.timelines[place].status:
        share = split.requests[place].energy_j
    measured = split.idle_source.startswith("measured")
    return Burst(split.window_j - split.idle_j, share, measured)


def served_bursts(
    meter: Meter,
    endpoint: Endpoint,
    base: WorkloadPlan,
    request: PlannedRequest,
    prompt_for: PromptFor,
    slice_s: float = DEFAULT_SLICE_S,
) -> Callable[[bool], Burst]:
    """A burst runner for ``measure_marginal``: ``base`` replayed against ``endpoint``,
    with ``request`` added or not."""
    added, place = with_request(base, request)

    def run(extra: bool) -> Burst:
        plan = added if extra else base
        replayed = run_workload(meter, endpoint, plan, prompt_for, slice_s=slice_s)
        return burst_of(replayed, place if extra else None)

    return run


def _row(r: MarginalEnergy) -> tuple[Raw, ...]:
    m, s = r.marginal, r.share
    return (
        r.input_tokens,
        r.output_tokens,
        m.mean,
        _span(m),
        s.mean if s is not None else None,
        m.mean / s.mean if s is not None and s.mean > 0 else None,
    )


def _cell(value: Raw) -> str:
    if value is None:
        return "—"
    return value if isinstance(value, str) else fmt_number(float(value), 3)


def marginal_table(results: Sequence[MarginalEnergy]) -> Table:
    """The marginal joules beside the attributed shares, one row per request size."""
    raw = tuple(_row(r) for r in results)
    level = f"{results[0].level:.0%} " if results else ""
    notes = [
        "marginal: the window's joules above idle with the request minus without it, "
        f"paired bursts in ABBA blocks, {level}t interval",
        "share J: its attributed joules in the bursts that sent it (work share); a decode "
        "step's fixed cost is in the share, not in the margin while the batch is busy",
        *(f"{r.input_tokens}/{r.output_tokens}: {r.note}" for r in results if r.note),
    ]
    return Table(
        "one more request: its marginal joules beside its attributed share",
        ("input_tokens", "output_tokens", "marginal_j", "interval", "share_j", "ratio"),
        ("in", "out", "marginal J", "interval", "share J", "marginal/share"),
        raw,
        tuple(tuple(_cell(v) for v in row) for row in raw),
        tuple(notes),
    )
