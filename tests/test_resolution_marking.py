"""Sensor resolution is known and respected (issue 12, item 4; issue 60).

On a fake A100 whose energy counter updates every 100 ms at a constant 250 W, a 30 ms
prefill cannot be split at its mark: without a prefill pass its figures (and the 600 ms
decode's, which the same mark bounds) are marked and never gated; with one, each trial's
prefill is measured as passes repeated back to back and comes out at its true 7.5 J.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from pytest_llmenergy.case_tables import case_tables
from pytest_llmenergy.compare import UNRESOLVED, CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.controller.benchmark import CaseIdentity, EnergyBenchmark
from pytest_llmenergy.controller.passes import ALIGNED_PASS_MULTIPLE
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.figures import FIGURES, resolved, value
from pytest_llmenergy.meters import mark_phase, open_meter
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.storage.runfile import Run, dumps, loads
from pytest_llmenergy.tables import render
from tests.fakes.fake_pynvml import NVML_DEVICE_ARCH_AMPERE, FakeGPU, fake_uuid, install_fake_pynvml
from tests.fakes.trace import PowerTrace

WATTS = 250.0
PREFILL_S = 0.03
DECODE_S = 0.6


def generate() -> Any:
    """A query: a 30 ms prefill, then 600 ms of decode, split where a model splits it."""
    time.sleep(PREFILL_S)
    mark_phase("decode", ending="prefill")
    time.sleep(DECODE_S)


def prefill_pass() -> None:
    time.sleep(PREFILL_S)


def _case(monkeypatch: pytest.MonkeyPatch, with_passes: bool) -> CaseResult:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGPU(
        "NVIDIA A100",
        fake_uuid(0),
        NVML_DEVICE_ARCH_AMPERE,
        PowerTrace([(1e6, WATTS)]),
        counter_period_s=0.1,
    )
    install_fake_pynvml(monkeypatch, [gpu])
    results: list[CaseResult] = []
    with open_meter("nvml") as meter:
        assert meter.resolution_s == pytest.approx(0.1, rel=0.3)
        bench = EnergyBenchmark(
            meter,
            ControllerSettings(rule="research", warmup=0, min_trials=2, max_trials=2),
            CaseIdentity("t.py::test_q[x]", "test_q[x]", {}),
            results.append,
        )
        passes = prefill_pass if with_passes else None
        return bench(generate, input_tokens=100, output_tokens=8, prefill_pass=passes)


@pytest.fixture
def case(monkeypatch: pytest.MonkeyPatch) -> CaseResult:
    """The case split at its marks alone (no prefill pass)."""
    return _case(monkeypatch, with_passes=False)


def test_a_short_prefill_is_measured_by_repeated_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case(monkeypatch, with_passes=True)
    assert case.resolution_s is not None
    for key in ("prefill_j", "prefill_j_per_in_token", "energy_j", "j_per_token", "decode_j"):
        assert resolved(FIGURES[key], case), key
    # each window of passes lasts ALIGNED_PASS_MULTIPLE x the resolution at least (its
    # edges on the counter's refreshes)
    assert case.prefill_passes
    for window in case.prefill_passes:
        assert window.passes * window.seconds >= ALIGNED_PASS_MULTIPLE * case.resolution_s * 0.9
    # the truth: 250 W x 30 ms per pass (sleep overruns a little: use the measured time)
    per_pass_s = sum(w.seconds for w in case.prefill_passes) / len(case.prefill_passes)
    assert value(case, "prefill_pass_j") == pytest.approx(WATTS * per_pass_s, rel=0.15)
    assert value(case, "prefill_pass_j_per_in_token") == pytest.approx(
        WATTS * per_pass_s / 100, rel=0.15
    )
    # each trial's prefill is its own window of passes' (the decode the rest)
    assert [t.phases["prefill"].joules for t in case.trials] == [
        w.joules for w in case.prefill_passes
    ]


def test_a_short_prefill_split_at_its_mark_is_marked(case: CaseResult) -> None:
    assert not case.prefill_passes and not any(t.split for t in case.trials)
    for key in ("prefill_j", "prefill_j_per_in_token", "decode_j"):
        assert not resolved(FIGURES[key], case), key  # 600 ms: under 34 x 100 ms
    for key in ("energy_j", "j_per_token"):
        assert resolved(FIGURES[key], case), key  # 630 ms: over 2 x 100 ms


def test_tables_mark_unresolved_figures(case: CaseResult) -> None:
    text = render(case_tables([case], columns=["prefill_j", "decode_j"]), "table")
    assert "\u2020" in text.splitlines()[3]  # the row: prefill J marked
    assert "not resolved, never gated" in text


def test_unresolved_figures_are_never_gated(case: CaseResult, tmp_path: Any) -> None:
    worse = replace(
        case,
        trials=tuple(
            replace(t, phases={**t.phases, "prefill": replace(t.phases["prefill"], joules=99.0)})
            for t in case.trials
        ),
    )
    c = compare_cases([case], [worse], CompareOptions(gates=parse_gates("prefill_j:5%")))
    assert not c.failed and c.deltas[0].verdict == UNRESOLVED
    # and the resolution survives the run file


def test_the_passes_and_the_split_survive_the_run_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    case = _case(monkeypatch, with_passes=True)
    run = Run("", "x", "", "complete", "hw", {}, {}, {}, {}, cases=(case,))
    back = loads(dumps(run), tmp_path / "r.json").cases[0]
    assert back.resolution_s == case.resolution_s and back.prefill_passes == case.prefill_passes
    assert back.trials == case.trials and back.trials[0].split == "prefill passes"
