"""NVIDIA GPUs through NVML (``pynvml``, from nvidia-ml-py): the device layer's vendor.

NVML counts power in mW and energy in mJ, and reports which clocks hold the GPU back
(clock-event reasons), how long the power cap and heat held it (violation counters) and,
on most boards, each process's SM utilization.  It cannot read which clocks were locked,
so a GPU is taken to have its clocks unlocked when a session starts (the default after
boot).  The GPUs are the ones CUDA sees (``CUDA_VISIBLE_DEVICES``, resolved here as the
CUDA runtime resolves it), numbered as CUDA numbers them, so ``gpu:i`` is ``cuda:i``.
``init_library`` is the package's one ``nvmlInit``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from .device import (
    GPU_INFO_FIELDS,
    GpuDevice,
    GpuDeviceError,
    GpuLibrary,
    GpuProcess,
    PowerLimits,
    SmSample,
    one_line,
)

T = TypeVar("T")
_NO_PERMISSION, _NOT_SUPPORTED, _NOT_FOUND = 4, 3, 6  # NVML_ERROR_*, if pynvml lacks one
_POLICY_POWER, _POLICY_THERMAL = 0, 1
_MIB = 1024 * 1024
INSTALL_HINT = "nvidia-ml-py is not installed: pip install 'pytest-llmenergy[nvml]'"

# Hints for nvmlInit failures, by NVML error name: what the user can do about it.
_INIT_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "no NVIDIA driver on this machine",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded (try nvidia-smi)",
    "NVML_ERROR_NO_PERMISSION": "no permission to open the GPU devices (/dev/nvidia*)",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "the NVML library and the kernel driver differ in version (reboot after a driver update)"
    ),
}

_INT_ENTRY = re.compile(r"([+-]?)(\d+)")


def text(value: Any) -> str:
    """Old nvidia-ml-py releases return ``bytes``, newer ones ``str``; we want ``str``."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise GpuDeviceError(INSTALL_HINT, missing=True) from None
    return pynvml


def init_library(module: ModuleType | None = None) -> ModuleType:
    """pynvml (or ``module``, a stand-in of it), imported and initialised: the package's
    one ``nvmlInit``.  ``GpuDeviceError`` saying why (NVML's own words, what they mean
    here and what to do) where it cannot be; each success needs its ``nvmlShutdown``."""
    nvml = module if module is not None else import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        hint = "NVML could not start"
        for name, meaning in _INIT_HINTS.items():
            if code is not None and getattr(nvml, name, None) == code:
                hint = meaning
                break
        raise GpuDeviceError(f"{one_line(exc)}: {hint}") from None
    return nvml


class CudaVisible:
    """Resolves ``CUDA_VISIBLE_DEVICES`` to NVML indices the way the CUDA runtime does.

    Entries are integer indices (read like ``strtoul``: ``1gpu`` is 1), ``GPU-<uuid>``
    (a unique prefix is enough) or MIG devices; parsing stops at the first entry that
    names no device (``-1``, an index out of range, an unknown UUID), and a device
    listed twice makes CUDA see no device at all.
    """

    def __init__(self, nvml: ModuleType, count: int) -> None:
        self._nvml = nvml
        self._count = count
        self._uuids: list[str] | None = None
        self.mig_entries: dict[int, list[str]] = {}  # NVML index -> MIG entries naming it

    def uuids(self) -> list[str]:
        """All GPUs' UUIDs, fetched only when an entry names a UUID."""
        if self._uuids is None:
            nvml = self._nvml
            self._uuids = [
                text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(self._count)
            ]
        return self._uuids

    def by_uuid(self, prefix: str) -> int | None:
        matches = [i for i, uuid in enumerate(self.uuids()) if uuid.startswith(prefix)]
        exact = [i for i in matches if self.uuids()[i] == prefix]
        if exact:
            return exact[0]
        return matches[0] if len(matches) == 1 else None

    def by_mig(self, entry: str) -> int | None:
        """The parent GPU of a MIG device: NVML measures energy per physical GPU."""
        if entry.startswith("MIG-GPU-"):  # old form: MIG-GPU-<gpu uuid>/<gi>/<ci>
            return self.by_uuid(entry[len("MIG-") :].split("/", 1)[0])
        nvml = self._nvml
        try:
            mig = nvml.nvmlDeviceGetHandleByUUID(entry.encode())
            parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            parent_uuid = text(nvml.nvmlDeviceGetUUID(parent))
        except nvml.NVMLError:
            return None
        return self.by_uuid(parent_uuid)

    def resolve(self, spec: str | None) -> list[int]:
        """NVML index of each CUDA ordinal (a GPU repeats when several of its MIGs are listed)."""
        if spec is None:
            return list(range(self._count))
        ordinals: list[int] = []
        entries: list[str] = []
        for raw in spec.split(","):
            entry = raw.strip()
            index: int | None
            if entry.startswith("MIG-"):
                index = self.by_mig(entry)
            elif entry.startswith("GPU-"):
                index = self.by_uuid(entry)
            else:
                match = _INT_ENTRY.match(entry)
                index = int(match.group(2)) if match and match.group(1) != "-" else None
                if index is not None and index >= self._count:
                    index = None
            if index is None:
                break
            is_mig = entry.startswith("MIG-")
            if entry in entries or (not is_mig and index in ordinals):
                return []  # CUDA: a repeated device hides every device
            if is_mig:
                self.mig_entries.setdefault(index, []).append(entry)
            entries.append(entry)
            ordinals.append(index)
        return ordinals


class NvidiaLibrary(GpuLibrary):
    vendor = "nvidia"
    reads_through = "NVML"
    manual_restore = "nvidia-smi -pl / -rgc"

    def __init__(self, module: Any = None) -> None:
        self._open = False
        self.nvml = init_library(module)
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
        name = text(self.call(self.nvml.nvmlDeviceGetName, handle))
        uuid = text(self.call(self.nvml.nvmlDeviceGetUUID, handle))
        return NvidiaGpu(self, handle, domain, name, uuid)

    def devices(self, gpus: Sequence[int] | None = None) -> list[GpuDevice]:
        indices = self.call(visible_gpu_indices, self.nvml, gpus)
        handles = [self.call(self.nvml.nvmlDeviceGetHandleByIndex, i) for i in indices]
        return [self._device(h, f"gpu:{i}") for i, h in zip(indices, handles)]

    def by_uuid(self, uuid: str, domain: str, name: str) -> GpuDevice:
        handle = self.call(self.nvml.nvmlDeviceGetHandleByUUID, uuid.encode())
        return NvidiaGpu(self, handle, domain, name, uuid)

    def close(self) -> None:
        """nvmlShutdown exactly once per nvmlInit (NVML counts them)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):  # closing must not fail the session
                self.nvml.nvmlShutdown()

    def machine_rows(self) -> tuple[list[dict[str, Any]], str | None]:
        """Every GPU NVML lists (not only those CUDA sees: the record is the machine's),
        a GPU without a handle kept in its place; a field the driver cannot give: None."""
        nvml = self.nvml
        driver = self._field(lambda: text(nvml.nvmlSystemGetDriverVersion()))
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            return [], f"NVML sees no GPU (driver {driver})"
        rows: list[dict[str, Any]] = []
        problems: list[str] = []
        for i in range(count):
            try:
                rows.append(self._machine_row(i, nvml.nvmlDeviceGetHandleByIndex(i), driver))
            except nvml.NVMLError as exc:
                problems.append(f"GPU {i}: {one_line(exc)}")
                rows.append(dict.fromkeys(GPU_INFO_FIELDS, None) | {"index": i, "driver": driver})
        return rows, "; ".join(problems) or None

    def _field(self, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except (self.nvml.NVMLError, AttributeError):  # AttributeError: an old nvidia-ml-py
            return None

    def _machine_row(self, index: int, h: Any, driver: str | None) -> dict[str, Any]:
        nvml, field = self.nvml, self._field
        sm_clock = getattr(nvml, "NVML_CLOCK_SM", 1)
        return {
            "index": index,
            "name": field(lambda: text(nvml.nvmlDeviceGetName(h))),
            "uuid": field(lambda: text(nvml.nvmlDeviceGetUUID(h))),
            "memory_bytes": field(lambda: int(nvml.nvmlDeviceGetMemoryInfo(h).total)),
            "power_limit_w": field(lambda: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
            "default_power_limit_w": field(
                lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0
            ),
            "sm_clock_mhz": field(lambda: int(nvml.nvmlDeviceGetMaxClockInfo(h, sm_clock))),
            "driver": driver,
        }


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

    def process_ids(self) -> frozenset[int]:
        """The PIDs with a compute context on it (``nvmlDeviceGetComputeRunningProcesses``:
        CUDA's work; no name looked up per process); none where the driver keeps no list."""
        get = getattr(self._nvml, "nvmlDeviceGetComputeRunningProcesses", None)
        if get is None:
            return frozenset()
        try:
            listed = self._call(get, self.handle)
        except GpuDeviceError as exc:
            if exc.unsupported:
                return frozenset()
            raise
        return frozenset(int(p.pid) for p in listed)

    def _name(self, pid: int) -> str:
        get = getattr(self._nvml, "nvmlSystemGetProcessName", None)
        try:
            return text(self._call(get, pid)) if get is not None else ""
        except GpuDeviceError:
            return ""

    def sm_samples(self, since_us: int) -> tuple[SmSample, ...] | None:
        """NVML's per-process SM utilization samples since ``since_us``."""
        get = getattr(self._nvml, "nvmlDeviceGetProcessUtilization", None)
        if get is None:
            return None
        nvml = self._nvml
        try:
            samples = get(self.handle, since_us)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", _NOT_FOUND):
                return ()  # no sample since then: nobody used the SMs
            raise GpuDeviceError(one_line(exc)) from None
        return tuple(SmSample(int(s.pid), float(s.smUtil), int(s.timeStamp)) for s in samples)

    def energy_counter_j(self) -> float | None:
        """NVML's total-energy counter (mJ since the driver loaded; Volta and newer)."""
        try:
            get = self._nvml.nvmlDeviceGetTotalEnergyConsumption
            return int(self._call(get, self.handle)) / 1000
        except GpuDeviceError:
            return None

    def power_w(self) -> float:
        return int(self._call(self._nvml.nvmlDeviceGetPowerUsage, self.handle)) / 1000

    def power_note(self) -> str:
        return "nvmlDeviceGetPowerUsage"


def visible_gpu_indices(nvml: ModuleType, gpus: Sequence[int] | None = None) -> list[int]:
    """NVML indices of the physical GPUs CUDA sees (``CUDA_VISIBLE_DEVICES``), or of the
    ones among them that ``gpus`` (CUDA ordinals, as ``--energy-gpus``) names: the GPUs
    whose settings a sweep changes.  Needs NVML initialised."""
    count = int(nvml.nvmlDeviceGetCount())
    ordinals = CudaVisible(nvml, count).resolve(os.environ.get("CUDA_VISIBLE_DEVICES"))
    chosen = range(len(ordinals)) if gpus is None else [i for i in gpus if i < len(ordinals)]
    return list(dict.fromkeys(ordinals[i] for i in chosen))
