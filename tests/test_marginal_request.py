"""One more request's marginal joules, by paired bursts with it and without it, beside its
attributed share: the pairs and the interval on known numbers, then a stand-in engine
whose every step's energy is known (tests/fakes/batch_engine.py).

The figures: run ``test_the_margin_on_a_stand_in_engine`` with ``-s``.
"""

from __future__ import annotations

import random

import pytest

from pytest_llmenergy.pairing.marginal import (
    WITH,
    WITHOUT,
    Burst,
    differences,
    estimate,
    marginal_table,
    measure_marginal,
    paired_turns,
    served_bursts,
    with_request,
)
from pytest_llmenergy.serving.client import Endpoint
from pytest_llmenergy.serving.workload_plan import PlannedRequest, WorkloadPlan, parse_workload
from pytest_llmenergy.tables import render
from tests.fakes.batch_engine import BatchEngine
from tests.fakes.fake_openai_server import Behaviour, FakeServer
from tests.fakes.scripted import TraceMeter
from tests.test_request_energy import COSTS, FIRST_ID, prompt_for

EXTRA = PlannedRequest(index=0, arrival_s=0.05, input_tokens=200, output_tokens=40)


def plan_of(requests: list[PlannedRequest]) -> WorkloadPlan:
    return WorkloadPlan(parse_workload("alpaca"), tuple(requests))


# -- the pairs -------------------------------------------------------------------------------
def test_the_turns_are_abba_blocks_giving_the_pairs_asked() -> None:
    turns = paired_turns(6, random.Random(3))
    assert len(turns) == 12
    for start in range(0, 12, 4):
        assert tuple(turns[start : start + 4]) in (
            (WITHOUT, WITH, WITH, WITHOUT),
            (WITH, WITHOUT, WITHOUT, WITH),
        )


def test_each_pair_is_with_minus_without() -> None:
    turns = [WITHOUT, WITH, WITH, WITHOUT, WITH, WITHOUT, WITHOUT, WITH]
    joules = [10.0, 15.0, 16.0, 10.5, 14.0, 9.0, 9.5, 15.5]
    assert differences(turns, [Burst(j) for j in joules]) == [5.0, 5.5, 5.0, 6.0]


def test_the_interval_holds_a_known_margin_beside_the_share() -> None:
    rng = random.Random(1)
    turns = paired_turns(10, rng)
    drift = [0.02 * i for i in range(len(turns))]  # a machine warming up
    bursts = [
        Burst(100 + d + rng.gauss(0, 0.3) + (7.0 if t == WITH else 0.0), 9.0 if t == WITH else None)
        for t, d in zip(turns, drift)
    ]
    found = estimate(turns, bursts, EXTRA)
    assert found.marginal.low < 7.0 < found.marginal.high
    assert found.marginal.high - found.marginal.low < 1.0
    assert found.share is not None and found.share.mean == pytest.approx(9.0)
    assert "marginal 6.99 J [6.64, 7.33] (95%, 10 pairs)" in found.text()
    assert "its attributed share 9 J" in found.text()


def test_a_failed_request_and_a_fitted_idle_are_said() -> None:
    turns = paired_turns(2, random.Random(0))
    bursts = [Burst(10.0 + (2.0 if t == WITH else 0.0), None, idle_measured=False) for t in turns]
    found = estimate(turns, bursts, EXTRA)
    assert found.share is None
    assert "idle power fitted" in found.note and "failed in 2 bursts" in found.note
    with pytest.raises(ValueError, match="two pairs"):
        estimate(turns[:2], bursts[:2], EXTRA)


def test_the_added_request_keeps_the_arrival_order() -> None:
    base = plan_of([PlannedRequest(i, 0.1 * i, 10, 10) for i in range(3)])
    added, place = with_request(base, EXTRA)
    assert [r.arrival_s for r in added.requests] == [0.0, 0.05, 0.1, 0.2]
    assert place == 1 and added.requests[place].index == 3  # its own prompt


# -- a stand-in engine -----------------------------------------------------------------------
def test_the_margin_on_a_stand_in_engine() -> None:
    """Six requests of 80 output tokens decode together; one more of 200 input and 40
    output tokens joins them and leaves before they end.  Its margin is its prompt and its
    per-request part of each step (0.03 J x 200 + 0.05 J x 39 = 7.95 J): the steps' fixed
    0.8 J is paid with it or without it.  Its share carries 1/7 of each step besides."""
    base = plan_of([PlannedRequest(i, 0.0, 40, 80) for i in range(6)])
    engine = BatchEngine(COSTS)
    meter = TraceMeter({"gpu:0": engine.trace})
    meter.measure_idle(0.1)
    truth: list[float] = []
    try:
        with FakeServer(Behaviour(engine=engine)) as server:
            endpoint = Endpoint(server.url, "fake-model", timeout_s=30)
            run = served_bursts(meter, endpoint, base, EXTRA, prompt_for)

            def burst(extra: bool) -> Burst:
                measured = run(extra)
                rows = range(len(base.requests) + extra)
                truth.append(sum(engine.truth[FIRST_ID + i].energy_j for i in rows))
                return measured

            found = measure_marginal(burst, EXTRA, pairs=6, seed=2)
    finally:
        engine.stop()
    turns = paired_turns(6, random.Random(2))
    true_margin = differences(turns, [Burst(j) for j in truth])
    by_hand = COSTS.prefill_j_per_token * EXTRA.input_tokens + COSTS.step_j_per_request * (
        EXTRA.output_tokens - 1
    )
    print(render([marginal_table([found])], "table", width=120))
    print(f"true margin per pair: {[round(d, 3) for d in true_margin]}; by hand {by_hand:.3f} J")
    m = found.marginal
    assert m.mean == pytest.approx(sum(true_margin) / len(true_margin), abs=0.1)
    assert m.low <= by_hand + 0.1 and by_hand - 0.1 <= m.high
    assert found.share is not None and found.share.low > m.high  # the share is dearer
