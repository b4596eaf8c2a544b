"""A served workload in the report: its requests drawn over the window's power, coloured
by their attributed joules (issue 63, item 4), checked against the batching stand-in
engine whose energy is known (tests/fakes/batch_engine.py)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import pytest

from pytest_llmenergy.html import render_report
from pytest_llmenergy.html.served_chart import power_points, request_points, served_trial
from pytest_llmenergy.results import CaseResult, Trial
from pytest_llmenergy.storage.runfile import Run, RunFileError, dumps, loads
from tests.casefactory import make_case
from tests.fakes.fake_openai_server import Behaviour
from tests.test_request_energy import served


def served_case() -> CaseResult:
    """A case whose one trial replayed 30 requests against the stand-in engine."""
    run, _ = served("alpaca:rate=30,requests=30,scale=0.25,seed=5", Behaviour(), slice_s=0.05)
    split = run.attribution
    trial = Trial(
        index=1,
        seconds=sum(p.seconds for p in run.power),
        joules=split.window_j,
        net_joules=split.window_j - split.idle_j,
        joules_by_domain={"gpu:0": split.window_j},
        net_joules_by_domain={"gpu:0": split.window_j - split.idle_j},
        input_tokens=run.plan.input_tokens,
        output_tokens=run.plan.output_tokens,
        requests=run.requests,
        power=run.power,
    )
    return dataclasses.replace(make_case([trial.seconds]), trials=(trial,))


@pytest.fixture(scope="module")
def workload_case() -> CaseResult:
    return served_case()


def test_the_power_trace_is_the_windows_energy_over_time(workload_case: CaseResult) -> None:
    trial = served_trial(workload_case)
    assert trial is not None
    power = power_points(trial)
    assert len(power) >= 10  # 50 ms slices over a workload of about a second
    # the slices tile the window, and their energy is the window's: the truth it split
    assert all(a["end_s"] == pytest.approx(b["start_s"]) for a, b in itertools.pairwise(power))
    integral = sum(p["power_w"] * (p["end_s"] - p["start_s"]) for p in power)
    assert integral == pytest.approx(trial.joules, rel=1e-9)
    requests = request_points(trial)
    assert len(requests) == 30
    assert all(p["sent_s"] <= p["first_s"] <= p["end_s"] for p in requests)
    # every request ran inside the window the trace covers
    assert min(p["sent_s"] for p in requests) >= power[0]["start_s"]
    assert max(p["end_s"] for p in requests) <= power[-1]["end_s"] + 0.05
    assert sum(p["energy_j"] for p in requests) == pytest.approx(
        sum(q.energy_j or 0.0 for q in trial.requests)
    )


def test_the_report_draws_the_requests_over_the_power(workload_case: CaseResult) -> None:
    run = Run(
        "",
        "served",
        "2026-01-01T00:00:00Z",
        "complete",
        "hw",
        {},
        {},
        {},
        {},
        cases=(workload_case,),
    )
    page = render_report([run])
    specs = json.loads(re.search(r'id="llmenergy-specs">\s*(.*?)\s*</script>', page, re.S).group(1))
    spec = specs["served-0"]
    power, requests = spec["vconcat"]
    assert len(power["data"]["values"]) == len(power_points(workload_case.trials[0]))
    assert len(requests["data"]["values"]) == 30
    assert requests["layer"][0]["encoding"]["color"]["field"] == "energy_j"
    assert "Served workloads" in page and "J p50" in page  # the section and its table


def test_a_report_without_a_workload_draws_none() -> None:
    run = Run(
        "", "x", "2026-01-01T00:00:00Z", "complete", "hw", {}, {}, {}, {}, cases=(make_case([1.0]),)
    )
    assert "served-0" not in render_report([run])


def test_the_power_trace_survives_the_run_file(workload_case: CaseResult, tmp_path: Path) -> None:
    run = Run(
        "", "x", "2026-01-01T00:00:00Z", "complete", "hw", {}, {}, {}, {}, cases=(workload_case,)
    )
    back = loads(dumps(run), tmp_path / "x.json").cases[0]
    assert back.trials[0].power == workload_case.trials[0].power
    data = json.loads(dumps(run))
    data["cases"][0]["trials"][0]["power"][3]["end_s"] = -1.0
    with pytest.raises(RunFileError, match=r"power\[3\]\.end_s is -1\.0; it cannot be below 0"):
        loads(json.dumps(data), tmp_path / "y.json")
    first = data["cases"][0]["trials"][0]["power"][0]
    first["end_s"], first["start_s"] = 0.0, 0.5
    data["cases"][0]["trials"][0]["power"][3]["end_s"] = 1.0
    with pytest.raises(RunFileError, match=r"power\[0\] ends at 0\.0 s, before it starts"):
        loads(json.dumps(data), tmp_path / "z.json")
