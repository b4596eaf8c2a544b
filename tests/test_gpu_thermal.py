"""A steady thermal state before every case (issue 37, item 3): on stand-in GPUs whose
temperature rises with the power they draw and decays toward their idle level
(tests/fakes/gpu_physics.Heat), the suite waits for the GPUs to cool between cases, keeps
every wait in the run file and sums them at the end; on virtual time, so a minute of
cooling takes none."""

from __future__ import annotations

import fnmatch
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.conditions import thermal
from pytest_llmenergy.conditions.thermal import (
    ThermalSettling,
    gpu_temperatures_reader,
    wait_summary,
)
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.gpu.device import vendor_labels
from pytest_llmenergy.results import ThermalWait
from pytest_llmenergy.storage.runfile import loads
from tests.fakes.fake_amdsmi import build_fake_amdsmi, mi210, mi300x
from tests.fakes.fake_pynvml import build_fake_pynvml
from tests.fakes.gpu_physics import Heat, Phase
from tests.fakes.gpu_project import PHYSICS, TEST_FILE, install_for_test, make_gpu, virtual_sleep
from tests.fakes.trace import SwitchTrace

HEAT = Heat(ambient_c=25.0, c_per_w=0.1, tau_s=30.0)
IDLE_C = HEAT.settled_c(PHYSICS.idle_w)  # 31 °C at 60 W


# -- the stand-in's physics -------------------------------------------------------------------
def test_the_heat_model_rises_with_power_and_decays_to_idle() -> None:
    trace = SwitchTrace(60.0, origin=0.0)
    trace.set(400.0, 10.0)
    trace.set(60.0, 40.0)
    at = lambda t: HEAT.temperature_c(trace.steps, trace.origin, t)  # noqa: E731
    assert at(5.0) == pytest.approx(IDLE_C)  # settled at idle
    peak = IDLE_C + (HEAT.settled_c(400.0) - IDLE_C) * (1 - math.exp(-1.0))  # one tau
    assert at(40.0) == pytest.approx(peak)
    assert at(70.0) == pytest.approx(IDLE_C + (peak - IDLE_C) * math.exp(-1.0))
    assert at(10_000.0) == pytest.approx(IDLE_C)
    # the time to cool, closed form, agrees with the trace
    cooled = 40.0 + HEAT.cooling_s(peak, IDLE_C + 2.0, 60.0)
    assert at(cooled) == pytest.approx(IDLE_C + 2.0)


@pytest.fixture
def nvml_heat(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fake A100 that heats with work, on virtual time (the wait's clock too)."""
    module = build_fake_pynvml([make_gpu(0, heat=HEAT)], virtual_time=True)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(thermal, "monotonic", module.fake.clock)
    monkeypatch.setattr(thermal, "sleep", virtual_sleep(module.fake))
    return module


def test_the_nvml_reader_sees_the_gpu_warm_and_cool(nvml_heat: Any) -> None:
    read = gpu_temperatures_reader()
    try:
        assert read.source == "NVML" and read() == [round(IDLE_C)]
        nvml_heat.fake.work(0, (Phase("compute", 20.0),))
        hot = read()[0]
        assert hot is not None and hot > IDLE_C + 10
        thermal.sleep(600.0)
        assert read() == [round(IDLE_C)]
    finally:
        read.close()
    assert nvml_heat.fake.init_count == 0  # NVML closed again


def test_the_amdsmi_reader_uses_the_edge_sensor_or_the_hotspot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No NVIDIA library here: amdsmi; an MI300X has no edge sensor, its hotspot is read."""
    traces = [SwitchTrace(PHYSICS.idle_w, origin=0.0) for _ in range(2)]
    gpus = [mi300x(0, traces[0], heat=HEAT), mi210(1, traces[1], heat=HEAT, physics=PHYSICS)]
    module = build_fake_amdsmi(gpus, virtual_time=True)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", module)
    read = gpu_temperatures_reader()
    try:
        assert read.source == "amdsmi" and read() == [round(IDLE_C), round(IDLE_C)]
        module.fake.work(1, (Phase("compute", 30.0),))
        idle, hot = read()
        assert idle == round(IDLE_C) and hot is not None and hot > IDLE_C + 10
    finally:
        read.close()
    assert module.fake.calls["amdsmi_shut_down"] == 1
    only_second = gpu_temperatures_reader([1])
    assert len(only_second()) == 1
    only_second.close()


def test_no_gpu_library_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(
        ConfigError, match=r"no GPU temperature can be read here \(nvidia: nvidia-ml-py.*; amd: "
    ):
        gpu_temperatures_reader()


@pytest.mark.parametrize("variable", ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"])
def test_the_amd_reader_reads_the_gpu_hip_sees(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """HIP_VISIBLE_DEVICES=1: HIP's GPU 0, the one the meter measures as gpu:0, is amdsmi's
    second; its temperature is read, not the first's (amdsmi lists both)."""
    traces = [SwitchTrace(PHYSICS.idle_w, origin=0.0) for _ in range(2)]
    gpus = [mi210(i, traces[i], heat=HEAT, physics=PHYSICS) for i in range(2)]
    module = build_fake_amdsmi(gpus, virtual_time=True)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", module)
    for name in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "1")
    module.fake.work(1, (Phase("compute", 30.0),))  # only amdsmi's second GPU heats
    for read in (gpu_temperatures_reader(), gpu_temperatures_reader([0], "amdsmi")):
        try:
            (only,) = read()
            assert only is not None and only > IDLE_C + 10
        finally:
            read.close()


# -- the wait itself, on a scripted temperature ------------------------------------------------
class Scripted:
    """Temperatures that follow a fake clock: ``temps(t)``; sleeping advances the clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, temps: Any) -> None:
        self.t = 0.0
        self.temps = temps
        monkeypatch.setattr(thermal, "monotonic", lambda: self.t)
        monkeypatch.setattr(thermal, "sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def __call__(self) -> list[float | None]:
        return list(self.temps(self.t))


def test_a_case_waits_until_near_the_previous_start(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = {"c": 40.0}
    read = Scripted(monkeypatch, lambda t: [gpu["c"] - t, None])  # a GPU without a sensor
    settling = ThermalSettling(read, tolerance_c=2.0, max_wait_s=60.0, poll_s=1.0)
    first = settling.settle()
    assert first == ThermalWait(start_c=(40.0, None), tolerance_c=2.0)  # the first: no wait
    gpu["c"] = 40.0 + 1.0 + 10.0  # the case heated the GPU by 10 °C (+1 s it took)
    read.t = 1.0
    second = settling.settle()
    assert second.reference_c == (40.0, None)
    assert second.waited_s == pytest.approx(8.0)  # 50 °C -> 42 °C, a degree a second
    assert second.start_c == (42.0, None) and not second.gave_up


def test_a_case_that_finds_the_gpus_cool_did_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the sensors takes time (a slow driver call here: 0.2 s), but that is not
    a wait: the summary counts only cases that slept."""
    read = Scripted(monkeypatch, lambda t: [40.0])
    slow = read.__call__

    def reading() -> list[float | None]:
        read.t += 0.2
        return slow()

    settling = ThermalSettling(reading, tolerance_c=2.0, max_wait_s=60.0, poll_s=1.0)
    settling.settle()
    second = settling.settle()
    assert second.reference_c == (40.0,) and second.waited_s == 0.0 and not second.gave_up


def test_the_reference_never_climbs_above_the_first_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each case may start within the tolerance of the one before it, but a chain of such
    starts would creep up a tolerance per case: the first case's start caps it."""
    temps = iter([[40.0], [42.0], [42.0], [41.0], [39.0], [39.0]])
    read = Scripted(monkeypatch, lambda t: next(temps))
    settling = ThermalSettling(read, tolerance_c=2.0, max_wait_s=60.0)
    assert settling.settle().start_c == (40.0,)
    assert settling.settle().start_c == (42.0,)  # within 2 °C of 40: no wait
    third = settling.settle()  # 42 again: its reference is 40, not 42
    assert third.reference_c == (40.0,) and third.waited_s == 0.0
    fourth = settling.settle()  # 41: starts at once (<= 42)
    assert fourth.reference_c == (40.0,)
    assert settling.settle().start_c == (39.0,)  # cooler is fine
    assert settling.reference() == [39.0]  # the previous start, when below the first's


def test_a_case_gives_up_at_the_longest_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    temps = iter([[40.0], [70.0]])
    read = Scripted(monkeypatch, lambda t: next(temps, [70.0 - 0.1 * t]))
    settling = ThermalSettling(read, tolerance_c=1.0, max_wait_s=5.0, poll_s=2.0)
    settling.settle()
    late = settling.settle()
    assert late.gave_up and late.waited_s == pytest.approx(5.0)  # 2 + 2 + 1: never past
    assert late.start_c[0] == pytest.approx(69.5)
    line = wait_summary([ThermalWait((40.0,), tolerance_c=1.0), late], 5.0)
    assert line == (
        "thermal: waited 5.0 s in all for the GPUs to cool, before 1 of 2 case(s) (longest "
        "5.0 s); 1 started hotter than their reference after the longest wait (5 s, "
        "--energy-thermal-max-wait)"
    )


# -- the suite, as users run it ------------------------------------------------------------------
@pytest.fixture
def hot_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("LLMENERGY_GPU_STATE", str(tmp_path / "llmenergy-gpu-state.json"))
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "driver-state.json"))
    monkeypatch.setenv("FAKE_GPU_HEAT", "30")
    return install_for_test(monkeypatch)


RUN = (
    "-p",
    "no:randomly",
    "--energy-backend=nvml",
    "--energy-shuffle=off",
    "--energy-min-trials=3",
    "--energy-max-trials=3",
    "--energy-warmup=1",
    "--energy-min-time=0",  # one call a trial: the stand-in GPU's works are counted
    "--energy-json=run.json",
)


def test_the_suite_waits_for_a_hot_gpu_and_reports_it(
    pytester: pytest.Pytester, hot_gpu: Any
) -> None:
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(*RUN, "--energy-thermal-tolerance=1", "-v")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*thermal: every case waits until each GPU is at most 1 °C above its reference*"
            "read through NVML, 31 °C now",
            "*waiting for the GPUs to cool: * °C, to <= 32 °C*",
            "*thermal: waited * s in all for the GPUs to cool, before 1 of 2 case(s)*",
        ]
    )
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    first, second = run.cases
    assert first.thermal is not None and second.thermal is not None
    assert first.thermal.waited_s == 0.0 and first.thermal.start_c == (31.0,)
    # the first case (3 s of prefill at 400 W with its warm-up) left the GPU warmer: the
    # second waited, whole seconds, about as long as the physics says it takes to cool
    assert second.thermal.reference_c == (31.0,) and second.thermal.start_c == (32.0,)
    assert not second.thermal.gave_up
    # no longer than the physics allows: from the hottest the GPU could be (settled at
    # full power) to the last reading above the target (32.5 °C rounds to 33), + one poll
    longest_s = HEAT.cooling_s(HEAT.settled_c(400.0), 32.5, PHYSICS.idle_w) + thermal.POLL_S
    assert 5.0 < second.thermal.waited_s <= longest_s


def test_a_gpu_that_does_not_cool_in_time_is_said(pytester: pytest.Pytester, hot_gpu: Any) -> None:
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(*RUN, "--energy-thermal-tolerance=1", "--energy-thermal-max-wait=3")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*thermal: waited 3.0 s in all for the GPUs to cool, before 1 of 2 case(s) "
            "(longest 3.0 s); 1 started hotter than their reference after the longest wait "
            "(3 s, --energy-thermal-max-wait)*"
        ]
    )
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    late = run.cases[1].thermal
    assert late is not None and late.gave_up and late.start_c[0] > 32.0  # type: ignore[operator]


def test_off_by_default_nothing_is_read_or_waited(pytester: pytest.Pytester, hot_gpu: Any) -> None:
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(*RUN)
    assert result.ret == 0, result.stdout.str()
    assert "thermal" not in result.stdout.str()
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    assert all(c.thermal is None for c in run.cases)
    assert hot_gpu.fake.calls["nvmlDeviceGetTemperature"] == 0


def test_the_ini_twin_sets_it_too(pytester: pytest.Pytester, hot_gpu: Any) -> None:
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    pytester.makeini(
        "[pytest]\nllmenergy_thermal_tolerance = 1C\nllmenergy_thermal_max_wait = 2s\n"
    )
    result = pytester.runpytest(*RUN)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*waited 2.0 s in all*1 started hotter*(2 s, *"])


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--energy-thermal-tolerance=warm"],
            "*--energy-thermal-tolerance=warm: expected degrees Celsius > 0 such as 2 or 2C, "
            "got 'warm'",
        ),
        (
            ["--energy-thermal-tolerance=2", "--energy-thermal-max-wait=0"],
            "*--energy-thermal-max-wait=0: expected seconds > 0*",
        ),
        (
            ["--energy-thermal-tolerance=2"],
            "*--energy-thermal-tolerance: no GPU temperature can be read here (nvidia: "
            "nvidia-ml-py is not installed: *; amd: the amdsmi Python package is not "
            f"installed: *): run on a machine with a GPU of a known vendor ({vendor_labels()}), "
            "or leave out --energy-thermal-tolerance",
        ),
    ],
)
def test_bad_input_and_no_gpu_stop_at_start_in_one_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str], line: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(*args, "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = [part for part in result.stderr.lines if part.strip()]
    said = " ".join(part.strip() for part in err)  # one line, fitted to the terminal
    assert fnmatch.fnmatch(said, line), said
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


AMD_TEST_FILE = """
import sys

import pytest

from tests.fakes.gpu_physics import Phase


@pytest.mark.parametrize("seconds", [20.0, 1.0])
def test_work(energy_benchmark, seconds):
    fake = sys.modules["amdsmi"].fake
    energy_benchmark(fake.work, 0, (Phase("compute", seconds),), input_tokens=8, output_tokens=8)
"""


def test_the_suite_waits_for_a_hot_amd_gpu_too(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MI300X (no edge sensor: its hotspot is read) that 20 s of work heats: the next
    case waits for it, on the amdsmi stand-in's virtual time."""
    trace = SwitchTrace(PHYSICS.idle_w)
    module = build_fake_amdsmi([mi300x(0, trace, heat=HEAT, physics=PHYSICS)], virtual_time=True)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", module)
    monkeypatch.setattr(thermal, "monotonic", module.fake.clock)
    monkeypatch.setattr(thermal, "sleep", virtual_sleep(module.fake))
    pytester.makepyfile(test_amd=AMD_TEST_FILE)
    result = pytester.runpytest(
        "-p",
        "no:randomly",
        "--energy-backend=estimate",
        "--energy-shuffle=off",
        "--energy-min-trials=2",
        "--energy-max-trials=2",
        "--energy-warmup=0",
        "--energy-thermal-tolerance=2",
        "--energy-json=run.json",
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*read through amdsmi, 31 °C now*", "*waited * s in all*before 1 of 2 case(s)*"]
    )
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    hot, after = (c.thermal for c in run.cases)
    assert hot is not None and after is not None
    # two 20 s trials at 400 W lifted it well above 33 °C; it cooled back before the next
    assert after.reference_c == (31.0,) and after.start_c[0] <= 33.0  # type: ignore[operator]
    assert after.waited_s > 10.0 and not after.gave_up
    assert module.fake.calls["amdsmi_get_temp_metric"] > 2


def test_interleaved_visits_each_wait_and_the_case_keeps_their_sum(
    pytester: pytest.Pytester, hot_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under --energy-interleave every visit of a case waits: the case keeps its first
    visit's temperatures and the seconds of all of them, which the summary adds up."""
    slept: list[float] = []
    idle = thermal.sleep
    monkeypatch.setattr(thermal, "sleep", lambda s: (slept.append(s), idle(s)))
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(
        *RUN, "--energy-interleave=2", "--energy-thermal-tolerance=1", "--energy-seed=3"
    )
    assert result.ret == 0, result.stdout.str()
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    waits = [c.thermal for c in run.cases]
    assert all(w is not None for w in waits)
    total_s = math.fsum(w.waited_s for w in waits if w is not None)
    assert total_s > 5.0  # the later visits found the GPU warm from the one before
    assert total_s == pytest.approx(math.fsum(slept), abs=0.5)  # every visit's wait counted
    result.stdout.fnmatch_lines([f"*thermal: waited {total_s:.1f} s in all*"])
    assert hot_gpu.fake.gpus[0].works == 2 * 3 + 2 * 2  # 3 trials a case, a warm-up a visit
