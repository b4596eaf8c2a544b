"""The validity of a sampling meter's power telemetry (meters/validity.py): every device
read, no longer hole than the allowed gap, the window's edges covered, and the counter
against the trapezoid integral where a domain has both; an invalid case is marked, never
gated."""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import replace
from html import escape
from typing import Any

import pytest

from pytest_llmenergy import open_meter
from pytest_llmenergy.case_tables import case_tables, cell
from pytest_llmenergy.compare import INVALID_TELEMETRY, CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.controller.benchmark import CaseIdentity, EnergyBenchmark
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import FIGURES
from pytest_llmenergy.html import render_report
from pytest_llmenergy.meters.readings import Domain, Measurement, Method, PowerSample
from pytest_llmenergy.meters.validity import Telemetry, judge
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.storage.runfile import RunFileError, case_dict, decode_trial, dumps, loads
from tests.casefactory import make_case
from tests.fakes.fake_pynvml import NVML_DEVICE_ARCH_PASCAL, FakeGPU, fake_uuid, install_fake_pynvml
from tests.fakes.trace import PowerTrace
from tests.test_storage_runfile import sample_run

SAMPLED = {f"gpu:{i}": Domain(f"gpu:{i}", Method.SAMPLED) for i in range(2)}


def window(
    samples: list[PowerSample],
    t0: float = 0.0,
    t1: float = 10.0,
    domains: dict[str, Domain] = SAMPLED,
    by_domain: dict[str, float] | None = None,
) -> Measurement:
    return Measurement(
        seconds=t1 - t0,
        by_domain=by_domain or dict.fromkeys(domains, 0.0),
        domains=domains,
        samples=tuple(samples),
        t_start=t0,
        t_end=t1,
        backend="trace",
    )


def sampled(
    trace: PowerTrace,
    domains: tuple[str, ...],
    times: list[float],
    skip: tuple[float, float] = (0, 0),
) -> list[PowerSample]:
    """The trace read at ``times`` for ``domains``, none read within ``skip``."""
    return [
        PowerSample(t, {d: trace.power_at(t) for d in domains})
        for t in times
        if not skip[0] < t < skip[1]
    ]


def every(step_s: float, t0: float = 0.0, t1: float = 10.0) -> list[float]:
    return [t0 + i * step_s for i in range(round((t1 - t0) / step_s) + 1)]


# -- one window judged --------------------------------------------------------------------
def test_a_trace_with_a_3_s_hole_and_a_gpu_never_read_is_invalid() -> None:
    trace = PowerTrace([(4.0, 300.0), (60.0, 200.0)], origin=0.0)
    # gpu:0 sampled every 100 ms but not from 3 s to 6 s; gpu:1 never answered
    samples = sampled(trace, ("gpu:0",), every(0.1), skip=(3.05, 5.95))
    v = judge(window(samples))
    assert v is not None and not v.valid
    assert v.devices == ("gpu:0", "gpu:1") and v.read == ("gpu:0",)
    assert v.max_gap_s == pytest.approx(3.0)
    assert v.covered and v.counter_vs_integral is None
    assert v.reason == "gpu:1 never read; gpu:0 went 3 s without a sample (at most 1 s)"
    # a wider allowance forgives the hole, never the missing GPU
    wide = judge(window(samples), max_gap_s=5.0)
    assert wide is not None and wide.reason == "gpu:1 never read"


def test_a_clean_trace_is_valid() -> None:
    trace = PowerTrace([(4.0, 300.0), (60.0, 200.0)], origin=0.0)
    v = judge(window(sampled(trace, ("gpu:0", "gpu:1"), every(0.1))))
    assert v == Telemetry(("gpu:0", "gpu:1"), ("gpu:0", "gpu:1"), pytest.approx(0.1), covered=True)
    assert v is not None and v.valid and v.reason == ""


def test_a_window_whose_edges_no_sample_came_near_is_not_covered() -> None:
    trace = PowerTrace([(60.0, 200.0)], origin=0.0)
    v = judge(window(sampled(trace, ("gpu:0", "gpu:1"), every(0.5, 1.6, 8.6))))
    assert v is not None and not v.covered and v.max_gap_s == pytest.approx(0.5)
    assert v.reason == "gpu:0, gpu:1 not sampled within 1 s of an edge"


def test_interval_samples_see_back_over_their_span() -> None:
    """powermetrics' 1 s averages, back to back, leave no hole although 1 s apart."""
    domains = {"gpu": Domain("gpu", Method.SAMPLED)}
    samples = [PowerSample(t, {"gpu": 5.0}, span_s=1.0) for t in every(1.0, 1.0, 11.0)]
    v = judge(window(samples, domains=domains), max_gap_s=0.5)
    assert v is not None and v.valid and v.max_gap_s == pytest.approx(0.0)


def test_the_counter_is_checked_against_the_trapezoid_integral_of_known_power() -> None:
    """A ramp from 100 W to 300 W over 10 s holds 2000 J: the trapezoid of 1 s samples is
    exact on a ramp, so a true counter agrees and one 10 % high is flagged."""
    domains = {"gpu:0": Domain("gpu:0", Method.COUNTER)}
    samples = [PowerSample(t, {"gpu:0": 100.0 + 20.0 * t}) for t in every(1.0)]
    true_j = 2000.0
    v = judge(window(samples, domains=domains, by_domain={"gpu:0": true_j}))
    assert v is not None and v.valid and v.devices == ()
    assert v.counter_vs_integral == pytest.approx(0.0, abs=1e-12)
    off = judge(window(samples, domains=domains, by_domain={"gpu:0": 1.1 * true_j}))
    assert off is not None and off.counter_vs_integral == pytest.approx(0.1 / 1.1)
    assert off.reason == "counter and integrated power differ by 9.1% (at most 5%)"


def test_a_meter_that_does_not_sample_has_no_verdict() -> None:
    counter = {"cpu:package-0": Domain("cpu:package-0", Method.COUNTER)}
    estimate = {"cpu:process": Domain("cpu:process", Method.ESTIMATED)}
    assert judge(window([], domains=counter)) is None
    assert judge(window([], domains=estimate)) is None
    # a torchrun job's window, merged from its ranks' joules, carries no samples to judge
    assert judge(window([])) is None


# -- the stand-in NVML: a GPU that stops answering ------------------------------------------
def pascal(n: int, watts: float) -> FakeGPU:
    """A board without an energy counter: the meter samples its power in a thread."""
    return FakeGPU(
        f"Pascal #{n}", fake_uuid(n), NVML_DEVICE_ARCH_PASCAL, PowerTrace([(1e6, watts)])
    )


def test_a_gpu_that_stops_answering_leaves_a_hole_the_other_keeps_its_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [pascal(0, 100.0), pascal(1, 200.0)]
    install_fake_pynvml(monkeypatch, gpus)
    with open_meter("nvml", sample_interval_s=0.05) as meter:
        with meter.measure() as clean:
            time.sleep(0.3)
        with meter.measure() as m:
            time.sleep(0.1)
            gpus[1].lost = True  # every NVML call on it fails: "GPU is lost"
            time.sleep(1.6)
            gpus[1].lost = False
            time.sleep(0.1)
    ok = judge(clean.measurement)
    assert ok is not None and ok.valid and ok.devices == ("gpu:0", "gpu:1")
    v = judge(m.measurement)
    assert v is not None and not v.valid and v.read == ("gpu:0", "gpu:1")
    assert 1.5 < v.max_gap_s < 1.9
    assert v.reason.startswith("gpu:1 went 1.") and v.reason.endswith("(at most 1 s)")
    own_0 = [s for s in m.samples if "gpu:0" in s.power_w]
    assert max(b.t - a.t for a, b in itertools.pairwise(own_0)) < 0.5  # gpu:0 was not held up
    # the hole is bridged at the power on either side of it, not counted as 0 W
    assert m.by_domain["gpu:1"] == pytest.approx(200.0 * m.seconds, rel=0.02)


# -- stored, summed up per case, marked, not gated ---------------------------------------------
BAD = Telemetry(("gpu:0", "gpu:1"), ("gpu:0",), 3.0, True, None, "gpu:1 never read")


def with_telemetry(case: CaseResult, telemetry: Telemetry | None) -> CaseResult:
    return replace(case, trials=tuple(replace(t, telemetry=telemetry) for t in case.trials))


def test_a_trials_telemetry_survives_the_run_file() -> None:
    case = with_telemetry(make_case([1.0, 1.1, 0.9]), BAD)
    trial = json.loads(json.dumps(case_dict(case)))["trials"][0]
    assert trial["telemetry"]["reason"] == "gpu:1 never read"
    assert decode_trial(trial).telemetry == BAD
    del trial["telemetry"]  # a run file from before the flags
    assert decode_trial(trial).telemetry is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_gap_s", 1e400),
        ("max_gap_s", -1.0),
        ("max_gap_s", "3"),
        ("covered", "yes"),
        ("read", ["gpu:0", 1]),
        ("reason", None),
        ("counter_vs_integral", math.inf),
    ],
)
def test_a_hostile_telemetry_field_is_one_line(key: str, value: Any) -> None:
    trial = json.loads(json.dumps(case_dict(with_telemetry(make_case([1.0]), BAD))))["trials"][0]
    trial["telemetry"][key] = value
    with pytest.raises(RunFileError, match="telemetry") as e:
        decode_trial(json.loads(json.dumps(trial)))
    assert "\n" not in str(e.value)


def test_a_run_file_with_a_nan_gap_is_refused_in_one_line(tmp_path: Any) -> None:
    run = sample_run((with_telemetry(make_case([1.0]), BAD),))
    text = dumps(run).replace('"max_gap_s": 3.0', '"max_gap_s": NaN', 1)
    assert "NaN" in text
    with pytest.raises(RunFileError) as e:
        loads(text, tmp_path / "r.json")
    assert "\n" not in str(e.value)
    assert loads(dumps(run), tmp_path / "r.json").cases[0].trials[0].telemetry == BAD


def test_an_invalid_case_is_marked_and_never_gated() -> None:
    base = make_case([1.0, 1.01, 0.99, 1.0], method="sampled")
    worse = with_telemetry(make_case([2.0, 2.01, 1.99, 2.0], method="sampled"), BAD)
    assert len(worse.invalid_telemetry) == 4
    assert cell(FIGURES["trials"], worse).endswith("(4i)")
    (table,) = case_tables([worse])
    note = f"{worse.name}: invalid telemetry (4 of 4), not gated: gpu:1 never read"
    assert note in table.notes
    assert f'<p class="note">{escape(note)}</p>' in render_report([sample_run((worse,))])
    c = compare_cases([base], [worse], CompareOptions(gates=parse_gates("j_per_token:5%")))
    (delta,) = [d for d in c.deltas if d.metric == "j_per_token"]
    assert delta.verdict == INVALID_TELEMETRY and not delta.failed
    assert not c.failures
    valid = with_telemetry(worse, replace(BAD, read=BAD.devices, reason=""))
    assert not valid.invalid_telemetry
    again = compare_cases([base], [valid], CompareOptions(gates=parse_gates("j_per_token:5%")))
    assert again.failures  # the same regression with valid telemetry fails


def test_the_controller_judges_every_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    install_fake_pynvml(monkeypatch, [pascal(0, 150.0)])
    results: list[CaseResult] = []
    with open_meter("nvml", sample_interval_s=0.02) as meter:
        bench = EnergyBenchmark(
            meter,
            ControllerSettings(warmup=0, min_trials=2, max_trials=2, max_sample_gap_s=0.05),
            CaseIdentity("t.py::test_q", "test_q", {}),
            results.append,
        )
        case = bench(lambda: time.sleep(0.05), input_tokens=1, output_tokens=1)
    assert [t.telemetry is not None and t.telemetry.valid for t in case.trials] == [True, True]
    with pytest.raises(ConfigError, match="max_sample_gap_s must be > 0"):
        ControllerSettings(max_sample_gap_s=0.0)


# -- the way users run it -----------------------------------------------------------------------
SUITE = """
import sys, time

def work():
    gpus = sys.modules["pynvml"].fake.gpus  # the stand-in NVML this session shares
    if LOSE:
        gpus[1].lost = True
    time.sleep(0.5)
    gpus[1].lost = False

def test_case(energy_benchmark):
    energy_benchmark(work, input_tokens=1, output_tokens=1)
"""


def test_an_invalid_case_is_shown_and_not_gated_in_a_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [pascal(0, 100.0), pascal(1, 100.0)]
    install_fake_pynvml(monkeypatch, gpus)
    common = (
        "--energy-backend=nvml",
        "--energy-sample-interval=0.02",
        "--energy-warmup=0",
        "--energy-min-trials=3",
        "--energy-max-trials=3",
        "-p",
        "no:randomly",
    )
    pytester.makeini("[pytest]\nllmenergy_max_sample_gap = 0.2s\n")  # the option's ini twin
    pytester.makepyfile(test_cases="LOSE = False\n" + SUITE)
    pytester.runpytest(*common, "--energy-save=base").assert_outcomes(passed=1)
    gpus[1].trace = PowerTrace([(1e6, 300.0)])  # a 2x regression...
    pytester.makepyfile(test_cases="LOSE = True\n" + SUITE)  # ... with gpu:1 lost meanwhile
    result = pytester.runpytest(*common, "--energy-compare-fail=j_per_token:5%")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*test_case: invalid telemetry (3 of 3), not gated: gpu:1 went 0.* s without a "
            "sample (at most 0.2 s)*",
            "*1 case(s) not gated: invalid power telemetry (--energy-max-sample-gap)*",
        ]
    )
    result.stdout.no_fnmatch_line("*FAIL*")
