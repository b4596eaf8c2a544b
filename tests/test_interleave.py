"""--energy-interleave: every energy case visited several times per session (pytester)."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.test_plugin import assert_one_line_usage_error

CONFTEST = """
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace
def pytest_llmenergy_meters(config):
    return {"trace": lambda options: TraceMeter({"gpu:0": PowerTrace([(3600, 200.0)])})}
"""

# Every call of a target appends its case to calls.log: the order the session ran them in.
CASES = """
import time
import pytest

def target(name):
    with open("calls.log", "a") as f:
        f.write(name + "\\n")
    time.sleep(0.002)

@pytest.mark.parametrize("case", ["a", "b", "c"])
def test_case(case, energy_benchmark):
    result = energy_benchmark(target, case, input_tokens=4, output_tokens=4)
    assert result.trials

def test_fixed_rounds(energy_benchmark):
    energy_benchmark.pedantic(target, ("p",), input_tokens=1, output_tokens=1, rounds=4)

def test_plain():
    with open("calls.log", "a") as f:
        f.write("plain\\n")
"""


@pytest.fixture
def cases(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES)
    return pytester


def blocks(calls: list[str], name: str) -> int:
    """How many separate stretches of the session ran ``name``."""
    return sum(1 for key, _ in itertools.groupby(calls) if key == name)


def test_each_case_is_visited_n_times_and_kept_whole(cases: pytest.Pytester) -> None:
    result = cases.runpytest(
        "--energy-backend=trace",
        "--energy-interleave=3",
        "--energy-seed=5",
        "--energy-min-time=0",  # one call a trial, as the calls are counted
        "--energy-json=run.json",
        "-p",
        "no:randomly",
    )
    # the three cases and the pedantic test report once per visit, the plain test once
    result.assert_outcomes(passed=3 * 3 + 3 + 1)
    result.stdout.fnmatch_lines(["*interleaved: every energy case visited 3 times*"])
    calls = (cases.path / "calls.log").read_text().split()
    assert calls.count("plain") == 1
    # three visits each, apart from each other, except where a visit's last case is the
    # next visit's first (two boundaries: at most two merged stretches in all)
    assert all(blocks(calls, name) >= 2 for name in "abc"), calls
    assert sum(blocks(calls, name) for name in "abc") >= 3 * 3 - 2, calls
    assert calls.count("p") == 4  # fixed rounds run once, at the first visit
    run = json.loads((cases.path / "run.json").read_text())
    by_name = {c["name"]: c for c in run["cases"]}
    assert len(run["cases"]) == 4  # one kept result per case, never one per visit
    for name in "abc":
        case = by_name[f"test_case[{name}]"]
        trials = case["trials"]
        assert [t["index"] for t in trials] == list(range(1, len(trials) + 1))
        assert {t["visit"] for t in trials} == {1, 2, 3}  # every visit measured some
        assert [t["visit"] for t in trials] == sorted(t["visit"] for t in trials)
        # the warm-up runs at every visit, then the visit's trials
        assert calls.count(name) == 3 + len(trials) + len(case.get("disturbed_trials", []))
        assert case["status"] in ("converged", "limit")
    assert all("visit" not in t for t in by_name["test_fixed_rounds"]["trials"])


def test_without_the_option_trials_run_back_to_back(cases: pytest.Pytester) -> None:
    result = cases.runpytest("--energy-backend=trace", "--energy-json=run.json")
    result.assert_outcomes(passed=5)
    calls = (cases.path / "calls.log").read_text().split()
    assert all(blocks(calls, name) == 1 for name in "abc")
    run = json.loads((cases.path / "run.json").read_text())
    assert all("visit" not in t for c in run["cases"] for t in c["trials"])


def test_the_ini_twin_sets_it(cases: pytest.Pytester) -> None:
    cases.makeini("[pytest]\nllmenergy_interleave = 2\n")
    result = cases.runpytest("--energy-backend=trace", "-k", "not plain and not fixed")
    result.assert_outcomes(passed=3 * 2)
    calls = (cases.path / "calls.log").read_text().split()
    assert sum(blocks(calls, name) for name in "abc") >= 3 * 2 - 1, calls


def test_bad_count_is_one_line(cases: pytest.Pytester) -> None:
    result = cases.runpytest("--energy-backend=trace", "--energy-interleave=0")
    assert_one_line_usage_error(result, "--energy-interleave", ">= 1")


def test_xdist_is_refused_at_start(cases: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    result = cases.runpytest("--energy-backend=trace", "--energy-interleave=2", "-n", "2")
    assert_one_line_usage_error(result, "--energy-interleave", "-n")
    assert not (cases.path / "calls.log").exists()
