"""How long the optimizer takes on a large workload: 10 million queries, three systems.

Run by naming the directory: ``pytest tests/perf --benchmark-only``.  The target is
under 2 s per decision on the development machine (2 cores), counting included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_llmenergy.routing.fit import build_model
from pytest_llmenergy.routing.optimize import Capacity, Router
from pytest_llmenergy.routing.profile import read_profile_csv, select
from pytest_llmenergy.routing.workload import Workload, alpaca

PAPER = Path(__file__).parents[2] / "examples" / "wilkins2024" / "wilkins2024.csv"
QUERIES = 10_000_000
DECISION_BUDGET_S = 2.0


def within_budget(benchmark: Any, perf_budget: Any, what: str) -> None:
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None under --benchmark-disable: ran once, unmeasured
        perf_budget(f"a routing decision, {what}", stats.stats.mean, DECISION_BUDGET_S, "s")


@pytest.fixture(scope="module")
def big_workload() -> Workload:
    """Alpaca's token counts, resampled to 10 million queries."""
    base = alpaca("alpaca-paper")
    pick = np.random.default_rng(7).integers(0, len(base), QUERIES)
    return Workload("alpaca x 10M", base.input_tokens[pick], base.output_tokens[pick])


def _models(systems: list[str]) -> list[Any]:
    chosen = select(read_profile_csv(PAPER), systems, ["all"])["all"]
    return [build_model(p) for p in chosen]


THREE = ["M1-Pro", "Swing AMD+A100", "Palmetto Intel+A100"]


@pytest.mark.parametrize("by", ["input", "output"])
def test_three_systems(benchmark: Any, perf_budget: Any, big_workload: Workload, by: str) -> None:
    models = _models(THREE)

    def decide() -> Any:
        return Router(models, big_workload, by=by).solve(1.0)

    decision = benchmark.pedantic(decide, rounds=3, warmup_rounds=1)
    assert sum(decision.totals.queries.values()) == QUERIES
    within_budget(benchmark, perf_budget, f"three systems by {by}")


def test_three_systems_with_capacity(
    benchmark: Any, perf_budget: Any, big_workload: Workload
) -> None:
    models = _models(THREE)
    caps = [Capacity("M1-Pro", query_share=0.5), Capacity("Swing AMD+A100", busy_share=0.3)]

    def decide() -> Any:
        return Router(models, big_workload, by="input").solve(0.7, caps)

    decision = benchmark.pedantic(decide, rounds=3, warmup_rounds=1)
    assert decision.totals.queries["M1-Pro"] <= QUERIES // 2
    within_budget(benchmark, perf_budget, "three systems with capacities")


def test_two_systems_by_both(benchmark: Any, perf_budget: Any, big_workload: Workload) -> None:
    models = _models(THREE[:2])

    def decide() -> Any:
        return Router(models, big_workload, by="both").solve(1.0)

    decision = benchmark.pedantic(decide, rounds=3, warmup_rounds=1)
    assert sum(decision.totals.queries.values()) == QUERIES
    within_budget(benchmark, perf_budget, "two systems by both")


def test_three_systems_with_capacity_and_65536_distinct_sizes(
    benchmark: Any, perf_budget: Any
) -> None:
    """The worst case for the capacity search: every token count from 1 to 65,536 occurs."""
    rng = np.random.default_rng(11)
    wide = Workload(
        "uniform 1..65536", rng.integers(1, 65537, QUERIES), rng.integers(1, 513, QUERIES)
    )
    models = _models(THREE)
    caps = [Capacity("M1-Pro", query_share=0.3), Capacity("Swing AMD+A100", busy_share=0.5)]

    def decide() -> Any:
        return Router(models, wide, by="input").solve(1.0, caps)

    decision = benchmark.pedantic(decide, rounds=3, warmup_rounds=1)
    assert decision.totals.queries["M1-Pro"] <= 0.3 * QUERIES
    within_budget(benchmark, perf_budget, "65,536 distinct sizes")
