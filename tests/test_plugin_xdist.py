"""pytest-xdist: ``-n 2`` gives one run file with every case, one table, one gate, and the
workers never measure at the same time on a shared meter (issue 13, item 1)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from tests.test_plugin_keep import REPO
from tests.test_plugin_suite import TRACE_METER

pytest.importorskip("xdist")

# Each case writes its windows' edges (wall clock) where the test can read them.
CASES = """
import json, os, time, pytest

@pytest.mark.parametrize("n", [8, 16, 32, 64, 128, 256])
def test_case(energy_benchmark, n):
    edges = []

    def target():
        t0 = time.time()
        time.sleep(0.02)
        edges.append((t0, time.time()))

    energy_benchmark(target, input_tokens=n, output_tokens=4)
    with open(os.environ["EDGES"], "a") as f:
        f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER", "-"), edges]) + "\\n")

def test_plain():
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    monkeypatch.setenv("EDGES", str(pytester.path / "edges.jsonl"))
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(test_cases=CASES)
    return pytester


def test_two_workers_make_one_run_one_table_one_gate(project: pytest.Pytester) -> None:
    common = ("-n", "2", "--energy-backend=trace", "--energy-rule=research", "-p", "no:randomly")
    result = project.runpytest_subprocess(*common, "--energy-save=base")
    result.assert_outcomes(passed=7)
    # one run file, complete, with every case; no seed given: the controller chose one
    [path] = sorted((project.path / ".llmenergy").glob("*/*.json"))
    data = json.loads(path.read_text())
    assert data["run"]["status"] == "complete"
    assert sorted(c["input_tokens"] for c in data["cases"]) == [8, 16, 32, 64, 128, 256]
    assert all(len(c["trials"]) >= 3 for c in data["cases"])
    result.stdout.fnmatch_lines(["llmenergy: saved 6 case(s) to *0001_base.json"])
    assert result.stdout.str().count("llmenergy: energy per token") == 1  # one table
    # both workers measured, never at the same time
    lines = [json.loads(x) for x in (project.path / "edges.jsonl").read_text().splitlines()]
    assert {worker for worker, _ in lines} == {"gw0", "gw1"}
    windows = sorted(edge for _, edges in lines for edge in edges)
    for (_, end), (start, _) in itertools.pairwise(windows):
        assert start >= end, "two workers measured at once"
    # one gate, by the controller, against that run
    gated = project.runpytest_subprocess(
        *common, "--energy-compare-fail=j_per_token:50%", "--energy-report=report.html"
    )
    gated.assert_outcomes(passed=7)
    gated.stdout.fnmatch_lines(["llmenergy: energy gate passed (j_per_token:50%)*"])
    # one HTML report, by the controller, of every case and the comparison
    assert gated.stdout.str().count("llmenergy: HTML report of 6 case(s)") == 1
    page = (project.path / "report.html").read_text()
    assert "this run against 0001_base (baseline)" in page
    assert all(f"test_case[{n}]" in page for n in (8, 16, 32, 64, 128, 256))
    assert len(sorted((project.path / ".llmenergy").glob("*/*.json"))) == 1  # nothing saved


def test_the_workers_collect_the_same_cases_without_a_seed(project: pytest.Pytester) -> None:
    """Before, each worker shuffled with its own seed: "Different tests were collected"."""
    result = project.runpytest_subprocess(
        "-n", "2", "--energy-backend=trace", "--energy-max-trials=3", "--energy-min-trials=3"
    )
    result.assert_outcomes(passed=7)
    result.stdout.no_fnmatch_line("*Different tests were collected*")


def test_a_worker_result_is_checked_like_a_run_file(tmp_path: Path) -> None:
    from pytest_llmenergy.errors import LLMEnergyError
    from pytest_llmenergy.storage.runfile import case_dict, decode_case
    from tests.casefactory import make_case

    case = make_case([1.0, 1.1, 0.9])
    assert decode_case(json.dumps(case_dict(case))).trials == case.trials
    with pytest.raises(LLMEnergyError, match="not a case"):
        decode_case('{"nodeid": 3}')
    for hostile, problem in (
        ("[" * 200_000, "nested more than 32 levels deep"),
        ('{"nodeid": 1e400}', "nodeid: 1e400 is beyond a double's range"),
        ('{"nodeid": "a", "nodeid": "b"}', "has the key nodeid twice"),
    ):
        with pytest.raises(LLMEnergyError) as info:
            decode_case(hostile)
        assert problem in str(info.value) and "\n" not in str(info.value)


def test_a_worker_report_that_is_not_a_case_leaves_the_others_whole(
    project: pytest.Pytester,
) -> None:
    """Issue 33: a test can write any user property, the controller's channel included;
    what does not decode is one line naming the test, never an INTERNALERROR."""
    project.makepyfile(
        test_hostile="""
        def test_hostile(record_property):
            record_property("llmenergy_case", "[" * 200_000)
        """
    )
    result = project.runpytest_subprocess(
        "-n", "2", "--energy-backend=trace", "--energy-rule=research", "--energy-save=base"
    )
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["llmenergy: saved 6 case(s) to *0001_base.json"])
    refused = (
        "llmenergy: test_hostile.py::test_hostile: its worker's report: not a case: nested "
        "more than 32 levels deep; that case is left out of this run"
    )
    assert result.stdout.lines.count(refused) == 1
    assert "INTERNALERROR" not in result.stdout.str()


# Each test writes its whole span, from the fixture's setup to its teardown: the part of a
# test outside the measurement window (loading a model, building prompts).
SPANS = """
import json, os, time, pytest

@pytest.fixture(autouse=True)
def span():
    t0 = time.time()
    time.sleep(0.05)  # "loading a model": CPU work outside every window
    yield
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER", "-"), t0, time.time()]) + "\\n")
"""


@pytest.mark.parametrize("backend,turns", [("estimate", True), ("trace", False)])
def test_a_cpu_meter_runs_one_whole_test_at_a_time(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backend: str, turns: bool
) -> None:
    """A meter that sees the CPU sees the other worker's work outside its windows too: the
    workers take turns on whole tests, and the header says that -n gains nothing."""
    monkeypatch.setenv("SPANS", str(project.path / "spans.jsonl"))
    (project.path / "conftest.py").write_text(TRACE_METER + SPANS)
    result = project.runpytest_subprocess(
        "-n", "2", f"--energy-backend={backend}", "--energy-rule=research", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=7)
    said = "*pytest-xdist: 2 workers take turns, one test at a time*-n gains nothing here"
    if turns:
        result.stdout.fnmatch_lines([said])
    else:
        result.stdout.no_fnmatch_line(said)
    spans = [json.loads(x) for x in (project.path / "spans.jsonl").read_text().splitlines()]
    assert {worker for worker, _, _ in spans} == {"gw0", "gw1"}
    ordered = sorted((t0, t1) for _, t0, t1 in spans)
    overlaps = sum(start < end for (_, end), (start, _) in itertools.pairwise(ordered))
    if turns:
        assert overlaps == 0, "a worker worked while the other measured"
