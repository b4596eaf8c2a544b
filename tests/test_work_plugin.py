"""--energy-count-work as users run it: the suite, a scripted meter, saved runs, gates."""

from __future__ import annotations

import json

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
    first = suite.runpytest_subprocess(
        *COMMON, "--energy-json=base.json", "--energy-columns=tokens_in,flops_per_token"
    )
    first.assert_outcomes(passed=1, deselected=1)
    first.stdout.fnmatch_lines(
        [
            "llmenergy: counted work: one more run of each case after its trials*",
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
        "python", "-m", "pytest_llmenergy", "compare", "less.json", "head.json",
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
