"""NVIDIA Jetson, the third GPU family (issue 46 item 1): one module (``gpu/jetson.py``)
and one row of ``gpu.device.VENDORS``; its backend, the ``auto`` meter, the thermal
reader, the machine record and torchrun's ranks follow the row.  On a fake sysfs tree
(tests/fakes/jetson.py) in both of the INA3221 drivers' layouts, whose rails follow power
traces of known energy."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

import pytest_llmenergy
from pytest_llmenergy import Method, open_meter
from pytest_llmenergy.conditions.control import GpuControl, GpuControlError, StateFile
from pytest_llmenergy.conditions.isolation import neighbours
from pytest_llmenergy.conditions.thermal import gpu_temperatures_reader
from pytest_llmenergy.errors import MeterUnavailable
from pytest_llmenergy.gpu.device import VENDORS, gpu_backend, open_library
from pytest_llmenergy.gpu.jetson import ROOT_ENV, JetsonLibrary
from pytest_llmenergy.meters import BUILTIN_BACKENDS, sample_interval_defaults
from pytest_llmenergy.meters.auto import GPU_ORDER
from pytest_llmenergy.storage.machine import gpu_info
from tests.fakes.jetson import MODEL, FakeJetson, FakeRail, orin
from tests.fakes.trace import PowerTrace

LAYOUTS = ["iio", "hwmon"]


@pytest.fixture
def only_jetson(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No NVIDIA or AMD library here; the Jetson's sysfs under tmp_path."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_both_layouts_find_the_gpu_rail(tmp_path: Path, layout: str) -> None:
    orin(tmp_path, PowerTrace([(3600, 7.25)]), layout)
    library = open_library("jetson", tmp_path)
    (gpu,) = library.devices()
    assert (gpu.domain, gpu.name, gpu.uuid) == ("gpu:0", MODEL, "jetson-VDD_GPU_SOC")
    assert gpu.power_w() == pytest.approx(7.25)  # mW (iio), or mV x mA (hwmon), in W
    assert gpu.energy_counter_j() is None  # sampled: the monitor keeps no counter
    assert gpu.temperature_c() == pytest.approx(41.5)  # GPU-therm, not CPU-therm
    note = gpu.power_note()
    assert "INA3221 rail VDD_GPU_SOC" in note and "also feeds the SoC" in note
    assert ("in_power0_input, mW" if layout == "iio" else "in1_input x curr1_input") in note
    library.close()


def test_a_rail_of_the_gpu_alone_comes_before_a_shared_one(tmp_path: Path) -> None:
    rails = [FakeRail(n, PowerTrace([(3600, w)])) for n, w in (("VDD_CPU_GPU_CV", 9), ("GPU", 3))]
    FakeJetson(tmp_path, rails)
    (gpu,) = JetsonLibrary(tmp_path).devices()
    assert gpu.power_w() == pytest.approx(3.0)
    assert "also feeds" not in gpu.power_note()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_meter_integrates_the_rail_over_a_trace_of_known_energy(
    only_jetson: Path, layout: str
) -> None:
    """A constant rail integrates exactly; a step of +10 W for 0.25 s inside the window
    adds its 2.5 J, to within what sampling every 20 ms can blur at the step's two edges."""
    trace = PowerTrace([(3600, 7.25)])
    fake = orin(only_jetson, trace, layout)
    with fake, open_meter("jetson", sample_interval_s=0.02) as meter:
        assert meter.domains["gpu:0"].method == Method.SAMPLED
        assert meter.resolution_s == pytest.approx(0.02)
        assert "gpu:0 NVIDIA Jetson AGX Orin Developer Kit: sampled (INA3221 rail" in (
            meter.describe()
        )
        with meter.measure() as flat:
            time.sleep(0.2)
        assert flat.by_domain["gpu:0"] == pytest.approx(7.25 * flat.seconds, rel=1e-6)

        fake.rails[0].trace = PowerTrace([(0.15, 5.0), (0.25, 15.0), (3600, 5.0)])
        with meter.measure() as step:
            time.sleep(0.6)
        known_j = 5.0 * step.seconds + 10.0 * 0.25
        assert step.seconds > 0.4  # the step lies inside the window
        assert step.by_domain["gpu:0"] == pytest.approx(known_j, abs=10.0 * 2 * 0.03)
        assert step.joules == pytest.approx(step.by_domain["gpu:0"])


def test_not_a_jetson_says_so_in_one_line(only_jetson: Path) -> None:
    with pytest.raises(MeterUnavailable) as info:
        open_meter("jetson")
    reason = info.value.reason
    assert reason.startswith(f"no INA3221 power monitor under {only_jetson / 'sys'}")
    assert reason.endswith("not an NVIDIA Jetson; use --energy-backend=auto or estimate")


def test_a_monitor_without_a_gpu_rail_names_its_rails(only_jetson: Path) -> None:
    FakeJetson(only_jetson, [FakeRail("VDD_IN", PowerTrace([(1, 1.0)]))], "hwmon")
    with pytest.raises(MeterUnavailable, match=r"no INA3221 rail is named for the GPU \(rails: "):
        open_meter("jetson")


def test_cuda_visible_devices_can_hide_it(
    only_jetson: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orin(only_jetson, PowerTrace([(3600, 5.0)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(MeterUnavailable, match="no NVIDIA Jetson GPU found"):
        open_meter("jetson")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with open_meter("jetson") as meter:
        assert list(meter.domains) == ["gpu:0"]


def test_auto_thermal_machine_record_and_ranks_follow_the_row(only_jetson: Path) -> None:
    orin(only_jetson, PowerTrace([(3600, 5.0)]))
    with open_meter("auto") as meter:
        assert meter.backend.startswith("auto(jetson+")
        assert "jetson: used (GPUs: gpu:0)" in meter.notes
    read = gpu_temperatures_reader(backend="auto")
    assert read() == [pytest.approx(41.5)] and "INA3221" in read.source
    read.close()
    rows, note = gpu_info()
    assert note is None
    assert [(r["index"], r["name"], r["uuid"], r["power_limit_w"]) for r in rows] == [
        (0, MODEL, "jetson-VDD_GPU_SOC", None)
    ]
    assert gpu_backend("auto") == gpu_backend("rapl") == "jetson"  # a torchrun rank's meter


def test_settings_are_refused_and_nobody_is_listed(only_jetson: Path, tmp_path: Path) -> None:
    orin(only_jetson, PowerTrace([(3600, 5.0)]))
    control = GpuControl(StateFile(tmp_path / "state.json"), backend="jetson")
    try:
        assert neighbours(control.devices, (1,)) == ()  # no process list: nothing known
        with pytest.raises(GpuControlError, match="a power limit is not supported"):
            control.limits()
    finally:
        control.close()


def test_the_family_is_one_module_and_one_row() -> None:
    """Jetson is named by its module and its VENDORS row alone; everything else follows."""
    assert [v.backend for v in VENDORS][-1] == "jetson"
    assert "jetson" in BUILTIN_BACKENDS and GPU_ORDER[-1] == "jetson"
    assert sample_interval_defaults()["jetson"] == 0.1
    package = Path(pytest_llmenergy.__file__).parent
    naming = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if re.search("jetson", p.read_text(encoding="utf-8"), re.IGNORECASE)
    )
    assert naming == ["gpu/device.py", "gpu/jetson.py"]
