"""Each request's joules in a served workload: the window's energy split among requests.

A server batches requests that arrive at random times, so no request has a window of its
own: its energy has to be attributed from two timelines, the meter's (its energy over
short slices of the workload's window) and every request's (sent, each streamed token,
end).  Two rules, side by side:

- **work share** (this project's): the window is cut into the meter's slices; from each
  slice the static power x its length is set apart as idle joules, and the rest is split
  among the requests that worked in it by their share of its work.  An engine makes each
  token in the step before it streams, so a request's prompt is placed in the step
  before its first token and each decode token in the step before its chunk (the step:
  the median gap between chunks).  Work is weighed by its cost (``CostWeights``): J per
  prefill token, J per decode token, and J per decode step, of which each request of a
  batch of b pays 1/b (the batch: requests streaming at that moment); the costs are
  fitted from the window itself, else counted.  A slice with no request working keeps
  its energy apart (``unassigned_j``).  So the requests' joules, the idle joules and the
  unassigned joules add up to the window's energy exactly, whatever the weights;
- **plain** (ML.ENERGY's benchmark): the steady window's joules per output token times
  the request's output tokens.  It ignores prefill and the batch a request ran in, and
  its sum is not the window's energy: shown beside the first, never instead.

A meter can only tell apart stretches as long as its resolution (a counter's refresh,
a sampler's interval or averaging span, the slices themselves).  A request shorter than
two of those gets a share of whole steps whose energy other requests also drew: its
figure is kept and marked (``RequestShare.coarse``), never silently taken as its own.

Pure functions on plain data; the workload's replay (``serving/replay.py``) records the
timelines on one clock, the meter's (``time.perf_counter``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..results import PowerSlice
from .steady import close_at

# Two of the meter's steps: a request must span at least this many to have its own share.
COARSE_STEPS = 2.0
# Slices with work the per-token fit needs before it is trusted over the counted weights.
MIN_FIT_SLICES = 8


@dataclass(frozen=True)
class TokenTimeline:
    """One request as the client saw it, on the meter's clock (seconds)."""

    input_tokens: int
    output_tokens: int  # what it produced: the server's usage, else the chunks counted
    sent_s: float
    token_s: tuple[float, ...]  # each streamed chunk's arrival; the first is the first token
    end_s: float
    status: str = ""  # "": completed as asked; else why not (failed, cut, miscounted)
    streamed: bool = True  # False: the response came whole, no token times


# The meter's joules over one stretch of the window (every counted domain): the run file
# keeps them as a trial's power (``results.PowerSlice``).
EnergySlice = PowerSlice


@dataclass(frozen=True)
class MeterTimeline:
    """The window's energy over time, as finely as the meter tells it."""

    slices: tuple[EnergySlice, ...]  # contiguous, in time order
    resolution_s: float  # the shortest stretch whose energy the meter tells apart
    idle_w: float | None = None  # the measured static power (None: fitted from the window)

    @property
    def joules(self) -> float:
        return sum(s.joules for s in self.slices)


@dataclass(frozen=True)
class CostWeights:
    """What the work costs, in joules where fitted: a prefill token, a decode token, and
    a decode step (an engine reads its weights once a step, whatever the batch, so each
    request of a batch of b pays 1/b of it), and where the figures come from."""

    prefill: float
    decode: float
    step: float = 0.0
    source: str = ""

    def of(self, work: Work) -> float:
        return self.prefill * work[0] + self.decode * work[1] + self.step * work[2]


# A prefill token and a decode token are the same matrix products (2 x parameters FLOPs),
# so counted work weighs them alike and knows no step; decode's memory traffic makes it
# dearer in joules on GPUs, which the fit finds where the window shows it.
COUNTED = CostWeights(1.0, 1.0, 0.0, "counted: a prefill token and a decode token weigh the same")

# (prefill tokens, decode tokens, decode steps' shares: 1/b for a token made in a batch of b)
Work = tuple[float, float, float]


@dataclass(frozen=True)
class RequestShare:
    """One request's joules: its work share (prefill + decode, net of idle) and the
    plain rule's figure; ``coarse`` says why the share is not its own ("" when it is)."""

    prefill_j: float
    decode_j: float
    plain_j: float
    coarse: str = ""

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j


@dataclass(frozen=True)
class SteadyRate:
    """ML.ENERGY's steady window over a workload and its joules per output token."""

    j_per_token: float
    start_s: float
    end_s: float
    tokens: float
    note: str = ""  # "": a steady window; else why the whole window stands in


@dataclass(frozen=True)
class Attribution:
    """A workload window's energy, split: per request, idle, and unassigned."""

    requests: tuple[RequestShare, ...]
    window_j: float
    idle_j: float  # the static power x the window's length
    unassigned_j: float  # energy above idle in slices where no request worked
    idle_w: float
    idle_source: str
    weights: CostWeights
    steady: SteadyRate
    resolution_s: float
    coarse: str = ""  # "": the meter's timeline is fine enough for most requests

    @property
    def requests_j(self) -> float:
        return sum(r.energy_j for r in self.requests)


# -- the requests' work over time ------------------------------------------------------
@dataclass(frozen=True)
class _Work:
    """Work spread evenly over [start_s, end_s]."""

    start_s: float
    end_s: float
    work: Work


class Batch:
    """How many requests were decoding at a moment, as the client saw them: past their
    first token and not past their last."""

    def __init__(self, requests: Sequence[TokenTimeline]) -> None:
        streamed = [r for r in requests if r.token_s]
        self._firsts = sorted(r.token_s[0] for r in streamed)
        self._lasts = sorted(r.token_s[-1] for r in streamed)

    def at(self, t: float) -> int:
        """Requests decoding at ``t`` (a token arriving at ``t`` counts its own)."""
        started = bisect.bisect_right(self._firsts, t)
        ended = bisect.bisect_left(self._lasts, t)
        return max(started - ended, 1)


def work_segments(request: TokenTimeline, batch: Batch, step_s: float = 0.0) -> list[_Work]:
    """Where a request's tokens were worked on, as far as the client can see.  An engine
    makes each token in the step before it streams (``step_s``, as long as the engine's
    steps seem): the prompt in the step before the first token, not while it waited in
    the queue; each decode token in the step before the chunk that brought it (a longer
    gap held other requests' prefills), as a 1/b share of that step.  ``step_s`` 0: the
    whole gaps, from its sending.  A request with no token back did no work anyone can
    place."""
    times = request.token_s
    decode = max(request.output_tokens - 1, 0)
    if not request.streamed and request.output_tokens and not request.status:
        steps = decode / batch.at((request.sent_s + request.end_s) / 2)
        return [_Work(request.sent_s, request.end_s, (request.input_tokens, decode, steps))]
    if not times:
        return []
    begin = max(request.sent_s, times[0] - step_s) if step_s > 0 else request.sent_s
    segments = [_Work(begin, times[0], (request.input_tokens, 0.0, 0.0))]
    if decode == 0:
        return segments
    if len(times) == 1:  # one chunk carried every token: spread them to the end
        end = max(request.end_s, times[0])
        steps = decode / batch.at((times[0] + end) / 2)
        return [*segments, _Work(times[0], end, (0.0, decode, steps))]
    each = decode / (len(times) - 1)
    segments += [
        _Work(max(a, b - step_s) if step_s > 0 else a, b, (0.0, each, each / batch.at(b)))
        for a, b in itertools.pairwise(times)
    ]
    return segments


def step_length(requests: Sequence[TokenTimeline]) -> float:
    """The median gap between streamed chunks: the engine's step, as the client sees it."""
    gaps = sorted(b - a for r in requests for a, b in itertools.pairwise(r.token_s) if b > a)
    return gaps[len(gaps) // 2] if gaps else 0.0


def _slice_work(
    slices: Sequence[EnergySlice], requests: Sequence[TokenTimeline]
) -> list[dict[int, Work]]:
    """Per slice, each request's work in it."""
    starts = [s.start_s for s in slices]
    batch = Batch(requests)
    step_s = step_length(requests)
    out: list[dict[int, Work]] = [{} for _ in slices]
    for r, request in enumerate(requests):
        for seg in work_segments(request, batch, step_s):
            for k, share in _overlaps(slices, starts, seg.start_s, seg.end_s):
                p, d, s = out[k].get(r, (0.0, 0.0, 0.0))
                wp, wd, ws = seg.work
                out[k][r] = (p + wp * share, d + wd * share, s + ws * share)
    return out


def _overlaps(
    slices: Sequence[EnergySlice], starts: Sequence[float], a: float, b: float
) -> list[tuple[int, float]]:
    """The slices [a, b] overlaps and the share of [a, b] in each (a moment: all in its
    slice; outside the window: the nearest slice)."""
    last = len(slices) - 1
    first = min(max(bisect.bisect_right(starts, a) - 1, 0), last)
    if b <= a:
        return [(first, 1.0)]
    out = []
    for k in range(first, last + 1):
        s = slices[k]
        if s.start_s >= b and out:
            break
        lo = a if k == 0 else max(a, s.start_s)
        hi = b if k == last else min(b, s.end_s)
        if hi > lo:
            out.append((k, (hi - lo) / (b - a)))
    return out or [(first, 1.0)]


# -- weights and idle power, from the window -------------------------------------------
def fit_costs(
    slices: Sequence[EnergySlice], work: Sequence[dict[int, Work]], idle_w: float | None
) -> tuple[CostWeights | None, float | None]:
    """The joules of a prefill token, a decode token and a decode step (and the static
    power, where not known) by least squares over the slices, none below zero: slice J =
    idle W x seconds + its prefill tokens x J + its decode tokens x J + its steps x J.
    None where the window cannot tell them (too few slices with work, no cost found for
    prefill or decode)."""
    rows = [
        (
            s.seconds,
            sum(w[0] for w in ws.values()),
            sum(w[1] for w in ws.values()),
            sum(w[2] for w in ws.values()),
            s.joules,
        )
        for s, ws in zip(slices, work)
    ]
    busy = sum(1 for row in rows if row[1] + row[2] > 0)
    if busy < MIN_FIT_SLICES:
        return None, None
    table = np.array(rows, dtype=float)
    y = table[:, 4] - (idle_w * table[:, 0] if idle_w is not None else 0.0)
    columns = [1, 2, 3] if idle_w is not None else [0, 1, 2, 3]
    fitted = dict(zip(columns, _nonnegative_fit(table[:, columns], y)))
    prefill, decode, step = fitted.get(1, 0.0), fitted.get(2, 0.0), fitted.get(3, 0.0)
    if prefill <= 0 or decode + step <= 0:
        return None, fitted.get(0)
    source = f"fitted from the window's {busy} slices with work"
    return CostWeights(prefill, decode, step, source), fitted.get(0)


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0: the best of the column subsets whose
    plain fit has none below zero (four columns at most: fifteen subsets)."""
    cols = x.shape[1]
    best, best_err = [0.0] * cols, float(np.sum(y * y))
    for size in range(1, cols + 1):
        for keep in itertools.combinations(range(cols), size):
            coef, *_ = np.linalg.lstsq(x[:, list(keep)], y, rcond=None)
            if np.any(coef < 0) or not np.all(np.isfinite(coef)):
                continue
            err = float(np.sum((x[:, list(keep)] @ coef - y) ** 2))
            if err < best_err:
                best = [0.0] * cols
                for i, c in zip(keep, coef):
                    best[i] = float(c)
                best_err = err
    return best


# -- the plain rule --------------------------------------------------------------------
def steady_rate(slices: Sequence[EnergySlice], requests: Sequence[TokenTimeline]) -> SteadyRate:
    """The steady window's joules per output token, ML.ENERGY's way: it opens when as many
    requests as the workload's mean batch have streamed their first token and closes a
    request before the drain (``steady.close_at``); the whole window where it has none."""
    whole = _whole_rate(slices, requests)
    done = [r for r in requests if r.token_s]
    if len(done) < 3:
        return _with_note(whole, "fewer than 3 requests streamed tokens: no steady window")
    span = max(r.end_s for r in done) - min(r.sent_s for r in done)
    batch = sum(r.end_s - r.sent_s for r in done) / span if span > 0 else 1.0
    c = min(max(round(batch), 1), len(done))
    opens = sorted(r.token_s[0] for r in done)[c - 1]
    closes = sorted(r.end_s for r in done)[close_at(len(done), c) - 1]
    tokens = _tokens_between(done, opens, closes)
    if closes <= opens or tokens <= 0:
        return _with_note(
            whole, f"no steady window: a request finished before {c} had begun generating"
        )
    joules = _joules_between(slices, opens, closes)
    return SteadyRate(joules / tokens, opens, closes, tokens)


def _whole_rate(slices: Sequence[EnergySlice], requests: Sequence[TokenTimeline]) -> SteadyRate:
    tokens = float(sum(r.output_tokens for r in requests))
    joules = sum(s.joules for s in slices)
    start = slices[0].start_s if slices else 0.0
    end = slices[-1].end_s if slices else 0.0
    return SteadyRate(joules / tokens if tokens else 0.0, start, end, tokens)


def _with_note(rate: SteadyRate, note: str) -> SteadyRate:
    return SteadyRate(rate.j_per_token, rate.start_s, rate.end_s, rate.tokens, note)


def _tokens_between(requests: Sequence[TokenTimeline], a: float, b: float) -> float:
    """Output tokens streamed in (a, b]: each chunk counts the tokens it stands for."""
    total = 0.0
    for r in requests:
        each = r.output_tokens / len(r.token_s)
        total += each * sum(1 for t in r.token_s if a < t <= b)
    return total


def _joules_between(slices: Sequence[EnergySlice], a: float, b: float) -> float:
    """The slices' energy over [a, b], a slice cut in part taken pro rata of its time."""
    total = 0.0
    for s in slices:
        overlap = min(b, s.end_s) - max(a, s.start_s)
        if overlap > 0 and s.seconds > 0:
            total += s.joules * overlap / s.seconds
    return total


# -- the split ---------------------------------------------------------------------------
def attribute(
    timeline: MeterTimeline,
    requests: Sequence[TokenTimeline],
    weights: CostWeights | None = None,
) -> Attribution:
    """Split the window's energy per request (work share, and the plain rule beside it).

    ``weights``: the per-token costs to weigh work by (measured elsewhere, or counted);
    None fits them from the window, and falls back to ``COUNTED`` where it cannot."""
    slices = timeline.slices
    if not slices:
        raise ValueError("a meter timeline needs at least one slice")
    work = _slice_work(slices, requests)
    fitted, fitted_idle_w = fit_costs(slices, work, timeline.idle_w)
    chosen = weights or fitted or COUNTED
    idle_w, idle_source = _idle(timeline.idle_w, fitted_idle_w)
    prefill = [0.0] * len(requests)
    decode = [0.0] * len(requests)
    idle_j = unassigned_j = 0.0
    for s, ws in zip(slices, work):
        idle = idle_w * s.seconds
        idle_j += idle
        dynamic = s.joules - idle
        total = sum(chosen.of(w) for w in ws.values())
        if total <= 0:
            unassigned_j += dynamic
            continue
        for r, w in ws.items():
            prefill[r] += dynamic * chosen.prefill * w[0] / total
            decode[r] += dynamic * (chosen.of(w) - chosen.prefill * w[0]) / total
    steady = steady_rate(slices, requests)
    resolution_s = timeline.resolution_s
    shares = tuple(
        RequestShare(
            prefill[i],
            decode[i],
            steady.j_per_token * r.output_tokens,
            request_coarseness(r, resolution_s, len(slices)),
        )
        for i, r in enumerate(requests)
    )
    return Attribution(
        requests=shares,
        window_j=timeline.joules,
        idle_j=idle_j,
        unassigned_j=unassigned_j,
        idle_w=idle_w,
        idle_source=idle_source,
        weights=chosen,
        steady=steady,
        resolution_s=resolution_s,
        coarse=window_coarseness(requests, resolution_s, len(slices)),
    )


def _idle(measured_w: float | None, fitted_w: float | None) -> tuple[float, str]:
    """The static power set apart from the requests, and where it comes from."""
    if measured_w is not None:
        return measured_w, "measured (the meter's idle baseline)"
    if fitted_w is not None and fitted_w > 0:
        return fitted_w, "fitted from the window (its joules against its slices' work)"
    return 0.0, "unknown: the static power stays in the requests' joules"


def _duration_s(request: TokenTimeline) -> float:
    last = request.token_s[-1] if request.token_s else request.end_s
    return max(last, request.end_s) - request.sent_s


def request_coarseness(request: TokenTimeline, resolution_s: float, slices: int) -> str:
    """Why a request's share is not its own energy ("" when the meter resolves it)."""
    if not request.token_s and (request.streamed or request.status):
        return "no token came back: no work of its own can be placed in time"
    if slices <= 1:
        return "the meter gave the window's total only: every request shares it by work"
    seconds = _duration_s(request)
    if seconds < COARSE_STEPS * resolution_s:
        return (
            f"it lasted {seconds:.3g} s, under {COARSE_STEPS:g} of the meter's "
            f"{resolution_s:.3g} s steps: its joules are a share of whole steps"
        )
    return ""


def window_coarseness(requests: Sequence[TokenTimeline], resolution_s: float, slices: int) -> str:
    """Whether the meter's timeline is too coarse for these requests ("": fine)."""
    if slices <= 1:
        return (
            "the meter gave the window's total only (a counter read at its edges): "
            "per-request joules follow the work weights alone"
        )
    timed = sorted(_duration_s(r) for r in requests if r.token_s)
    if not timed:
        return ""
    median = timed[len(timed) // 2]
    if median < COARSE_STEPS * resolution_s:
        return (
            f"the meter's resolution ({resolution_s:.3g} s) is too coarse for these "
            f"requests (median {median:.3g} s): most per-request figures are marked"
        )
    return ""
