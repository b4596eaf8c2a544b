"""``auto``: the best meters this machine has, combined.

GPUs come from the first GPU backend that finds its GPUs (NVML, amdsmi, then the other
vendors of the device layer's registry, in its order); the CPU side from the first of RAPL,
pyJoules, powermetrics and the estimate that works.  Every backend not used is listed
with the reason, so the report header says what measured what.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import MeterUnavailable
from ..gpu.device import VENDORS
from .base import Meter
from .meter_settings import MeterSettings
from .readings import Domain, PowerSample, Reading

GPU_ORDER = tuple(v.backend for v in VENDORS)  # the device layer's registry, in order
CPU_ORDER = ("rapl", "pyjoules", "powermetrics", "estimate")


@dataclass(frozen=True)
class BackendStatus:
    """Why a backend is or isn't part of the auto meter."""

    backend: str
    used: bool
    reason: str

    def line(self) -> str:
        state = "used" if self.used else "not used"
        return f"{self.backend}: {state} ({self.reason})"


class CompositeMeter(Meter):
    """Several meters read together; each domain belongs to exactly one of them."""

    def __init__(self, meters: list[Meter], statuses: list[BackendStatus]) -> None:
        super().__init__()
        self.meters = meters
        self.statuses = statuses
        self.backend = "auto(" + "+".join(m.backend for m in meters) + ")"
        self._domains: dict[str, Domain] = {}
        for meter in meters:
            for name, dom in meter.domains.items():
                if name in self._domains:
                    raise ValueError(f"domain {name} is measured by two meters")
                self._domains[name] = dom
        notes = [s.line() for s in statuses]
        for meter in meters:
            notes.extend(meter.notes)
        self.notes = tuple(notes)
        # Only a part with background work needs the start/stop bookkeeping.
        self._uses_start_stop = any(m._uses_start_stop for m in meters)

    @property
    def domains(self) -> Mapping[str, Domain]:
        """Each part's domains now: a GPU meter's follow the GPUs in use (gpu_meter.py)."""
        out: dict[str, Domain] = {}
        for meter in self.meters:
            out.update(meter.domains)
        return out

    @property
    def kind(self) -> str:
        return "+".join(m.kind for m in self.meters)

    def settings(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for meter in self.meters:
            out.update(meter.settings())
        return out

    def identity(self) -> dict[str, str]:
        """Its parts' domains as each part states them (a GPU meter: every GPU it may
        read, whichever the last window chose), in order."""
        parts = [meter.identity().get("domains", "") for meter in self.meters]
        domains = ", ".join(d for d in parts if d)
        return {"meter": self.kind, "domains": domains, **self.settings()}

    @property
    def resolution_s(self) -> float | None:
        """The coarsest part's: a window's total is only as fine as its coarsest domain."""
        parts = [m.resolution_s for m in self.meters]
        known = [r for r in parts if r is not None]
        return max(known) if len(known) == len(parts) else None

    def _read(self) -> Reading:
        states = tuple(m._read() for m in self.meters)
        return Reading(t=time.perf_counter(), state=states)

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        out: dict[str, float] = {}
        for meter, ra, rb in zip(self.meters, a.state, b.state):
            out.update(meter._energy_j(ra, rb))
        return out

    def _start(self) -> None:
        for meter in self.meters:
            meter._acquire()

    def _stop(self) -> None:
        for meter in reversed(self.meters):
            meter._release()

    def _samples(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        merged = [s for m in self.meters for s in m._samples(t0, t1)]
        return tuple(sorted(merged, key=lambda s: s.t))

    def describe(self) -> str:
        return "; ".join(m.describe() for m in self.meters)

    def close(self) -> None:
        for meter in self.meters:
            meter.close()


def create(options: MeterSettings) -> CompositeMeter:
    meters: list[Meter] = []
    statuses: list[BackendStatus] = []
    # both GPU backends would name their GPUs gpu:0...: one vendor per session
    _first_that_works(GPU_ORDER, "GPUs", options, meters, statuses)
    _first_that_works(CPU_ORDER, "CPU", options, meters, statuses)
    if not meters:  # the estimate works everywhere psutil does
        raise MeterUnavailable("auto", "; ".join(s.line() for s in statuses))
    return CompositeMeter(meters, statuses)


def _first_that_works(
    order: tuple[str, ...],
    what: str,
    options: MeterSettings,
    meters: list[Meter],
    statuses: list[BackendStatus],
) -> None:
    """Open the first backend of ``order`` that works and measures nothing already
    measured (pyJoules also reads the GPUs NVML does); every other one gets its reason."""
    from . import resolve_factory

    chosen: Meter | None = None
    for name in order:
        if chosen is not None:
            statuses.append(
                BackendStatus(name, False, f"{what} already measured by {chosen.backend}")
            )
            continue
        try:
            candidate = resolve_factory(name)(options)
        except MeterUnavailable as exc:
            statuses.append(BackendStatus(name, False, exc.reason))
            continue
        overlap = set(candidate.domains) & {d for m in meters for d in m.domains}
        if overlap:
            candidate.close()
            statuses.append(BackendStatus(name, False, f"overlaps {sorted(overlap)}"))
            continue
        chosen = candidate
        meters.append(chosen)
        statuses.append(BackendStatus(name, True, f"{what}: " + ", ".join(chosen.domains)))
