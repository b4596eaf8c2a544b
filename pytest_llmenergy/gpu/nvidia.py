"""NVIDIA GPUs through NVML (``pynvml``, from nvidia-ml-py): the device layer's vendor.

NVML counts power in mW and reports which clocks hold the GPU back (clock-event
reasons), how long the power cap and heat held it (violation counters) and, on most
boards, each process's SM utilization.  It cannot read which clocks were locked, so a
GPU is taken to have its clocks unlocked when a session starts (the default after boot).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..meters.nvml import visible_gpu_indices
from .device import GpuDevice, GpuDeviceError, GpuLibrary, GpuProcess, PowerLimits, one_line

T = TypeVar("T")
_NO_PERMISSION, _NOT_SUPPORTED = 4, 3  # NVML_ERROR_*, if pynvml lacks one
_POLICY_POWER, _POLICY_THERMAL = 0, 1
_MIB = 1024 * 1024


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvidiaLibrary(GpuLibrary):
    vendor = "nvidia"
    manual_restore = "nvidia-smi -pl / -rgc"

    def __init__(self, module: Any = None) -> None:
        if module is None:
            try:
                import pynvml as module
            except ImportError:
                raise GpuDeviceError(
                    "nvidia-ml-py is not installed: pip install 'pytest-llmenergy[nvml]'"
                ) from None
        self.nvml = module
        self._open = False
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise GpuDeviceError(f"NVML could not start ({one_line(exc)})") from None
        self._open = True

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, an NVML error turned into GpuDeviceError."""
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            raise GpuDeviceError(
                one_line(exc),
                permission=code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", _NO_PERMISSION),
                unsupported=code == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED),
            ) from None

    def _device(self, handle: Any, domain: str) -> NvidiaGpu:
        name = _text(self.call(self.nvml.nvmlDeviceGetName, handle))
        uuid = _text(self.call(self.nvml.nvmlDeviceGetUUID, handle))
        return NvidiaGpu(self, handle, domain, name, uuid)

    def devices(self, gpus: Sequence[int] | None = None) -> list[GpuDevice]:
        indices = self.call(visible_gpu_indices, self.nvml, gpus)
        handles = [self.call(self.nvml.nvmlDeviceGetHandleByIndex, i) for i in indices]
        return [self._device(h, f"gpu:{i}") for i, h in zip(indices, handles)]

    def by_uuid(self, uuid: str, domain: str, name: str) -> GpuDevice:
        handle = self.call(self.nvml.nvmlDeviceGetHandleByUUID, uuid.encode())
        return NvidiaGpu(self, handle, domain, name, uuid)

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):  # closing must not fail the session
                self.nvml.nvmlShutdown()


class NvidiaGpu(GpuDevice):
    def __init__(
        self, library: NvidiaLibrary, handle: Any, domain: str, name: str, uuid: str
    ) -> None:
        super().__init__(domain, name, uuid)
        self._library = library
        self._nvml = library.nvml
        self._call = library.call
        self.handle = handle
        nvml = self._nvml
        self._sm = getattr(nvml, "NVML_CLOCK_SM", 1)
        self._sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )  # the name before nvidia-ml-py 12.535

    def power_limit_w(self) -> float:
        return int(self._call(self._nvml.nvmlDeviceGetPowerManagementLimit, self.handle)) / 1000

    def set_power_limit_w(self, watts: float) -> None:
        self._call(self._nvml.nvmlDeviceSetPowerManagementLimit, self.handle, round(watts * 1000))

    def power_limits(self) -> PowerLimits:
        nvml, h = self._nvml, self.handle
        low, high = self._call(nvml.nvmlDeviceGetPowerManagementLimitConstraints, h)
        default = self._call(nvml.nvmlDeviceGetPowerManagementDefaultLimit, h)
        return PowerLimits(low / 1000, high / 1000, default / 1000)

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        nvml, h = self._nvml, self.handle
        memory = max(self._call(nvml.nvmlDeviceGetSupportedMemoryClocks, h))
        clocks = self._call(nvml.nvmlDeviceGetSupportedGraphicsClocks, h, memory)
        return tuple(sorted((int(c) for c in clocks), reverse=True))

    def lock_clocks_mhz(self, mhz: int) -> None:
        self._call(self._nvml.nvmlDeviceSetGpuLockedClocks, self.handle, mhz, mhz)

    def reset_clocks(self) -> None:
        self._call(self._nvml.nvmlDeviceResetGpuLockedClocks, self.handle)

    def sm_clock_mhz(self) -> int | None:
        try:
            return int(self._call(self._nvml.nvmlDeviceGetClockInfo, self.handle, self._sm))
        except GpuDeviceError:
            return None

    def temperature_c(self) -> float | None:
        try:
            get = self._nvml.nvmlDeviceGetTemperature
            return float(self._call(get, self.handle, self._sensor))
        except GpuDeviceError:
            return None

    def event_reasons(self) -> int:
        if self._reasons is None:
            return 0
        try:
            return int(self._call(self._reasons, self.handle))
        except GpuDeviceError:
            return 0

    def violation_ns(self) -> tuple[int, int] | None:
        get = getattr(self._nvml, "nvmlDeviceGetViolationStatus", None)
        if get is None:
            return None
        try:
            power = self._call(get, self.handle, _POLICY_POWER).violationTime
            heat = self._call(get, self.handle, _POLICY_THERMAL).violationTime
        except GpuDeviceError:
            return None
        return int(power), int(heat)

    def enforced_power_limit_w(self) -> float | None:
        get = getattr(self._nvml, "nvmlDeviceGetEnforcedPowerLimit", None)
        if get is None:
            return super().enforced_power_limit_w()
        try:
            return int(self._call(get, self.handle)) / 1000
        except GpuDeviceError:
            return None

    def processes(self) -> tuple[GpuProcess, ...]:
        """Compute and graphics processes; a list the driver does not keep is empty."""
        nvml = self._nvml
        seen: dict[int, GpuProcess] = {}
        for kind in ("Compute", "Graphics"):
            get = getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses", None)
            if get is None:
                continue
            try:
                listed = self._call(get, self.handle)
            except GpuDeviceError as exc:
                if exc.unsupported:
                    continue
                raise
            for p in listed:
                used = getattr(p, "usedGpuMemory", None)
                memory = used / _MIB if isinstance(used, int) else None
                seen.setdefault(int(p.pid), GpuProcess(int(p.pid), self._name(p.pid), memory))
        return tuple(seen.values())

    def _name(self, pid: int) -> str:
        get = getattr(self._nvml, "nvmlSystemGetProcessName", None)
        try:
            return _text(self._call(get, pid)) if get is not None else ""
        except GpuDeviceError:
            return ""
