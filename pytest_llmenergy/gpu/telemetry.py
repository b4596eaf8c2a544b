"""What the GPUs did during each trial: temperature, SM clock, clock-event reasons.

A thread samples every GPU while a trial runs (clock, temperature, the current
clock-event reasons, called "throttle reasons" before nvidia-ml-py 12.535), and NVML's
violation counters are read at the trial's edges (time held back by the power cap and by
heat, exact however short the trial).  A trial slowed by heat or a power brake does not
show the setting under test: it is marked, kept, left out of the figures and repeated.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from ..results import GpuTelemetry

# Clock-event reason bits (nvmlClocksEventReason*), by the name a trial records.
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,  # locked or application clocks below the maximum
    "sw_power_cap": 0x4,  # the power limit: what a power-limit setting does
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock": 0x100,
}
# Reasons that mean the trial ran at something other than its setting.
DISQUALIFYING = ("hw_thermal", "sw_thermal", "hw_power_brake", "hw_slowdown")
DEFAULT_INTERVAL_S = 0.01
_POLICY_POWER, _POLICY_THERMAL = 0, 1


def reason_names(mask: int) -> tuple[str, ...]:
    return tuple(name for name, bit in REASON_BITS.items() if mask & bit)


class TrialTelemetry:
    """``start()`` before a trial's window, ``stop()`` after it: one ``GpuTelemetry``."""

    def __init__(self, nvml: Any, handles: Sequence[Any], interval_s: float = DEFAULT_INTERVAL_S):
        self.nvml = nvml
        self.handles = tuple(handles)
        self.interval_s = interval_s
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        self._sm = getattr(nvml, "NVML_CLOCK_SM", 1)
        self._gpu_sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        self._samples: list[tuple[int | None, int | None, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._violations: list[tuple[int, int] | None] = []
        self._power_limit_w: float | None = None

    def _violation_ns(self) -> list[tuple[int, int] | None]:
        nvml = self.nvml
        out: list[tuple[int, int] | None] = []
        for h in self.handles:
            try:
                power = nvml.nvmlDeviceGetViolationStatus(h, _POLICY_POWER).violationTime
                heat = nvml.nvmlDeviceGetViolationStatus(h, _POLICY_THERMAL).violationTime
                out.append((int(power), int(heat)))
            except (nvml.NVMLError, AttributeError):
                out.append(None)
        return out

    def _sample(self) -> None:
        nvml = self.nvml
        for h in self.handles:
            try:
                sm: int | None = int(nvml.nvmlDeviceGetClockInfo(h, self._sm))
            except nvml.NVMLError:
                sm = None
            try:
                temp: int | None = int(nvml.nvmlDeviceGetTemperature(h, self._gpu_sensor))
            except nvml.NVMLError:
                temp = None
            try:
                mask = int(self._reasons(h)) if self._reasons is not None else 0
            except nvml.NVMLError:
                mask = 0
            self._samples.append((sm, temp, mask))

    def _loop(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval_s):
                return

    def _limit_w(self) -> float | None:
        """The power limit in force (the lowest among the GPUs)."""
        nvml = self.nvml
        limits = []
        for h in self.handles:
            with contextlib.suppress(nvml.NVMLError, AttributeError):
                limits.append(int(nvml.nvmlDeviceGetEnforcedPowerLimit(h)) / 1000)
        return min(limits) if limits else None

    def start(self) -> None:
        self._samples = []
        self._stop.clear()
        self._power_limit_w = self._limit_w()
        self._violations = self._violation_ns()
        self._thread = threading.Thread(target=self._loop, name="llmenergy-gpu-telemetry")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> GpuTelemetry:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        after = self._violation_ns()
        power_s = thermal_s = 0.0
        known = False
        for a, b in zip(self._violations, after):
            if a is not None and b is not None:
                known = True
                power_s = max(power_s, (b[0] - a[0]) / 1e9)
                thermal_s = max(thermal_s, (b[1] - a[1]) / 1e9)
        # the clock while the GPU worked: idle samples (before the work reached the GPU)
        # would pull the mean toward the idle clock
        working = [s for s in self._samples if not s[2] & REASON_BITS["gpu_idle"]]
        clocks = [s[0] for s in working or self._samples if s[0] is not None]
        temps = [s[1] for s in self._samples if s[1] is not None]
        mask = 0
        for s in self._samples:
            mask |= s[2]
        reasons = reason_names(mask)
        bad = [r for r in reasons if r in DISQUALIFYING]
        if known and thermal_s > 0 and not any("thermal" in r for r in bad):
            bad.append("thermal (violation counter)")
        return GpuTelemetry(
            temperature_c_max=float(max(temps)) if temps else None,
            sm_clock_mhz_mean=sum(clocks) / len(clocks) if clocks else None,
            reasons=reasons,
            power_capped_s=power_s if known else None,
            thermal_s=thermal_s if known else None,
            throttled=", ".join(bad),
            power_limit_w=self._power_limit_w,
        )
