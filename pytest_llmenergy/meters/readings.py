"""What a meter reads: a reading at an edge, the energy between two (a span), its phases,
and the domains and methods behind each figure.  Plain data, shared by every meter and
by what reads their results."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Method(str, Enum):
    """How a domain's joules came about; reports mark anything not measured."""

    COUNTER = "counter"  # a hardware energy counter read at the edges
    SAMPLED = "sampled"  # power samples integrated over time
    ESTIMATED = "estimated"  # a model (TDP x utilization), not a sensor
    # a measured total shared out by CPU time (RAPL package x this tree's share)
    ATTRIBUTED = "attributed"

    def __str__(self) -> str:
        return self.value


# The domain of energy that belongs to this process tree alone (estimated, attributed,
# or sampled per process), whatever the meter.
PROCESS_DOMAIN = "cpu:process"


@dataclass(frozen=True)
class Domain:
    """One place energy is measured, e.g. ``gpu:0`` or ``cpu:package-0``.

    ``counted`` is False for domains contained in another one (RAPL core is part of
    package), so that totals count every joule once.
    """

    name: str
    method: Method
    counted: bool = True


@dataclass(frozen=True)
class PowerSample:
    """Power per domain at time ``t`` (meter clock: ``time.perf_counter``).

    ``span_s`` is 0 for an instantaneous reading and the averaging interval for a
    reading that is the mean power over ``(t - span_s, t]`` (powermetrics).
    """

    t: float
    power_w: Mapping[str, float]
    span_s: float = 0.0


@dataclass(frozen=True)
class Reading:
    """What a meter saw at one instant; ``state`` is private to the meter."""

    t: float
    state: Any = None


@dataclass(frozen=True)
class EnergySpan:
    """Energy of a stretch of time, gross and net of the idle baseline."""

    seconds: float
    by_domain: Mapping[str, float]
    domains: Mapping[str, Domain]
    idle_power_w: Mapping[str, float] = field(default_factory=dict)

    @property
    def joules(self) -> float:
        """Gross total: every counted domain once."""
        return sum(j for name, j in self.by_domain.items() if self.domains[name].counted)

    @property
    def net_by_domain(self) -> dict[str, float]:
        """Gross minus idle power x duration (not clipped at 0, so noise stays unbiased)."""
        return {
            name: j - self.idle_power_w.get(name, 0.0) * self.seconds
            for name, j in self.by_domain.items()
        }

    @property
    def net_joules(self) -> float:
        net = self.net_by_domain
        return sum(j for name, j in net.items() if self.domains[name].counted)

    @property
    def methods(self) -> dict[str, Method]:
        return {name: d.method for name, d in self.domains.items()}

    @property
    def estimated(self) -> bool:
        """True when any counted joule is an estimate rather than a measurement."""
        return any(d.method is Method.ESTIMATED for d in self.domains.values() if d.counted)

    @property
    def power_w(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Phase(EnergySpan):
    """The part of a window between two marks."""

    name: str = ""
    offset_s: float = 0.0  # start of the phase, seconds after the window opened


@dataclass(frozen=True)
class Measurement(EnergySpan):
    """The result of one closed window."""

    phases: Mapping[str, Phase] = field(default_factory=dict)
    samples: tuple[PowerSample, ...] = ()
    t_start: float = 0.0  # meter clock (time.perf_counter) at open
    t_end: float = 0.0
    backend: str = ""


def duration_text(seconds: float) -> str:
    """A short duration for people: ``100 ms``, ``1 ms``, ``15.6 ms``, ``1 us``, ``2 s``."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
