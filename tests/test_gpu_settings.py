"""GPU settings (issue 14, items 1, 2, 5): the fake's NVML semantics, parsing and
resolving the axes, applying with read-back, restoring, and the state file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmenergy.conditions.control import GpuControl, GpuControlError, StateFile, recover
from pytest_llmenergy.conditions.settings import (
    AUTO_CLOCK,
    GpuLimits,
    GpuSetting,
    cross,
    parse_clocks,
    parse_power_limits,
    parse_slowdowns,
    resolve_clocks,
    resolve_power,
)
from pytest_llmenergy.conditions.telemetry import TrialTelemetry
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.gpu.nvidia import NvidiaLibrary
from tests.fakes import fake_pynvml as fake_module
from tests.fakes.fake_pynvml import build_fake_pynvml, install_fake_pynvml
from tests.fakes.gpu_physics import Phase
from tests.fakes.gpu_project import PHYSICS, make_gpu

A100 = GpuLimits("gpu:0", "A100", 100.0, 400.0, 400.0, tuple(range(1410, 209, -15)))


# -- the fake behaves like NVML ------------------------------------------------------------
def test_fake_power_limit_semantics(tmp_path: Path) -> None:
    nvml = build_fake_pynvml([make_gpu()], state_path=tmp_path / "driver.json")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [100_000, 400_000]
    nvml.nvmlDeviceSetPowerManagementLimit(h, 250_000)
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 250_000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 250_000
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetPowerManagementLimit(h, 450_000)
    # the setting outlives the process: the next fake on the same file finds it
    again = build_fake_pynvml([make_gpu()], state_path=tmp_path / "driver.json")
    again.nvmlInit()
    assert again.nvmlDeviceGetPowerManagementLimit(again.nvmlDeviceGetHandleByIndex(0)) == 250_000
    user = build_fake_pynvml([make_gpu()], root=False)
    user.nvmlInit()
    with pytest.raises(user.NVMLError) as err:
        user.nvmlDeviceSetPowerManagementLimit(user.nvmlDeviceGetHandleByIndex(0), 250_000)
    assert err.value.value == fake_module.NVML_ERROR_NO_PERMISSION


def test_fake_clock_semantics() -> None:
    nvml = build_fake_pynvml([make_gpu()])
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    memory = nvml.nvmlDeviceGetSupportedMemoryClocks(h)[0]
    clocks = nvml.nvmlDeviceGetSupportedGraphicsClocks(h, memory)
    assert clocks[0] == 1410 and clocks[-1] == 210
    assert nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) == 210  # idle
    nvml.nvmlDeviceSetGpuLockedClocks(h, 1000, 1000)  # rounded to a supported clock
    assert nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) in (995, 1005)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetGpuLockedClocks(h, 100, 100)
    nvml.nvmlDeviceResetGpuLockedClocks(h)
    assert nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) == 210
    old = build_fake_pynvml([make_gpu()], old_reason_names=True)
    assert not hasattr(old, "nvmlDeviceGetCurrentClocksEventReasons")
    assert hasattr(old, "nvmlDeviceGetCurrentClocksThrottleReasons")


def test_fake_physics_caps_compute_more_than_memory() -> None:
    nvml = build_fake_pynvml([make_gpu()], virtual_time=True)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    fake = nvml.fake

    def timed(kind: str) -> float:
        t0 = fake.clock()
        fake.work(0, (Phase(kind, 1.0),))  # virtual seconds: far longer than a late wake-up
        return fake.clock() - t0

    full = {k: timed(k) for k in ("compute", "memory")}
    nvml.nvmlDeviceSetPowerManagementLimit(h, 200_000)
    capped = {k: timed(k) for k in ("compute", "memory")}
    assert capped["compute"] / full["compute"] > 1.3
    assert capped["memory"] / full["memory"] < 1.05


# -- parsing and resolving the axes ---------------------------------------------------------
def test_parse_axes() -> None:
    spec = parse_power_limits("200W,250, 80%")
    assert spec.values == (200.0, 250.0) and spec.percents == (80.0,)
    assert parse_power_limits("all").all_step == 0.0
    assert parse_power_limits("all:50W").all_step == 50.0
    assert parse_clocks("1410MHz,1200").values == (1410.0, 1200.0)
    assert parse_slowdowns("0%,5%") == (0.0, 0.05)
    for bad in ("fast", "200MHz", "-5W", "all:0W", ""):
        with pytest.raises(ConfigError, match="expected"):
            parse_power_limits(bad)
    with pytest.raises(ConfigError):
        parse_clocks("80%")


def test_resolve_power_and_clocks() -> None:
    assert resolve_power(parse_power_limits("200W,80%"), [A100], "--x") == [400.0, 320.0, 200.0]
    assert resolve_power(parse_power_limits("all:100W"), [A100], "--x") == [
        400.0,
        300.0,
        200.0,
        100.0,
    ]
    with pytest.raises(ConfigError, match=r"500 W is outside the range: .*100 W to 400 W"):
        resolve_power(parse_power_limits("500W"), [A100], "--energy-gpu-power-limits")
    clocks, notes = resolve_clocks(parse_clocks("1000MHz"), [A100], "--x")
    assert clocks[-1] == AUTO_CLOCK and clocks[0] in (995, 1005) and notes
    with pytest.raises(ConfigError, match="210 MHz to 1410 MHz"):
        resolve_clocks(parse_clocks("2000"), [A100], "--energy-gpu-clocks")
    settings = cross([400.0, 250.0], [1005, AUTO_CLOCK], 400.0, 400.0)
    assert [s.id for s in settings] == [
        "pl400W-sm1005MHz",
        "pl400W-smauto",
        "pl250W-sm1005MHz",
        "pl250W-smauto",
    ]
    assert [s.default for s in settings] == [False, True, False, False]
    assert GpuSetting(250.0).labels()["power_limit_w"] == "250"


# -- applying, reading back, restoring -------------------------------------------------------
def test_apply_reads_back_and_restore_gives_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = install_fake_pynvml(monkeypatch, [make_gpu()], state_path=tmp_path / "driver.json")
    state = StateFile(tmp_path / "state.json")
    control = GpuControl(state)
    gpu = nvml.fake.gpus[0]
    back = control.apply(GpuSetting(250.0, 1005))
    assert back[0].power_limit_w == 250.0 and back[0].sm_clock_mhz == 1005
    assert gpu.power_limit_mw == 250_000 and gpu.locked_clocks_mhz == (1005, 1005)
    assert state.read() is not None  # written before the first change
    restored = control.restore()
    assert restored[0].power_limit_w == 400.0
    assert gpu.power_limit_mw == 400_000 and gpu.locked_clocks_mhz is None
    assert state.read() is None
    control.close()
    assert nvml.fake.init_count == 0


def test_a_killed_session_is_recovered_from_its_state_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = install_fake_pynvml(monkeypatch, [make_gpu()])
    state = StateFile(tmp_path / "state.json")
    control = GpuControl(state)
    control.apply(GpuSetting(150.0, 810))
    # "killed": nothing restored; a dead pid in the file
    data = state.read()
    assert data is not None
    data["pid"] = 2**22 + 12345
    state.path.write_text(__import__("json").dumps(data))
    found = recover(state, nvml)
    assert found is not None
    assert nvml.fake.gpus[0].power_limit_mw == 400_000
    assert nvml.fake.gpus[0].locked_clocks_mhz is None
    assert not state.path.exists()
    assert recover(state, nvml) is None


def test_no_permission_is_one_line_saying_how_to_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    install_fake_pynvml(monkeypatch, [make_gpu()], root=False)
    control = GpuControl(StateFile(tmp_path / "s.json"))
    with pytest.raises(GpuControlError, match="needs root or CAP_SYS_ADMIN"):
        control.check_permission()
    control.close()


def test_telemetry_marks_a_thermally_throttled_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = build_fake_pynvml([make_gpu(thermal_works=frozenset({2}))], virtual_time=True)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetPowerManagementLimit(h, 200_000)
    device = NvidiaLibrary(nvml).by_uuid(nvml.nvmlDeviceGetUUID(h), "gpu:0", "A100")
    probe = TrialTelemetry([device], interval_s=0.002)
    seen = []
    for _ in range(2):
        probe.start()
        nvml.fake.work(0, (Phase("compute", 0.02),))
        seen.append(probe.stop())
    ok, hot = seen
    assert not ok.throttled and "sw_power_cap" in ok.reasons
    true_s, _ = PHYSICS.run((Phase("compute", 0.02),), 200.0, None, 210 / 1410)
    assert true_s > 0.025  # stretched by the cap, all of it capped:
    assert ok.power_capped_s == pytest.approx(true_s, rel=0.02)
    assert ok.sm_clock_mhz_mean is not None and ok.sm_clock_mhz_mean < 1200
    assert "hw_thermal" in hot.throttled and (hot.thermal_s or 0) > 0
    assert hot.temperature_c_max == 92


def test_a_state_file_that_is_no_json_is_one_line(tmp_path: Path) -> None:
    """Issue 33: 100,000 '[' in the state file was a RecursionError traceback."""
    for text in ("[" * 100_000, '{"format": '):
        path = tmp_path / "state.json"
        path.write_text(text)
        with pytest.raises(GpuControlError, match="cannot read the GPU state file") as info:
            StateFile(path).read()
        assert "\n" not in str(info.value)
