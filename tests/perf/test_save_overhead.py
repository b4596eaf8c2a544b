"""What keeping a run on disk costs after each case, and how that grows with the suite.

The run file is rewritten after every finished case (so a crash keeps it), which is
quadratic in the number of cases; these benchmarks say where that starts to matter.
Run by naming the directory: ``pytest tests/perf --benchmark-only``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.storage.recorder import RunRecorder
from pytest_llmenergy.storage.store import Storage
from tests.casefactory import make_case
from tests.test_storage_runfile import sample_run

# Above this per-case cost, saving would be a visible share of even a fast LLM case.
PER_CASE_BUDGET_S = 0.25


@pytest.mark.parametrize("n_cases", [57, 500])
def test_save_after_the_last_case(
    benchmark: Any, perf_budget: Any, tmp_path: Path, n_cases: int
) -> None:
    """The write after case n: the file holds n cases of 25 trials with phases."""
    cases = [make_case([0.1 + i * 1e-4] * 25, input_tokens=8 + i) for i in range(n_cases)]
    counter = iter(range(10**6))

    def setup() -> tuple[tuple[RunRecorder], dict[str, Any]]:
        recorder = RunRecorder(sample_run(()), storage=Storage(tmp_path / str(next(counter))))
        recorder.add(cases[:-1])  # everything before the last case is already on disk
        return (recorder,), {}

    benchmark.pedantic(lambda r: r.add(cases), setup=setup, rounds=5)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        mean_s = float(stats.stats.mean)
        size = max(p.stat().st_size for p in tmp_path.glob("*/*/*.json"))
        benchmark.extra_info.update(per_case_ms=round(mean_s * 1e3, 2), file_mb=size / 1e6)
        print(
            f"\n{n_cases} cases: save after a case {mean_s * 1e3:.1f} ms, file {size / 1e6:.1f} MB"
        )
        perf_budget(
            f"saving after case {n_cases} (file {size / 1e6:.1f} MB)",
            mean_s,
            PER_CASE_BUDGET_S,
            "s",
        )
