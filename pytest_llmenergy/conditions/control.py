"""Changing a GPU's power limit and SM clocks, and always giving it back as it was.

Before the first change, the original settings go to a state file (written
atomically); every change is read back and checked; ``restore`` sets the originals
again, reads them back and removes the file.  A session killed outright (SIGKILL, a
power cut of the host process) leaves the file behind: the next session, or
``llmenergy gpu restore``, finds it and restores from it.

Every GPU is reached through the device layer (gpu/device.py), so this works alike on
NVIDIA and AMD; the state file records each GPU's vendor, so a killed AMD session is
restored through amdsmi.  NVML cannot read which clocks were locked, so a GPU is
assumed to have its clocks unlocked when a session starts (the default after boot);
restoring unlocks them.  A vendor's library is imported only when a control is opened.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..errors import LLMEnergyError
from ..gpu.device import (
    GpuDevice,
    GpuDeviceError,
    GpuLibrary,
    one_line,
    open_gpus,
    open_library,
    vendor_labels,
)
from .settings import AUTO_CLOCK, GpuLimits, GpuSetting

STATE_ENV = "LLMENERGY_GPU_STATE"
STATE_FORMAT = "pytest-llmenergy-gpu-state"
PERMISSION_FIX = (
    "changing GPU power limits and clocks needs root or CAP_SYS_ADMIN: run the session as "
    "root (sudo -E python -m pytest ...), or leave out --energy-gpu-power-limits and "
    "--energy-gpu-clocks"
)


class GpuControlError(LLMEnergyError):
    """A GPU setting could not be changed or restored; the message says what to do."""


def default_state_path() -> Path:
    """Where the originals wait until restored: ``$LLMENERGY_GPU_STATE``, else the
    user's cache folder."""
    given = os.environ.get(STATE_ENV)
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "pytest-llmenergy" / "gpu-state.json"


@dataclass(frozen=True)
class Original:
    """One GPU as found: what restoring sets again."""

    uuid: str
    domain: str
    name: str
    power_limit_mw: int | None
    clocks_locked: bool = False  # locked by a session since (to unlock on restore)
    vendor: str = "nvidia"  # whose library restores it (files written before AMD: NVIDIA)


@dataclass(frozen=True)
class ReadBack:
    """One GPU as read after a change or a restore."""

    domain: str
    name: str
    power_limit_w: float | None
    clocks_locked: bool
    sm_clock_mhz: int | None

    def describe(self) -> str:
        limit = "n/a" if self.power_limit_w is None else f"{self.power_limit_w:g} W"
        clocks = "locked" if self.clocks_locked else "unlocked"
        now = "" if self.sm_clock_mhz is None else f" (SM clock now {self.sm_clock_mhz} MHz)"
        return f"{self.domain} {self.name}: power limit {limit}, clocks {clocks}{now}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StateFile:
    """The originals of the GPUs a session changed, until they are restored."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_state_path()

    def read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: '[' x 10^5
            raise GpuControlError(
                f"cannot read the GPU state file {self.path}: {one_line(exc)}; check it "
                "and restore the GPUs by hand (nvidia-smi -pl / -rgc, amd-smi reset "
                "--power-cap), then delete it"
            ) from None
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise GpuControlError(f"{self.path} is not a GPU state file of pytest-llmenergy")
        problem = _state_problem(data)
        if problem:
            raise GpuControlError(
                f"the GPU state file {self.path} is damaged: {one_line(problem)}; restore the "
                "GPUs by hand (nvidia-smi -pl / -rgc, amd-smi reset --power-cap), then delete it"
            )
        return data

    def write(self, originals: Sequence[Original]) -> None:
        data = {
            "format": STATE_FORMAT,
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "gpus": [o.__dict__ for o in originals],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @staticmethod
    def originals(data: dict[str, Any]) -> list[Original]:
        return [Original(**g) for g in data.get("gpus", [])]


def _state_problem(data: dict[str, Any]) -> str:
    """What in a state file is not as ``StateFile.write`` writes it; "" when nothing."""
    pid = data.get("pid", 0)
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        return f"pid should be a process id, not {json.dumps(pid)}"
    gpus = data.get("gpus", [])
    if not isinstance(gpus, list):
        return f"gpus should be a list of GPUs, not {json.dumps(gpus)}"
    kinds: dict[str, tuple[type, ...]] = {
        "uuid": (str,),
        "domain": (str,),
        "name": (str,),
        "power_limit_mw": (int, type(None)),
        "clocks_locked": (bool,),
        "vendor": (str,),
    }
    required = {f.name for f in fields(Original) if f.default is MISSING}
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            return f"gpus[{i}] should be an object, not {json.dumps(gpu)}"
        for key, value in gpu.items():
            if key not in kinds:
                return f"gpus[{i}] has an unknown field {json.dumps(key)}"
            wanted = kinds[key]
            if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
                return f"gpus[{i}].{key} is {json.dumps(value)}"
        missing = sorted(required - gpu.keys())
        if missing:
            return f"gpus[{i}] lacks {', '.join(missing)}"
    return ""


class GpuControl:
    """Applies settings to the GPUs (through the device layer, any vendor) and restores them."""

    def __init__(
        self,
        state: StateFile,
        gpus: Sequence[int] | None = None,
        library: GpuLibrary | None = None,
        backend: str = "auto",
    ) -> None:
        """``gpus``: ordinals the framework uses (``--energy-gpus``); None: every GPU it
        sees; ``backend``: the energy backend, whose vendor's GPUs these are."""
        try:
            self.library = library if library is not None else open_gpus(backend)
        except GpuDeviceError as exc:
            raise GpuControlError(
                f"GPU settings and telemetry need the GPU vendor's library, which could not "
                f"start ({exc}): run on a machine with a GPU of a known vendor "
                f"({vendor_labels()}), or leave out "
                "--energy-gpu-power-limits, --energy-gpu-clocks and --energy-gpu-telemetry"
            ) from None
        self.state = state
        self._originals: list[Original] | None = None  # set once the state file is written
        self.current: GpuSetting | None = None
        try:
            self.devices = self.library.devices(gpus)
        except GpuDeviceError as exc:
            self.close()
            raise GpuControlError(f"listing the GPUs failed: {exc}") from None
        except BaseException:
            self.close()
            raise
        if not self.devices:
            self.close()
            raise GpuControlError(f"no {self.vendor} GPU to change settings of (none visible)")

    @property
    def vendor(self) -> str:
        return self.library.vendor

    # -- what the GPUs allow ---------------------------------------------------------
    def limits(self) -> list[GpuLimits]:
        out = []
        for d in self.devices:
            try:
                power = d.power_limits()
                clocks = d.supported_clocks_mhz()
            except GpuDeviceError as exc:
                raise GpuControlError(
                    f"{d.domain} {d.name}: its power limits and clocks cannot be read ({exc}); "
                    "this GPU cannot be swept"
                ) from None
            out.append(
                GpuLimits(d.domain, d.name, power.min_w, power.max_w, power.default_w, clocks)
            )
        return out

    def check_permission(self) -> None:
        """Write each GPU's limit as it is (changing nothing): only root may, so a user
        without the right learns it now, in one line, not at the first case."""
        for d in self.devices:
            try:
                d.set_power_limit_w(d.power_limit_w())
            except GpuDeviceError as exc:
                if exc.permission:
                    raise GpuControlError(PERMISSION_FIX) from None
                raise GpuControlError(f"cannot set the power limit of {d.name}: {exc}") from None

    # -- changing ------------------------------------------------------------------------
    def _remember(self, lock_clocks: bool) -> None:
        """Write the originals before the first change (and again when clocks are first
        locked), so a killed session leaves what is needed to restore."""
        if self._originals is None:
            self._originals = [
                Original(d.uuid, d.domain, d.name, _limit_mw(d), vendor=self.vendor)
                for d in self.devices
            ]
            self.state.write(self._originals)
        if lock_clocks and not all(o.clocks_locked for o in self._originals):
            self._originals = [replace(o, clocks_locked=True) for o in self._originals]
            self.state.write(self._originals)

    def apply(self, setting: GpuSetting) -> list[ReadBack]:
        """Set, then read back; a GPU that did not take the setting is an error."""
        if setting == self.current:
            return []
        lock = setting.sm_clock_mhz is not None and setting.sm_clock_mhz != AUTO_CLOCK
        self._remember(lock)
        out = []
        for d in self.devices:
            where = f"{d.domain} {d.name}"
            try:
                if setting.power_limit_w is not None:
                    d.set_power_limit_w(setting.power_limit_w)
                if lock:
                    assert setting.sm_clock_mhz is not None
                    d.lock_clocks_mhz(setting.sm_clock_mhz)
                elif setting.sm_clock_mhz == AUTO_CLOCK:
                    d.reset_clocks()
                back = _read_back(d, lock)
            except GpuDeviceError as exc:
                self.current = None
                fix = f"; {PERMISSION_FIX}" if exc.permission else ""
                raise GpuControlError(f"{where}: setting {setting.id} failed: {exc}{fix}") from None
            if setting.power_limit_w is not None and back.power_limit_w != setting.power_limit_w:
                raise GpuControlError(
                    f"{where}: power limit set to {setting.power_limit_w:g} W but reads back "
                    f"{back.power_limit_w} W (another tool changing it?)"
                )
            if lock and back.sm_clock_mhz != setting.sm_clock_mhz:
                raise GpuControlError(
                    f"{where}: SM clock locked at {setting.sm_clock_mhz} MHz but reads "
                    f"{back.sm_clock_mhz} MHz"
                )
            out.append(back)
        self.current = setting
        return out

    # -- giving back -----------------------------------------------------------------------
    def restore(self) -> list[ReadBack]:
        """The originals again, read back; the state file goes once all are back.
        Nothing changed: nothing to do."""
        if self._originals is None:
            return []
        out = restore_originals(self.library, self._originals)
        self.state.remove()
        self._originals = None
        self.current = None
        return out

    @property
    def changed(self) -> bool:
        return self._originals is not None

    def close(self) -> None:
        self.library.close()


def _limit_mw(device: GpuDevice) -> int | None:
    try:
        return round(device.power_limit_w() * 1000)
    except GpuDeviceError:
        return None


def _read_back(device: GpuDevice, locked: bool) -> ReadBack:
    limit = _limit_mw(device)
    return ReadBack(
        device.domain,
        device.name,
        None if limit is None else limit / 1000,
        locked,
        device.sm_clock_mhz(),
    )


def restore_originals(library: GpuLibrary, originals: Sequence[Original]) -> list[ReadBack]:
    """Set each GPU (found by UUID) back; raises naming the GPUs that could not be."""
    out: list[ReadBack] = []
    failed: list[str] = []
    for o in originals:
        try:
            d = library.by_uuid(o.uuid, o.domain, o.name)
            if o.power_limit_mw is not None:
                d.set_power_limit_w(o.power_limit_mw / 1000)
            if o.clocks_locked:
                d.reset_clocks()
            back = _read_back(d, False)
        except GpuDeviceError as exc:
            failed.append(f"{o.domain} {o.name}: {exc}")
            continue
        out.append(back)
        if o.power_limit_mw is not None and back.power_limit_w != o.power_limit_mw / 1000:
            failed.append(f"{o.domain} {o.name}: power limit reads back {back.power_limit_w} W")
    if failed:
        raise GpuControlError(
            "could not restore " + "; ".join(failed) + "; run `llmenergy gpu restore` as root "
            f"(or {library.manual_restore})"
        )
    return out


def recover(
    state: StateFile, module: Any = None, *, force: bool = False
) -> tuple[dict[str, Any], list[ReadBack]] | None:
    """Restore what a session that died left in the state file; None if there is none.
    Each GPU is restored through the library of the vendor the file records (``module``:
    that library's package, for tests).  A session still alive owns its GPUs: that is an
    error, not a restore (unless ``force``: the pid was reused by another program)."""
    data = state.read()
    if data is None:
        return None
    pid = int(data.get("pid", 0))
    if not force and pid and pid != os.getpid() and _pid_alive(pid):
        raise GpuControlError(
            f"another session (pid {pid}, started {data.get('started')}) is changing GPU "
            f"settings ({state.path}); wait for it to end, or if it is not pytest-llmenergy, "
            "run `llmenergy gpu restore --force`"
        )
    originals = StateFile.originals(data)
    back: list[ReadBack] = []
    for vendor in dict.fromkeys(o.vendor for o in originals):
        try:
            library = open_library(vendor, module)
        except GpuDeviceError as exc:
            raise GpuControlError(
                f"a session left {vendor} GPU settings to restore ({state.path}) but its "
                f"library could not start: {exc}"
            ) from None
        try:
            back += restore_originals(library, [o for o in originals if o.vendor == vendor])
        finally:
            library.close()
    state.remove()
    return data, back
