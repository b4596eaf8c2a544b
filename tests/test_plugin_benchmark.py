"""pytest-benchmark's tests get their energy; --benchmark-only keeps the energy cases."""

from __future__ import annotations

import json

import pytest

from tests.test_plugin import TRACE_CONFTEST  # a 200 W meter registered as "trace"

TESTS = """
import time

def test_sleep(benchmark):
    benchmark.pedantic(time.sleep, args=(0.002,), rounds=20, iterations=1)

def test_energy_case(energy_benchmark):
    energy_benchmark(time.sleep, 0.001, input_tokens=1, output_tokens=1)

def test_plain():
    pass
"""


def test_benchmark_json_carries_joules_and_energy_cases_are_not_skipped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run under xdist, pytest-benchmark would take the inner session for a worker too
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(test_b=TESTS)
    result = pytester.runpytest(
        "--energy-backend=trace", "--benchmark-only", "--benchmark-json=out.json", "-rs"
    )
    result.assert_outcomes(passed=2, skipped=1)  # only the plain test is skipped
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_b.py: Skipping non-benchmark*"])
    [bench] = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    info, stats = bench["extra_info"], bench["stats"]
    assert info["energy_meter"] == "trace" and info["energy_estimated"] is False
    assert info["energy_power_w"] == pytest.approx(200.0, rel=1e-3)  # the trace's truth
    assert info["energy_j"] == pytest.approx(200.0 * info["energy_window_s"], rel=1e-3)
    # the window holds 20 rounds of ~2 ms: its joules cover at least the rounds' time
    assert info["energy_j"] >= 200.0 * stats["mean"] * stats["rounds"] * 0.99
    assert info["energy_per_round_j"] == pytest.approx(200.0 * stats["mean"], rel=1e-3)


def test_without_pytest_benchmark_nothing_changes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(test_b=TESTS.split("def test_sleep")[0] + "\ndef test_x(): pass\n")
    result = pytester.runpytest("--energy-backend=trace", "-p", "no:benchmark")
    result.assert_outcomes(passed=1)
