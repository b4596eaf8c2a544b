"""A GPU as the meters, the settings, the telemetry and the isolation check need it,
whatever its vendor: the package's one vendor layer, below the meters.

One module per vendor sits beside this one (``nvidia.py`` through NVML, ``amd.py``
through amdsmi, ``jetson.py`` through the INA3221 power monitor's sysfs files);
``VENDORS`` is the registry, so a new vendor is one module and one row: the energy
backend, the ``auto`` meter's GPU order, the thermal reader, the machine record and the
ranks of a torchrun job all follow the row.  A vendor module imports its library only
when its GPUs are opened, initialises it in one place (its ``init_library``, where it
has one), and turns every error of it into ``GpuDeviceError``.  Outside this folder only
the NVIDIA and AMD meters (``meters/nvml.py``, ``meters/amdsmi.py``) call a vendor
library, through the module and the handles this layer opened them, for what only they
need (the counters' checks, power fields, MIG, MI250 dies).  Units are the project's
everywhere: watts, joules, MHz, °C, whatever the vendor counts in.
"""

from __future__ import annotations

import contextlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import LLMEnergyError

# Why a GPU's clock is held below its maximum, as bits: NVML's clock-event reasons are
# the common encoding; a vendor without them reports GPU_IDLE alone (or nothing).
GPU_IDLE = 0x1


def one_line(exc: BaseException) -> str:
    """An exception of a vendor library as one line of a message."""
    return " ".join(str(exc).split()) or type(exc).__name__


class GpuDeviceError(LLMEnergyError):
    """A vendor library refused a call; the message is one line, in its own words."""

    def __init__(
        self,
        message: str,
        *,
        permission: bool = False,
        unsupported: bool = False,
        missing: bool = False,
    ):
        super().__init__(message)
        self.permission = permission  # only root (or CAP_SYS_ADMIN) may do this
        self.unsupported = unsupported  # this GPU or driver has no such thing
        self.missing = missing  # the vendor's package is not installed (the message: how to)


def unsupported(name: str, what: str) -> GpuDeviceError:
    return GpuDeviceError(f"{name}: {what} is not supported", unsupported=True)


@dataclass(frozen=True)
class SmSample:
    """One of a driver's per-process SM utilization samples."""

    pid: int
    sm_percent: float
    at_us: int  # when, by the driver's clock: µs since the epoch


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


class GpuDevice:
    """One GPU: identity, energy and power, power limit, clocks, temperature, the
    processes on it.  A vendor overrides what its GPUs have; the rest says it has not
    (``GpuDeviceError`` with ``unsupported``, or None where a reading may be missing)."""

    def __init__(self, domain: str, name: str, uuid: str) -> None:
        self.domain = domain  # gpu:<ordinal the framework uses>
        self.name = name
        self.uuid = uuid  # how a later process finds the same GPU again

    # -- energy and power (what a meter reads) -----------------------------------------
    def energy_counter_j(self) -> float | None:
        """The GPU's energy counter now, J since an origin of its own, never wrapping
        while a session runs; None: it keeps none (its power is sampled instead)."""
        return None

    def power_w(self) -> float:
        """The power it draws now (its driver's own average, where that is all it has)."""
        raise unsupported(self.name, "reading power")

    def power_note(self) -> str:
        """Where ``power_w`` comes from, for the meter's line."""
        return "power"

    # -- settings ------------------------------------------------------------------------
    def power_limit_w(self) -> float:
        raise unsupported(self.name, "a power limit")

    def set_power_limit_w(self, watts: float) -> None:
        raise unsupported(self.name, "setting a power limit")

    def power_limits(self) -> PowerLimits:
        raise unsupported(self.name, "a power limit")

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """SM clocks it can be locked at, highest first; () where it cannot be locked."""
        return ()

    def lock_clocks_mhz(self, mhz: int) -> None:
        raise unsupported(self.name, "locking clocks")

    def reset_clocks(self) -> None:
        raise unsupported(self.name, "locking clocks")

    # -- telemetry -----------------------------------------------------------------------
    def sm_clock_mhz(self) -> int | None:
        return None

    def temperature_c(self) -> float | None:
        return None

    def processes(self) -> tuple[GpuProcess, ...]:
        """Every process the driver lists on this GPU (compute and graphics)."""
        raise unsupported(self.name, "listing the processes on it")

    def process_ids(self) -> frozenset[int]:
        """The PIDs of the processes with work on this GPU, as the driver numbers them
        (a container's own PID namespace may not be the driver's): which GPUs a session
        uses, asked at every window, so a vendor may skip what ``processes`` adds."""
        return frozenset(p.pid for p in self.processes())

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

    def sm_samples(self, since_us: int) -> tuple[SmSample, ...] | None:
        """The driver's per-process SM utilization samples since ``since_us`` (its clock,
        µs since the epoch); () none since then; None where it keeps none."""
        return None


class GpuLibrary(ABC):
    """A vendor's library, opened: the GPUs the framework sees, and finding one again."""

    vendor: ClassVar[str]
    # What its readings come through, as the header names it ("NVML").
    reads_through: ClassVar[str]
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

    def machine_rows(self) -> tuple[list[dict[str, Any]], str | None]:
        """Its GPUs for the run file's machine record (``GPU_INFO_FIELDS``, None where
        unknown), and a note where something could not be read; only queries."""
        rows = []
        for i, d in enumerate(self.devices()):
            row = dict.fromkeys(GPU_INFO_FIELDS, None) | {"index": i, "name": d.name}
            row["uuid"] = d.uuid
            with contextlib.suppress(GpuDeviceError):
                row["power_limit_w"] = d.power_limit_w()
            with contextlib.suppress(GpuDeviceError):
                row["default_power_limit_w"] = d.power_limits().default_w
            rows.append(row)
        return rows, None


GPU_INFO_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory_bytes",
    "power_limit_w",
    "default_power_limit_w",
    "sm_clock_mhz",
    "driver",
)


@dataclass(frozen=True)
class Vendor:
    """One row of the registry: the vendor, the energy backend that reads its GPUs,
    ``module:class`` of its library (imported when opened), its name in messages, how
    often its power is sampled by default, and the ``torch`` module that queues work on
    its GPUs (whose ``synchronize`` a window's edge waits for)."""

    name: str
    backend: str
    library: str
    label: str
    interval_s: float = 0.1
    torch: str = "cuda"  # torch on ROCm keeps the torch.cuda names


VENDORS = (
    Vendor("nvidia", "nvml", "pytest_llmenergy.gpu.nvidia:NvidiaLibrary", "NVIDIA"),
    Vendor("amd", "amdsmi", "pytest_llmenergy.gpu.amd:AmdLibrary", "AMD"),
    Vendor("jetson", "jetson", "pytest_llmenergy.gpu.jetson:JetsonLibrary", "NVIDIA Jetson"),
)


def vendor_named(name: str) -> Vendor:
    """The row of a vendor, by its name or its backend's."""
    for vendor in VENDORS:
        if name in (vendor.name, vendor.backend):
            return vendor
    raise GpuDeviceError(f"no GPU vendor {name!r}; known: {', '.join(v.name for v in VENDORS)}")


def vendor_labels() -> str:
    return ", ".join(v.label for v in VENDORS)


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


def gpu_backend(backend: str) -> str:
    """The energy backend that reads this machine's GPUs and nothing else: ``backend``
    where it is a vendor's, else that of the first vendor whose GPUs are here (the
    first vendor's where none is: its meter then says why it cannot measure)."""
    if any(backend == v.backend for v in VENDORS):
        return backend
    try:
        library = open_gpus("auto")
    except GpuDeviceError:
        return VENDORS[0].backend
    library.close()
    return vendor_named(library.vendor).backend
