"""How busy the rest of the machine was during a trial.

Other processes change what a trial measures: they take cores (torch's threads then
wait or spin, which an estimate counts as work), caches and memory bandwidth, and a
package meter adds their joules.  A busy machine must be *detected*, not measured, so
each trial records the share of the machine's CPU capacity that processes outside this
process tree used: (machine-wide busy CPU time - this tree's) / (wall time x CPUs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from .process_tree import ProcessTreeCpu, ProcessTrees, machine_busy_cpu_seconds

# /proc/stat counts in ticks of 10 ms per CPU; a difference of two readings can be off
# by about one tick per CPU without anything having happened.
PROC_TICK_S = 0.01
# A share is judged over at least this long (a 15 ms trial's own readings would be all
# rounding), ending at the trial's end: what the machine did around the trial.
MIN_SPAN_S = 0.25


@dataclass(frozen=True)
class CpuActivity:
    """One reading: the clock, the machine's busy CPU seconds and this tree's."""

    t_s: float
    machine_busy_s: float
    tree_s: float


class BackgroundCpu:
    """``share(a, b)``: the rest of the machine's CPU use between two readings, as a
    fraction of the machine's capacity (1.0: every CPU busy with something else)."""

    def __init__(
        self,
        tree: ProcessTreeCpu | ProcessTrees | None = None,
        *,
        logical_cpus: int | None = None,
        machine_busy_s: Callable[[], float] = machine_busy_cpu_seconds,
        clock: Callable[[], float] = time.perf_counter,
        tick_s: float = PROC_TICK_S,
    ) -> None:
        self.tree = tree if tree is not None else ProcessTreeCpu()
        self.logical_cpus = max(1, logical_cpus or psutil.cpu_count() or 1)
        self._machine_busy_s = machine_busy_s
        self._clock = clock
        self.tick_s = tick_s

    def read(self) -> CpuActivity:
        return CpuActivity(self._clock(), self._machine_busy_s(), self.tree.read())

    def share(self, a: CpuActivity, b: CpuActivity) -> float:
        wall_s = b.t_s - a.t_s
        if wall_s <= 0:
            return 0.0
        others_s = (b.machine_busy_s - a.machine_busy_s) - (b.tree_s - a.tree_s)
        others_s -= self.tick_s * self.logical_cpus  # rounding of the tick counters
        return min(1.0, max(0.0, others_s / (wall_s * self.logical_cpus)))

    def share_around(self, earlier: Sequence[CpuActivity], end: CpuActivity) -> float:
        """The share over the latest span of at least ``MIN_SPAN_S`` ending at ``end``,
        starting at one of the ``earlier`` readings (oldest first); the whole history if
        it is shorter."""
        start = earlier[0]
        for reading in earlier:
            if end.t_s - reading.t_s < MIN_SPAN_S:
                break
            start = reading
        return self.share(start, end)
