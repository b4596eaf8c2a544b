"""How long calibrating and predicting take (issue 17).

Run by naming the directory: ``pytest tests/perf --benchmark-only``.  Targets on the
development machine (2 cores): calibrating a 16-case run (leave-one-case-out included)
under 2 s; one prediction (a 2048-token prompt, 512 output tokens) under 50 ms.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmenergy.predict.calibrate import calibrate_runs
from pytest_llmenergy.predict.features import ModelShape
from pytest_llmenergy.predict.predict import predict
from tests.test_predict import LLAMA, sample_run, synthetic_case

SIZES = [(n, 32) for n in (8, 16, 32, 64, 128, 256, 512, 1024, 2048)] + [
    (32, n) for n in (8, 16, 32, 64, 128, 256, 512)
]
BIG = ModelShape("mistral-7b", "mistral", 4096, 32, 32, 8, 128, 14336, 32000)


@pytest.fixture(scope="module")
def run() -> Any:
    return sample_run(
        tuple(synthetic_case(LLAMA, i, o, noise=0.01 * k) for k, (i, o) in enumerate(SIZES))
    )


def test_calibration_speed(benchmark: Any, perf_budget: Any, run: Any) -> None:
    data = benchmark(calibrate_runs, [run], ["synthetic"])
    assert data["calibrations"][0]["models"] == ["l"]
    perf_budget("calibrating a 16-case run", benchmark.stats.stats.mean, 2.0, "s")


def test_prediction_speed(benchmark: Any, perf_budget: Any, run: Any) -> None:
    cal = calibrate_runs([run], ["synthetic"])["calibrations"][0]
    (row,) = benchmark(predict, cal, BIG, [2048], [512])
    assert row.time_s > 0
    perf_budget("one prediction, 2048 -> 512 tokens", benchmark.stats.stats.mean, 0.05, "s")
