"""What one measurement window (open + close) costs, per backend.

A window wraps every measured test case, so its cost is added to what we measure.
Run by naming the directory: ``pytest tests/perf --benchmark-only``.  Each backend
has one ``test_<backend>_window_overhead`` here, on fake hardware so that the number
is our own code's (plus a few microseconds of fake library calls).
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmenergy import Meter, Method, open_meter
from tests.fakes.fake_pynvml import NVML_DEVICE_ARCH_AMPERE, FakeGPU, fake_uuid, install_fake_pynvml
from tests.fakes.trace import PowerTrace

# Far above what a window should cost: failing this means something slow crept into
# the hot path (a thread start, an import, a file read), not a few percent of drift.
WINDOW_BUDGET_S = 50e-6


def one_window(meter: Meter) -> None:
    with meter.measure():
        pass


def record_mean(benchmark: Any, label: str) -> float | None:
    """Print the mean window time and keep it in the JSON report; None if not benchmarked."""
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable: the function ran once, unmeasured
        return None
    mean_s = float(stats.stats.mean)
    benchmark.extra_info["mean_window_us"] = round(mean_s * 1e6, 2)
    print(f"\n{label}: one window (open + close) takes {mean_s * 1e6:.1f} us on average")
    return mean_s


# -- nvml ------------------------------------------------------------------------------


def test_nvml_window_overhead(benchmark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One Ampere GPU with an energy counter: two counter reads and no thread per window."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGPU("NVIDIA A100", fake_uuid(0), NVML_DEVICE_ARCH_AMPERE, PowerTrace([(1e6, 250.0)]))
    install_fake_pynvml(monkeypatch, [gpu])
    with open_meter("nvml") as meter:
        assert meter.domains["gpu:0"].method is Method.COUNTER
        benchmark(one_window, meter)
    mean_s = record_mean(benchmark, "nvml")
    if mean_s is not None:
        assert mean_s < WINDOW_BUDGET_S


# -- estimate --------------------------------------------------------------------------


def test_estimate_window_overhead(benchmark: Any) -> None:
    """TDP x process CPU time: two psutil CPU-time reads (a /proc read on Linux), no thread."""
    with open_meter("estimate", cpu_tdp_w=65) as meter:
        assert meter.domains["cpu:process"].method is Method.ESTIMATED
        benchmark(one_window, meter)
    mean_s = record_mean(benchmark, "estimate")
    if mean_s is not None:
        assert mean_s < WINDOW_BUDGET_S
