"""The ``estimate`` backend: CPU energy from TDP x utilization, for machines without sensors.

There is no power reading at all: the CPU time of this process and its children
(live or finished, see ``process_tree.py``) is a counter, and each CPU-second is
charged ``TDP / logical CPUs`` joules, i.e. a process tree keeping every
available CPU busy draws the full TDP and an idle one draws nothing.  This is the
CodeCarbon-style model; it ignores memory, GPU, turbo and idle power, so every
joule it gives is marked :attr:`~.base.Method.ESTIMATED`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import MeterUnavailable
from ..probes.process_tree import attributed_note, cpu_reader
from .base import Meter
from .cpu_tdp import TdpLookup, cpu_brand, resolve_tdp
from .meter_settings import MeterSettings
from .readings import PROCESS_DOMAIN, Domain, Method, Reading

DOMAIN = PROCESS_DOMAIN

CpuSecondsSource = Callable[[], float]
Clock = Callable[[], float]


def machine_logical_cpus(psutil_module: Any = None) -> int:
    """Logical CPUs of the whole machine: a chip's TDP is spread over all of its threads.

    Not the affinity mask: a job pinned to 8 of 128 CPUs must not be charged 1/8 of
    the chip's TDP per CPU-second.
    """
    count = psutil_module.cpu_count() if psutil_module is not None else os.cpu_count()
    return max(1, count or 1)


class EstimateMeter(Meter):
    """A counter meter over process CPU time; the CPU-time source and clock are injectable."""

    backend = "estimate"

    def __init__(
        self,
        tdp: TdpLookup,
        logical_cpus: int,
        cpu_seconds: CpuSecondsSource,
        clock: Clock = time.perf_counter,
        brand: str = "",
    ) -> None:
        super().__init__()
        if logical_cpus < 1:
            raise ValueError(f"logical CPUs must be >= 1, got {logical_cpus}")
        self.tdp = tdp
        self.logical_cpus = logical_cpus
        self.brand = brand
        self.watts_per_cpu = tdp.watts / logical_cpus  # joules per CPU-second
        self._cpu_seconds = cpu_seconds
        self._clock = clock
        self._resolution_s = time.get_clock_info("process_time").resolution  # CPU-time tick
        self._domains: Mapping[str, Domain] = MappingProxyType(
            {DOMAIN: Domain(DOMAIN, Method.ESTIMATED)}
        )
        self.notes: list[str] = [
            "estimated, not measured: CPU TDP x the CPU utilization of this process and"
            " its children"
            " (memory, GPU and idle power are not included)",
            f"TDP {tdp.watts:g} W ({tdp.source})",
            f"CPU {brand!r}, {logical_cpus} logical CPUs on the machine"
            f" -> {self.watts_per_cpu:g} J per CPU-second",
        ]

    @property
    def domains(self) -> Mapping[str, Domain]:
        return self._domains

    def _read(self) -> Reading:
        return Reading(self._clock(), self._cpu_seconds())

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        cpu_s = b.state - a.state
        return {DOMAIN: self.watts_per_cpu * cpu_s}

    def settings(self) -> dict[str, str]:
        return {"TDP": f"{self.tdp.watts:g} W"}

    def describe(self) -> str:
        return (
            f"{self.backend}: {DOMAIN} ({Method.ESTIMATED}), TDP {self.tdp.watts:g} W"
            f" [{self.tdp.source}] x process-tree CPU-seconds / {self.logical_cpus} logical CPUs"
        )


def create(options: MeterSettings) -> EstimateMeter:
    """The estimate meter for this process, with the real CPU-time source and clock."""
    try:
        import psutil
    except ImportError as exc:
        raise MeterUnavailable("estimate", "psutil is not installed: pip install psutil") from exc
    logical_cpus = machine_logical_cpus(psutil)
    brand = cpu_brand()
    tdp = resolve_tdp(brand, logical_cpus, options.cpu_tdp_w)
    tree_cpu_s = cpu_reader(options.attributed_pids)
    meter = EstimateMeter(tdp, logical_cpus, tree_cpu_s, time.perf_counter, brand)
    if options.attributed_pids:
        meter.notes.append(attributed_note(options.attributed_pids))
    return meter
