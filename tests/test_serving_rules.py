"""ML.ENERGY's rules for a server's configurations (issue 48, item 1): the steady window
opens when the batch first holds the concurrency and closes ``requests - concurrency - 1``
finishes later; a window shorter than ``--llm-min-steady`` or a mean batch under
``--llm-min-batch-fill`` of the concurrency rejects the configuration, and a rejected
concurrency rejects the larger ones of its group.  The fake server's power follows its
batch (idle + W per generating request), so the steady window's true energy is known."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmenergy.case_tables import case_tables
from pytest_llmenergy.compare import UNSTABLE, CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.figures import value
from pytest_llmenergy.html.casedata import case_table
from pytest_llmenergy.results import STEADY, CaseResult, PhaseRecord, Trial
from pytest_llmenergy.serving.client import (
    Endpoint,
    EngineTime,
    engine_time_from_metrics,
    running_from_metrics,
)
from pytest_llmenergy.serving.steady import (
    CLIENT_COUNT,
    ENGINE_TIMES,
    SERVER_GAUGE,
    BatchSampler,
    BurstWatch,
    close_at,
)
from pytest_llmenergy.serving.target import ServerTarget
from pytest_llmenergy.serving_rules import rejections
from pytest_llmenergy.storage.runfile import loads
from tests.fakes.fake_openai_server import FakeServer, StaleGauge, frontend_gauge
from tests.test_plugin import assert_one_line_usage_error
from tests.test_serving import Prompts, served  # noqa: F401 - the fixture
from tests.test_serving_steady import IDLE_W, PER_REQUEST_W, TraceMeter, powered


# -- the window and its mean batch, on a scripted clock --------------------------------------
def _clock(times: list[float]) -> Iterator[float]:
    return iter(times)


def test_the_window_closes_as_ml_energy_closes_it() -> None:
    assert close_at(4, 4) == 1  # one wave: the first finish starts the drain
    assert close_at(10, 4) == 5  # the queue empties at the 6th finish; one early
    assert close_at(5, 4) == 1


def test_the_mean_batch_is_the_time_average_of_requests_generating() -> None:
    """Concurrency 4, 8 requests, a server that holds 2: two generate from t=0, the 3rd
    and 4th start as the first two end.  The window opens at the 4th first token (t=2)
    and closes at the 3rd finish (t=4); two generate all through it: batch 2 of 4."""
    t = iter([0.0, 0.0, 2.0, 2.0, 2.0, 2.0, 4.0, 4.0, 4.0, 4.0, 6.0, 6.0])
    marks: list[str] = []
    watch = BurstWatch(4, lambda phase, ending: marks.append(phase), lambda: next(t), requests=8)
    watch.first_token(), watch.first_token()  # 0, 0
    watch.finished(), watch.finished()  # 2, 2: two slots free
    watch.first_token(), watch.first_token()  # 2, 2: the 4th first token opens it
    watch.finished()  # 4: the 3rd finish closes it (8 - 4 - 1)
    watch.finished(), watch.first_token(), watch.first_token()
    watch.finished(), watch.finished()
    got = watch.result(1.0, min_batch_fill=0.85)
    assert marks == [STEADY, "drain"]
    assert got.seconds == 2.0 and got.batch == pytest.approx(2.0)
    fill = "its mean batch was 2 of 4 requests (50%; requests past their first token, as the"
    assert fill in got.unstable and "under --llm-min-batch-fill=85%" in got.unstable
    assert got.batch_source == CLIENT_COUNT
    # the server's own gauge, where it publishes one, is the batch
    served_batch = watch.result(1.0, min_batch_fill=0.85, server_batch=3.9)
    assert served_batch.batch == 3.9 and served_batch.batch_source == SERVER_GAUGE
    assert served_batch.unstable == ""
    assert "--max-num-seqs" in got.unstable
    assert watch.result(1.0, min_batch_fill=0.5).unstable == ""  # 50 % is enough for 50 %
    both = watch.result(5.0, min_batch_fill=0.85).unstable
    assert "lasted 2 s, less than --llm-min-steady=5 s" in both and "mean batch" in both


# -- the server's own batch: its running-requests gauge --------------------------------------
PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0 1732700000000
vllm:num_requests_waiting{engine="0",model_name="m"} 9.0
vllm:num_requests_running_total 40
sglang:num_running_reqs NaN
vllm:num_requests_running{engine="2"} -1
"""


def test_the_gauge_is_summed_over_engines_and_hostile_lines_are_skipped() -> None:
    assert running_from_metrics(PAGE) == 5.0  # timestamps, NaN, negatives, neighbours out
    assert running_from_metrics("sglang:num_running_reqs 4\n") == 4.0
    assert running_from_metrics("# nothing here\nfoo 1\n") is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('vlm:_nusqrtig{}="0123456789.e+-naNIf \n#'))))
def test_any_metrics_page_reads_as_a_count_or_none(text: str) -> None:
    got = running_from_metrics("vllm:num_requests_running" + text)
    assert got is None or (math.isfinite(got) and got >= 0)


ENGINE_PAGE = """\
vllm:request_inference_time_seconds_sum{engine="0",model_name="m"} 12.5
vllm:request_inference_time_seconds_sum{engine="1",model_name="m"} 2.5 1732700000000
vllm:request_inference_time_seconds_count{engine="0",model_name="m"} 30.0
vllm:request_inference_time_seconds_count{engine="1",model_name="m"} 6.0
vllm:request_inference_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 30.0
vllm:request_inference_time_seconds_sum{engine="2"} NaN
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 99.0
"""


def test_the_engines_request_time_is_summed_over_engines_and_hostile_lines_skipped() -> None:
    assert engine_time_from_metrics(ENGINE_PAGE) == EngineTime(15.0, 36)
    assert engine_time_from_metrics(PAGE) is None  # a gauge alone: no engine timings
    no_count = "vllm:request_inference_time_seconds_sum 3\n"
    assert engine_time_from_metrics(no_count) is None  # a sum without its count says nothing
    assert (
        engine_time_from_metrics(no_count + "vllm:request_inference_time_seconds_count 2.5\n")
        is None
    )


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('vlm:_nusqrtig{}="0123456789.e+-naNIf \n#'))))
def test_any_metrics_page_reads_as_engine_time_or_none(text: str) -> None:
    page = "vllm:request_inference_time_seconds_sum" + text
    got = engine_time_from_metrics(page + "\nvllm:request_inference_time_seconds_count 1e400")
    assert got is None  # an infinite count is no count
    got = engine_time_from_metrics(page + "\nvllm:request_inference_time_seconds_count 3")
    assert got is None or (math.isfinite(got.seconds) and got.seconds >= 0 and got.requests == 3)


def test_the_sampler_weighs_each_reading_by_how_long_it_held() -> None:
    """Each reading stands at its HTTP request's midpoint and holds until the next: a
    gauge read at uneven moments is averaged over time, not over readings."""
    values = iter([0.0, 2.0, 2.0, 1.0, 0.0] + [0.0] * 1000)
    # (asked, answered) per reading: midpoints 0, 1, 1.5, 4, 5; then far later
    moments = iter([0.0, 0.0, 0.8, 1.2, 1.5, 1.5, 3.0, 5.0, 5.0, 5.0, *range(100, 2100)])
    sampler = BatchSampler(lambda: next(values), interval_s=0.001, clock=lambda: next(moments))
    with sampler:
        deadline = time.monotonic() + 10.0  # a busy machine may schedule the thread late
        while len(sampler.samples) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sampler.samples[:5] == [(0.0, 0.0), (1.0, 2.0), (1.5, 2.0), (4.0, 1.0), (5.0, 0.0)]
    # 2 from t=1 to 4, then 1 to 5: (3 x 2 + 1 x 1) / 4; a plain mean would say 1.25
    assert sampler.mean(1, 5) == pytest.approx(7 / 4)
    # the reading before the window holds into it: 0 from 0.5 to 1, then as above to 4.5
    assert sampler.mean(0.5, 4.5) == pytest.approx((0 * 0.5 + 2 * 3 + 1 * 0.5) / 4)
    assert sampler.mean(2, 3.9) is None  # no reading inside: no mean
    assert sampler.mean(3, 4.5) is None  # one reading is no mean either


def test_a_gauge_outside_the_clients_counts_is_set_aside_for_the_clients_count() -> None:
    """Concurrency 2, 6 requests on a scripted clock: the client streams from 2 all
    through the window (t=1 to 4, closed by the 3rd finish), 2 in flight.  A gauge within
    GAUGE_SLACK of that is the batch; one that reads 0 (stale) or 4 (another client's
    requests) is not."""

    def watched() -> BurstWatch:
        t = iter([0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0])
        watch = BurstWatch(2, clock=lambda: next(t), requests=6)
        watch.sent(), watch.sent()  # 0, 0
        watch.first_token(), watch.first_token()  # 1, 1: the window opens
        watch.finished(), watch.sent(), watch.first_token()  # 2: refilled at once
        watch.finished(), watch.sent(), watch.first_token()  # 3
        watch.finished()  # 4: the 3rd finish closes it (6 - 2 - 1)
        assert watch.window == (1.0, 4.0)
        return watch

    assert watched().result(0.5, min_batch_fill=0.85).batch == pytest.approx(2.0)
    agree = watched().result(0.5, min_batch_fill=0.85, server_batch=1.6)
    assert (agree.batch, agree.batch_source, agree.batch_note) == (1.6, SERVER_GAUGE, "")
    stale = watched().result(0.5, min_batch_fill=0.85, server_batch=0.0)
    assert stale.batch == pytest.approx(2.0) and stale.batch_source == CLIENT_COUNT
    assert stale.batch_note.startswith("the server's running-requests gauge read 0, under ")
    assert stale.batch_note.endswith(": the batch is the client's count, 2")
    assert stale.unstable == ""  # the client's 2 of 2 is a full batch
    crowded = watched().result(0.5, min_batch_fill=0.85, server_batch=4.0)
    assert "over the 2 requests the client had in flight" in crowded.batch_note
    assert crowded.batch == pytest.approx(2.0)
    # a gauge set aside still names itself where the client's count rejects the burst
    low = watched().result(0.5, min_batch_fill=1.5, server_batch=0.0)
    assert "(100%; requests past their first token, as the client sees them; the " in low.unstable
    assert "gauge read 0, under the 2 requests" in low.unstable


def test_where_the_engine_publishes_its_timings_they_are_the_batch_and_the_gauge_checks() -> None:
    """Issue 54, item 6, on a scripted clock: concurrency 2, the client streams from 2
    and has 2 in flight (t=1 to 4).  Where the server publishes its engine's request
    times, the batch is the requests in flight x the share of their time the engine ran
    them (0.9: 1.8 of 2), whatever its gauge reads; a gauge within GAUGE_SLACK of it goes
    unnamed, one further away (set by a frontend behind its engine) is named; and the
    client's own count never decides where the engine's times exist."""

    def watched() -> BurstWatch:
        t = iter([0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0])
        watch = BurstWatch(2, clock=lambda: next(t), requests=6)
        watch.sent(), watch.sent()
        watch.first_token(), watch.first_token()
        watch.finished(), watch.sent(), watch.first_token()
        watch.finished(), watch.sent(), watch.first_token()
        watch.finished()
        return watch

    near = watched().result(0.5, min_batch_fill=0.85, server_batch=1.4, engine_share=0.9)
    assert (near.batch, near.batch_source, near.batch_note) == (
        pytest.approx(1.8),
        ENGINE_TIMES,
        "",
    )
    lagging = watched().result(0.5, min_batch_fill=0.85, server_batch=0.9, engine_share=0.9)
    assert lagging.batch == pytest.approx(1.8) and lagging.batch_source == ENGINE_TIMES
    assert lagging.batch_note.startswith(
        "the server's running-requests gauge read 0.9, where the engine's own request "
        "timings put 1.8 requests in its batch"
    )
    assert lagging.batch_note.endswith(": the batch is the engine timings', 1.8")
    assert lagging.unstable == ""  # 1.8 of 2 is 90 %
    # a server that holds 1 of the 2 the client keeps in flight: the engine ran them half
    # of their time, and the gauge agrees: the burst is rejected on the engine's timings
    held = watched().result(0.5, min_batch_fill=0.85, server_batch=1.0, engine_share=0.5)
    assert (held.batch, held.batch_source, held.batch_note) == (1.0, ENGINE_TIMES, "")
    assert (
        "its mean batch was 1 of 2 requests (50%; the client's requests in flight x the "
        "share of their time the engine ran them)" in held.unstable
    )
    no_gauge = watched().result(0.5, min_batch_fill=0.85, engine_share=0.5)
    assert (no_gauge.batch, no_gauge.batch_source) == (pytest.approx(1.0), ENGINE_TIMES)


# -- against a server whose power follows its batch ------------------------------------------
def test_a_concurrency_the_server_cannot_hold_is_rejected_and_its_window_measured() -> None:
    """A server that holds 2 (--max-num-seqs 2), asked for 4 at once over 12 requests:
    the window exists (the queue refills the batch) but holds 2, so the burst is
    rejected for its fill; its joules are still the stand-in's own over the window."""
    behaviour, trace = powered(max_num_seqs=2, prefill_s=0.005, token_s=0.004)
    with FakeServer(behaviour) as server:
        target = ServerTarget(
            Endpoint(server.url, "fake-model"), Prompts(), min_steady_s=0.05, requests=12
        )
        with TraceMeter(trace).measure() as window:
            burst = target.run(8, 20, 4)
    assert server.max_in_flight >= 4  # the client kept four in flight (five, as one ends)
    assert burst.queries == 12 and len(burst.requests) == 12
    assert 1.7 < burst.steady_batch < 2.1
    assert "mean batch was" in burst.unstable and "(4" not in burst.unstable[:20]
    steady = window.phases[STEADY]
    assert steady.joules == pytest.approx((IDLE_W + 2 * PER_REQUEST_W) * steady.seconds, rel=0.05)


def test_a_queue_that_keeps_the_batch_full_is_accepted_and_measured_at_full_power() -> None:
    """Concurrency 3 over 12 requests on a server without a limit: the window holds 3 all
    through (each finished request replaced at once), its power idle + 3 W."""
    behaviour, trace = powered(prefill_s=0.002, token_s=0.004)
    with FakeServer(behaviour) as server:
        target = ServerTarget(
            Endpoint(server.url, "fake-model"), Prompts(), min_steady_s=0.05, requests=12
        )
        with TraceMeter(trace).measure() as window:
            burst = target.run(8, 20, 3)
    assert burst.unstable == "", burst.unstable
    assert burst.steady_batch > 0.85 * 3
    steady = window.phases[STEADY]
    # the window spans about 12 - 3 - 1 = 8 finishes of 3 requests at a time: ~2.7 waves
    assert steady.seconds > 0.15
    assert steady.joules / steady.seconds == pytest.approx(IDLE_W + 3 * PER_REQUEST_W, rel=0.06)


@pytest.mark.parametrize(
    ("gauge", "rests_on_gauge", "named"),
    [
        (lambda server: 3.5, True, ""),  # prefills counted, a reading between: the batch
        (lambda server: server.generating / 2, False, "under the"),  # half of the batch
        (StaleGauge(60.0), False, "gauge read 0, under the"),  # never refreshed in time
        (lambda server: server.generating + 5, False, "over the"),  # another client's
    ],
    ids=["within", "half", "stale", "crowded"],
)
def test_the_servers_gauge_is_the_batch_where_it_agrees_with_the_client(
    gauge: Any, rests_on_gauge: bool, named: str
) -> None:
    """Issue 54, item 6: vLLM's gauge read 0 of 1 while the client streamed from one
    request all through the window, and every concurrency was rejected.  A server whose
    gauge strays from the client's counts (half, stale at 0, or more than it sent) has
    its batch from the client's count instead, and the burst names what the gauge read."""
    behaviour, _ = powered(prefill_s=0.002, token_s=0.004)
    behaviour.running_gauge = gauge
    with FakeServer(behaviour) as server:
        target = ServerTarget(
            Endpoint(server.url, "fake-model"), Prompts(), min_steady_s=0.05, requests=12
        )
        target.probe()
        assert target.batch_gauge
        burst = target.run(8, 100, 4)  # a window of ~0.8 s: readings every 0.1 s
    assert burst.unstable == "", burst.unstable
    if rests_on_gauge:
        assert (burst.steady_batch, burst.steady_batch_note) == (3.5, "")
    else:
        assert burst.steady_batch > 0.85 * 4  # the client's count: four streaming
        assert named in burst.steady_batch_note
        assert burst.steady_batch_note.endswith(
            f"the batch is the client's count, {burst.steady_batch:.3g}"
        )


@pytest.mark.parametrize("engine_timings", [True, False], ids=["engine-timed", "gauge-only"])
def test_a_frontend_behind_its_engine_is_seen_through_the_engines_own_timings(
    engine_timings: bool,
) -> None:
    """Issue 54, item 6, as it happened on vLLM's CPU build: at concurrency 1 every other
    response reached the client in one piece at its end (the API server behind its
    engine), so the gauge that API server sets, and the client's count of requests
    streaming, both read about half a request while the engine ran one all the time.
    With the engine's own request times on /metrics the batch is the engine's (about 1
    of 1, accepted) and the note names the gauge's reading; without them the burst is
    rejected on a gauge the client's count agrees with, as the failing tier was."""
    behaviour, _ = powered(prefill_s=0.002, token_s=0.004)
    behaviour.running_gauge = frontend_gauge
    behaviour.whole_every = 2
    behaviour.engine_timings = engine_timings
    with FakeServer(behaviour) as server:
        target = ServerTarget(
            Endpoint(server.url, "fake-model"), Prompts(), min_steady_s=0.05, requests=12
        )
        target.probe()
        assert target.batch_gauge and target.engine_timed is engine_timings
        burst = target.run(8, 60, 1)  # ~0.25 s a request, ~2.5 s a window
    whole = [r for r in burst.requests if r.ttft_s > 0.9 * r.latency_s]
    assert 4 <= len(whole) <= 8  # about every other response came whole
    if engine_timings:
        assert burst.steady_batch > 0.9, burst.steady_batch_note
        assert burst.unstable == ""
        assert burst.steady_batch_note.startswith("the server's running-requests gauge read 0.")
        assert "the batch is the engine timings'" in burst.steady_batch_note
    else:
        assert 0.3 < burst.steady_batch < 0.7
        assert "; the server's running-requests gauge), under --llm-min-batch" in burst.unstable


# -- whole configurations: the group rule ----------------------------------------------------
class _Conf:
    confidence = 0.95
    min_time = 0.0


def _case(c: int, unstable: str = "", n_out: int = 40, model: str = "m") -> CaseResult:
    trials = tuple(
        Trial(
            i + 1, 2.0, j, j, {"gpu:0": j}, {"gpu:0": j}, 8, n_out, queries=c,
            phases={STEADY: PhaseRecord(1.0, j / 2, {"gpu:0": j / 2})},
            steady_tokens=100, unstable=unstable, steady_batch=c * 0.5 if unstable else c,
        )
        for i, j in enumerate([100.0, 101.0, 99.0, 100.0])
    )  # fmt: skip
    labels = {"model": model, **({"concurrency": str(c)} if c > 1 else {})}
    node = f"t.py::t[{model}-in8-out{n_out}-c{c}]"
    return CaseResult(node, node.split("::")[1], labels, 8, n_out, "rounds", _Conf(), trials)


def test_a_rejected_concurrency_rejects_the_larger_ones_of_its_group_only() -> None:
    cases = [
        _case(1),
        _case(2),
        _case(4, "its mean batch was 2 of 4 requests (50%)"),
        _case(8),  # passed on its own: the group rule rejects it
        _case(16, "the batch never held all 16 requests"),  # keeps its own reason
        _case(8, n_out=64),  # another group (other tokens): untouched
        _case(8, model="other"),  # another model: untouched
    ]
    got = rejections(cases)
    assert sorted(got) == sorted(c.nodeid for c in cases[2:5])
    own = got[cases[2].nodeid]
    assert own.by == "" and own.reason == "4 of 4 bursts: its mean batch was 2 of 4 requests (50%)"
    carried = got[cases[3].nodeid]
    assert carried.by == cases[2].nodeid
    assert "its group's concurrency 4 was rejected (t[m-in8-out40-c4])" in carried.reason
    assert "ML.ENERGY's group rule" in carried.reason
    assert got[cases[4].nodeid].reason.endswith("the batch never held all 16 requests")
    # shown: a note per rejected configuration, the carried one included
    notes = [n for t in case_tables(cases) for n in t.notes]
    carried_note = "out40-c8: rejected, not gated: its group's concurrency 4"
    assert any(carried_note in n for n in notes), notes
    assert sum("rejected, not gated" in n for n in notes) == 3
    html_notes = case_table([("run", cases)]).notes  # the HTML report's case table
    assert sum("rejected, not gated" in n for n in html_notes) == 3
    assert any("its group's concurrency 4" in n for n in html_notes)
    # never gated: the carried one's regression is spared, its neighbour's is not
    worse = [dataclass_scaled(c, 2.0) for c in cases]
    c = compare_cases(cases, worse, CompareOptions(gates=parse_gates("j_per_token:5%")))
    verdicts = {d.nodeid: d.verdict for d in c.deltas if d.metric == "j_per_token"}
    assert verdicts[cases[3].nodeid] == UNSTABLE
    assert verdicts[cases[1].nodeid] == "FAIL"


def dataclass_scaled(case: CaseResult, factor: float) -> CaseResult:
    """The case with every trial's joules times ``factor``."""
    import dataclasses

    trials = tuple(
        dataclasses.replace(
            t,
            joules=t.joules * factor,
            net_joules=t.net_joules * factor,
            joules_by_domain={k: v * factor for k, v in t.joules_by_domain.items()},
            net_joules_by_domain={k: v * factor for k, v in t.net_joules_by_domain.items()},
        )
        for t in case.trials
    )
    return dataclasses.replace(case, trials=trials)


# -- the suite, as users run it --------------------------------------------------------------
def test_a_sweep_against_a_frontend_behind_its_engine_rests_on_the_engines_timings(
    served: pytest.Pytester,  # noqa: F811 - test_serving's fixture
) -> None:
    """Issue 54, item 6, the way users run it, against a server that behaves as vLLM's
    CPU build did in the failing tier: it holds 2, its API server passes every third
    response on whole at its end, the gauge it sets lags the engine, and its engine's
    request times are on /metrics.  --llm-concurrency=1,2,4 over 10 requests a burst:
    concurrency 1 and 2 are accepted (their batch the engine's wherever the gauge strays,
    named), 4 is rejected for its fill (in the table's notes and the run file); the header
    says what the batch rests on, and the run keeps every trial."""
    behaviour, _ = powered(model="tiny", max_num_seqs=2, prefill_s=0.003, token_s=0.004)
    behaviour.running_gauge = frontend_gauge
    behaviour.whole_every = 3
    behaviour.engine_timings = True
    with FakeServer(behaviour) as s:
        result = served.runpytest_subprocess(
            f"--llm-endpoint={s.url}",
            "--llm-model=tiny-llama",
            "--llm-input-tokens=16",
            "--llm-concurrency=1,2,4",
            "--llm-requests=10",
            "--llm-min-steady=20ms",
            "--energy-backend=estimate",
            "--energy-max-trials=3",
            "--energy-json=run.json",
            "-p",
            "no:randomly",
        )
    out = result.stdout.str()
    assert result.ret == 0, out
    said = " ".join(line.strip() for line in result.stdout.lines)  # as the terminal wraps
    for words in (
        "bursts (10 requests a burst, the concurrency at once) are also measured",
        "than 0.02 s or a mean batch under 85% of the concurrency rejects",
        "request timings (vLLM's inference-time totals) x the requests in flight, checked",
    ):
        assert words in said, out
    result.stdout.fnmatch_lines(
        ["*-c4*: rejected, not gated: * bursts: its mean batch was * of 4 *"]
    )
    run = loads((served.path / "run.json").read_text(), served.path / "run.json")
    by = {c.labels.get("concurrency", "1"): c for c in run.cases}
    assert by["4"].unstable and not by["2"].unstable and not by["1"].unstable, out
    assert value(by["1"], "steady_batch") > 0.85 and value(by["2"], "steady_batch") > 1.7
    notes = [t.steady_batch_note for c in (by["1"], by["2"]) for t in c.trials]
    assert any(notes), "no burst's gauge strayed: the stand-in's frontend did not lag"
    assert all("the batch is the engine timings'" in n for n in notes if n)
    assert value(by["4"], "steady_batch") < 0.85 * 4
    assert all(t.queries == 10 for c in run.cases for t in c.trials)
    raw = json.loads((served.path / "run.json").read_text())
    assert raw["options"]["serve_endpoint"]["engine_timed"] is True
    assert raw["options"]["requests"] == 10 and raw["options"]["min_batch_fill"] == 0.85


def test_a_sweep_against_a_stale_gauge_rests_on_the_clients_count_and_says_so(
    served: pytest.Pytester,  # noqa: F811 - test_serving's fixture
) -> None:
    """Issue 54, item 6, the way users run it: the same sweep against a server holding 2
    whose gauge is never refreshed within a burst (it reads 0, as vLLM's read 0 of 1 and
    0 of 2 in the failing tier).  Concurrency 1 and 2 are accepted on the client's count,
    4 is rejected on it; every burst's note names the gauge's reading, in the table's
    notes and the run file."""
    behaviour, _ = powered(model="tiny", max_num_seqs=2, prefill_s=0.003, token_s=0.003)
    behaviour.running_gauge = StaleGauge(3600.0)
    with FakeServer(behaviour) as s:
        result = served.runpytest_subprocess(
            f"--llm-endpoint={s.url}",
            "--llm-model=tiny-llama",
            "--llm-input-tokens=16",
            "--llm-concurrency=1,2,4",
            "--llm-requests=10",
            "--llm-min-steady=20ms",
            "--energy-backend=estimate",
            "--energy-max-trials=3",
            "--energy-json=run.json",
            "-p",
            "no:randomly",
        )
    out = result.stdout.str()
    assert result.ret == 0, out
    said = " ".join(line.strip() for line in result.stdout.lines)  # as the terminal wraps
    assert "gauge on /metrics), checked against the client's counts: where it strays from" in said
    result.stdout.fnmatch_lines(
        [
            "*in16-out32-c4*: rejected, not gated: * bursts: its mean batch was * of 4 "
            "requests (*; requests past their first token, as the client sees them*",
        ]
    )
    for name in ("in16-out32", "in16-out32-c2"):  # concurrency 1's name has no suffix
        result.stdout.fnmatch_lines(
            [
                f"*-{name}: * of 3 bursts: the server's running-requests gauge read 0, under "
                "the * requests the client was streaming tokens from: the batch is the "
                "client's count, *"
            ]
        )
        assert f"-{name}: rejected" not in out
    run = loads((served.path / "run.json").read_text(), served.path / "run.json")
    by = {c.labels.get("concurrency", "1"): c for c in run.cases}
    assert by["4"].unstable and not by["2"].unstable and not by["1"].unstable
    assert 1.6 < value(by["2"], "steady_batch") <= 2.05
    # a window too short for two readings has no gauge to judge: the client's, unnamed
    notes = {n: [t.steady_batch_note for t in c.trials] for n, c in by.items()}
    # (concurrency 4's bursts, rejected for their fill, may all be that short)
    assert any(notes["1"]) and any(notes["2"]), notes
    assert all(n.startswith("the server's running-requests gauge read 0, under ")
               for case in notes.values() for n in case if n)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--llm-min-batch-fill=150%",), "--llm-min-batch-fill=150%"),
        (("--llm-requests=1e400",), "--llm-requests=1e400"),
        (("-o", "llmenergy_min_batch_fill=x"), "llmenergy_min_batch_fill = x (ini)"),
        (("-o", "llmenergy_requests=-3"), "llmenergy_requests = -3 (ini)"),
    ],
)
def test_bad_rule_options_are_one_line(
    served: pytest.Pytester,  # noqa: F811 - test_serving's fixture
    args: tuple[str, ...],
    named: str,
) -> None:
    result = served.runpytest_subprocess(
        "--llm-endpoint=http://127.0.0.1:9", "--llm-model=tiny-llama", *args
    )
    assert_one_line_usage_error(result, named)
