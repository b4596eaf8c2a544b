"""A stand-in for the ``pynvml`` module (nvidia-ml-py) whose GPUs follow power traces.

It keeps the real module's behaviour where our meter could trip over it:
``NVMLError(value)`` turns into the subclass for that code, calls before ``nvmlInit``
raise ``Uninitialized``, ``nvmlDeviceGetHandleByUUID`` wants ``bytes``, the energy
counter is an integer in mJ that the driver refreshes only every ``counter_period_s``
and does not exist before Volta, ``nvmlDeviceGetPowerUsage`` is a 1 s average on
Ampere and newer, and ``nvmlDeviceGetFieldValues`` reports failure per field.
What other NVML clients (Zeus) probe is there too: ``_nvmlGetFunctionPointer``,
which the official bindings have and unofficial ones lack, and the C2C (Grace Hopper)
query, unsupported on other boards.

The settings a GPU keeps behave as on a real board: the power limit (mW, within
``nvmlDeviceGetPowerManagementLimitConstraints``) and locked SM clocks (within the
supported clocks) can be set only as root (``NVML_ERROR_NO_PERMISSION`` otherwise), read
back, and outlive the process: with ``state_path`` the fake keeps them in a file that the
next "process" (the next fake built on that file) finds, as the driver would.  A GPU
whose ``trace`` is a ``SwitchTrace`` and which has ``physics`` runs work (``fake.work``)
at the clock its power limit and locked clocks allow (tests/fakes/gpu_physics.py), and
reports that clock, its temperature, the clock-event (throttle) reasons and the
violation times while the work runs.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from .gpu_physics import (
    REASON_GPU_IDLE,
    REASON_HW_THERMAL,
    REASON_NONE,
    Heat,
    Phase,
    Physics,
)
from .trace import PowerTrace, SwitchTrace

NVML_SUCCESS = 0
ERROR_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_IN_USE": 19,
    "NVML_ERROR_MEMORY": 20,
    "NVML_ERROR_NO_DATA": 21,
    "NVML_ERROR_UNKNOWN": 999,
}
_ERROR_STRINGS = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    8: "Insufficient External Power",
    9: "Driver Not Loaded",
    10: "Timeout",
    11: "Interrupt Request Issue",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    20: "Insufficient Memory",
    999: "Unknown Error",
}
NVML_ERROR_UNINITIALIZED = ERROR_CODES["NVML_ERROR_UNINITIALIZED"]
NVML_ERROR_INVALID_ARGUMENT = ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"]
NVML_ERROR_NOT_SUPPORTED = ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"]
NVML_ERROR_NOT_FOUND = ERROR_CODES["NVML_ERROR_NOT_FOUND"]
NVML_ERROR_LIBRARY_NOT_FOUND = ERROR_CODES["NVML_ERROR_LIBRARY_NOT_FOUND"]
NVML_ERROR_DRIVER_NOT_LOADED = ERROR_CODES["NVML_ERROR_DRIVER_NOT_LOADED"]
NVML_ERROR_GPU_IS_LOST = ERROR_CODES["NVML_ERROR_GPU_IS_LOST"]

NVML_DEVICE_ARCH_KEPLER = 2
NVML_DEVICE_ARCH_MAXWELL = 3
NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3

NVML_POWER_SCOPE_GPU = 0
NVML_POWER_SCOPE_MODULE = 1
NVML_POWER_SCOPE_MEMORY = 2

NVML_TEMPERATURE_GPU = 0

NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
VISIBLE_S = 0.015  # real seconds a phase lasts under virtual time, at most
MIN_VISIBLE_S = 0.005  # phases shorter than twice this pass at once
_VIOLATION_BITS = ((NVML_PERF_POLICY_POWER, 0x4), (NVML_PERF_POLICY_THERMAL, 0x40))

# Clock-event (formerly "throttle") reasons: both spellings, as nvidia-ml-py 12.535+ has.
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksThrottleReasonGpuIdle = 0x1
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonSwThermalSlowdown = 0x20

_CONSTANT_PREFIXES = (
    "NVML_SUCCESS",
    "NVML_DEVICE_ARCH_",
    "NVML_FI_",
    "NVML_VALUE_",
    "NVML_CLOCK_",
    "NVML_POWER_SCOPE_",
    "NVML_TEMPERATURE_",
    "NVML_PERF_POLICY_",
    "nvmlClocks",
)


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` builds the subclass registered for ``code``."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # pynvml's own name
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:  # pynvml compares errors by code
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = None  # type: ignore[assignment]  # as in pynvml, where __eq__ drops it


def _error_class(code_name: str, code: int) -> type[NVMLError]:
    """NVML_ERROR_NOT_SUPPORTED -> NVMLError_NotSupported, constructible without arguments."""
    words = code_name.removeprefix("NVML_ERROR_").split("_")
    class_name = "NVMLError_" + "".join(w.capitalize() for w in words)

    def new(cls: type[NVMLError], *args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    error_class = type(class_name, (NVMLError,), {"__new__": new, "__module__": "pynvml"})
    NVMLError._valClassMapping[code] = error_class
    return error_class


ERROR_CLASSES = {name: _error_class(name, code) for name, code in ERROR_CODES.items()}
NVMLError_NotSupported = ERROR_CLASSES["NVML_ERROR_NOT_SUPPORTED"]
NVMLError_NotFound = ERROR_CLASSES["NVML_ERROR_NOT_FOUND"]
NVMLError_Uninitialized = ERROR_CLASSES["NVML_ERROR_UNINITIALIZED"]
NVMLError_LibraryNotFound = ERROR_CLASSES["NVML_ERROR_LIBRARY_NOT_FOUND"]
NVMLError_InvalidArgument = ERROR_CLASSES["NVML_ERROR_INVALID_ARGUMENT"]
NVMLError_GpuIsLost = ERROR_CLASSES["NVML_ERROR_GPU_IS_LOST"]
NVMLError_NoPermission = ERROR_CLASSES["NVML_ERROR_NO_PERMISSION"]
NVML_ERROR_NO_PERMISSION = ERROR_CODES["NVML_ERROR_NO_PERMISSION"]


def fake_uuid(n: int) -> str:
    """A deterministic GPU UUID; GPUs n and m share the prefix ``GPU-0000000``."""
    return f"GPU-{n:08x}-1a2b-3c4d-5e6f-{n:012x}"


def fake_mig_uuid(n: int) -> str:
    return f"MIG-{n:08x}-aaaa-bbbb-cccc-{n:012x}"


@dataclass
class FakeGPU:
    """One simulated board.

    ``architecture=None`` makes nvmlDeviceGetArchitecture unsupported (old drivers);
    ``energy_counter=False`` makes a Volta+ board without a usable counter (some vGPUs);
    ``lost=True`` makes every query raise ``GPU is lost``;
    ``c2c_enabled=None`` makes the C2C mode query unsupported (every board but Grace Hopper).
    The static facts (memory, power limits in mW, max SM clock in MHz) are what
    ``nvidia-smi -q`` would show; a limit or clock of None makes its query unsupported.
    """

    name: str
    uuid: str
    architecture: int | None
    trace: PowerTrace
    counter_period_s: float = 0.1
    energy_offset_mj: int = 0
    instant_field: bool = False
    mig_uuids: tuple[str, ...] = ()
    energy_counter: bool = True
    lost: bool = False
    memory_bytes: int = 40 * 1024**3
    power_limit_mw: int | None = 400_000
    default_power_limit_mw: int | None = 400_000
    max_sm_clock_mhz: int | None = 1410
    c2c_enabled: bool | None = None
    # What can be set, as ``nvidia-smi -q -d POWER,SUPPORTED_CLOCKS`` would list it.
    min_power_limit_mw: int = 100_000
    max_power_limit_mw: int = 400_000
    memory_clock_mhz: int = 1215
    supported_sm_clocks_mhz: tuple[int, ...] = tuple(range(1410, 209, -15))  # A100's
    idle_sm_clock_mhz: int = 210
    locked_clocks_mhz: tuple[int, int] | None = None
    idle_temperature_c: int = 35
    physics: Physics | None = None
    thermal_works: frozenset[int] = frozenset()  # work calls (1-based) thermally throttled
    # With heat, the temperature follows the power trace (warms with work, cools after);
    # without, it is the idle temperature plus a step while working.
    heat: Heat | None = None
    # What the board is doing now, for the getters (set by FakeNvml.work).
    busy: tuple[int, int, float] | None = field(default=None, repr=False)  # mhz, reasons, W
    works: int = field(default=0, repr=False)
    violation_ns: dict[int, int] = field(default_factory=dict, repr=False)
    # Processes with a context on the board, pid -> (name, bytes used or None where the
    # driver cannot tell, as under some vGPUs and in containers): compute and graphics.
    # A process that ran work() has a compute context (as a CUDA program would).
    processes: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    graphics_processes: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    # Per-process utilization samples (µs since the epoch, pid, SM %), as the driver
    # keeps them, where ``process_utilization`` (most boards since Maxwell; off by default
    # here, so a fake GPU's meter reports its GPUs alone unless a test asks for gpu:process):
    # otherwise NOT_SUPPORTED, as under vGPUs.
    util_samples: list[tuple[int, int, int]] = field(default_factory=list)
    process_utilization: bool = False


@dataclass
class FakeProcessInfo:
    """``c_nvmlProcessInfo_t``: pynvml turns an unknown memory use into None."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeUtilSample:
    """``c_nvmlProcessUtilizationSample_t``: percentages over the driver's sample period."""

    pid: int
    timeStamp: int  # µs since the epoch
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


@dataclass(frozen=True)
class FakeHandle:
    """Stands for ``c_nvmlDevice_t``; ``mig`` is the MIG instance's position, if any."""

    index: int
    mig: int | None = None


@dataclass
class FakeValue:
    """``c_nvmlValue_t``: a union, only the member for ``valueType`` means anything."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass
class FakeViolationTime:
    """``c_nvmlViolationTime_t``: ns held back by one policy since the driver loaded."""

    referenceTime: int
    violationTime: int


@dataclass
class FakeC2cModeInfo:
    """``c_nvmlC2cModeInfo_v1_t``: whether the chip-to-chip link (Grace Hopper) is on."""

    isC2cEnabled: int


@dataclass
class FakeMemory:
    """``c_nvmlMemory_t``: bytes."""

    total: int
    free: int
    used: int


@dataclass
class FakeFieldValue:
    """``c_nvmlFieldValue_t``: each field succeeds or fails on its own (``nvmlReturn``)."""

    fieldId: int
    scopeId: int = 0
    timestamp: int = 0  # microseconds
    latencyUsec: int = 0
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_INT
    nvmlReturn: int = NVML_SUCCESS
    value: FakeValue = field(default_factory=FakeValue)


class FakeNvml:
    """The state behind one fake module: the GPUs, the init count and every call made."""

    API = (
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetFieldValues",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetC2cModeInfoV",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetSupportedMemoryClocks",
        "nvmlDeviceGetSupportedGraphicsClocks",
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlSystemGetProcessName",
        "nvmlDeviceGetProcessUtilization",
    )

    def __init__(
        self,
        gpus: Sequence[FakeGPU],
        init_error: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        *,
        root: bool = True,
        state_path: str | os.PathLike[str] | None = None,
        virtual_time: bool = False,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        # With virtual time, work takes exactly its simulated duration on this clock,
        # whatever the host's scheduler does (the meter must read the same clock).
        self.virtual_time = virtual_time
        self.virtual_s = 0.0
        self.clock = (lambda: clock() + self.virtual_s) if virtual_time else clock
        self.init_count = 0  # NVML counts nvmlInit calls; the last nvmlShutdown closes it
        self.calls: Counter[str] = Counter()
        # (function, GPU index) of every call made on a GPU's handle: which GPUs were read
        self.gpu_calls: Counter[tuple[str, int]] = Counter()
        self._calling = threading.local()  # the function being called, per thread
        self.driver_version: str | bytes = "550.54.15"  # old nvidia-ml-py returned bytes
        self.root = root  # setters need root (or CAP_SYS_ADMIN), as on a real driver
        self.state_path = state_path
        self._lock = threading.Lock()
        if state_path is not None:
            self._load_state()

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def calls_on(self, index: int, functions: Sequence[str] | None = None) -> int:
        """Calls made on GPU ``index``'s handle (of ``functions`` only, where given)."""
        return sum(
            n
            for (fn, i), n in self.gpu_calls.items()
            if i == index and (functions is None or fn in functions)
        )

    def start_context(self, index: int, pid: int | None = None, name: str = "python") -> None:
        """A process (this one by default) opens a CUDA context on GPU ``index``: the
        driver lists it among the board's compute processes from now on, with the memory
        a context takes, until it exits (``end_context``), as NVML does."""
        gpu = self.gpus[index]
        gpu.processes[os.getpid() if pid is None else pid] = (name, 512 * 1024 * 1024)

    def end_context(self, index: int, pid: int | None = None) -> None:
        self.gpus[index].processes.pop(os.getpid() if pid is None else pid, None)

    # -- helpers ---------------------------------------------------------------------
    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        self._calling.fn = fn
        if self.init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: object) -> FakeGPU:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self.gpu_calls[(getattr(self._calling, "fn", "?"), handle.index)] += 1
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _whole_gpu(self, handle: object) -> FakeGPU:
        """Power and energy exist for physical GPUs only, not for MIG instances."""
        gpu = self._gpu(handle)
        assert isinstance(handle, FakeHandle)
        if handle.mig is not None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    @staticmethod
    def _energy_j(trace: PowerTrace, t0: float, t1: float) -> float:
        """Trace energy, with the first step's power assumed before the trace began."""
        before = max(0.0, min(t1, trace.origin) - t0) * trace.steps[0][1]
        return before + trace.energy_between(max(t0, trace.origin), max(t1, trace.origin))

    # -- the pynvml API --------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByUUID")
        if not isinstance(uuid, bytes):  # what ctypes.c_char_p says to a str
            raise TypeError(f"bytes or integer address expected instead of {type(uuid).__name__}")
        text = uuid.decode()
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                return FakeHandle(i)
            if text in gpu.mig_uuids:
                return FakeHandle(i, gpu.mig_uuids.index(text))
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        self._enter("nvmlDeviceGetUUID")
        gpu = self._gpu(handle)
        return gpu.uuid if handle.mig is None else gpu.mig_uuids[handle.mig]

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        self._enter("nvmlDeviceGetName")
        gpu = self._gpu(handle)
        return gpu.name if handle.mig is None else f"{gpu.name} MIG {handle.mig + 1}g"

    def nvmlDeviceGetArchitecture(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetArchitecture")
        gpu = self._gpu(handle)
        if gpu.architecture is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.architecture

    def nvmlDeviceIsMigDeviceHandle(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceIsMigDeviceHandle")
        self._gpu(handle)
        return int(handle.mig is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeHandle) -> FakeHandle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        self._gpu(handle)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(handle.index)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        """mJ since the driver loaded, refreshed only at ticks ``counter_period_s`` apart."""
        self._enter("nvmlDeviceGetTotalEnergyConsumption")
        gpu = self._whole_gpu(handle)
        arch = gpu.architecture
        if not gpu.energy_counter or (arch is not None and arch < NVML_DEVICE_ARCH_VOLTA):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        origin = gpu.trace.origin
        ticks = math.floor((self.clock() - origin) / gpu.counter_period_s)
        last_tick = origin + max(ticks, 0) * gpu.counter_period_s
        return gpu.energy_offset_mj + math.floor(1000 * gpu.trace.energy_until(last_tick))

    def _process_list(self, listed: dict[int, tuple[str, int | None]]) -> list[FakeProcessInfo]:
        return [FakeProcessInfo(pid, used) for pid, (_, used) in listed.items()]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[FakeProcessInfo]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return self._process_list(self._gpu(handle).processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[FakeProcessInfo]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses")
        return self._process_list(self._gpu(handle).graphics_processes)

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        """The name of a process with a context on any board; NOT_FOUND otherwise."""
        self._enter("nvmlSystemGetProcessName")
        for gpu in self.gpus:
            for listed in (gpu.processes, gpu.graphics_processes):
                if pid in listed:
                    return listed[pid][0]
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetProcessUtilization(
        self, handle: FakeHandle, lastSeenTimeStamp: int
    ) -> list[FakeUtilSample]:
        """Samples newer than ``lastSeenTimeStamp`` (µs); none: NOT_FOUND, as NVML says."""
        self._enter("nvmlDeviceGetProcessUtilization")
        gpu = self._gpu(handle)
        if not gpu.process_utilization:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        found = [
            FakeUtilSample(pid, t, sm) for t, pid, sm in gpu.util_samples if t > lastSeenTimeStamp
        ]
        if not found:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return found

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        """mW: the mean of the last second on Ampere and newer, the instant power before."""
        self._enter("nvmlDeviceGetPowerUsage")
        gpu = self._whole_gpu(handle)
        now = self.clock()
        arch = gpu.architecture
        if arch is not None and NVML_DEVICE_ARCH_AMPERE <= arch != NVML_DEVICE_ARCH_UNKNOWN:
            return int(1000 * self._energy_j(gpu.trace, now - 1.0, now))
        return int(1000 * gpu.trace.power_at(now))

    def nvmlDeviceGetFieldValues(
        self, handle: FakeHandle, field_ids: Sequence[int | tuple[int, int]]
    ) -> list[FakeFieldValue]:
        self._enter("nvmlDeviceGetFieldValues")
        gpu = self._gpu(handle)
        now = self.clock()
        out = []
        for item in field_ids:
            field_id, scope_id = item if isinstance(item, tuple) else (item, 0)
            value = FakeFieldValue(field_id, scope_id, timestamp=int(now * 1e6))
            supported = gpu.instant_field and handle.mig is None
            if supported and field_id == NVML_FI_DEV_POWER_INSTANT:
                value.value.uiVal = int(1000 * gpu.trace.power_at(now))
            elif supported and field_id == NVML_FI_DEV_POWER_AVERAGE:
                value.value.uiVal = int(1000 * self._energy_j(gpu.trace, now - 1.0, now))
            else:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            out.append(value)
        return out

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> FakeMemory:
        """Total framebuffer bytes; nothing allocated."""
        self._enter("nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle)
        return FakeMemory(total=gpu.memory_bytes, free=gpu.memory_bytes, used=0)

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeHandle) -> int:
        """mW, the limit in force."""
        self._enter("nvmlDeviceGetPowerManagementLimit")
        gpu = self._whole_gpu(handle)
        if gpu.power_limit_mw is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeHandle) -> int:
        """mW, the limit the board ships with."""
        self._enter("nvmlDeviceGetPowerManagementDefaultLimit")
        gpu = self._whole_gpu(handle)
        if gpu.default_power_limit_mw is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.default_power_limit_mw

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        """MHz; only the SM and graphics clocks are simulated (they share a maximum here)."""
        self._enter("nvmlDeviceGetMaxClockInfo")
        gpu = self._gpu(handle)
        if clock_type not in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_VIDEO):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if clock_type not in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM) or gpu.max_sm_clock_mhz is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_sm_clock_mhz

    def nvmlDeviceGetC2cModeInfoV(self, handle: FakeHandle) -> FakeC2cModeInfo:
        """Grace Hopper's chip-to-chip mode; NOT_SUPPORTED on boards without the link."""
        self._enter("nvmlDeviceGetC2cModeInfoV")
        gpu = self._gpu(handle)
        if gpu.c2c_enabled is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return FakeC2cModeInfo(int(gpu.c2c_enabled))

    # -- settings that outlive the process -------------------------------------------
    def _load_state(self) -> None:
        """The driver keeps a board's limits and locked clocks until reset: so does this
        file, between fakes built on it (one per simulated process)."""
        assert self.state_path is not None
        try:
            with open(self.state_path) as f:
                saved = json.load(f)
        except FileNotFoundError:
            return
        for gpu in self.gpus:
            mine = saved.get(gpu.uuid)
            if mine is None:
                continue
            gpu.power_limit_mw = mine["power_limit_mw"]
            locked = mine["locked_clocks_mhz"]
            gpu.locked_clocks_mhz = None if locked is None else (locked[0], locked[1])

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        data = {
            gpu.uuid: {
                "power_limit_mw": gpu.power_limit_mw,
                "locked_clocks_mhz": gpu.locked_clocks_mhz,
            }
            for gpu in self.gpus
        }
        tmp = f"{self.state_path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.state_path)

    def _privileged(self) -> None:
        if not self.root:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)

    # -- the setters and getters of settings (real NVML semantics) --------------------
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeHandle) -> list[int]:
        """[min, max] mW a limit may take."""
        self._enter("nvmlDeviceGetPowerManagementLimitConstraints")
        gpu = self._whole_gpu(handle)
        if gpu.power_limit_mw is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.min_power_limit_mw, gpu.max_power_limit_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeHandle, limit: int) -> None:
        """mW; root only; outside the constraints is INVALID_ARGUMENT."""
        self._enter("nvmlDeviceSetPowerManagementLimit")
        gpu = self._whole_gpu(handle)
        if gpu.power_limit_mw is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._privileged()
        if not isinstance(limit, int) or not (
            gpu.min_power_limit_mw <= limit <= gpu.max_power_limit_mw
        ):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = limit
        self._save_state()

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit")
        gpu = self._whole_gpu(handle)
        if gpu.power_limit_mw is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.power_limit_mw

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: FakeHandle) -> list[int]:
        self._enter("nvmlDeviceGetSupportedMemoryClocks")
        return [self._gpu(handle).memory_clock_mhz]

    def nvmlDeviceGetSupportedGraphicsClocks(
        self, handle: FakeHandle, memory_mhz: int
    ) -> list[int]:
        """MHz, highest first, for one supported memory clock."""
        self._enter("nvmlDeviceGetSupportedGraphicsClocks")
        gpu = self._gpu(handle)
        if memory_mhz != gpu.memory_clock_mhz:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return list(gpu.supported_sm_clocks_mhz)

    def nvmlDeviceSetGpuLockedClocks(self, handle: FakeHandle, min_mhz: int, max_mhz: int) -> None:
        """Root only; a value outside the supported clocks is INVALID_ARGUMENT, one inside
        is rounded to the nearest supported clock, as the driver does."""
        self._enter("nvmlDeviceSetGpuLockedClocks")
        gpu = self._whole_gpu(handle)
        self._privileged()
        clocks = gpu.supported_sm_clocks_mhz
        if not (min(clocks) <= min_mhz <= max_mhz <= max(clocks)):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

        def nearest(mhz: int) -> int:
            return min(clocks, key=lambda c: abs(c - mhz))

        gpu.locked_clocks_mhz = (nearest(min_mhz), nearest(max_mhz))
        self._save_state()

    def nvmlDeviceResetGpuLockedClocks(self, handle: FakeHandle) -> None:
        self._enter("nvmlDeviceResetGpuLockedClocks")
        gpu = self._whole_gpu(handle)
        self._privileged()
        gpu.locked_clocks_mhz = None
        self._save_state()

    def _max_clock(self, gpu: FakeGPU) -> int:
        return max(gpu.supported_sm_clocks_mhz)

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        """MHz now: the work's clock, else the locked clock, else the idle clock."""
        self._enter("nvmlDeviceGetClockInfo")
        gpu = self._gpu(handle)
        if clock_type == NVML_CLOCK_MEM:
            return gpu.memory_clock_mhz
        if clock_type not in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        busy = gpu.busy
        if busy is not None:
            return busy[0]
        if gpu.locked_clocks_mhz is not None:
            return gpu.locked_clocks_mhz[0]  # a locked minimum holds even at idle
        return gpu.idle_sm_clock_mhz

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        """°C: warmer with the power drawn."""
        self._enter("nvmlDeviceGetTemperature")
        gpu = self._gpu(handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if gpu.heat is not None:  # whole degrees, as NVML reports them
            return round(gpu.heat.temperature_c(gpu.trace.steps, gpu.trace.origin, self.clock()))
        busy = gpu.busy
        if busy is None:
            return gpu.idle_temperature_c
        if busy[1] & REASON_HW_THERMAL:
            return 92
        return int(gpu.idle_temperature_c + 0.08 * busy[2])

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons")
        gpu = self._gpu(handle)
        busy = gpu.busy
        if busy is not None:
            return busy[1]
        locked = gpu.locked_clocks_mhz
        if locked is not None and locked[0] > gpu.idle_sm_clock_mhz:
            return REASON_NONE if locked[1] >= self._max_clock(gpu) else 0x2
        return REASON_GPU_IDLE

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        """The name before nvidia-ml-py 12.535; the same bits."""
        self.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] += 1
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetViolationStatus(self, handle: FakeHandle, policy: int) -> FakeViolationTime:
        """ns the board was held back by the power cap (0) or heat (1)."""
        self._enter("nvmlDeviceGetViolationStatus")
        gpu = self._whole_gpu(handle)
        if policy not in (NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            return FakeViolationTime(int(self.clock() * 1e9), gpu.violation_ns.get(policy, 0))

    # -- running work --------------------------------------------------------------------
    def work(
        self,
        index: int,
        phases: Sequence[Phase],
        between: Callable[[], object] | None = None,
    ) -> float:
        """Run the phases on GPU ``index`` at the clock its settings allow (sleeping their
        true duration, drawing their true power); ``between`` runs at each phase change
        (e.g. to mark the first output token).  Returns the seconds it slept."""
        gpu = self.gpus[index]
        physics = gpu.physics
        trace = gpu.trace
        if physics is None or not isinstance(trace, SwitchTrace):
            raise TypeError("work() needs a GPU with physics and a SwitchTrace")
        gpu.works += 1
        gpu.processes.setdefault(os.getpid(), ("python", 512 * 1024 * 1024))  # a context now
        thermal = gpu.works in gpu.thermal_works
        max_mhz = self._max_clock(gpu)
        min_ratio = min(gpu.supported_sm_clocks_mhz) / max_mhz
        limit_w = (gpu.power_limit_mw or gpu.max_power_limit_mw) / 1000
        lock = gpu.locked_clocks_mhz
        lock_ratio = None if lock is None else lock[1] / max_mhz
        slept = 0.0
        for i, phase in enumerate(phases):
            if i and between is not None:
                between()
            ratio, reasons = physics.clock_ratio(phase.kind, limit_w, lock_ratio, min_ratio)
            if thermal:
                ratio *= physics.thermal_slowdown
                reasons |= REASON_HW_THERMAL
            seconds = phase.seconds * physics.stretch(phase.kind, ratio) / physics.speed
            watts = physics.power_w(phase.kind, ratio)
            start = trace.set(watts, self.clock())
            gpu.busy = (round(ratio * max_mhz), reasons, watts)
            if self.virtual_time:
                # long enough for observers (telemetry) to see it; short enough, against
                # the phase's own duration, that a late wake-up rarely outlasts it
                time.sleep(min(seconds / 2, VISIBLE_S) if seconds >= 2 * MIN_VISIBLE_S else 0)
                elapsed = self.clock() - start
                self.virtual_s += max(0.0, seconds - elapsed)
                end = trace.set(physics.idle_w, start + max(seconds, elapsed))
            else:
                time.sleep(seconds)
                end = trace.set(physics.idle_w, self.clock())
            gpu.busy = None
            with self._lock:
                for policy, bit in _VIOLATION_BITS:
                    if reasons & bit:
                        ns = int((end - start) * 1e9)
                        gpu.violation_ns[policy] = gpu.violation_ns.get(policy, 0) + ns
            slept += end - start
        return slept

    def nvmlGetFunctionPointer(self, name: str) -> Callable[..., Any]:
        """The official bindings' ``_nvmlGetFunctionPointer``: a library entry point by name.

        Here the entry points are the fake's own functions; like the real one it needs
        the library loaded (nvmlInit) and raises FUNCTION_NOT_FOUND for unknown names.
        """
        if self.init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if name not in self.API:
            raise NVMLError(ERROR_CODES["NVML_ERROR_FUNCTION_NOT_FOUND"])
        return getattr(self, name)


def build_fake_pynvml(
    gpus: Sequence[FakeGPU],
    init_error: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    *,
    root: bool = True,
    state_path: str | os.PathLike[str] | None = None,
    old_reason_names: bool = False,
    virtual_time: bool = False,
) -> types.ModuleType:
    """A module object that looks like ``pynvml``; its state is ``module.fake``.

    ``old_reason_names``: an nvidia-ml-py before 12.535, without the ``ClocksEvent`` names.
    """
    fake = FakeNvml(
        gpus, init_error, clock, root=root, state_path=state_path, virtual_time=virtual_time
    )
    module = types.ModuleType("pynvml", "fake pynvml (tests/fakes/fake_pynvml.py)")
    this = sys.modules[__name__]
    for name in dir(this):
        if name.startswith(_CONSTANT_PREFIXES):
            setattr(module, name, getattr(this, name))
    for name, code in ERROR_CODES.items():
        setattr(module, name, code)
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    for error_class in ERROR_CLASSES.values():
        setattr(module, error_class.__name__, error_class)
    for name in FakeNvml.API:
        setattr(module, name, getattr(fake, name))
    if old_reason_names:
        del module.nvmlDeviceGetCurrentClocksEventReasons  # type: ignore[attr-defined]
        for name in [n for n in vars(module) if n.startswith("nvmlClocksEvent")]:
            delattr(module, name)
    module._nvmlGetFunctionPointer = fake.nvmlGetFunctionPointer  # type: ignore[attr-defined]
    module.fake = fake  # type: ignore[attr-defined]
    module.calls = fake.calls  # type: ignore[attr-defined]
    return module


def install_fake_pynvml(
    monkeypatch: pytest.MonkeyPatch,
    gpus: Sequence[FakeGPU],
    *,
    init_error: int | None = None,
    root: bool = True,
    state_path: str | os.PathLike[str] | None = None,
) -> Any:
    """Make ``import pynvml`` return a fake with these GPUs until the test ends."""
    module = build_fake_pynvml(gpus, init_error, root=root, state_path=state_path)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def install_fake_pynvml_without_library(monkeypatch: pytest.MonkeyPatch) -> Any:
    """nvidia-ml-py installed, no driver: nvmlInit raises NVMLError_LibraryNotFound."""
    return install_fake_pynvml(monkeypatch, [], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
