"""Each request's joules in a served workload, against a truth: a batching stand-in
engine whose every prefill token and decode step has a known energy, read by a counter
that draws exactly that energy (tests/fakes/batch_engine.py).

The figures the serving guide quotes come from ``test_work_share_finds_each_requests_joules``:
run it with ``-s`` to see them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmenergy.meters.readings import Reading
from pytest_llmenergy.serving.attribution import (
    COUNTED,
    CostWeights,
    EnergySlice,
    MeterTimeline,
    TokenTimeline,
    attribute,
)
from pytest_llmenergy.serving.client import Endpoint
from pytest_llmenergy.serving.replay import WorkloadRun, run_workload
from pytest_llmenergy.serving.workload_plan import draw, parse_workload
from tests.fakes.batch_engine import BatchEngine, StepCosts, Truth
from tests.fakes.fake_openai_server import Behaviour, FakeServer
from tests.fakes.scripted import TraceMeter

# Steps long enough for this machine's threads to stream on time, lengths halved: the
# 200 requests of the workload take about 20 s.
COSTS = StepCosts(step_s=0.012, prefill_base_s=0.003)
WORKLOAD = "alpaca:rate=13,requests=200,scale=0.5,seed=1"
FIRST_ID = 1000  # a request's prompt starts with FIRST_ID + its row: the truth's key


def prompt_for(input_tokens: int, row: int) -> list[int]:
    return [FIRST_ID + row, *([5] * (input_tokens - 1))]


def truths(engine: BatchEngine, n: int) -> list[Truth]:
    return [engine.truth.get(FIRST_ID + i, Truth()) for i in range(n)]


def served(
    spec: str, behaviour: Behaviour, meter_of: type[TraceMeter] | None = None, **kwargs: object
) -> tuple[WorkloadRun, BatchEngine]:
    """``spec`` replayed against a stand-in engine, metered by a counter on its trace
    (its idle baseline measured first, as ``--energy-idle`` does)."""
    engine = BatchEngine(COSTS)
    behaviour.engine = engine
    meter = (meter_of or TraceMeter)({"gpu:0": engine.trace})
    meter.measure_idle(0.1)
    try:
        with FakeServer(behaviour) as server:
            endpoint = Endpoint(server.url, "fake-model", timeout_s=30)
            run = run_workload(meter, endpoint, draw(parse_workload(spec)), prompt_for, **kwargs)
    finally:
        engine.stop()
    return run, engine


def relative_errors(figures: list[float], truth: list[float]) -> np.ndarray:
    return np.array([(f - t) / t for f, t in zip(figures, truth)])


# -- the truth -------------------------------------------------------------------------
def test_work_share_finds_each_requests_joules() -> None:
    run, engine = served(WORKLOAD, Behaviour(), slice_s=0.05)
    split = run.attribution
    truth = truths(engine, len(run.timelines))
    assert not any(t.status for t in run.timelines)
    # the batch held more than 4 requests, step by step, as the engine ran them
    batch = sum(t.batch_sum for t in truth) / sum(t.steps for t in truth)
    assert batch > 4
    work = relative_errors([r.energy_j for r in split.requests], [t.energy_j for t in truth])
    plain = relative_errors([r.plain_j for r in split.requests], [t.energy_j for t in truth])
    within = float(np.mean(np.abs(work) < 0.05))
    plain_within = float(np.mean(np.abs(plain) < 0.05))
    requests_j = split.requests_j
    true_j = sum(t.energy_j for t in truth)
    print(
        f"\nmean batch {batch:.2f}; work share: {within:.1%} of requests within 5 % "
        f"(median error {np.median(np.abs(work)):.2%}, worst {np.max(np.abs(work)):.1%}); "
        f"plain rule: {plain_within:.1%} (median {np.median(np.abs(plain)):.1%}); "
        f"window {split.window_j:.1f} J = requests {requests_j:.1f} + idle "
        f"{split.idle_j:.1f} + unassigned {split.unassigned_j:.3f}; truth above idle "
        f"{true_j:.1f} J; weights {split.weights}"
    )
    assert within >= 0.90
    # the requests' joules and the idle joules are the window's, to rounding
    total = requests_j + split.idle_j + split.unassigned_j
    assert total == pytest.approx(split.window_j, rel=1e-9)
    assert abs(split.unassigned_j) < 0.005 * split.window_j
    assert requests_j == pytest.approx(true_j, rel=0.005)
    # the idle joules are the static power over the window, measured
    assert split.idle_w == pytest.approx(COSTS.idle_w, rel=1e-6)
    # the fit found the engine's costs
    assert split.weights.prefill == pytest.approx(COSTS.prefill_j_per_token, rel=0.15)
    assert split.weights.step == pytest.approx(COSTS.step_j, rel=0.15)
    # ML.ENERGY's rule, side by side: one J/token for all, blind to prefill and batch
    assert plain_within < within
    assert not split.coarse


def test_failed_and_cut_requests_are_recorded_never_raised() -> None:
    behaviour = Behaviour(fail_every=7, cut_every=5)
    run, _ = served("alpaca:rate=30,requests=30,scale=0.25,seed=3", behaviour)
    statuses = [t.status for t in run.timelines]
    failed = [s for s in statuses if s.startswith("failed before its first token")]
    cut = [s for s in statuses if s.startswith("failed after")]
    # the server's refusals (a loaded machine may also time a request out)
    assert failed and any("HTTP 500" in s for s in failed)
    assert cut and all("usage" in s for s in cut)
    split = run.attribution
    assert len(split.requests) == 30
    assert all(math.isfinite(r.energy_j) for r in split.requests)
    total = split.requests_j + split.idle_j + split.unassigned_j
    assert total == pytest.approx(split.window_j, rel=1e-9)
    for timeline, share, record in zip(run.timelines, split.requests, run.requests):
        assert record.status == timeline.status
        if not timeline.token_s:  # nothing came back: no work of its own to place
            assert share.energy_j == 0.0
            assert share.coarse.startswith("no token came back")
        elif timeline.status:  # cut: the tokens it got are its work
            assert record.output_tokens == len(timeline.token_s)


class SteppedCounter(TraceMeter):
    """A counter that refreshes once a second: what it reads is the energy as of its
    last refresh (a meter far coarser than the requests)."""

    period_s = 1.0

    def __init__(self, traces: Mapping[str, object]) -> None:
        super().__init__(traces)  # type: ignore[arg-type]
        self._resolution_s = self.period_s
        self._origin = time.perf_counter()

    def _read(self) -> Reading:
        t = time.perf_counter()
        tick = self._origin + math.floor((t - self._origin) / self.period_s) * self.period_s
        return Reading(t=t, state={n: tr.energy_until(tick) for n, tr in self.traces.items()})


def test_a_meter_too_coarse_for_the_requests_marks_their_figures() -> None:
    run, _ = served("alpaca:rate=20,requests=40,scale=0.25,seed=4", Behaviour(), SteppedCounter)
    split = run.attribution
    assert split.resolution_s >= 1.0
    assert "too coarse" in split.coarse
    marked = [r for r in split.requests if r.coarse]
    assert len(marked) >= 0.9 * len(split.requests)
    assert all("meter's 1 s steps" in r.coarse for r in marked if r.coarse.startswith("it lasted"))
    assert all(r.coarse for r in run.requests if r.latency_s < 2.0)
    # marked, still whole: the window's energy is all there
    total = split.requests_j + split.idle_j + split.unassigned_j
    assert total == pytest.approx(split.window_j, rel=1e-9)


# -- the rule on hand-made timelines ---------------------------------------------------
def slices(*joules: float, width_s: float = 1.0) -> tuple[EnergySlice, ...]:
    return tuple(EnergySlice(i * width_s, (i + 1) * width_s, j) for i, j in enumerate(joules))


def test_each_slice_is_shared_by_the_work_in_it() -> None:
    # two requests decoding alone in turn: each slice's energy above idle is its own
    a = TokenTimeline(1, 3, 0.0, (0.5, 1.0, 1.5), 1.5)
    b = TokenTimeline(1, 3, 2.0, (2.5, 3.0, 3.5), 3.5)
    timeline = MeterTimeline(slices(20, 20, 40, 40), resolution_s=0.0, idle_w=10.0)
    split = attribute(timeline, [a, b], weights=COUNTED)
    assert [r.energy_j for r in split.requests] == pytest.approx([20.0, 60.0])
    assert split.idle_j == pytest.approx(40.0)
    assert split.requests_j + split.idle_j + split.unassigned_j == pytest.approx(120.0)


def test_a_decode_step_is_shared_by_its_batch() -> None:
    # two requests streaming their tokens in the same steps: equal shares of the step
    a = TokenTimeline(0, 5, 0.0, (0.1, 0.3, 0.5, 0.7, 0.9), 0.9)
    b = TokenTimeline(0, 5, 0.0, (0.1, 0.3, 0.5, 0.7, 0.9), 0.9)
    weights = CostWeights(prefill=1.0, decode=0.1, step=1.0, source="given")
    split = attribute(MeterTimeline(slices(10.0), 0.0, 0.0), [a, b], weights)
    assert split.requests[0].energy_j == pytest.approx(5.0)
    assert split.requests[1].energy_j == pytest.approx(5.0)


def test_a_counter_read_at_the_edges_alone_marks_every_request() -> None:
    a = TokenTimeline(4, 3, 0.0, (0.2, 0.4, 0.6), 0.6)
    split = attribute(MeterTimeline(slices(5.0), 2.0), [a])
    assert split.requests[0].coarse.startswith("the meter gave the window's total only")
    assert "total only" in split.coarse


def test_the_plain_rule_is_the_steady_windows_joules_per_token() -> None:
    # three requests, one after another: no batch, so the whole window stands in
    requests = [TokenTimeline(1, 2, float(i), (i + 0.5, i + 1.0), i + 1.0, "") for i in range(3)]
    split = attribute(MeterTimeline(slices(10, 10, 10), 0.0, 0.0), requests, COUNTED)
    assert [r.plain_j for r in split.requests] == pytest.approx([10.0, 10.0, 10.0])


@st.composite
def workloads(draw: st.DrawFn) -> tuple[MeterTimeline, list[TokenTimeline]]:
    """A window of slices and requests anywhere in or around it, failed ones too."""
    n = draw(st.integers(1, 12))
    width = draw(st.floats(0.01, 2.0))
    joules = draw(st.lists(st.floats(-5.0, 500.0), min_size=n, max_size=n))
    timeline = MeterTimeline(
        slices(*joules, width_s=width),
        draw(st.floats(0.0, 3.0)),
        draw(st.one_of(st.none(), st.floats(0.0, 100.0))),
    )
    requests = []
    for _ in range(draw(st.integers(0, 8))):
        sent = draw(st.floats(-1.0, n * width + 1.0))
        gaps = draw(st.lists(st.floats(0.0, 1.0), max_size=6))
        times = tuple(sent + sum(gaps[: i + 1]) for i in range(len(gaps)))
        end = (times[-1] if times else sent) + draw(st.floats(0.0, 0.5))
        requests.append(
            TokenTimeline(
                draw(st.integers(0, 4000)),
                draw(st.integers(0, 4000)),
                sent,
                times,
                end,
                draw(st.sampled_from(["", "failed after 2 tokens: cut"])),
                draw(st.booleans()),
            )
        )
    return timeline, requests


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_the_requests_idle_and_unassigned_joules_add_up_to_the_window(
    case: tuple[MeterTimeline, list[TokenTimeline]],
) -> None:
    timeline, requests = case
    split = attribute(timeline, requests)
    figures = [split.idle_j, split.unassigned_j, *(r.energy_j for r in split.requests)]
    assert all(math.isfinite(f) for f in figures)
    scale = sum(abs(s.joules) for s in timeline.slices) + split.idle_j + 1.0
    assert abs(sum(figures) - timeline.joules) <= 1e-9 * scale
    assert len(split.requests) == len(requests)
