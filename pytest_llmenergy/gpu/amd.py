"""AMD GPUs through amdsmi (ROCm's ``amdsmi`` package): the device layer's vendor.

amdsmi counts power caps in µW (``amdsmi_get_power_cap_info``, ``amdsmi_set_power_cap``
with sensor 0), temperatures in °C (``amdsmi_get_temp_metric``; an MI300X has no edge
sensor, only the hotspot), clocks in MHz (``amdsmi_get_clock_info``: ``clk``, and
``clk_deep_sleep`` while idle), and marks a value a part lacks by the string "N/A".
The two dies of an MI250X share one power cap.  Locking clocks is not supported here:
amdsmi sets a range but cannot read back the range it replaced, and only resets it
through the performance level, so a session could not give the GPU back as it found it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import MeterUnavailable
from ..meters.amdsmi import init_library, visible_indices
from .device import (
    GPU_IDLE,
    GpuDevice,
    GpuDeviceError,
    GpuLibrary,
    GpuProcess,
    PowerLimits,
    one_line,
)

T = TypeVar("T")
_NO_PERM, _NOT_SUPPORTED = 10, 2  # amdsmi_status_t
_MIB = 1024 * 1024


def _number(value: Any) -> float | None:
    """A field as a number, or None for "N/A" (and the like)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class AmdLibrary(GpuLibrary):
    vendor = "amd"
    reads_through = "amdsmi"
    manual_restore = "amd-smi set --power-cap WATTS, or amd-smi reset --power-cap"
    no_clock_lock = (
        "locking clocks is not supported on AMD GPUs here (amdsmi cannot read back the clock "
        "range it would replace): sweep power caps with --energy-gpu-power-limits"
    )

    def __init__(self, module: Any = None) -> None:
        self._open = False
        try:
            self.smi = init_library(module)
        except MeterUnavailable as exc:
            raise GpuDeviceError(exc.reason) from None
        self._open = True

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, an amdsmi error turned into GpuDeviceError."""
        try:
            return fn(*args)
        except self.smi.AmdSmiException as exc:
            get = getattr(exc, "get_error_code", None)
            code = get() if get is not None else None
            raise GpuDeviceError(
                one_line(exc), permission=code == _NO_PERM, unsupported=code == _NOT_SUPPORTED
            ) from None

    def _handles(self) -> list[Any]:
        return list(self.call(self.smi.amdsmi_get_processor_handles))

    def _device(self, handle: Any, domain: str) -> AmdGpu:
        info = self.call(self.smi.amdsmi_get_gpu_asic_info, handle)
        name = str(info.get("market_name") or "")
        uuid = str(self.call(self.smi.amdsmi_get_gpu_device_uuid, handle))
        return AmdGpu(self, handle, domain, name if name and name != "N/A" else "AMD GPU", uuid)

    def devices(self, gpus: Sequence[int] | None = None) -> list[GpuDevice]:
        handles = self._handles()
        ordinals = visible_indices(len(handles))  # amdsmi index of each HIP ordinal
        chosen = range(len(ordinals)) if gpus is None else [i for i in gpus if i < len(ordinals)]
        return [self._device(handles[ordinals[i]], f"gpu:{i}") for i in chosen]

    def by_uuid(self, uuid: str, domain: str, name: str) -> GpuDevice:
        for handle in self._handles():
            if str(self.call(self.smi.amdsmi_get_gpu_device_uuid, handle)) == uuid:
                return AmdGpu(self, handle, domain, name, uuid)
        raise GpuDeviceError(f"no AMD GPU with UUID {uuid} (amdsmi lists it no more)")

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):  # closing must not fail the session
                self.smi.amdsmi_shut_down()


class AmdGpu(GpuDevice):
    def __init__(self, library: AmdLibrary, handle: Any, domain: str, name: str, uuid: str):
        super().__init__(domain, name, uuid)
        self._smi = library.smi
        self._call = library.call
        self.handle = handle

    def _caps_uw(self) -> dict[str, Any]:
        return self._call(self._smi.amdsmi_get_power_cap_info, self.handle)

    def power_limit_w(self) -> float:
        cap = _number(self._caps_uw().get("power_cap"))
        if cap is None:
            raise GpuDeviceError(f"{self.name}: amdsmi reports no power cap", unsupported=True)
        return cap / 1e6

    def set_power_limit_w(self, watts: float) -> None:
        self._call(self._smi.amdsmi_set_power_cap, self.handle, 0, round(watts * 1e6))

    def power_limits(self) -> PowerLimits:
        caps = self._caps_uw()
        got = [_number(caps.get(k)) for k in ("min_power_cap", "max_power_cap")]
        default = _number(caps.get("default_power_cap"))
        low, high = got
        if low is None or high is None:
            raise GpuDeviceError(f"{self.name}: amdsmi reports no power cap range")
        return PowerLimits(low / 1e6, high / 1e6, (default if default is not None else high) / 1e6)

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return ()  # see AmdLibrary.no_clock_lock

    def _gfx(self) -> dict[str, Any] | None:
        try:
            return self._call(
                self._smi.amdsmi_get_clock_info, self.handle, self._smi.AmdSmiClkType.GFX
            )
        except GpuDeviceError:
            return None

    def sm_clock_mhz(self) -> int | None:
        info = self._gfx()
        clk = None if info is None else _number(info.get("clk"))
        return None if clk is None else int(clk)

    def event_reasons(self) -> int:
        info = self._gfx()
        return GPU_IDLE if info is not None and info.get("clk_deep_sleep") == 1 else 0

    def temperature_c(self) -> float | None:
        smi = self._smi
        for sensor in (smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureType.HOTSPOT):
            try:
                value = self._call(
                    smi.amdsmi_get_temp_metric,
                    self.handle,
                    sensor,
                    smi.AmdSmiTemperatureMetric.CURRENT,
                )
            except GpuDeviceError:
                continue
            if _number(value) is not None:
                return float(value)
        return None

    def processes(self) -> tuple[GpuProcess, ...]:
        """amdsmi's process list: dicts (``pid``, ``name``, ``mem`` in bytes) in current
        releases, bare process handles (pids) in old ones."""
        out: dict[int, GpuProcess] = {}
        for p in self._call(self._smi.amdsmi_get_gpu_process_list, self.handle):
            if isinstance(p, dict):
                pid = int(p["pid"])
                name = str(p.get("name") or "")
                mem = _number(p.get("mem"))
                out.setdefault(
                    pid,
                    GpuProcess(
                        pid, "" if name == "N/A" else name, None if mem is None else mem / _MIB
                    ),
                )
            else:
                out.setdefault(int(p), GpuProcess(int(p)))
        return tuple(out.values())
