"""What the GPUs did during each trial: temperature, SM clock, clock-event reasons.

A thread samples every GPU while a trial runs (clock, temperature, the current
clock-event reasons, called "throttle reasons" before nvidia-ml-py 12.535), and the
violation counters are read at the trial's edges (time held back by the power cap and by
heat, exact however short the trial).  Every GPU is read through the device layer: AMD
GPUs give clock and temperature, and no reasons beyond idle (amdsmi has none).  A trial
slowed by heat or a power brake does not show the setting under test: it is marked,
kept, left out of the figures and repeated.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..gpu.device import GPU_IDLE, GpuDevice
from ..results import GpuNeighbour, GpuTelemetry
from .isolation import neighbours

# Clock-event reason bits (nvmlClocksEventReason*), by the name a trial records.
REASON_BITS = {
    "gpu_idle": GPU_IDLE,
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
NEIGHBOUR_EVERY = 10  # samples between looks for other processes during a trial


def reason_names(mask: int) -> tuple[str, ...]:
    return tuple(name for name, bit in REASON_BITS.items() if mask & bit)


class TrialTelemetry:
    """``start()`` before a trial's window, ``stop()`` after it: one ``GpuTelemetry``.

    ``roots``: the session's own process trees, to look for other processes on the GPUs
    at both edges (and every ``NEIGHBOUR_EVERY`` samples between); None: not looked for.
    ``clocks`` False: only that, no thread, and ``stop()`` is None when nobody was there.
    """

    def __init__(
        self,
        devices: Sequence[GpuDevice],
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        roots: tuple[int, ...] | None = None,
        clocks: bool = True,
    ):
        self.devices = tuple(devices)
        self.interval_s = interval_s
        self.roots = roots
        self.clocks = clocks
        self._neighbours: dict[tuple[str, int], GpuNeighbour] = {}
        self._samples: list[tuple[int | None, float | None, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._violations: list[tuple[int, int] | None] = []
        self._power_limit_w: float | None = None

    def _violation_ns(self) -> list[tuple[int, int] | None]:
        return [d.violation_ns() for d in self.devices]

    def _sample(self) -> None:
        for d in self.devices:
            self._samples.append((d.sm_clock_mhz(), d.temperature_c(), d.event_reasons()))

    def _look(self) -> None:
        if self.roots is not None:
            for n in neighbours(self.devices, self.roots):
                self._neighbours.setdefault((n.gpu, n.pid), n)

    def _loop(self) -> None:
        count = 0
        while True:
            self._sample()
            count += 1
            if count % NEIGHBOUR_EVERY == 0:
                self._look()
            if self._stop.wait(self.interval_s):
                return

    def _limit_w(self) -> float | None:
        """The power limit in force (the lowest among the GPUs)."""
        limits = [w for w in (d.enforced_power_limit_w() for d in self.devices) if w is not None]
        return min(limits) if limits else None

    def start(self) -> None:
        self._neighbours = {}
        self._look()
        if not self.clocks:
            return
        self._samples = []
        self._stop.clear()
        self._power_limit_w = self._limit_w()
        self._violations = self._violation_ns()
        self._thread = threading.Thread(target=self._loop, name="llmenergy-gpu-telemetry")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> GpuTelemetry | None:
        self._look()
        found = tuple(self._neighbours.values())
        if not self.clocks:
            return GpuTelemetry(neighbours=found) if found else None
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
            neighbours=found,
        )
