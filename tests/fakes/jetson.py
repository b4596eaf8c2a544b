"""A fake NVIDIA Jetson sysfs tree in a temp dir, laid out as its INA3221 drivers lay it out.

``layout="iio"`` (older JetPack, the ``ina3221x`` driver):
``sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0/`` with ``rail_name_N`` and
``in_powerN_input`` (mW), ``in_voltageN_input`` (mV), ``in_currentN_input`` (mA), channels
from 0.  ``layout="hwmon"`` (newer JetPack): ``sys/class/hwmon/hwmon2/`` with ``name``
``ina3221``, ``inN_label``, ``inN_input`` (mV), ``currN_input`` (mA), channels from 1; beside
it an unrelated hwmon device (a fan) that the reader must pass over.  Each rail follows a
power trace (tests/fakes/trace.py): while started, a writer thread rewrites every rail's
files from its trace, atomically, as sysfs values appear, at a constant voltage.  Also
``proc/device-tree/model`` and a ``GPU-therm`` thermal zone.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .trace import PowerTrace

ORIN_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")  # AGX Orin's first monitor
MODEL = "NVIDIA Jetson AGX Orin Developer Kit"


@dataclass
class FakeRail:
    label: str
    trace: PowerTrace
    volts_mv: int = 5000


class FakeJetson:
    def __init__(
        self,
        root: Path,
        rails: list[FakeRail],
        layout: str = "iio",
        gpu_temp_mc: int = 41_500,
        tick_s: float = 0.002,
    ) -> None:
        self.root = root
        self.rails = rails
        self.layout = layout
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        model = root / "proc/device-tree/model"
        model.parent.mkdir(parents=True)
        model.write_text(MODEL + "\x00")
        zone = root / "sys/class/thermal/thermal_zone1"
        zone.mkdir(parents=True)
        (zone / "type").write_text("GPU-therm\n")
        (zone / "temp").write_text(f"{gpu_temp_mc}\n")
        cpu = root / "sys/class/thermal/thermal_zone0"
        cpu.mkdir()
        (cpu / "type").write_text("CPU-therm\n")
        (cpu / "temp").write_text("38000\n")
        if layout == "iio":
            self.folder = root / "sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0"
            self.folder.mkdir(parents=True)
            self.first = 0
            for n, rail in enumerate(rails):
                (self.folder / f"rail_name_{n}").write_text(rail.label + "\n")
        elif layout == "hwmon":
            fan = root / "sys/class/hwmon/hwmon0"
            fan.mkdir(parents=True)
            (fan / "name").write_text("pwmfan\n")
            (fan / "in1_label").write_text("VDD_GPU\n")  # not an INA3221: passed over
            self.folder = root / "sys/class/hwmon/hwmon2"
            self.folder.mkdir(parents=True)
            (self.folder / "name").write_text("ina3221\n")
            self.first = 1
            for n, rail in enumerate(rails, start=1):
                (self.folder / f"in{n}_label").write_text(rail.label + "\n")
        else:
            raise ValueError(layout)
        self._write_all(time.perf_counter())

    def _files(self, n: int, rail: FakeRail, t: float) -> dict[str, str]:
        mw = rail.trace.power_at(t) * 1000
        ma = mw / rail.volts_mv * 1000
        if self.layout == "iio":
            return {
                f"in_power{n}_input": f"{round(mw)}",
                f"in_voltage{n}_input": f"{rail.volts_mv}",
                f"in_current{n}_input": f"{round(ma)}",
            }
        return {f"in{n}_input": f"{rail.volts_mv}", f"curr{n}_input": f"{round(ma)}"}

    def _write_all(self, t: float) -> None:
        for n, rail in enumerate(self.rails, start=self.first):
            for name, value in self._files(n, rail, t).items():
                tmp = self.folder / f".{name}.tmp"
                tmp.write_text(value + "\n")
                os.replace(tmp, self.folder / name)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self._write_all(time.perf_counter())

    def start(self) -> FakeJetson:
        self._write_all(time.perf_counter())
        self._thread = threading.Thread(target=self._run, name="fake jetson", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FakeJetson:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def orin(root: Path, gpu: PowerTrace, layout: str = "iio") -> FakeJetson:
    """An AGX Orin: the GPU on VDD_GPU_SOC (shared with the SoC), the CPU, the board's input."""
    traces = [gpu, PowerTrace([(3600, 4.0)]), PowerTrace([(3600, 9.0)])]
    return FakeJetson(root, [FakeRail(n, t) for n, t in zip(ORIN_RAILS, traces)], layout)
