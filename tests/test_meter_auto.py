"""``auto``: NVML for GPUs plus the best CPU meter, each reason for leaving one out said."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pytest_llmenergy import Method, open_meter
from pytest_llmenergy.meters.auto import CompositeMeter
from tests.fakes.fake_pynvml import (
    NVML_DEVICE_ARCH_AMPERE,
    FakeGPU,
    fake_uuid,
    install_fake_pynvml,
    install_fake_pynvml_without_library,
)
from tests.fakes.powercap import FakePowercap, FakeZone
from tests.fakes.trace import PowerTrace


def status(meter: CompositeMeter, backend: str) -> str:
    return next(s.line() for s in meter.statuses if s.backend == backend)


def test_gpu_from_nvml_and_cpu_from_rapl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_trace = PowerTrace([(0.1, 90.0), (10, 310.0)])
    install_fake_pynvml(
        monkeypatch, [FakeGPU("NVIDIA A100", fake_uuid(0), NVML_DEVICE_ARCH_AMPERE, gpu_trace)]
    )
    pkg = FakeZone("package-0", PowerTrace([(10, 60.0)]))
    dram = FakeZone("dram", PowerTrace([(10, 7.0)]))
    fake = FakePowercap(tmp_path, {0: (pkg, [dram])})
    monkeypatch.setenv("LLMENERGY_POWERCAP_ROOT", str(tmp_path))
    meter = open_meter("auto")
    assert isinstance(meter, CompositeMeter)
    assert meter.backend == "auto(nvml+rapl)"
    assert set(meter.domains) == {"gpu:0", "cpu:package-0", "cpu:dram-0"}
    assert "used (GPUs: gpu:0)" in status(meter, "nvml")
    assert "used (CPU: cpu:package-0, cpu:dram-0)" in status(meter, "rapl")
    assert "CPU already measured by rapl" in status(meter, "estimate")
    assert any("CPU already measured" in note for note in meter.notes)
    with fake, meter.measure() as m:
        time.sleep(0.3)
    res = m.measurement
    gpu_truth = gpu_trace.energy_between(res.t_start, res.t_end)
    assert res.by_domain["gpu:0"] == pytest.approx(gpu_truth, abs=2 * 0.1 * 310.0)
    # the fake's counters lag the trace by at most the longest pause between its writes
    resolution_j = 2 * 60.0 * fake.max_gap_s + 1e-5
    assert res.by_domain["cpu:package-0"] == pytest.approx(60.0 * res.seconds, abs=resolution_j), (
        f"fake counter gap {fake.max_gap_s * 1e3:.1f} ms"
    )
    assert res.joules == pytest.approx(sum(res.by_domain.values()))
    assert res.methods == {
        "gpu:0": Method.COUNTER, "cpu:package-0": Method.COUNTER, "cpu:dram-0": Method.COUNTER
    }  # fmt: skip
    meter.close()


def test_with_no_sensors_auto_falls_back_to_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_pynvml_without_library(monkeypatch)
    meter = open_meter("auto", powercap_root=str(tmp_path / "none"))
    assert meter.backend.endswith("estimate)")
    for backend in ("nvml", "rapl", "pyjoules", "powermetrics"):
        assert "not used" in status(meter, backend)
    assert "no RAPL zones" in status(meter, "rapl")
    with meter.measure() as m:
        sum(range(200_000))
    assert m.measurement.estimated
    assert m.methods == {"cpu:process": Method.ESTIMATED}
