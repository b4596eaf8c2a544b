"""An adapter over pyJoules, the tool the research measured RAPL with.

pyJoules' own ``EnergyMeter`` keeps one start/stop state, so windows could not nest;
the adapter reads pyJoules' devices directly and keeps the window logic ours.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from typing import Any

from ..errors import MeterError, MeterUnavailable
from .base import Meter
from .meter_settings import MeterSettings
from .rapl import PERMISSION_HINT
from .readings import Domain, Method, Reading

BACKEND = "pyjoules"
# What pyJoules' counters resolve: RAPL registers update about every 1 ms; NVML's GPU
# counter every 20 to 100 ms depending on the board (the nvml meter times it; through
# pyJoules we cannot, so the coarse end is assumed).
RAPL_UPDATE_PERIOD_S = 0.001
NVML_UPDATE_PERIOD_S = 0.1
_RAPL_RE = re.compile(r"^(package|dram|core|uncore)_(\d+)$")
_GPU_RE = re.compile(r"^nvidia_gpu_(\d+)$")


def domain_for(pyjoules_name: str) -> tuple[Domain, float]:
    """Our domain for a pyJoules domain name, and the factor from its unit to joules."""
    if m := _RAPL_RE.match(pyjoules_name):
        kind, socket = m.groups()
        counted = kind in ("package", "dram")  # core and uncore are parts of package
        return Domain(f"cpu:{kind}-{socket}", Method.COUNTER, counted), 1e-6  # µJ
    if m := _GPU_RE.match(pyjoules_name):
        return Domain(f"gpu:{m.group(1)}", Method.COUNTER), 1e-3  # mJ
    raise MeterUnavailable(BACKEND, f"pyJoules reported an unknown domain {pyjoules_name!r}")


class PyJoulesMeter(Meter):
    backend = BACKEND

    def __init__(self, devices: list[Any]) -> None:
        super().__init__()
        self._devices = devices
        names = [str(d) for dev in devices for d in dev.get_configured_domains()]
        mapped = [domain_for(n) for n in names]
        self._domains = {dom.name: dom for dom, _ in mapped}
        self._names = [dom.name for dom, _ in mapped]
        self._scale = [scale for _, scale in mapped]
        gpu = any(name.startswith("gpu:") for name in self._names)
        self._resolution_s = NVML_UPDATE_PERIOD_S if gpu else RAPL_UPDATE_PERIOD_S
        self.notes = (
            "pyjoules: " + ", ".join(f"{n} as {d}" for n, d in zip(names, self._names)),
            "pyjoules: counters are read at the window's edges; pyJoules does not handle "
            "RAPL wraparound, so a window longer than a wrap period fails (use rapl)",
        )

    @property
    def domains(self) -> Mapping[str, Domain]:
        return self._domains

    def _read(self) -> Reading:
        values = [v for dev in self._devices for v in dev.get_energy()]
        return Reading(t=time.perf_counter(), state=values)

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, scale, va, vb in zip(self._names, self._scale, a.state, b.state):
            if vb < va:
                raise MeterError(
                    f"{name}: the counter wrapped during the window and pyJoules cannot "
                    "unwrap it; use --energy-backend=rapl, which can"
                )
            out[name] = (vb - va) * scale
        return out


def create(options: MeterSettings) -> PyJoulesMeter:
    try:
        from pyJoules.device import rapl_device
        from pyJoules.device.device_factory import DeviceFactory
        from pyJoules.exception import NoSuchDeviceError
    except ImportError as exc:
        raise MeterUnavailable(
            BACKEND, f"pyJoules is not installed ({exc}): pip install 'pytest-llmenergy[pyjoules]'"
        ) from exc
    root = options.resolved_powercap_root()
    # pyJoules reads a module-level path; point it at the tree the rapl meter would read
    # (for the default root this is pyJoules' own default).
    rapl_device.RAPL_API_DIR = os.path.join(root, "intel-rapl")
    try:
        devices = DeviceFactory.create_devices()
    except NoSuchDeviceError as exc:  # pyJoules raises it without a message
        raise MeterUnavailable(
            BACKEND, f"pyJoules found no RAPL or NVIDIA device under {root} (NoSuchDeviceError)"
        ) from exc
    except PermissionError as exc:
        raise MeterUnavailable(BACKEND, f"cannot read {exc.filename}: {PERMISSION_HINT}") from exc
    if not devices:
        raise MeterUnavailable(
            BACKEND, f"pyJoules found no RAPL zones under {root} and no NVIDIA GPU through NVML"
        )
    meter = PyJoulesMeter(devices)
    try:  # energy_uj is root-only on most kernels: fail now, not in the first case
        meter._read()
    except PermissionError as exc:
        raise MeterUnavailable(BACKEND, f"cannot read {exc.filename}: {PERMISSION_HINT}") from exc
    return meter
