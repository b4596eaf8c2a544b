"""Applying a GPU setting costs less than the case's warm-up (issue 14).

Each energy case applies its setting (power limit and locked clocks, each read back)
before its warm-up; that must stay cheaper than the warm-up itself, the shortest of
which, in the default grid, is one ``generate`` of tiny-llama at 8 input and 32 output
tokens.  Measured on the fake NVML (tests/fakes): what it times is this package's own
cost per change (the calls, the read-back, the checks); a real driver's setters add
their own latency, which NVML does not document.  Also timed: the per-trial telemetry
(a sampling thread started and stopped around each trial).  Run with
``pytest tests/perf --benchmark-only``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.conditions.control import GpuControl, StateFile
from pytest_llmenergy.conditions.settings import AUTO_CLOCK, GpuSetting
from pytest_llmenergy.conditions.telemetry import TrialTelemetry
from pytest_llmenergy.llm.loader import load_model
from tests.fakes.fake_pynvml import install_fake_pynvml
from tests.fakes.gpu_project import make_gpu

SETTINGS = (GpuSetting(250.0, 1005), GpuSetting(400.0, AUTO_CLOCK, default=True))


@pytest.fixture
def control(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    install_fake_pynvml(monkeypatch, [make_gpu()])
    c = GpuControl(StateFile(tmp_path / "state.json"))
    yield c
    c.restore()
    c.close()


def test_applying_a_setting_costs_less_than_the_warmup(
    benchmark: Any, perf_budget: Any, control: Any, tmp_path: Path
) -> None:
    model = load_model("tiny-llama", cache_dir=tmp_path / "cache")
    ids = model.prompt_ids(8)
    model.generate(ids, 32)  # the first call loads kernels: not what a warm-up costs later
    warmups = []
    for _ in range(5):
        t0 = time.perf_counter()
        model.generate(ids, 32)
        warmups.append(time.perf_counter() - t0)
    warmup_s = statistics.median(warmups)
    flip = iter(SETTINGS * 100_000)

    def apply() -> None:
        control.apply(next(flip))

    benchmark(apply)
    apply_s = benchmark.stats.stats.mean
    benchmark.extra_info.update(warmup_s=warmup_s, apply_s=apply_s)
    perf_budget(
        f"applying a GPU setting (a tenth of a warm-up of {warmup_s * 1e3:.1f} ms)",
        apply_s,
        warmup_s / 10,
        "s",
    )


def test_trial_telemetry_start_stop(benchmark: Any, perf_budget: Any, control: Any) -> None:
    probe = TrialTelemetry(control.devices)

    def trial() -> None:
        probe.start()
        probe.stop()

    benchmark(trial)
    perf_budget("a trial's GPU telemetry, start + stop", benchmark.stats.stats.mean, 0.005, "s")
