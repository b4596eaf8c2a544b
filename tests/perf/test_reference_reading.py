"""A case's reading of the machine's speed against the session's full one, in time.

A case times every 20th iteration of the reference loop and scales by 20
(``probes/reference.case_reference_s``): it must read the same quantity as the full
loop, within 5 %, so that runs read either way compare.  A timing, so it lives here
beside the other speed figures, not in the default test run (it read 1.054 in CI on a
slow day, 2026-11-26).  Run with ``pytest tests/perf --benchmark-only``.
"""

from __future__ import annotations

import statistics
from typing import Any

from pytest_llmenergy.probes.reference import case_reference_s, reference_s

ROUNDS = 15
BUDGET = 0.05


def test_a_case_reading_estimates_the_full_reference(benchmark: Any, perf_budget: Any) -> None:
    full, case = [], []
    for _ in range(ROUNDS):  # interleaved: the machine's drift hits both alike
        full.append(reference_s(repeats=1))
        case.append(case_reference_s())
    ratio = statistics.median(case) / statistics.median(full)
    benchmark.pedantic(case_reference_s, rounds=5, iterations=1)
    perf_budget("a case's reading against the full reference", abs(ratio - 1.0), BUDGET, "%")
