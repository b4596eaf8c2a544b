"""--energy-count-work as users run it: the suite, a scripted meter, saved runs, gates."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch  # noqa: F401  # imported before any in-process run (see test_plugin_suite)

from pytest_llmenergy.figures import value
from pytest_llmenergy.storage.runfile import load
from tests.test_plugin_suite import model_cache, suite  # noqa: F401  # fixtures

COMMON = (
    "--energy-backend=trace",
    "--llm-model=tiny-llama",
    "--llm-input-tokens=16",
    "--llm-output-tokens=4",
    "--energy-rule=research",
    "--energy-max-trials=3",
    "--energy-count-work=on",
    "-k",
    "input",
    "-p",
    "no:randomly",
)
GATES = "flops_per_token:0%,decode_bytes_per_output_token:0%"


def test_counted_work_is_kept_and_its_gate_is_exact(suite: pytest.Pytester) -> None:  # noqa: F811
    first = suite.runpytest_subprocess(  # -v: the header's details
        *COMMON, "--energy-json=base.json", "--energy-columns=tokens_in,flops_per_token", "-v"
    )
    first.assert_outcomes(passed=1, deselected=1)
    first.stdout.fnmatch_lines(
        [
            "llmenergy: counted work: each case's warm-up run*",
            "*FLOP/tok*",
            "llmenergy: the work of 1 case(s) counted in *",
        ]
    )
    (case,) = load(suite.path / "base.json").cases
    assert len(case.trials) == 3  # the counted run is not a trial
    assert case.work is not None and case.work.marked
    assert value(case, "flops_per_token") > 0  # type: ignore[operator]
    assert value(case, "decode_flops_per_output_token") > 0  # type: ignore[operator]
    # the same work made slower (busy work after every forward pass): the work gate passes
    second = suite.runpytest_subprocess(
        *COMMON,
        "--energy-json=head.json",
        "--llm-inject-regression=50%",
        "--energy-compare=base.json",
        f"--energy-compare-fail={GATES}",
    )
    assert second.ret == 0, second.stdout.str()
    second.stdout.fnmatch_lines(
        ["llmenergy: energy gate passed (*)*", "*counted, exact: no noise*"]
    )
    (head,) = load(suite.path / "head.json").cases
    assert head.work is not None and head.work.ops() == case.work.ops()
    # more work in the head (here: less in a baseline edited by hand) fails at once
    data = json.loads((suite.path / "base.json").read_text())
    for op in data["cases"][0]["work"]["decode"]:
        op["flops"] = op["flops"] / 2
    (suite.path / "less.json").write_text(json.dumps(data))
    compared = suite.run(
        sys.executable, "-m", "pytest_llmenergy", "compare", "less.json", "head.json",
        "--fail-on", GATES,
    )  # fmt: skip
    assert compared.ret == 1, compared.stdout.str() + compared.stderr.str()
    compared.stdout.fnmatch_lines(["*flops_per_token*FAIL*"])


def test_under_xdist_the_work_travels_with_its_case_and_the_summary_counts_it(
    suite: pytest.Pytester,  # noqa: F811
) -> None:
    """The controller counts nothing itself: its summary line comes from its workers'
    cases, as the run file's counted work does."""
    result = suite.runpytest_subprocess(*COMMON, "-n", "2", "--energy-json=xdist.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmenergy: the work of 1 case(s) counted in *"])
    (case,) = load(suite.path / "xdist.json").cases
    assert case.work is not None and case.work.marked and case.work.seconds > 0
    assert value(case, "flops_per_token") > 0  # type: ignore[operator]


CALLS_TEST = """
import json, os, torch

CALLS = []

def work():
    CALLS.append(1)
    return torch.ones(8, 8) @ torch.ones(8, 8)

def test_rule(energy_benchmark):
    energy_benchmark(work, input_tokens=4, output_tokens=4)
    record("rule", energy_benchmark.result)

def test_pedantic(energy_benchmark):
    energy_benchmark.pedantic(work, rounds=3, input_tokens=4, output_tokens=4)
    record("pedantic", energy_benchmark.result)

def record(name, result):
    with open(os.environ["CALLS_FILE"], "a") as out:
        line = {"name": name, "calls": len(CALLS), "warmup": result.options.warmup,
                "trials": len(result.trials) + len(result.disturbed),
                # a window of calls: a fast call runs many to a trial (controller/window.py)
                "runs": sum(t.passes for t in (*result.trials, *result.disturbed)),
                "counted": result.work is not None}
        out.write(json.dumps(line) + "\\n")
    CALLS.clear()
"""


@pytest.mark.parametrize(
    ("option", "pedantic_counted", "pedantic_extra"),
    [(None, False, 0), ("--energy-count-work=on", True, 1), ("--energy-count-work=off", False, 0)],
)
def test_by_default_a_case_is_counted_in_its_warm_up_and_runs_no_more_than_asked(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    option: str | None,
    pedantic_counted: bool,
    pedantic_extra: int,
) -> None:
    """The default counts in the warm-up call: warm-up + the trials' calls, never more.  A
    case without a warm-up (``pedantic``'s default) is counted only when asked (``on``),
    in one more call after its trials; ``off`` counts nothing."""
    from tests.test_plugin import TRACE_CONFTEST
    from tests.test_plugin_keep import REPO

    calls = pytester.path / "calls.jsonl"
    monkeypatch.setenv("CALLS_FILE", str(calls))
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(test_calls=CALLS_TEST)
    args = ["--energy-backend=trace", "--energy-max-trials=3", "-p", "no:randomly", "-v"]
    result = pytester.runpytest_subprocess(*args, *([option] if option else []))
    result.assert_outcomes(passed=2)
    rows = {r["name"]: r for r in map(json.loads, calls.read_text().splitlines())}
    rule, pedantic = rows["rule"], rows["pedantic"]
    assert rule["calls"] == rule["warmup"] + rule["runs"]  # the count took no call
    assert rule["counted"] is (option != "--energy-count-work=off")
    assert pedantic["calls"] == pedantic["trials"] + pedantic_extra
    assert pedantic["runs"] == pedantic["trials"]  # a round is one call
    assert pedantic["counted"] is pedantic_counted
    header = "llmenergy: counted work: each case's warm-up run*"
    if option == "--energy-count-work=off":
        assert "counted work" not in result.stdout.str()
    else:
        result.stdout.fnmatch_lines([header])
