"""AMD GPUs through amdsmi (ROCm's ``amdsmi`` package): the device layer's vendor.

amdsmi counts power caps in µW (``amdsmi_get_power_cap_info``, ``amdsmi_set_power_cap``
with sensor 0), power in W (``amdsmi_get_power_info``), temperatures in °C
(``amdsmi_get_temp_metric``; an MI300X has no edge sensor, only the hotspot), clocks in
MHz (``amdsmi_get_clock_info``: ``clk``, and ``clk_deep_sleep`` while idle), and marks a
value a part lacks by the string "N/A".  The two dies of an MI250X share one power cap.
Locking clocks is not supported here: amdsmi sets a range but cannot read back the range
it replaced, and only resets it through the performance level, so a session could not
give the GPU back as it found it.

The GPUs are the ones HIP sees (``ROCR_VISIBLE_DEVICES``, then ``HIP_VISIBLE_DEVICES``,
or ``CUDA_VISIBLE_DEVICES`` when that one is unset, as HIP reads them), numbered as HIP
numbers them, so ``gpu:i`` is what torch on ROCm calls ``cuda:i``; amdsmi is taken to
list the GPUs in HIP's order (both sort by PCI bus).  ``init_library`` is the package's
one ``amdsmi_init``.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, TypeVar

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
INSTALL_HINT = (
    "the amdsmi Python package is not installed: install the one that comes with your "
    "ROCm, pip install /opt/rocm/share/amd_smi (its version must match ROCm's)"
)
# Power fields, best first: the instant one (MI300), the one newer amdsmi fills for every
# part, then the firmware's average (MI200/MI210).  All in watts.
POWER_FIELDS = ("current_socket_power", "socket_power", "average_socket_power")
# amdsmi marks a value the part lacks by "N/A", or (raw fields of newer releases) by the
# largest value of the field's width.
_UNSET = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})

# amdsmi status codes (amdsmi_status_t) of init failures: what they mean here, what to do.
_INIT_HINTS = {
    10: "no permission to open the GPU devices (/dev/kfd, /dev/dri): add the user to the "
    "render and video groups",
    18: "amdsmi could not start: check that ROCm and the amdgpu driver work (amd-smi list)",
    34: "the amdgpu kernel driver is not loaded (modprobe amdgpu, or try amd-smi)",
    51: "no AMD GPU driver on this machine",
    52: "libamd_smi.so not found: install ROCm, or set ROCM_PATH",
}


def _number(value: Any) -> float | None:
    """A field as a number, or None for "N/A" (and the like)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def watts(value: Any) -> float | None:
    """A power field in watts, or None where the part has none (``"N/A"``, a marker)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value < min(_UNSET):  # also NaN; no GPU draws 65 kW
        return None
    return float(value)


def import_amdsmi() -> ModuleType:
    """``amdsmi`` prints to stdout when libamd_smi.so is missing and fails with whatever
    exception its ctypes loading meets (OSError, AttributeError, KeyError): one line here."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import amdsmi
    except ImportError:
        raise GpuDeviceError(INSTALL_HINT, missing=True) from None
    except Exception as exc:
        raise GpuDeviceError(
            f"the amdsmi package cannot load libamd_smi ({one_line(exc)}): install the amdsmi "
            "package of this machine's ROCm (pip install /opt/rocm/share/amd_smi) and set "
            "ROCM_PATH"
        ) from None
    return amdsmi


def error_code(exc: BaseException) -> int | None:
    get = getattr(exc, "get_error_code", None)
    try:
        return int(get()) if get is not None else None
    except (TypeError, ValueError):
        return None


def init_library(module: ModuleType | None = None) -> ModuleType:
    """amdsmi (or ``module``, a stand-in of it), imported and initialised for AMD GPUs:
    the package's one ``amdsmi_init``.  ``GpuDeviceError`` saying why (amdsmi's own words,
    what they mean here and what to do) where it cannot be; each success needs its
    ``amdsmi_shut_down``."""
    smi = module if module is not None else import_amdsmi()
    try:
        smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except smi.AmdSmiException as exc:
        hint = _INIT_HINTS.get(error_code(exc) or -1, "amdsmi could not start")
        raise GpuDeviceError(f"{one_line(exc)}: {hint}") from None
    return smi


def _visible_entries(text: str, count: int) -> list[int]:
    """Indices named by a ``*_VISIBLE_DEVICES`` list into ``count`` devices; like HIP,
    parsing stops at the first entry that names no device."""
    out: list[int] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not (entry.isascii() and entry.isdigit()) or int(entry) >= count or int(entry) in out:
            break
        out.append(int(entry))
    return out


def visible_indices(count: int, environ: Mapping[str, str] | None = None) -> list[int]:
    """amdsmi index of each HIP ordinal: ``ROCR_VISIBLE_DEVICES`` picks among all GPUs,
    then ``HIP_VISIBLE_DEVICES`` (else ``CUDA_VISIBLE_DEVICES``) among those."""
    env = os.environ if environ is None else environ
    ordinals = list(range(count))
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    if rocr is not None:
        ordinals = [ordinals[i] for i in _visible_entries(rocr, len(ordinals))]
    hip = env.get("HIP_VISIBLE_DEVICES")
    if hip is None:
        hip = env.get("CUDA_VISIBLE_DEVICES")
    if hip is not None:
        ordinals = [ordinals[i] for i in _visible_entries(hip, len(ordinals))]
    return ordinals


def visibility_text(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    names = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    return ", ".join(f"{n}={env[n]!r}" for n in names if n in env)


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
        self.smi = init_library(module)
        self._open = True

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, an amdsmi error turned into GpuDeviceError."""
        try:
            return fn(*args)
        except self.smi.AmdSmiException as exc:
            code = error_code(exc)
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
        """amdsmi_shut_down once per amdsmi_init."""
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

    def power_w(self) -> float:
        """The first of ``POWER_FIELDS`` the part fills."""
        info = self._call(self._smi.amdsmi_get_power_info, self.handle)
        for field in POWER_FIELDS:
            value = watts(info.get(field))
            if value:
                return value
        raise GpuDeviceError(f"{self.name}: amdsmi reports no power", unsupported=True)

    def power_note(self) -> str:
        return "amdsmi_get_power_info"

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
