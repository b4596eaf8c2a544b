"""Changing a GPU's power limit and SM clocks, and always giving it back as it was.

Before the first change, the original settings go to a state file (written
atomically); every change is read back and checked; ``restore`` sets the originals
again, reads them back and removes the file.  A session killed outright (SIGKILL, a
power cut of the host process) leaves the file behind: the next session, or
``llmenergy gpu restore``, finds it and restores from it.

NVML cannot read which clocks were locked, so a GPU is assumed to have its clocks
unlocked when a session starts (the default after boot); restoring unlocks them.
``pynvml`` is imported only when a control is opened.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, LLMEnergyError
from ..meters.nvml import visible_gpu_indices
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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
                f"cannot read the GPU state file {self.path}: {_one_line(exc)}; check it "
                "and restore the GPUs with nvidia-smi -rpl / -rgc, then delete it"
            ) from None
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise GpuControlError(f"{self.path} is not a GPU state file of pytest-llmenergy")
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


def import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise ConfigError(
            "GPU settings need nvidia-ml-py: pip install 'pytest-llmenergy[nvml]'"
        ) from None
    return pynvml


class GpuControl:
    """Applies settings to the GPUs (NVML indices) and restores them."""

    def __init__(
        self, state: StateFile, gpus: Sequence[int] | None = None, nvml: Any = None
    ) -> None:
        """``gpus``: CUDA ordinals (``--energy-gpus``); None: every GPU CUDA sees."""
        self.nvml = nvml if nvml is not None else import_pynvml()
        self.state = state
        self._open = False
        self._originals: list[Original] | None = None  # set once the state file is written
        self.current: GpuSetting | None = None
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuControlError(
                f"GPU settings and telemetry need NVML, which could not start "
                f"({_one_line(exc)}): run on a machine with an NVIDIA driver, or leave out "
                "--energy-gpu-power-limits, --energy-gpu-clocks and --energy-gpu-telemetry"
            ) from None
        self._open = True
        try:
            self.indices = tuple(visible_gpu_indices(nvml, gpus))
            if not self.indices:
                raise GpuControlError("no NVIDIA GPU to change settings of (CUDA sees none)")
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
            self.uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self.handles]
            self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self.handles]
        except nvml.NVMLError as exc:
            self.close()
            raise GpuControlError(f"NVML failed while listing GPUs: {_one_line(exc)}") from None
        except BaseException:
            self.close()
            raise

    def domain(self, i: int) -> str:
        return f"gpu:{self.indices[i]}"

    # -- what the GPUs allow ---------------------------------------------------------
    def limits(self) -> list[GpuLimits]:
        nvml = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            try:
                low, high = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
                default = nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
                memory = max(nvml.nvmlDeviceGetSupportedMemoryClocks(h))
                clocks = nvml.nvmlDeviceGetSupportedGraphicsClocks(h, memory)
            except nvml.NVMLError as exc:
                raise GpuControlError(
                    f"{self.domain(i)} {self.names[i]}: its power limits and clocks cannot be "
                    f"read ({_one_line(exc)}); this GPU cannot be swept"
                ) from None
            out.append(
                GpuLimits(
                    self.domain(i),
                    self.names[i],
                    low / 1000,
                    high / 1000,
                    default / 1000,
                    tuple(sorted((int(c) for c in clocks), reverse=True)),
                )
            )
        return out

    def check_permission(self) -> None:
        """Write each GPU's limit as it is (changing nothing): only root may, so a user
        without the right learns it now, in one line, not at the first case."""
        nvml = self.nvml
        for h in self.handles:
            try:
                nvml.nvmlDeviceSetPowerManagementLimit(h, nvml.nvmlDeviceGetPowerManagementLimit(h))
            except nvml.NVMLError as exc:
                if exc.value == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4):
                    raise GpuControlError(PERMISSION_FIX) from None
                raise GpuControlError(
                    f"cannot set the power limit of {self.names[0]}: {_one_line(exc)}"
                ) from None

    # -- changing ------------------------------------------------------------------------
    def _remember(self, lock_clocks: bool) -> None:
        """Write the originals before the first change (and again when clocks are first
        locked), so a killed session leaves what is needed to restore."""
        nvml = self.nvml
        if self._originals is None:
            self._originals = [
                Original(uuid, self.domain(i), self.names[i], self._limit_mw(h))
                for i, (uuid, h) in enumerate(zip(self.uuids, self.handles))
            ]
            self.state.write(self._originals)
        if lock_clocks and not all(o.clocks_locked for o in self._originals):
            self._originals = [
                Original(o.uuid, o.domain, o.name, o.power_limit_mw, True) for o in self._originals
            ]
            self.state.write(self._originals)
        del nvml

    def _limit_mw(self, handle: Any) -> int | None:
        nvml = self.nvml
        try:
            return int(nvml.nvmlDeviceGetPowerManagementLimit(handle))
        except nvml.NVMLError:
            return None

    def apply(self, setting: GpuSetting) -> list[ReadBack]:
        """Set, then read back; a GPU that did not take the setting is an error."""
        if setting == self.current:
            return []
        nvml = self.nvml
        lock = setting.sm_clock_mhz is not None and setting.sm_clock_mhz != AUTO_CLOCK
        self._remember(lock)
        out = []
        for i, h in enumerate(self.handles):
            where = f"{self.domain(i)} {self.names[i]}"
            try:
                if setting.power_limit_w is not None:
                    nvml.nvmlDeviceSetPowerManagementLimit(h, round(setting.power_limit_w * 1000))
                if lock:
                    mhz = setting.sm_clock_mhz
                    nvml.nvmlDeviceSetGpuLockedClocks(h, mhz, mhz)
                elif setting.sm_clock_mhz == AUTO_CLOCK:
                    nvml.nvmlDeviceResetGpuLockedClocks(h)
                back = self._read_back(i, lock)
            except nvml.NVMLError as exc:
                self.current = None
                fix = (
                    PERMISSION_FIX
                    if exc.value == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4)
                    else ""
                )
                raise GpuControlError(
                    f"{where}: setting {setting.id} failed: {_one_line(exc)}"
                    + (f"; {fix}" if fix else "")
                ) from None
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

    def _read_back(self, i: int, locked: bool) -> ReadBack:
        nvml = self.nvml
        h = self.handles[i]
        limit = self._limit_mw(h)
        try:
            sm = int(nvml.nvmlDeviceGetClockInfo(h, getattr(nvml, "NVML_CLOCK_SM", 1)))
        except nvml.NVMLError:
            sm = None
        return ReadBack(
            self.domain(i), self.names[i], None if limit is None else limit / 1000, locked, sm
        )

    # -- giving back -----------------------------------------------------------------------
    def restore(self) -> list[ReadBack]:
        """The originals again, read back; the state file goes once all are back.
        Nothing changed: nothing to do."""
        if self._originals is None:
            return []
        out = restore_originals(self.nvml, self._originals)
        self.state.remove()
        self._originals = None
        self.current = None
        return out

    @property
    def changed(self) -> bool:
        return self._originals is not None

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()


def restore_originals(nvml: Any, originals: Sequence[Original]) -> list[ReadBack]:
    """Set each GPU (found by UUID) back; raises naming the GPUs that could not be."""
    out: list[ReadBack] = []
    failed: list[str] = []
    for o in originals:
        try:
            h = nvml.nvmlDeviceGetHandleByUUID(o.uuid.encode())
            if o.power_limit_mw is not None:
                nvml.nvmlDeviceSetPowerManagementLimit(h, int(o.power_limit_mw))
            if o.clocks_locked:
                nvml.nvmlDeviceResetGpuLockedClocks(h)
            limit = nvml.nvmlDeviceGetPowerManagementLimit(h)
            sm = int(nvml.nvmlDeviceGetClockInfo(h, getattr(nvml, "NVML_CLOCK_SM", 1)))
        except nvml.NVMLError as exc:
            failed.append(f"{o.domain} {o.name}: {_one_line(exc)}")
            continue
        out.append(ReadBack(o.domain, o.name, int(limit) / 1000, False, sm))
        if o.power_limit_mw is not None and int(limit) != int(o.power_limit_mw):
            failed.append(f"{o.domain} {o.name}: power limit reads back {int(limit) / 1000:g} W")
    if failed:
        raise GpuControlError(
            "could not restore " + "; ".join(failed) + "; run `llmenergy gpu restore` as root "
            "(or nvidia-smi -pl / -rgc)"
        )
    return out


def recover(
    state: StateFile, nvml: Any = None, *, force: bool = False
) -> tuple[dict[str, Any], list[ReadBack]] | None:
    """Restore what a session that died left in the state file; None if there is none.
    A session still alive owns its GPUs: that is an error, not a restore (unless
    ``force``: the pid was reused by another program)."""
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
    nvml = nvml if nvml is not None else import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise GpuControlError(
            f"a session left GPU settings to restore ({state.path}) but NVML could not start: "
            f"{_one_line(exc)}"
        ) from None
    try:
        back = restore_originals(nvml, StateFile.originals(data))
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    state.remove()
    return data, back
