"""Issue 61, item 5: a session's legend explains each mark once, after its last table.

Two tables (one per test): one whose cases all held their CI targets (``✓``), one whose
case stopped at its trial limit (``✗``).  Each table's legend had its own ``trials:``
line (``✓ …`` under one, ``✓ …, ✗ …`` under the other), and a line of one table only
stayed under that table while the lines they shared made a final legend below."""

from __future__ import annotations

import pytest

from tests.test_plugin import TRACE_CONFTEST

# a steady case (its CI targets hold) and a noisy one that cannot hold 1 % in 3 trials
TESTS = """
import itertools, time
import pytest

@pytest.mark.llmenergy(min_trials=3, max_trials=6, ci_target="time_s:90%,energy_j:90%")
def test_steady(energy_benchmark):
    energy_benchmark(time.sleep, 0.005, input_tokens=8, output_tokens=4)

NOISY = itertools.cycle([0.002, 0.03])

@pytest.mark.llmenergy(min_trials=3, max_trials=3, ci_target="time_s:1%")
def test_noisy(energy_benchmark):
    energy_benchmark(lambda: time.sleep(next(NOISY)), input_tokens=8, output_tokens=4)
"""


def _session(pytester: pytest.Pytester) -> list[str]:
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(test_legend=TESTS)
    result = pytester.runpytest(
        "--energy-backend=trace",
        "--energy-max-background=off",
        "--energy-min-time=0",
        "--energy-group-by=test",
        "--energy-shuffle=off",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=2)
    return result.stdout.lines


def test_each_legend_line_is_printed_once_after_the_last_table(
    pytester: pytest.Pytester,
) -> None:
    lines = _session(pytester)
    trials = [line for line in lines if line.startswith("trials: ")]
    assert len(trials) == 1, "\n".join(lines)
    assert "\u2713 the CI targets held" in trials[0] and "\u2717 stopped" in trials[0]
    ci = [line for line in lines if line.startswith("s \u00b1 CI")]
    assert len(ci) == 1, "\n".join(lines)
    # the legend follows the last table (its rows and its notes), nothing of it in between
    last_title = max(i for i, line in enumerate(lines) if line.startswith("test test_legend"))
    assert lines.index(trials[0]) > last_title and lines.index(ci[0]) > last_title
    noisy_note = next(i for i, line in enumerate(lines) if line.startswith("test_noisy: \u2717"))
    assert lines.index(trials[0]) > noisy_note
