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
"""

from __future__ import annotations

import math
import sys
import time
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from .trace import PowerTrace

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

_CONSTANT_PREFIXES = (
    "NVML_SUCCESS",
    "NVML_DEVICE_ARCH_",
    "NVML_FI_",
    "NVML_VALUE_",
    "NVML_CLOCK_",
    "NVML_POWER_SCOPE_",
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
    )

    def __init__(
        self,
        gpus: Sequence[FakeGPU],
        init_error: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.clock = clock
        self.init_count = 0  # NVML counts nvmlInit calls; the last nvmlShutdown closes it
        self.calls: Counter[str] = Counter()
        self.driver_version: str | bytes = "550.54.15"  # old nvidia-ml-py returned bytes

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    # -- helpers ---------------------------------------------------------------------
    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        if self.init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: object) -> FakeGPU:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
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
) -> types.ModuleType:
    """A module object that looks like ``pynvml``; its state is ``module.fake``."""
    fake = FakeNvml(gpus, init_error, clock)
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
    module._nvmlGetFunctionPointer = fake.nvmlGetFunctionPointer  # type: ignore[attr-defined]
    module.fake = fake  # type: ignore[attr-defined]
    module.calls = fake.calls  # type: ignore[attr-defined]
    return module


def install_fake_pynvml(
    monkeypatch: pytest.MonkeyPatch,
    gpus: Sequence[FakeGPU],
    *,
    init_error: int | None = None,
) -> Any:
    """Make ``import pynvml`` return a fake with these GPUs until the test ends."""
    module = build_fake_pynvml(gpus, init_error)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def install_fake_pynvml_without_library(monkeypatch: pytest.MonkeyPatch) -> Any:
    """nvidia-ml-py installed, no driver: nvmlInit raises NVMLError_LibraryNotFound."""
    return install_fake_pynvml(monkeypatch, [], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
