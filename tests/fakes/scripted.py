"""A counter meter that reads a scripted power trace: the truth for window logic tests."""

from __future__ import annotations

import time
from collections.abc import Mapping

from pytest_llmenergy.meters.base import Meter
from pytest_llmenergy.meters.readings import Domain, Method, Reading

from .trace import PowerTrace


class TraceMeter(Meter):
    """Each domain's counter is the exact integral of its trace up to the reading."""

    backend = "trace"

    def __init__(self, traces: Mapping[str, PowerTrace], counted: Mapping[str, bool] | None = None):
        super().__init__()
        self.traces = dict(traces)
        self._domains = {
            name: Domain(name, Method.COUNTER, (counted or {}).get(name, True)) for name in traces
        }
        self.reads = 0

    @property
    def domains(self) -> Mapping[str, Domain]:
        return self._domains

    def _read(self) -> Reading:
        self.reads += 1
        t = time.perf_counter()
        return Reading(t=t, state={n: tr.energy_until(t) for n, tr in self.traces.items()})

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        return {n: b.state[n] - a.state[n] for n in self.traces}
