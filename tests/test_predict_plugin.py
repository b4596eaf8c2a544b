"""--energy-profile-ops as users run it: the suite, a scripted meter, a saved run."""

from __future__ import annotations

import json
import sys

import pytest
import torch  # noqa: F401  # imported before any in-process run (see test_plugin_suite)

from tests.test_plugin_suite import model_cache, suite  # noqa: F401  # fixtures


def test_profile_ops_keeps_an_operator_trace_per_case_outside_the_trials(
    suite: pytest.Pytester,  # noqa: F811
) -> None:
    result = suite.runpytest_subprocess(
        "--energy-backend=trace",
        "--llm-model=tiny-llama",
        "--llm-input-tokens=64",
        "--llm-output-tokens=4",
        "--energy-rule=research",
        "--energy-max-trials=3",
        "--energy-profile-ops",
        "--energy-json=run.json",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "llmenergy: operator profiles: one more run of each case after its trials*",
            "llmenergy: 2 operator profiles recorded in *",
        ]
    )
    run = json.loads((suite.path / "run.json").read_text())
    for case in run["cases"]:
        profile = case["op_profile"]
        assert profile["model_name"] == "tiny-llama"
        assert profile["model_config"]["hidden_size"] == 64
        assert profile["classes"]["matmul"]["flops"] > 0
        assert profile["top_level_ops"] > 100
        assert len(case["trials"]) == 3  # the profiled run is not a trial
    calibrate = suite.run(
        sys.executable, "-m", "pytest_llmenergy", "calibrate", "run.json", "--out", "cal.json"
    )
    assert calibrate.ret == 2  # two cases are too few, and it says what to measure
    assert "measure more token sizes" in calibrate.stderr.str()


def test_without_the_option_cases_carry_no_profile(suite: pytest.Pytester) -> None:  # noqa: F811
    result = suite.runpytest_subprocess(
        "--energy-backend=trace",
        "--llm-model=tiny-llama",
        "--llm-input-tokens=8",
        "--llm-output-tokens=2",
        "--energy-rule=research",
        "--energy-max-trials=3",
        "--energy-json=run.json",
        "-k",
        "input",
    )
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.no_fnmatch_line("*operator profiles*")
    (case,) = json.loads((suite.path / "run.json").read_text())["cases"]
    assert case["op_profile"] is None
