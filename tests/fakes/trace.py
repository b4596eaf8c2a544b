"""A scripted power trace whose true energy over any interval is known exactly."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class PowerTrace:
    """Piecewise-constant power: ``steps`` of (duration_s, watts), the last held forever.

    Times passed to the methods are on the meter clock (``time.perf_counter``);
    the trace starts at ``origin`` (by default, when the trace is created).
    """

    steps: Sequence[tuple[float, float]]
    origin: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a trace needs at least one step")
        self._edges: list[float] = []
        t = 0.0
        for duration, _ in self.steps:
            t += duration
            self._edges.append(t)

    def power_at(self, t: float) -> float:
        rel = t - self.origin
        for edge, (_, watts) in zip(self._edges, self.steps):
            if rel < edge:
                return watts
        return self.steps[-1][1]

    def energy_until(self, t: float) -> float:
        """Joules from the origin to ``t`` (0 before the origin)."""
        rel = t - self.origin
        if rel <= 0:
            return 0.0
        joules, start = 0.0, 0.0
        for edge, (_, watts) in zip(self._edges, self.steps):
            if rel <= edge:
                return joules + watts * (rel - start)
            joules += watts * (edge - start)
            start = edge
        return joules + self.steps[-1][1] * (rel - start)

    def energy_between(self, t0: float, t1: float) -> float:
        return self.energy_until(t1) - self.energy_until(t0)

    def mean_power(self, t0: float, t1: float) -> float:
        return self.energy_between(t0, t1) / (t1 - t0) if t1 > t0 else self.power_at(t1)

    def max_power(self) -> float:
        return max(w for _, w in self.steps)


class SwitchTrace:
    """Power that changes when the code under test says so (``set``), e.g. at the first
    output token; the energy of any interval is still known exactly."""

    def __init__(self, watts: float, origin: float | None = None) -> None:
        self._times = [time.perf_counter() if origin is None else origin]
        self._watts = [watts]

    @property
    def origin(self) -> float:
        return self._times[0]

    @property
    def steps(self) -> list[tuple[float, float]]:
        """(duration_s, watts) of each switch so far, the last held until now."""
        ends = [*self._times[1:], float("inf")]
        return [(e - s, w) for s, e, w in zip(self._times, ends, self._watts)]

    def set(self, watts: float, t: float | None = None) -> float:
        t = time.perf_counter() if t is None else t
        if t < self._times[-1]:
            raise ValueError("a switch cannot go back in time")
        self._times.append(t)
        self._watts.append(watts)
        return t

    def power_at(self, t: float) -> float:
        watts = self._watts[0]
        for start, w in zip(self._times, self._watts):
            if t < start:
                break
            watts = w
        return watts

    def energy_until(self, t: float) -> float:
        joules = 0.0
        ends = [*self._times[1:], float("inf")]
        for start, end, w in zip(self._times, ends, self._watts):
            if t <= start:
                break
            joules += w * (min(t, end) - start)
        return joules

    def energy_between(self, t0: float, t1: float) -> float:
        return self.energy_until(t1) - self.energy_until(t0)

    def mean_power(self, t0: float, t1: float) -> float:
        return self.energy_between(t0, t1) / (t1 - t0) if t1 > t0 else self.power_at(t1)

    def max_power(self) -> float:
        return max(self._watts)
