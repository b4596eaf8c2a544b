"""tests/perf's budget checks: enforced by default, reported only with
LLMENERGY_PERF_ENFORCE=0 (as CI runs them), and every check's figures printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_plugin import assert_one_line_usage_error

PERF_CONFTEST = Path(__file__).parent / "perf" / "conftest.py"

CHECKS = """
def test_quick(perf_budget):
    perf_budget("a quick thing", 0.002, 0.005, "s")

def test_slow(perf_budget):
    perf_budget("a slow thing", 0.045, 0.03, "%")

def test_wrong(perf_budget):
    assert 1 + 1 == 3, "a wrong result is no budget"
"""


@pytest.fixture
def perf(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("LLMENERGY_PERF_ENFORCE", raising=False)
    pytester.makeconftest(PERF_CONFTEST.read_text())
    pytester.makepyfile(test_checks=CHECKS)
    return pytester


def test_an_exceeded_budget_fails_by_default(perf: pytest.Pytester) -> None:
    result = perf.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*perf budgets: 1 of 2 exceeded (enforced)*",
            "ok   test_checks.py::test_quick: a quick thing: 2 ms <= 5 ms",
            "OVER test_checks.py::test_slow: a slow thing: +4.50% > +3.00%",
            "FAILED test_checks.py::test_slow - Failed: over budget: a slow thing*",
        ]
    )


def test_reported_only_an_exceeded_budget_is_an_xfail_and_errors_still_fail(
    perf: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMENERGY_PERF_ENFORCE", "0")
    result = perf.runpytest("-p", "no:randomly", "-rfEx")
    result.assert_outcomes(passed=1, xfailed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*perf budgets: 1 of 2 exceeded (reported only, LLMENERGY_PERF_ENFORCE=0)*",
            "OVER test_checks.py::test_slow: a slow thing: +4.50% > +3.00%",
            "FAILED test_checks.py::test_wrong - AssertionError: a wrong result is no budget*",
            "XFAIL test_checks.py::test_slow - over budget, reported only*",
        ]
    )


def test_a_bad_setting_is_one_line(perf: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMENERGY_PERF_ENFORCE", "yes")
    result = perf.runpytest()
    assert_one_line_usage_error(result, "LLMENERGY_PERF_ENFORCE='yes'", "set it to 1", "or 0")
