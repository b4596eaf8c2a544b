"""A GPU as the settings, the telemetry and the isolation check need it, whatever its vendor.

One module per vendor sits beside this one (``nvidia.py`` through NVML, ``amd.py``
through amdsmi); ``VENDORS`` is the registry, so a new vendor is one module and one row.
A vendor module is imported only when its GPUs are opened, and it turns every error of
its library into ``GpuDeviceError``: nothing above this layer knows pynvml or amdsmi.
Units are the project's everywhere: watts, MHz, °C, whatever the vendor counts in.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import LLMEnergyError
from ..meters.gpu_meter import one_line as one_line  # re-exported for the vendors

# Why a GPU's clock is held below its maximum, as bits: NVML's clock-event reasons are
# the common encoding; a vendor without them reports GPU_IDLE alone (or nothing).
GPU_IDLE = 0x1


class GpuDeviceError(LLMEnergyError):
    """A vendor library refused a call; the message is one line, in its own words."""

    def __init__(self, message: str, *, permission: bool = False, unsupported: bool = False):
        super().__init__(message)
        self.permission = permission  # only root (or CAP_SYS_ADMIN) may do this
        self.unsupported = unsupported  # this GPU or driver has no such thing


@dataclass(frozen=True)
class GpuProcess:
    """A process the driver says is using a GPU."""

    pid: int
    name: str = ""
    memory_mib: float | None = None  # None: the driver did not say

    def describe(self) -> str:
        name = f" {self.name}" if self.name else ""
        memory = "" if self.memory_mib is None else f", {self.memory_mib:.0f} MiB"
        return f"pid {self.pid}{name}{memory}"


@dataclass(frozen=True)
class PowerLimits:
    """The power limits a GPU allows, in watts."""

    min_w: float
    max_w: float
    default_w: float


class GpuDevice(ABC):
    """One GPU: identity, power limit, clocks, temperature, the processes on it."""

    def __init__(self, domain: str, name: str, uuid: str) -> None:
        self.domain = domain  # gpu:<ordinal the framework uses>
        self.name = name
        self.uuid = uuid  # how a later process finds the same GPU again

    @abstractmethod
    def power_limit_w(self) -> float: ...

    @abstractmethod
    def set_power_limit_w(self, watts: float) -> None: ...

    @abstractmethod
    def power_limits(self) -> PowerLimits: ...

    @abstractmethod
    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """SM clocks it can be locked at, highest first; () where it cannot be locked."""

    def lock_clocks_mhz(self, mhz: int) -> None:
        raise GpuDeviceError(f"{self.name}: locking clocks is not supported", unsupported=True)

    def reset_clocks(self) -> None:
        raise GpuDeviceError(f"{self.name}: locking clocks is not supported", unsupported=True)

    @abstractmethod
    def sm_clock_mhz(self) -> int | None: ...

    @abstractmethod
    def temperature_c(self) -> float | None: ...

    @abstractmethod
    def processes(self) -> tuple[GpuProcess, ...]:
        """Every process the driver lists on this GPU (compute and graphics)."""

    def event_reasons(self) -> int:
        """The clock-event reason bits now (GPU_IDLE and NVML's others); 0: none known."""
        return 0

    def violation_ns(self) -> tuple[int, int] | None:
        """ns held back by the power cap and by heat since boot; None: not counted."""
        return None

    def enforced_power_limit_w(self) -> float | None:
        """The limit in force (NVML: the lowest of every limit set on it)."""
        try:
            return self.power_limit_w()
        except GpuDeviceError:
            return None


class GpuLibrary(ABC):
    """A vendor's library, opened: the GPUs the framework sees, and finding one again."""

    vendor: ClassVar[str]
    # How to restore by hand, for the line that says a restore failed.
    manual_restore: ClassVar[str]
    # Why its clocks cannot be locked here, or None where they can.
    no_clock_lock: ClassVar[str | None] = None

    @abstractmethod
    def devices(self, gpus: Sequence[int] | None = None) -> list[GpuDevice]:
        """The GPUs the framework sees (``--energy-gpus`` ordinals of them), one per board."""

    @abstractmethod
    def by_uuid(self, uuid: str, domain: str, name: str) -> GpuDevice:
        """The GPU a state file names, found again in a new process."""

    @abstractmethod
    def close(self) -> None: ...


@dataclass(frozen=True)
class Vendor:
    """One row of the registry: the vendor, the energy backend that reads its GPUs, and
    ``module:class`` of its library (imported when opened)."""

    name: str
    backend: str
    library: str


VENDORS = (
    Vendor("nvidia", "nvml", "pytest_llmenergy.gpu.nvidia:NvidiaLibrary"),
    Vendor("amd", "amdsmi", "pytest_llmenergy.gpu.amd:AmdLibrary"),
)


def vendor_named(name: str) -> Vendor:
    for vendor in VENDORS:
        if name in (vendor.name, vendor.backend):
            return vendor
    raise GpuDeviceError(f"no GPU vendor {name!r}; known: {', '.join(v.name for v in VENDORS)}")


def open_library(vendor: str, module: Any = None) -> GpuLibrary:
    """Open one vendor's library (``module``: the vendor package itself, for tests)."""
    where, _, cls = vendor_named(vendor).library.partition(":")
    return getattr(importlib.import_module(where), cls)(module)


def open_gpus(backend: str = "auto") -> GpuLibrary:
    """The library of the vendor whose GPUs the session measures: the backend's vendor,
    or (``auto`` or a CPU backend) the first vendor whose GPUs are here."""
    chosen = [v for v in VENDORS if backend in (v.name, v.backend)]
    why: list[str] = []
    for vendor in chosen or VENDORS:
        try:
            library = open_library(vendor.name)
        except GpuDeviceError as exc:
            why.append(f"{vendor.name}: {exc}")
            continue
        if chosen or library.devices():
            return library
        library.close()
        why.append(f"{vendor.name}: no GPU")
    raise GpuDeviceError("; ".join(why))
