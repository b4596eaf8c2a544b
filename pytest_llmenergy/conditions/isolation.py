"""Who else is on the measured GPUs: other processes, as optimum-benchmark's device
isolation checks them.

A GPU's energy counter counts every process's work on it.  A process outside this
session's own (this process, its children, the servers it measures, and, under
``llmenergy ab`` or torchrun, the launcher's other processes) that the driver lists on a
measured GPU, before or during a trial, disturbs that trial as a busy CPU does: it is
kept, marked, left out of the statistics and repeated.  At session start
``--energy-gpu-isolation`` decides: ``warn`` (the default) says who is there,
``error`` stops the session naming them, ``off`` does not look.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..gpu.device import GpuDevice, GpuDeviceError
from ..probes.process_tree import tree_pids
from ..results import GpuNeighbour

MODES = ("warn", "error", "off")
# Set by the launchers whose other processes belong to the same measurement.
_SHARED_PARENT_ENV = ("LLMENERGY_AB", "TORCHELASTIC_RUN_ID")
# Pids (comma-separated) of a harness above the session whose whole process tree is the
# measurement's own: ``llmenergy proof`` holds a CUDA context while its sessions run.
OWN_ROOTS_ENV = "LLMENERGY_OWN_ROOTS"


def own_roots(attributed_pids: Sequence[int] = ()) -> tuple[int, ...]:
    """The roots of the process trees whose GPU use is the session's own."""
    roots = [os.getpid(), *attributed_pids]
    if any(name in os.environ for name in _SHARED_PARENT_ENV):
        roots.append(os.getppid())
    given = os.environ.get(OWN_ROOTS_ENV, "").split(",")
    roots += [int(pid) for pid in given if pid.strip().isdigit()]
    return tuple(dict.fromkeys(roots))


def neighbours(devices: Sequence[GpuDevice], roots: Sequence[int]) -> tuple[GpuNeighbour, ...]:
    """The processes on these GPUs outside the trees of ``roots``; a GPU whose driver
    cannot list them is skipped (nothing known is nothing reported)."""
    listed: list[tuple[GpuDevice, list]] = []
    for d in devices:
        try:
            listed.append((d, list(d.processes())))
        except GpuDeviceError:
            continue
    if not any(procs for _, procs in listed):
        return ()
    ours = tree_pids(tuple(roots))
    return tuple(
        GpuNeighbour(d.domain, p.pid, p.name)
        for d, procs in listed
        for p in procs
        if p.pid not in ours
    )


def describe(found: Sequence[GpuNeighbour]) -> str:
    return ", ".join(n.describe() for n in found)
