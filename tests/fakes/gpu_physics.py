"""How a fake GPU's power cap and SM clock change the time and power of work on it.

A deliberately simple physical model, so that a test knows the true time-energy
frontier before measuring it:

- dynamic power grows with the cube of the SM clock (frequency x voltage squared);
- compute-bound work (prefill) takes time inversely proportional to the clock;
- memory-bound work (decode) waits on memory mostly: only ``clock_share_memory`` of its
  time scales with the clock, and it draws less dynamic power;
- a power limit makes the GPU run at the highest clock whose power fits under it
  (``SW_POWER_CAP``), so a cap slows compute-bound work more than memory-bound work;
- locked clocks hold the clock (``APPLICATIONS_CLOCKS_SETTING`` when below the maximum);
- with ``Heat``, the temperature follows the power drawn with a lag: it rises toward
  ``ambient + c_per_w x power`` while the GPU works and decays back toward its idle
  level (the same law at idle power) afterwards, with time constant ``tau_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

REASON_NONE = 0x0
REASON_GPU_IDLE = 0x1
REASON_APPLICATIONS_CLOCKS = 0x2
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True)
class Phase:
    """One stretch of work: ``seconds`` it takes at the maximum clock, uncapped."""

    kind: str  # "compute" or "memory"
    seconds: float


@dataclass(frozen=True)
class Physics:
    idle_w: float = 60.0
    static_w: float = 90.0  # drawn while working, whatever the clock
    compute_dynamic_w: float = 310.0  # at the maximum clock: 400 W in all
    memory_base_w: float = 60.0  # memory traffic during memory-bound work
    memory_dynamic_w: float = 150.0  # at the maximum clock: 300 W in all
    clock_share_memory: float = 0.05  # share of memory-bound time that scales with the clock
    thermal_slowdown: float = 0.8  # clock factor while thermally throttled
    speed: float = 1.0  # work done per second at the same clock, against the reference board

    def power_w(self, kind: str, ratio: float) -> float:
        """Power at clock ``ratio`` of the maximum."""
        if kind == "compute":
            return self.static_w + self.compute_dynamic_w * ratio**3
        return self.static_w + self.memory_base_w + self.memory_dynamic_w * ratio**3

    def stretch(self, kind: str, ratio: float) -> float:
        """Time at clock ``ratio``, relative to the time at the maximum clock."""
        if kind == "compute":
            return 1.0 / ratio
        share = self.clock_share_memory
        return (1.0 - share) + share / ratio

    def clock_ratio(
        self, kind: str, limit_w: float, lock_ratio: float | None, min_ratio: float
    ) -> tuple[float, int]:
        """The clock the GPU runs this work at, and the reasons it is held below maximum."""
        ratio = 1.0 if lock_ratio is None else lock_ratio
        reasons = REASON_APPLICATIONS_CLOCKS if lock_ratio is not None and lock_ratio < 1 else 0
        if self.power_w(kind, ratio) > limit_w:
            base = self.power_w(kind, 0.0)
            dynamic = self.power_w(kind, 1.0) - base
            capped = ((max(limit_w - base, 0.0)) / dynamic) ** (1 / 3)
            ratio = max(min(ratio, capped), min_ratio)
            reasons |= REASON_SW_POWER_CAP
        return ratio, reasons

    def run(
        self,
        phases: tuple[Phase, ...],
        limit_w: float,
        lock_ratio: float | None,
        min_ratio: float,
    ) -> tuple[float, float]:
        """True (seconds, joules) of the phases under this setting."""
        seconds = joules = 0.0
        for phase in phases:
            ratio, _ = self.clock_ratio(phase.kind, limit_w, lock_ratio, min_ratio)
            t = phase.seconds * self.stretch(phase.kind, ratio) / self.speed
            seconds += t
            joules += t * self.power_w(phase.kind, ratio)
        return seconds, joules


@dataclass(frozen=True)
class Heat:
    """A first-order thermal model: a GPU drawing P watts for long settles at
    ``ambient_c + c_per_w * P``, and gets there exponentially with ``tau_s``; so its
    temperature at any time follows from its power trace alone, exactly."""

    ambient_c: float = 25.0
    c_per_w: float = 0.1  # °C above ambient per watt, once settled: 400 W -> +40 °C
    tau_s: float = 30.0

    def settled_c(self, watts: float) -> float:
        return self.ambient_c + self.c_per_w * watts

    def temperature_c(self, steps: Sequence[tuple[float, float]], origin: float, t: float) -> float:
        """At ``t``, after the power ``steps`` ((seconds, watts), from ``origin``): the
        GPU had settled at the first step's power before it."""
        temp = self.settled_c(steps[0][1])
        start = origin
        for seconds, watts in steps:
            end = min(start + seconds, t)
            if end <= start:
                break
            target = self.settled_c(watts)
            temp = target + (temp - target) * math.exp(-(end - start) / self.tau_s)
            start += seconds
        return temp

    def cooling_s(self, from_c: float, to_c: float, idle_w: float) -> float:
        """Seconds at idle power from ``from_c`` down to ``to_c`` (inf: never)."""
        floor = self.settled_c(idle_w)
        if to_c <= floor:
            return math.inf
        return max(0.0, self.tau_s * math.log((from_c - floor) / (to_c - floor)))
