"""NVIDIA Jetson: the integrated GPU's power rail, read from the board's INA3221 power
monitor in sysfs (as Zeus and energymon read it); no library, nothing to initialise.

The monitor's driver lays its files out one of two ways:

* older JetPack (L4T 32, the ``ina3221x`` driver):
  ``/sys/bus/i2c/drivers/ina3221x/*/iio:device*/`` with ``rail_name_N`` and
  ``in_powerN_input`` in mW (else ``in_voltageN_input`` in mV and ``in_currentN_input``
  in mA);
* newer JetPack (L4T 34 on, the kernel's hwmon driver): ``/sys/class/hwmon/hwmon*/``
  whose ``name`` is ``ina3221``, with ``inN_label``, ``inN_input`` in mV and
  ``currN_input`` in mA.

The GPU's rail is the one named for it: ``VDD_GPU`` (TX1, TX2), ``POM_5V_GPU`` (Nano),
``GPU`` (AGX Xavier), and on newer modules a rail the GPU shares: ``VDD_CPU_GPU_CV``
(Xavier NX, Orin NX and Nano: CPU, GPU and CV cores) or ``VDD_GPU_SOC`` (AGX Orin: GPU
and SoC), which the meter's line names.  The monitor keeps no energy counter: the rail's
power is sampled (every 0.1 s by default) and integrated.  A Jetson has one GPU,
``gpu:0``, which torch calls ``cuda:0`` (a ``CUDA_VISIBLE_DEVICES`` that does not start
with 0 hides it).  Its temperature is the ``GPU-therm`` thermal zone's; it has no power
limit, clock lock or process list here.  ``LLMENERGY_JETSON_ROOT`` names the folder that
stands for ``/`` (a container that mounts the host's sysfs elsewhere; tests).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .device import GpuDevice, GpuDeviceError, GpuLibrary

ROOT_ENV = "LLMENERGY_JETSON_ROOT"
IIO_GLOB = "sys/bus/i2c/drivers/ina3221x/*/iio:device*"
HWMON_GLOB = "sys/class/hwmon/hwmon*"
THERMAL_GLOB = "sys/class/thermal/thermal_zone*"
MODEL_FILE = "proc/device-tree/model"
# Rails that feed more than the GPU, by the word in their name besides GPU.
_SHARED = {"CPU": "CPU", "SOC": "SoC", "CV": "CV cores"}


@dataclass(frozen=True)
class Rail:
    """One channel of an INA3221: its label, and its power as files to read."""

    label: str
    power_mw: Path | None  # in_powerN_input (iio)
    volts_mv: Path | None  # in_voltageN_input (iio), inN_input (hwmon)
    current_ma: Path | None  # in_currentN_input (iio), currN_input (hwmon)

    def power_w(self) -> float:
        if self.power_mw is not None:
            return _number(self.power_mw) / 1000
        assert self.volts_mv is not None and self.current_ma is not None
        return _number(self.volts_mv) * _number(self.current_ma) / 1e6

    def source(self) -> str:
        if self.power_mw is not None:
            return f"{self.power_mw.name}, mW"
        assert self.volts_mv is not None and self.current_ma is not None
        return f"{self.volts_mv.name} x {self.current_ma.name}, mV x mA"


def _number(path: Path) -> float:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise GpuDeviceError(f"{path}: {' '.join(str(exc).split())}") from None


def _file(folder: Path, name: str) -> Path | None:
    path = folder / name
    return path if path.is_file() else None


def find_rails(root: Path) -> list[Rail]:
    """Every INA3221 rail whose power can be read, in either layout."""
    rails: list[Rail] = []
    for folder in sorted(root.glob(IIO_GLOB)):
        for name_file in sorted(folder.glob("rail_name_*")):
            n = name_file.name.rpartition("_")[2]
            power = _file(folder, f"in_power{n}_input")
            volts = _file(folder, f"in_voltage{n}_input")
            current = _file(folder, f"in_current{n}_input")
            if power is not None or (volts is not None and current is not None):
                rails.append(Rail(name_file.read_text().strip(), power, volts, current))
    for folder in sorted(root.glob(HWMON_GLOB)):
        name = _file(folder, "name")
        if name is None or name.read_text().strip() != "ina3221":
            continue
        for label in sorted(folder.glob("in*_label")):
            n = label.name[2:].partition("_")[0]
            volts = _file(folder, f"in{n}_input")
            current = _file(folder, f"curr{n}_input")
            if volts is not None and current is not None:
                rails.append(Rail(label.read_text().strip(), None, volts, current))
    return rails


def gpu_rail(rails: Sequence[Rail]) -> Rail | None:
    """The rail named for the GPU, one of its own before one it shares."""
    named = [r for r in rails if "GPU" in r.label.upper()]
    own = [r for r in named if not shares(r.label)]
    return (own or named or [None])[0]


def shares(label: str) -> list[str]:
    """What else a GPU rail feeds, by its name (``VDD_CPU_GPU_CV``: CPU, CV cores)."""
    words = re.split(r"[^A-Z0-9]+", label.upper())
    return [what for word, what in _SHARED.items() if word in words]


def _cuda_sees_it() -> bool:
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return True
    first = spec.split(",")[0].strip()
    match = re.match(r"\d+", first)
    return first.startswith("GPU-") or (match is not None and int(match.group()) == 0)


class JetsonLibrary(GpuLibrary):
    vendor = "jetson"
    reads_through = "the INA3221 power monitor (sysfs)"
    manual_restore = "nothing to restore: no setting of a Jetson's GPU is changed here"
    no_clock_lock = "locking clocks is not supported on a Jetson here (nvpmodel sets its modes)"

    def __init__(self, module: Any = None) -> None:
        """``module``: the folder standing for ``/`` (else ``$LLMENERGY_JETSON_ROOT``, or /)."""
        self.root = Path(module if module is not None else os.environ.get(ROOT_ENV, "/"))
        rails = find_rails(self.root)
        if not rails:
            raise GpuDeviceError(
                f"no INA3221 power monitor under {self.root / 'sys'} (neither the ina3221x "
                "driver's rails nor an ina3221 hwmon device): not an NVIDIA Jetson"
            )
        rail = gpu_rail(rails)
        if rail is None:
            names = ", ".join(r.label for r in rails)
            raise GpuDeviceError(f"no INA3221 rail is named for the GPU (rails: {names})")
        self.rail = rail
        model = _file(self.root, MODEL_FILE)
        name = model.read_text(errors="replace").strip("\x00\n ") if model else ""
        self.name = name or "NVIDIA Jetson"

    def devices(self, gpus: Sequence[int] | None = None) -> list[GpuDevice]:
        if not _cuda_sees_it() or (gpus is not None and 0 not in gpus):
            return []
        return [JetsonGpu(self, "gpu:0")]

    def by_uuid(self, uuid: str, domain: str, name: str) -> GpuDevice:
        gpu = JetsonGpu(self, domain)
        if gpu.uuid != uuid:
            raise GpuDeviceError(f"no Jetson GPU {uuid} here (this one is {gpu.uuid})")
        return gpu

    def close(self) -> None:
        pass


class JetsonGpu(GpuDevice):
    def __init__(self, library: JetsonLibrary, domain: str) -> None:
        super().__init__(domain, library.name, f"jetson-{library.rail.label}")
        self.rail = library.rail
        self._root = library.root

    def power_w(self) -> float:
        return self.rail.power_w()

    def power_note(self) -> str:
        note = f"INA3221 rail {self.rail.label} ({self.rail.source()})"
        also = shares(self.rail.label)
        if also:
            note += f", which also feeds the {' and '.join(also)}: their power is counted too"
        return note

    def temperature_c(self) -> float | None:
        for zone in sorted(self._root.glob(THERMAL_GLOB)):
            kind = _file(zone, "type")
            temp = _file(zone, "temp")
            if kind is None or temp is None:
                continue
            if kind.read_text().strip().lower().startswith("gpu"):  # GPU-therm, gpu-thermal
                try:
                    return _number(temp) / 1000
                except GpuDeviceError:
                    return None
        return None
