"""A workload replayed against a server, every request's tokens timed, the meter sliced.

Each planned request (``serving/workload_plan.py``) is sent at its arrival time from a thread
of its own (open loop: a slow server does not slow the arrivals), asking for exactly its
tokens as the serving tier always does (``client.Endpoint.complete``: ``ignore_eos``,
``min_tokens``, the counts checked against the server's usage).  Each request's timeline
is recorded on the meter's clock: sent, each streamed chunk, end.  A request that fails,
is cut short or is counted otherwise is recorded as such (its ``status``), with the
tokens it did get: it cost the server energy too, and it never stops the workload.

Meanwhile a window of the meter is marked every ``slice_s`` from a thread of its own, so
that its phases are the meter's energy over time: counters read at each mark, samples
integrated between marks, every meter alike.  The slices add up to the window's energy
exactly (they are its phases), which ``serving/attribution.py`` then splits per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import LLMEnergyError, one_line
from ..meters.base import Meter
from ..meters.readings import Measurement
from ..results import PowerSlice, RequestRecord
from .attribution import (
    Attribution,
    CostWeights,
    EnergySlice,
    MeterTimeline,
    TokenTimeline,
    attribute,
)
from .client import CountMismatch, Endpoint, Prompt, check
from .workload_plan import PlannedRequest, WorkloadPlan

Clock = Callable[[], float]
PromptFor = Callable[[int, int], Prompt]  # (input tokens, row) -> the prompt
DEFAULT_SLICE_S = 0.05
# Marks a window takes at most: each mark checks the names before it, so thousands of
# them cost seconds; a long workload gets longer slices instead.
MAX_SLICES = 4000
# Requests in flight at most (threads): past it, arrivals wait for a thread, and their
# timelines say when they were really sent.
MAX_IN_FLIGHT = 512


# -- the requests ------------------------------------------------------------------------
def send_one(
    endpoint: Endpoint, planned: PlannedRequest, prompt: Prompt, clock: Clock = time.perf_counter
) -> TokenTimeline:
    """One request, its tokens timed; whatever goes wrong is its status, never raised."""
    times: list[float] = []
    stamp = lambda: times.append(clock())  # noqa: E731 - the two hooks, one clock
    sent = clock()
    status, produced = "", None
    try:
        done = endpoint.complete(
            prompt, planned.output_tokens, on_first_token=stamp, on_token=stamp
        )
        produced = done.completion_tokens
        check(done, planned.input_tokens, planned.output_tokens, f"request {planned.index + 1}")
    except CountMismatch as exc:
        status = f"miscounted: {one_line(str(exc), 200)}"
    except (LLMEnergyError, OSError, ValueError) as exc:
        got = f" after {len(times)} tokens" if times else " before its first token"
        status = f"failed{got}: {one_line(str(exc) or type(exc).__name__, 200)}"
    end = clock()
    return TokenTimeline(
        input_tokens=planned.input_tokens,
        output_tokens=produced if produced is not None else len(times),
        sent_s=sent,
        token_s=tuple(times),
        end_s=end,
        status=status,
        streamed=endpoint.stream,
    )


def replay(
    endpoint: Endpoint,
    plan: WorkloadPlan,
    prompt_for: PromptFor,
    clock: Clock = time.perf_counter,
    max_in_flight: int = MAX_IN_FLIGHT,
) -> tuple[TokenTimeline, ...]:
    """Send every planned request at its arrival time; their timelines in plan order."""
    requests = plan.requests
    prompts = [prompt_for(r.input_tokens, r.index) for r in requests]  # built before t=0
    workers = max(1, min(max_in_flight, len(requests)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llmenergy-load") as pool:
        start = clock()
        futures = []
        for planned, prompt in zip(requests, prompts):
            wait_s = start + planned.arrival_s - clock()
            if wait_s > 0:
                time.sleep(wait_s)
            futures.append(pool.submit(send_one, endpoint, planned, prompt, clock))
        return tuple(f.result() for f in futures)


# -- the meter, sliced -------------------------------------------------------------------
class SlicedWindow:
    """A window of ``meter`` marked every ``slice_s`` from a thread: its phases are the
    meter's energy over time.  ``with SlicedWindow(meter, 0.05) as w: ...`` then
    ``w.timeline()``."""

    def __init__(self, meter: Meter, slice_s: float = DEFAULT_SLICE_S) -> None:
        self.meter = meter
        self.slice_s = max(slice_s, meter.resolution_s or 0.0)
        self._window = meter.measure("slice-0")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._mark, name="llmenergy-slices", daemon=True)

    def __enter__(self) -> SlicedWindow:
        self._window.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._window.__exit__(*exc)

    def _mark(self) -> None:
        for n in range(1, MAX_SLICES):
            if self._stop.wait(self.slice_s):
                return
            self._window.mark(f"slice-{n}")

    @property
    def measurement(self) -> Measurement:
        return self._window.measurement

    def timeline(self) -> MeterTimeline:
        """The window's slices, its resolution (the slices', the meter's, its samples'
        averaging span, whichever is longest) and the meter's idle baseline if measured."""
        m = self.measurement
        slices = tuple(
            EnergySlice(m.t_start + p.offset_s, m.t_start + p.offset_s + p.seconds, p.joules)
            for p in m.phases.values()
        )
        lengths = sorted(s.seconds for s in slices)
        spans = [s.span_s for s in m.samples]
        resolution_s = max(
            lengths[len(lengths) // 2] if len(slices) > 1 else m.seconds,
            self.meter.resolution_s or 0.0,
            max(spans, default=0.0),
        )
        counted = [name for name, d in m.domains.items() if d.counted]
        idle = self.meter.idle_power_w
        idle_w = sum(idle.get(n, 0.0) for n in counted) if idle else None
        return MeterTimeline(slices, resolution_s, idle_w)


def slice_for(plan: WorkloadPlan, meter: Meter, slice_s: float = DEFAULT_SLICE_S) -> float:
    """A slice length that keeps a workload's window under ``MAX_SLICES`` marks (its
    arrivals, and as long again for the last requests to finish)."""
    return max(slice_s, meter.resolution_s or 0.0, 2 * plan.span_s / MAX_SLICES)


# -- the whole run -------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadRun:
    """One replay, measured and attributed: what ``energy_benchmark`` keeps of it is
    ``requests`` (each with its joules); ``attribution`` holds the window's split."""

    plan: WorkloadPlan
    timelines: tuple[TokenTimeline, ...]
    attribution: Attribution
    requests: tuple[RequestRecord, ...]
    # the window slice by slice, from its start: kept with the trial, drawn in the report
    power: tuple[PowerSlice, ...] = ()


def run_workload(
    meter: Meter,
    endpoint: Endpoint,
    plan: WorkloadPlan,
    prompt_for: PromptFor,
    *,
    weights: CostWeights | None = None,
    slice_s: float = DEFAULT_SLICE_S,
) -> WorkloadRun:
    """Replay ``plan`` inside a sliced window of ``meter`` and attribute its energy."""
    with SlicedWindow(meter, slice_for(plan, meter, slice_s)) as window:
        timelines = replay(endpoint, plan, prompt_for)
    timeline = window.timeline()
    split = attribute(timeline, timelines, weights)
    origin = window.measurement.t_start
    power = tuple(
        PowerSlice(max(s.start_s - origin, 0.0), max(s.end_s - origin, 0.0), s.joules)
        for s in timeline.slices
    )
    records = request_records(timelines, split, origin)
    return WorkloadRun(plan, timelines, split, records, power)


def request_records(
    timelines: Sequence[TokenTimeline], split: Attribution, origin: float
) -> tuple[RequestRecord, ...]:
    """Each request as the run file keeps it: timings from its sending (``sent_s`` from
    the window's opening) and its joules."""
    return tuple(
        RequestRecord(
            ttft_s=t.token_s[0] - t.sent_s if t.token_s else None,
            latency_s=t.end_s - t.sent_s,
            output_tokens=t.output_tokens,
            input_tokens=t.input_tokens,
            sent_s=max(t.sent_s - origin, 0.0),
            status=t.status,
            prefill_j=share.prefill_j,
            decode_j=share.decode_j,
            plain_j=share.plain_j,
            coarse=share.coarse,
        )
        for t, share in zip(timelines, split.requests)
    )


class WorkloadTarget:
    """A workload as a benchmark's target: each call replays the same planned requests
    (the seed draws them once) in a sliced window of ``meter`` and attributes it.  A case
    measuring it counts the whole workload as one query of all its tokens (``case``)."""

    def __init__(
        self,
        meter: Meter,
        endpoint: Endpoint,
        plan: WorkloadPlan,
        prompt_for: PromptFor,
        weights: CostWeights | None = None,
    ) -> None:
        self.meter, self.endpoint, self.plan = meter, endpoint, plan
        self.prompt_for, self.weights = prompt_for, weights
        self.last: WorkloadRun | None = None

    def run(self) -> WorkloadRun:
        self.last = run_workload(
            self.meter, self.endpoint, self.plan, self.prompt_for, weights=self.weights
        )
        return self.last

    def case(self) -> dict[str, int]:
        """What ``energy_benchmark`` declares: every planned token, as one query."""
        return {
            "input_tokens": self.plan.input_tokens,
            "output_tokens": self.plan.output_tokens,
            "queries": 1,
        }
