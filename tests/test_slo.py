"""The best configuration under a latency limit (issue 48, item 3): the time-energy front
over a sweep's configurations and the minimum-energy one meeting ``--llm-slo``, checked
against brute force on the points, and shown in the terminal, the run and the report."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmenergy.cli import main
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.frontier import pareto_front
from pytest_llmenergy.frontier.slo import (
    ITL,
    STEADY,
    TTFT,
    WHOLE,
    Configuration,
    Limit,
    choose,
    excess,
    meets,
    parse_slo,
    saved_limits,
    slo_text,
    sweeps,
)
from pytest_llmenergy.html.page import render_report
from pytest_llmenergy.meters.validity import Telemetry
from pytest_llmenergy.results import OOM, CaseResult, PhaseRecord, RequestRecord
from pytest_llmenergy.results import STEADY as STEADY_PHASE
from pytest_llmenergy.storage.runfile import load
from tests.casefactory import make_case, synthetic_run
from tests.fakes.fake_openai_server import Behaviour, FakeServer
from tests.test_plugin import assert_one_line_usage_error
from tests.test_serving import served  # noqa: F401 - the fixture

# small grids, so that ties (equal latencies, equal energies, equal points) are common
TIMES = st.sampled_from([0.01, 0.02, 0.03, 0.05, 0.08])
ENERGIES = st.sampled_from([0.1, 0.2, 0.3, 0.5])
POINTS = st.lists(st.tuples(TIMES, st.one_of(st.none(), TIMES), ENERGIES), min_size=0, max_size=8)


def configurations(raw: list[tuple[float, float | None, float]]) -> list[Configuration]:
    return [
        Configuration(f"t[c{i}]", f"c{i}", itl, ttft, j, (1, i, ""))
        for i, (itl, ttft, j) in enumerate(raw)
    ]


def dominated(p: Configuration, points: list[Configuration]) -> bool:
    return any(
        q.itl_s <= p.itl_s
        and q.j_per_out_token <= p.j_per_out_token
        and (q.itl_s < p.itl_s or q.j_per_out_token < p.j_per_out_token)
        for q in points
    )


# -- the front and the choice, against brute force ---------------------------------------------
@settings(max_examples=150, deadline=None)
@given(POINTS)
def test_the_front_is_every_point_no_other_dominates(raw: list) -> None:
    points = configurations(raw)
    front = pareto_front(points)
    assert {p.nodeid for p in front} == {p.nodeid for p in points if not dominated(p, points)}
    assert [p.itl_s for p in front] == sorted(p.itl_s for p in front)  # fastest first
    assert len(front) == len({p.nodeid for p in front})


@settings(max_examples=150, deadline=None)
@given(POINTS, TIMES, st.one_of(st.none(), TIMES))
def test_the_choice_is_the_least_energy_among_the_points_meeting_every_limit(
    raw: list, itl_max: float, ttft_max: float | None
) -> None:
    points = configurations(raw)
    limits = (Limit(ITL, itl_max), *([Limit(TTFT, ttft_max)] if ttft_max else []))
    feasible = [
        p
        for p in points
        if p.itl_s <= itl_max and (ttft_max is None or (p.ttft_s or math.inf) <= ttft_max)
    ]
    choice = choose(points, limits)
    if feasible:
        assert choice.chosen in feasible and choice.closest is None
        assert choice.chosen.j_per_out_token == min(p.j_per_out_token for p in feasible)
        tied = [p for p in feasible if p.j_per_out_token == choice.chosen.j_per_out_token]
        assert choice.chosen.itl_s == min(p.itl_s for p in tied)  # a tie: the faster
    else:
        assert choice.chosen is None
        assert (choice.closest is None) == (not points)
        if points:
            assert excess(choice.closest, limits) == min(excess(p, limits) for p in points)
            assert not meets(choice.closest, limits)


def test_one_point_and_none() -> None:
    (one,) = configurations([(0.05, 0.2, 0.3)])
    assert pareto_front([one]) == [one]
    assert choose([one], parse_slo("itl:50ms")).chosen == one
    missed = choose([one], parse_slo("itl:40ms"))
    assert missed.chosen is None and missed.closest == one
    assert excess(one, parse_slo("itl:40ms")) == pytest.approx(1.25)
    assert choose([], parse_slo("itl:40ms")) == dataclasses.replace(missed, closest=None)
    assert pareto_front([]) == []
    # a latency not measured meets no limit on it
    (blind,) = configurations([(0.01, None, 0.1)])
    assert not meets(blind, parse_slo("ttft:10s")) and meets(blind, parse_slo("itl:10ms"))


# -- the limits ----------------------------------------------------------------------------------
def test_limits_are_read_in_ms_or_s_and_written_back() -> None:
    limits = parse_slo("itl:100ms, TTFT:2s")
    assert limits == (Limit(ITL, 0.1), Limit(TTFT, 2.0))
    assert slo_text(limits) == "itl:100ms,ttft:2s"
    assert parse_slo(slo_text(limits)) == limits
    assert parse_slo("itl:0.25") == (Limit(ITL, 0.25),)  # seconds without a unit


@pytest.mark.parametrize(
    "text",
    ["itl:", "itl:-1ms", "itl:0ms", "itl:1e400ms", "itl:nanms", "foo:1s", "nan", "", "itl",
     "itl:100ms,", "itl:1s,itl:2s", "itl:100us", "itl:1s\nttft:2s"],
)  # fmt: skip
def test_bad_limits_are_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_slo(text)
    assert "\n" not in str(info.value).replace("\\n", "")


@pytest.mark.parametrize(
    "saved,expected,noted",
    [(None, (), False), ("", (), False), ("itl:100ms", (Limit(ITL, 0.1),), False),
     ("itl:-5ms", (), True), (5, (), True), (["itl:1s"], (), True)],
)  # fmt: skip
def test_a_run_files_limits_are_read_safely(saved: object, expected: tuple, noted: bool) -> None:
    limits, note = saved_limits({"slo": saved})
    assert limits == expected and bool(note) == noted


# -- cases into sweeps ---------------------------------------------------------------------------
def served_case(
    concurrency: int,
    tpot_s: float,
    watts: float,
    *,
    steady: bool = True,
    **kw: object,
) -> CaseResult:
    """A burst of ``concurrency`` 16 -> 32 token requests at ``tpot_s`` each."""
    case = make_case([1.0, 1.0, 1.0], input_tokens=16, output_tokens=32, watts=watts)
    request = RequestRecord(0.05, 0.05 + 31 * tpot_s, 32)
    phases = {STEADY_PHASE: PhaseRecord(0.5, watts * 0.2, {"gpu:0": watts * 0.2})}
    trials = tuple(
        dataclasses.replace(
            t,
            queries=concurrency,
            requests=(request,) * concurrency,
            phases=phases if steady else {},
            steady_tokens=100 if steady else 0,
        )
        for t in case.trials
    )
    labels = {**case.labels, **({"concurrency": str(concurrency)} if concurrency > 1 else {})}
    suffix = f"-c{concurrency}" if concurrency > 1 else ""
    base = dict(
        nodeid=case.nodeid.replace("]", f"{suffix}]"),
        name=case.name.replace("]", f"{suffix}]"),
        labels=labels,
        trials=trials,
    )
    return dataclasses.replace(case, **{**base, **kw})


def test_cases_differing_in_concurrency_are_one_sweep_with_left_out_configurations() -> None:
    invalid = Telemetry(("gpu:0",), (), 2.0, False, reason="gpu:0 never read")
    cases = [
        served_case(1, 0.010, 100.0, steady=False),
        served_case(2, 0.012, 120.0),
        served_case(4, 0.020, 130.0),
        served_case(8, 0.030, 400.0),  # slower and dearer than c4: off the front
        served_case(16, 0.040, 90.0, status=OOM, trials=(), reason="out of memory"),
    ]
    cheap = served_case(32, 0.05, 10.0)
    trials = tuple(dataclasses.replace(t, telemetry=invalid) for t in cheap.trials)
    cases.append(dataclasses.replace(cheap, trials=trials))
    (sweep,) = sweeps([*cases, make_case([1.0])], parse_slo("itl:15ms"))  # one case alone: none
    assert sweep.energy == WHOLE  # c1 has no steady window: every point the whole query's
    assert [p.setting for p in sweep.points] == ["c1", "c2", "c4", "c8"]
    assert [p.setting for p in sweep.front] == ["c1", "c2", "c4"]
    assert {o.setting: o.reason for o in sweep.left_out} == {
        "c16": "not measured: out of memory",
        "c32": "3 of 3 trials with invalid power telemetry",
    }
    # energy per output token: 100 W x 1 s per trial, over c queries of 32 tokens
    assert sweep.points[1].j_per_out_token == pytest.approx(120.0 / 2 / 32)
    assert sweep.choice is not None and sweep.choice.chosen is not None
    assert sweep.choice.chosen.setting == "c2"  # c4 is cheaper, but 20 ms
    # without c1, every configuration has a steady window: ML.ENERGY's figure
    (steady,) = sweeps(cases[1:4])
    assert steady.energy == STEADY and steady.choice is None
    assert steady.points[0].j_per_out_token == pytest.approx(120.0 * 0.2 / 100)


def test_a_rejected_configuration_is_left_out_with_its_reason() -> None:
    unstable = served_case(4, 0.02, 50.0)
    why = "the batch never held all 4"
    trials = tuple(dataclasses.replace(t, unstable=why) for t in unstable.trials)
    unstable = dataclasses.replace(unstable, trials=trials)
    (sweep,) = sweeps([served_case(2, 0.01, 100.0), unstable], parse_slo("itl:1s"))
    assert [p.setting for p in sweep.points] == ["c2"]
    (left,) = sweep.left_out
    assert left.setting == "c4" and "rejected: 3 of 3 bursts: the batch never held" in left.reason
    assert sweep.choice.chosen.setting == "c2"  # the cheaper c4 is not chosen


def test_local_batches_use_the_decode_time_per_token() -> None:
    one = make_case([1.0, 1.0], output_tokens=5)  # decode 0.75 s for 4 tokens
    eight = dataclasses.replace(
        one,
        nodeid=one.nodeid.replace("]", "-bs8]"),
        labels={**one.labels, "batch_size": "8"},
        trials=tuple(dataclasses.replace(t, queries=8) for t in one.trials),
    )
    (sweep,) = sweeps([one, eight], parse_slo("itl:1s,ttft:1s"))
    assert [p.setting for p in sweep.points] == ["bs1", "bs8"]
    assert sweep.points[0].itl_s == pytest.approx(0.75 / 4)
    assert sweep.points[0].ttft_s == pytest.approx(0.25)
    assert sweep.points[1].j_per_out_token == pytest.approx(100.0 / 8 / 5)
    assert sweep.choice.chosen.setting == "bs8"


# -- the report ------------------------------------------------------------------------------------
def test_the_html_report_has_the_section_with_every_name_escaped() -> None:
    evil = "<img src=x onerror=alert(1)>"
    cases = [
        dataclasses.replace(c, labels={**c.labels, "model": evil})
        for c in (served_case(1, 0.01, 100.0), served_case(2, 0.02, 90.0))
    ]
    run = dataclasses.replace(synthetic_run(0, name="slo"), cases=tuple(cases))
    run = dataclasses.replace(run, options={**run.options, "slo": "itl:5ms"})
    page = render_report([run])
    assert "<h2>The best configuration under a latency limit</h2>" in page
    assert "minimum-energy configuration under itl:5ms" in page
    assert evil not in page
    assert "none meets it; closest: c1" in page


# -- as users run it -------------------------------------------------------------------------------
@pytest.fixture
def in_process() -> None:
    """What a served session imports, imported here first: an in-process session forgets
    the modules it imported, and torch cannot be imported twice in one process."""
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer  # noqa: F401


@pytest.mark.usefixtures("in_process")
def test_a_served_sweep_shows_the_front_and_the_choice_and_keeps_the_limits(
    served: pytest.Pytester,  # noqa: F811 - test_serving's fixture
    capsys: pytest.CaptureFixture[str],
) -> None:
    with FakeServer(Behaviour(model="tiny", prefill_s=0.01, token_s=0.002)) as s:
        result = served.runpytest(
            f"--llm-endpoint={s.url}",
            "--llm-model=tiny-llama",
            "--llm-input-tokens=16",
            "--llm-concurrency=1,2,4",
            "--llm-min-steady=10ms",
            "--llm-slo=itl:1s",
            "--energy-backend=estimate",
            "--energy-max-trials=2",
            "--energy-json=run.json",
            "-p",
            "no:randomly",
        )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*llmenergy: the best configuration under a latency limit*",
            "*time-energy front over configurations*",
            "*tiny-llama input in16-out32*c1*whole query*yes",  # meets 1 s
            "*minimum-energy configuration under itl:1s*",
            "*tiny-llama input in16-out32*3*c*",
        ]
    )
    path = served.path / "run.json"
    assert json.loads(path.read_text())["options"]["slo"] == "itl:1s"
    (sweep,) = sweeps(load(path).cases, saved_limits(load(path).options)[0])
    assert sweep.choice.chosen is not None  # every one meets 1 s
    assert sweep.choice.chosen.j_per_out_token == min(p.j_per_out_token for p in sweep.points)
    capsys.readouterr()
    assert main(["show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "minimum-energy configuration under itl:1s" in shown
    assert f"{sweep.choice.chosen.setting} " in shown.split("under itl:1s", 1)[1]


def test_a_bad_limit_stops_the_session_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--llm-slo=itl:-1ms")
    assert_one_line_usage_error(result, "--llm-slo=itl:-1ms: itl: expected seconds > 0")
    pytester.makeini("[pytest]\nllmenergy_slo = foo:1s\n")
    result = pytester.runpytest()
    assert_one_line_usage_error(result, "llmenergy_slo = foo:1s (ini): expected limits such as")
