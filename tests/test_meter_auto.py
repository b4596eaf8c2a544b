"""``auto``: NVML for GPUs plus the best CPU meter, each reason for leaving one out said."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from pytest_llmenergy import Method, open_meter
from pytest_llmenergy.meters.auto import CompositeMeter
from pytest_llmenergy.meters.readings import duration_text
from tests.fakes.fake_amdsmi import install_fake_amdsmi, mi300x
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
    # cpu:process: the package's energy attributed to this process tree, not counted
    assert set(meter.domains) == {"gpu:0", "cpu:package-0", "cpu:dram-0", "cpu:process"}
    assert not meter.domains["cpu:process"].counted
    assert "used (GPUs: gpu:0)" in status(meter, "nvml")
    assert "used (CPU: cpu:package-0, cpu:dram-0, cpu:process)" in status(meter, "rapl")
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
    counted = [j for d, j in res.by_domain.items() if d != "cpu:process"]
    assert res.joules == pytest.approx(sum(counted))
    assert res.methods == {
        "gpu:0": Method.COUNTER, "cpu:package-0": Method.COUNTER, "cpu:dram-0": Method.COUNTER,
        "cpu:process": Method.ATTRIBUTED,
    }  # fmt: skip
    meter.close()


@pytest.mark.serial  # a counter's period, timed from sleeps
def test_resolution_is_the_coarsest_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 20 ms GPU counter next to 1 ms RAPL counters: the window resolves 20 ms."""
    gpu = FakeGPU("NVIDIA A100", fake_uuid(0), NVML_DEVICE_ARCH_AMPERE, PowerTrace([(60, 100.0)]))
    gpu.counter_period_s = 0.02
    install_fake_pynvml(monkeypatch, [gpu])
    FakePowercap(tmp_path, {0: (FakeZone("package-0", PowerTrace([(10, 60.0)])), [])})
    monkeypatch.setenv("LLMENERGY_POWERCAP_ROOT", str(tmp_path))
    with open_meter("auto") as meter:
        assert meter.backend == "auto(nvml+rapl)"
        # the GPU's period is measured at open, in real time: a busy machine's polling
        # read 15.5 ms for 20 (CI, 2026-11-27); RAPL's is the 1 ms the zone declares
        gpu_s, rapl_s = (m.resolution_s for m in meter.meters)
        assert rapl_s == 0.001 and gpu_s == pytest.approx(0.02, rel=0.4)
        assert meter.resolution_s == gpu_s
        line = meter.describe()
        gpu_period = duration_text(meter.meters[0].resolution_s or 0.0)
        assert f"counter (NVML total energy, mJ), updates every {gpu_period}" in line
        assert "rapl: cpu:package-0 (counter), cpu:process (attributed); resolution 1 ms" in line
    # a counter that never moves: its period is not timed, so taken as NVML's 100 ms
    # (issue 60: an unknown period taken as fine kept short phases split at their marks)
    gpu.trace = PowerTrace([(60, 0.0)])
    with open_meter("auto") as meter:
        assert meter.meters[0].resolution_s == 0.1 and meter.resolution_s == 0.1


def test_counters_without_a_sampler_need_no_start_or_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML counters and the estimate: nothing to start, so windows skip the bookkeeping."""
    install_fake_pynvml(
        monkeypatch,
        [FakeGPU("NVIDIA A100", fake_uuid(0), NVML_DEVICE_ARCH_AMPERE, PowerTrace([(60, 50.0)]))],
    )
    with open_meter("auto", powercap_root=str(tmp_path / "none")) as meter:
        assert meter.backend == "auto(nvml+estimate)"
        assert not meter._uses_start_stop
        with meter.measure() as m:
            time.sleep(0.01)
        assert set(m.by_domain) == {"gpu:0", "cpu:process"}


def test_with_no_sensors_auto_falls_back_to_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_pynvml_without_library(monkeypatch)
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not installed
    meter = open_meter("auto", powercap_root=str(tmp_path / "none"))
    assert meter.backend.endswith("estimate)")
    for backend in ("nvml", "amdsmi", "rapl", "pyjoules", "powermetrics"):
        assert "not used" in status(meter, backend)
    assert "no RAPL zones" in status(meter, "rapl")
    with meter.measure() as m:
        sum(range(200_000))
    assert m.measurement.estimated
    assert m.methods == {"cpu:process": Method.ESTIMATED}


def test_amd_gpus_from_amdsmi_where_nvml_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_pynvml_without_library(monkeypatch)
    install_fake_amdsmi(monkeypatch, [mi300x(0, PowerTrace([(60, 250.0)]), counter_period_s=0.002)])
    with open_meter("auto", powercap_root=str(tmp_path / "none")) as meter:
        assert meter.backend == "auto(amdsmi+estimate)"
        assert "not used (NVML Shared Library Not Found" in status(meter, "nvml")
        assert status(meter, "amdsmi") == "amdsmi: used (GPUs: gpu:0)"
        with meter.measure() as m:
            time.sleep(0.2)
    assert m.methods["gpu:0"] is Method.COUNTER
    assert m.by_domain["gpu:0"] == pytest.approx(250.0 * m.seconds, rel=0.03)


def test_one_gpu_vendor_per_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA and AMD GPUs in one machine would both be gpu:0...: NVML's are measured."""
    gpu = FakeGPU("NVIDIA A100", fake_uuid(0), NVML_DEVICE_ARCH_AMPERE, PowerTrace([(60, 50.0)]))
    install_fake_pynvml(monkeypatch, [gpu])
    fake = install_fake_amdsmi(monkeypatch, [mi300x(0, PowerTrace([(60, 250.0)]))]).fake
    with open_meter("auto", powercap_root=str(tmp_path / "none")) as meter:
        assert meter.backend == "auto(nvml+estimate)"
        assert status(meter, "amdsmi") == "amdsmi: not used (GPUs already measured by nvml)"
    assert fake.calls["amdsmi_init"] == 0
