"""A stand-in for ROCm's ``amdsmi`` Python package whose GPUs follow power traces.

It keeps the real package's behaviour where our meter could trip over it (checked
against ROCm/amdsmi ``py-interface``): calls before ``amdsmi_init`` fail with
``AMDSMI_STATUS_NOT_INIT``, init and shut-down are counted, handles are checked by type
and enums must be the package's own (``AmdSmiParameterException`` otherwise, as must a
power cap that is not an ``int``).  ``amdsmi_get_energy_count`` returns a count the
firmware refreshes only every ``counter_period_s``, worth ``counter_resolution`` µJ
each (15.3, as a C float: 15.300000190734863), under the key of the ROCm it plays:
``power`` in 6.2, ``power`` and ``energy_accumulator`` in 6.3, ``energy_accumulator``
alone from 6.4; ``counter_bits=32`` makes it wrap as a 32-bit counter would.
``amdsmi_get_power_info`` is in watts, an unsupported field the string ``"N/A"``:
``current_socket_power`` is the instant power and ``average_socket_power`` "N/A" on an
MI300X, the reverse on an MI210 or MI250X (whose average is over ``average_window_s``, a
guess: AMD documents none).  An MI250X is two dies listed as two GPUs: the first reports
both dies' power, the second 0 (or "N/A") and a counter that never moves.
``stuck_counter`` makes a counter that never moves, ``counter_scale`` one that moves at
the wrong rate (both are known on real parts).

The settings a GPU keeps behave as on a real board: the power cap (µW, within
``min_power_cap``..``max_power_cap``) can be set only as root (``AMDSMI_STATUS_NO_PERM``
otherwise), reads back, is shared by the two dies of an MI250X, and outlives the process:
with ``state_path`` the fake keeps it in a file that the next fake built on that file
finds, as the driver would.  A GPU whose ``trace`` is a ``SwitchTrace`` and which has
``physics`` runs work (``fake.work``) at the clock its power cap allows
(tests/fakes/gpu_physics.py), reporting that clock and its temperature meanwhile.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import pytest

from .fake_pynvml import MIN_VISIBLE_S, VISIBLE_S
from .gpu_physics import Heat, Phase, Physics
from .trace import PowerTrace, SwitchTrace

# amdsmi_status_t, as amdsmi_wrapper has them.
AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NO_PERM = 10
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34
AMDSMI_STATUS_NO_DRV = 51
_ERROR_INFO = {
    1: "AMDSMI_STATUS_INVAL - Invalid parameters",
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    18: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    31: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    32: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    34: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
    51: "AMDSMI_STATUS_NO_DRV - No Energy and HSMP driver present",
}
NA = "N/A"
UJ_PER_COUNT = struct.unpack("f", struct.pack("f", 15.3))[0]  # a C float, as ctypes returns it
ROCM_VERSIONS = ("6.2", "6.3", "6.4")


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _ERROR_INFO.get(
            err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"
        )

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self) -> str:
        return self.err_info

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: object, expected: object) -> None:
        super().__init__(None)
        self.err_code = None
        self.err_msg = (
            f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}"
        )

    def __str__(self) -> str:
        return self.err_msg


@dataclass(frozen=True)
class FakeHandle:
    """Stands for ``amdsmi_processor_handle`` (a pointer)."""

    index: int


@dataclass
class FakeAmdGpu:
    """One simulated GPU (one die: an MI250X is two of these, ``die`` 0 and 1).

    ``power_field``: which power field is valid (``current_socket_power`` on MI300X,
    ``average_socket_power`` on MI200/MI210); ``silent``: the second die of an MI250X,
    reporting ``silent_value`` (0 or "N/A") as its power and a counter that never moves.
    Power caps are in µW, as amdsmi has them.
    """

    market_name: str
    uuid: str
    trace: PowerTrace | SwitchTrace
    power_field: str = "current_socket_power"
    rocm: str = "6.4"
    counter_period_s: float = 0.01
    counter_offset: int = 0  # counts since the driver loaded
    counter_bits: int = 64
    counter_resolution_uj: float = UJ_PER_COUNT
    counter_scale: float = 1.0  # a counter counting this share of the true energy
    stuck_counter: bool = False
    energy_counter: bool = True
    average_window_s: float = 0.1
    silent: bool = False
    silent_value: int | str = 0
    partner: int | None = None  # index of the die that shares this one's board (MI250X)
    lost: bool = False
    # settings (µW), as ``amd-smi static --limit`` would show them
    power_cap_uw: int = 750_000_000
    default_power_cap_uw: int = 750_000_000
    min_power_cap_uw: int = 200_000_000
    max_power_cap_uw: int = 750_000_000
    max_gfx_clock_mhz: int = 2100
    min_gfx_clock_mhz: int = 500
    idle_gfx_clock_mhz: int = 500
    idle_temperature_c: int = 35
    edge_temperature: bool = False  # MI300X has no edge sensor, only hotspot
    processes: list[dict[str, Any]] = field(default_factory=list)
    physics: Physics | None = None
    heat: Heat | None = None  # the temperature follows the power trace (gpu_physics.Heat)
    busy: tuple[int, float] | None = field(default=None, repr=False)  # MHz, W while working


def process_entry(pid: int, name: str, mem: int | str = NA) -> dict[str, Any]:
    """One entry of ``amdsmi_get_gpu_process_list`` as current amdsmi returns it (bytes;
    "N/A" for a name or size the driver does not give)."""
    vram = mem if isinstance(mem, int) else 0
    return {
        "name": name or NA,
        "pid": pid,
        "mem": mem,
        "engine_usage": {"gfx": 0, "enc": 0},
        "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": vram},
    }


def _uuid(n: int) -> str:
    return f"{n:02x}ff74a1-0000-1000-80a1-{n:012x}"


def mi300x(n: int, trace: PowerTrace | SwitchTrace, **kw: Any) -> FakeAmdGpu:
    """An MI300X: instant power valid, average "N/A"; a 750 W cap."""
    return FakeAmdGpu("AMD Instinct MI300X", _uuid(n), trace, "current_socket_power", **kw)


def mi210(n: int, trace: PowerTrace | SwitchTrace, **kw: Any) -> FakeAmdGpu:
    """An MI210: average power valid, instant "N/A"; a 300 W cap."""
    caps = {"power_cap_uw": 300_000_000, "default_power_cap_uw": 300_000_000}
    caps |= {"max_power_cap_uw": 300_000_000, "min_power_cap_uw": 100_000_000, "rocm": "6.2"}
    caps |= {"max_gfx_clock_mhz": 1700, "edge_temperature": True}
    return FakeAmdGpu("AMD Instinct MI210", _uuid(n), trace, "average_socket_power", **(caps | kw))


def mi250x(
    n: int, trace: PowerTrace | SwitchTrace, silent_value: int | str = 0, **kw: Any
) -> list[FakeAmdGpu]:
    """An MI250X board as amdsmi lists it, dies ``n`` and ``n + 1``: the first reports
    both dies' power (the trace), the second ``silent_value`` and a counter stuck at 0."""
    caps = {"power_cap_uw": 560_000_000, "default_power_cap_uw": 560_000_000}
    caps |= {"max_power_cap_uw": 560_000_000, "min_power_cap_uw": 200_000_000, "rocm": "6.3"}
    caps |= {"max_gfx_clock_mhz": 1700, "edge_temperature": True}
    first = FakeAmdGpu(
        "AMD Instinct MI250X", _uuid(n), trace, "average_socket_power", partner=n + 1,
        **(caps | kw),
    )  # fmt: skip
    second = FakeAmdGpu(
        "AMD Instinct MI250X", _uuid(n + 1), PowerTrace([(1.0, 0.0)], origin=trace.origin),
        "average_socket_power", silent=True, silent_value=silent_value, partner=n,
        **(caps | kw),
    )  # fmt: skip
    return [first, second]


class FakeAmdSmi:
    """The state behind one fake package: the GPUs, the init count and every call made."""

    API = (
        "amdsmi_init",
        "amdsmi_shut_down",
        "amdsmi_get_processor_handles",
        "amdsmi_get_gpu_asic_info",
        "amdsmi_get_gpu_device_uuid",
        "amdsmi_get_gpu_device_bdf",
        "amdsmi_get_energy_count",
        "amdsmi_get_power_info",
        "amdsmi_get_power_cap_info",
        "amdsmi_set_power_cap",
        "amdsmi_get_temp_metric",
        "amdsmi_get_clock_info",
        "amdsmi_get_gpu_process_list",
    )

    def __init__(
        self,
        gpus: Sequence[FakeAmdGpu],
        init_error: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        *,
        root: bool = True,
        state_path: str | os.PathLike[str] | None = None,
        virtual_time: bool = False,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.virtual_time = virtual_time
        self.virtual_s = 0.0
        self.clock = (lambda: clock() + self.virtual_s) if virtual_time else clock
        self.init_count = 0
        self.calls: Counter[str] = Counter()
        self.root = root
        self.state_path = state_path
        self._lock = threading.Lock()
        if state_path is not None:
            self._load_state()

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    # -- helpers -----------------------------------------------------------------------
    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        if self.init_count == 0:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)

    def _gpu(self, handle: object) -> FakeAmdGpu:
        if not isinstance(handle, FakeHandle):
            raise AmdSmiParameterException(handle, FakeHandle)
        if not 0 <= handle.index < len(self.gpus):
            raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_FOUND)
        return gpu

    @staticmethod
    def _energy_j(trace: PowerTrace | SwitchTrace, t0: float, t1: float) -> float:
        """Trace energy, with the first step's power assumed before the trace began."""
        first_w = trace.power_at(trace.origin)
        before = max(0.0, min(t1, trace.origin) - t0) * first_w
        return before + trace.energy_between(max(t0, trace.origin), max(t1, trace.origin))

    # -- the amdsmi API ------------------------------------------------------------------
    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        self.calls["amdsmi_init"] += 1
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.init_count += 1

    def amdsmi_shut_down(self) -> None:
        self._enter("amdsmi_shut_down")
        self.init_count -= 1

    def amdsmi_get_processor_handles(self) -> list[FakeHandle]:
        self._enter("amdsmi_get_processor_handles")
        return [FakeHandle(i) for i in range(len(self.gpus))]

    def amdsmi_get_gpu_asic_info(self, handle: FakeHandle) -> dict[str, Any]:
        self._enter("amdsmi_get_gpu_asic_info")
        gpu = self._gpu(handle)
        return {
            "market_name": gpu.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{handle.index:016X}",
            "oam_id": handle.index,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
        }

    def amdsmi_get_gpu_device_uuid(self, handle: FakeHandle) -> str:
        self._enter("amdsmi_get_gpu_device_uuid")
        return self._gpu(handle).uuid

    def amdsmi_get_gpu_device_bdf(self, handle: FakeHandle) -> str:
        self._enter("amdsmi_get_gpu_device_bdf")
        self._gpu(handle)
        return f"0000:{0x0C + 0x10 * handle.index:02x}:00.0"

    def _count(self, gpu: FakeAmdGpu, now: float) -> int:
        if gpu.silent or gpu.stuck_counter:
            return gpu.counter_offset % 2**gpu.counter_bits
        origin = gpu.trace.origin
        ticks = math.floor((now - origin) / gpu.counter_period_s)
        last_tick = origin + max(ticks, 0) * gpu.counter_period_s
        uj = 1e6 * gpu.trace.energy_until(last_tick) * gpu.counter_scale
        return (
            gpu.counter_offset + math.floor(uj / gpu.counter_resolution_uj)
        ) % 2**gpu.counter_bits

    def amdsmi_get_energy_count(self, handle: FakeHandle) -> dict[str, Any]:
        """Counts since the driver loaded, refreshed at ticks ``counter_period_s`` apart,
        under the key of the ROCm played."""
        self._enter("amdsmi_get_energy_count")
        gpu = self._gpu(handle)
        if not gpu.energy_counter:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        now = self.clock()
        count = self._count(gpu, now)
        reply: dict[str, Any] = {}
        if gpu.rocm in ("6.2", "6.3"):
            reply["power"] = count
        if gpu.rocm != "6.2":
            reply["energy_accumulator"] = count
        reply["counter_resolution"] = gpu.counter_resolution_uj
        reply["timestamp"] = int(now * 1e9)
        return reply

    def amdsmi_get_power_info(self, handle: FakeHandle) -> dict[str, Any]:
        """Watts (integers); the field the part lacks is "N/A"."""
        self._enter("amdsmi_get_power_info")
        gpu = self._gpu(handle)
        now = self.clock()
        info: dict[str, Any] = {
            "current_socket_power": NA,
            "average_socket_power": NA,
            "gfx_voltage": 800,
            "soc_voltage": 900,
            "mem_voltage": 1100,
            "power_limit": gpu.power_cap_uw // 1_000_000,
        }
        if gpu.silent:
            info[gpu.power_field] = gpu.silent_value
        elif gpu.power_field == "current_socket_power":
            info["current_socket_power"] = round(gpu.trace.power_at(now))
        else:
            w = gpu.average_window_s
            info["average_socket_power"] = round(self._energy_j(gpu.trace, now - w, now) / w)
        return info

    # -- settings that outlive the process ------------------------------------------------
    def _load_state(self) -> None:
        assert self.state_path is not None
        try:
            with open(self.state_path) as f:
                saved = json.load(f)
        except FileNotFoundError:
            return
        for gpu in self.gpus:
            if gpu.uuid in saved:
                gpu.power_cap_uw = saved[gpu.uuid]["power_cap_uw"]

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        data = {gpu.uuid: {"power_cap_uw": gpu.power_cap_uw} for gpu in self.gpus}
        tmp = f"{self.state_path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.state_path)

    def amdsmi_get_power_cap_info(self, handle: FakeHandle) -> dict[str, int]:
        """µW."""
        self._enter("amdsmi_get_power_cap_info")
        gpu = self._gpu(handle)
        return {
            "power_cap": gpu.power_cap_uw,
            "default_power_cap": gpu.default_power_cap_uw,
            "dpm_cap": 0,
            "min_power_cap": gpu.min_power_cap_uw,
            "max_power_cap": gpu.max_power_cap_uw,
        }

    def amdsmi_set_power_cap(self, handle: FakeHandle, sensor_ind: int, cap: int) -> None:
        """µW; root only; an int or AmdSmiParameterException; outside the range INVAL.
        The two dies of an MI250X share one cap."""
        self._enter("amdsmi_set_power_cap")
        gpu = self._gpu(handle)
        if not isinstance(sensor_ind, int):
            raise AmdSmiParameterException(sensor_ind, int)
        if not isinstance(cap, int):
            raise AmdSmiParameterException(cap, int)
        if not self.root:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NO_PERM)
        if sensor_ind != 0 or not gpu.min_power_cap_uw <= cap <= gpu.max_power_cap_uw:
            raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
        gpu.power_cap_uw = cap
        if gpu.partner is not None:
            self.gpus[gpu.partner].power_cap_uw = cap
        self._save_state()

    def amdsmi_get_temp_metric(
        self,
        handle: FakeHandle,
        sensor_type: AmdSmiTemperatureType,
        metric: AmdSmiTemperatureMetric,
    ) -> int:
        """°C: warmer with the power drawn; MI300X has no edge sensor."""
        self._enter("amdsmi_get_temp_metric")
        gpu = self._gpu(handle)
        if not isinstance(sensor_type, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor_type, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        if sensor_type == AmdSmiTemperatureType.EDGE and not gpu.edge_temperature:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        if metric != AmdSmiTemperatureMetric.CURRENT:
            return 100
        if gpu.heat is not None:  # whole degrees, as amdsmi reports them
            return round(gpu.heat.temperature_c(gpu.trace.steps, gpu.trace.origin, self.clock()))
        busy = gpu.busy
        return (
            gpu.idle_temperature_c if busy is None else int(gpu.idle_temperature_c + 0.06 * busy[1])
        )

    def amdsmi_get_clock_info(self, handle: FakeHandle, clk_type: AmdSmiClkType) -> dict[str, Any]:
        """MHz now: the work's clock, else the idle clock."""
        self._enter("amdsmi_get_clock_info")
        gpu = self._gpu(handle)
        if not isinstance(clk_type, AmdSmiClkType):
            raise AmdSmiParameterException(clk_type, AmdSmiClkType)
        if clk_type == AmdSmiClkType.MEM:
            return {"clk": 1300, "min_clk": 900, "max_clk": 1300, "clk_locked": 0,
                    "clk_deep_sleep": 0}  # fmt: skip
        if clk_type != AmdSmiClkType.GFX:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        busy = gpu.busy
        return {
            "clk": gpu.idle_gfx_clock_mhz if busy is None else busy[0],
            "min_clk": gpu.min_gfx_clock_mhz,
            "max_clk": gpu.max_gfx_clock_mhz,
            "clk_locked": 0,
            "clk_deep_sleep": int(busy is None),
        }

    def amdsmi_get_gpu_process_list(self, handle: FakeHandle) -> list[dict[str, Any]]:
        self._enter("amdsmi_get_gpu_process_list")
        return [dict(p) for p in self._gpu(handle).processes]

    # -- running work ----------------------------------------------------------------------
    def work(
        self, index: int, phases: Sequence[Phase], between: Callable[[], object] | None = None
    ) -> float:
        """Run the phases on GPU ``index`` at the clock its power cap allows (sleeping their
        true duration, or advancing virtual time), drawing their true power."""
        gpu = self.gpus[index]
        physics = gpu.physics
        trace = gpu.trace
        if physics is None or not isinstance(trace, SwitchTrace):
            raise TypeError("work() needs a GPU with physics and a SwitchTrace")
        if not any(p.get("pid") == os.getpid() for p in gpu.processes):  # a context now
            gpu.processes.append(process_entry(os.getpid(), "python", 512 * 2**20))
        min_ratio = gpu.min_gfx_clock_mhz / gpu.max_gfx_clock_mhz
        limit_w = gpu.power_cap_uw / 1e6
        slept = 0.0
        for i, phase in enumerate(phases):
            if i and between is not None:
                between()
            ratio, _ = physics.clock_ratio(phase.kind, limit_w, None, min_ratio)
            seconds = phase.seconds * physics.stretch(phase.kind, ratio) / physics.speed
            watts = physics.power_w(phase.kind, ratio)
            start = trace.set(watts, self.clock())
            gpu.busy = (round(ratio * gpu.max_gfx_clock_mhz), watts)
            if self.virtual_time:  # visible to telemetry for a moment, as fake_pynvml's
                time.sleep(min(seconds / 2, VISIBLE_S) if seconds >= 2 * MIN_VISIBLE_S else 0)
                elapsed = self.clock() - start
                self.virtual_s += max(0.0, seconds - elapsed)
                end = trace.set(physics.idle_w, start + max(seconds, elapsed))
            else:
                time.sleep(seconds)
                end = trace.set(physics.idle_w, self.clock())
            gpu.busy = None
            slept += end - start
        return slept


def build_fake_amdsmi(
    gpus: Sequence[FakeAmdGpu],
    init_error: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    *,
    root: bool = True,
    state_path: str | os.PathLike[str] | None = None,
    virtual_time: bool = False,
) -> types.ModuleType:
    """A module object that looks like ``amdsmi``; its state is ``module.fake``."""
    fake = FakeAmdSmi(
        gpus, init_error, clock, root=root, state_path=state_path, virtual_time=virtual_time
    )
    module = types.ModuleType("amdsmi", "fake amdsmi (tests/fakes/fake_amdsmi.py)")
    this = sys.modules[__name__]
    for name in dir(this):
        if name.startswith(("AmdSmi", "AMDSMI_STATUS_")):
            setattr(module, name, getattr(this, name))
    for name in FakeAmdSmi.API:
        setattr(module, name, getattr(fake, name))
    module.fake = fake  # type: ignore[attr-defined]
    return module


def install_fake_amdsmi(
    monkeypatch: pytest.MonkeyPatch,
    gpus: Sequence[FakeAmdGpu],
    *,
    init_error: int | None = None,
    root: bool = True,
    state_path: str | os.PathLike[str] | None = None,
) -> Any:
    """Make ``import amdsmi`` return a fake with these GPUs until the test ends."""
    module = build_fake_amdsmi(gpus, init_error, root=root, state_path=state_path)
    monkeypatch.setitem(sys.modules, "amdsmi", module)
    return module
