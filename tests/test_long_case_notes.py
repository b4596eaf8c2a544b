"""A long case says which it is, how far it is and why it waits, now and then, in a
log (issue 54): nothing for a short case, a few lines for one that runs for minutes."""

from __future__ import annotations

import pytest

from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.plugin.progress import LongCaseNotes, limits_text


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_long_case_says_so_each_time_its_time_doubles() -> None:
    clock, lines = Clock(), []
    notes = LongCaseNotes(lines.append, "b/t.py::t[x]", "stops by 25 trials", 60.0, clock)
    for second in range(0, 600, 5):  # a trial every 5 s for 10 minutes
        clock.now = float(second)
        notes(f"trial {second // 5}: energy_j 3 J ±0.5 (> 0.3 J) [trial 4 disturbed; repeated]")
    # at 1, 2, 4 and 8 minutes: four lines in ten minutes, none before the first minute
    assert len(lines) == 4
    assert lines[0].startswith("llmenergy: b/t.py::t[x] still running after 60 s")
    assert "repeated" in lines[0] and lines[0].endswith("stops by 25 trials")
    notes("")  # the case is done: nothing more
    assert len(lines) == 4


def test_a_short_case_says_nothing() -> None:
    clock, lines = Clock(), []
    notes = LongCaseNotes(lines.append, "t", "", 60.0, clock)
    for second in range(0, 59):
        clock.now = float(second)
        notes("trial: ...")
    assert lines == []


def test_the_limits_are_the_rules() -> None:
    assert limits_text(ControllerSettings()) == "stops by 25 trials or 15 s measured"
    research = ControllerSettings(rule="research", max_trials=7)
    assert limits_text(research) == "stops by 7 trials"


def test_a_session_in_a_log_notes_its_long_case(pytester: pytest.Pytester) -> None:
    """Output to a file (CI's log), not a terminal: a case past the threshold is named
    with its latest trial; a short one is not."""
    pytester.makeconftest("import pytest_llmenergy.plugin.progress as p\np.LONG_CASE_S = 0.3\n")
    pytester.makepyfile(
        test_long="""
        import time

        def test_long(energy_benchmark):
            energy_benchmark(time.sleep, 0.1, input_tokens=1, output_tokens=1)

        def test_short(energy_benchmark):
            energy_benchmark(time.sleep, 0.001, input_tokens=1, output_tokens=1)
        """
    )
    done = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "--energy-max-background=off",
        "--energy-shuffle=off",
        "--energy-min-trials=6",
        "--energy-max-trials=6",
        "--energy-min-time=0",  # one call a trial: no window of calls to reach a minimum
    )
    done.assert_outcomes(passed=2)
    out = done.stdout.str()
    assert "llmenergy: test_long.py::test_long still running after" in out, out
    assert "stops by 6 trials" in out
    assert "test_short still running" not in out
