"""Which CPUs the two sides of a paired run may use (``llmenergy ab --side-cpus``).

The two sides take turns, so they never need a CPU at the same moment.  Left to the
scheduler, each side's process settles on a CPU of its own for seconds at a time, and
on a virtual machine two CPUs can run at different speeds for just as long (another
tenant on one of them): the head then reads a few percent slower or faster than the
base for as long as their processes stay apart, an offset the pairs of trials cannot
cancel.  Sharing one CPU shrinks that offset (measured: docs/evidence.md), so by
default both sides share one CPU.
"""

from __future__ import annotations

import contextlib
import os
import re

from ..errors import ConfigError

ONE, ALL = "one", "all"
DEFAULT_SIDE_CPUS = ONE


def parse_side_cpus(text: str) -> str:
    """``one``, ``all`` or a CPU list such as ``2`` or ``0-3,6``; checked, kept as text
    (resolved against the CPUs this process may use when the sides start)."""
    value = text.strip().lower()
    if value in (ONE, ALL):
        return value
    _cpu_list(value)  # a bad list says so now
    return value


def side_cpus(spec: str) -> frozenset[int] | None:
    """The CPUs both sides are pinned to; ``None``: not pinned (``all``, or an OS that
    cannot pin a process, where ``one`` is a preference and a CPU list an error)."""
    if spec == ALL:
        return None
    allowed = _allowed()
    if allowed is None:
        if spec == ONE:
            return None
        raise ConfigError(
            f"--side-cpus={spec}: this OS cannot pin a process to CPUs; leave the option "
            "out or use --side-cpus=all"
        )
    if spec == ONE:
        return frozenset({max(allowed)})  # CPU 0 takes most interrupts on many machines
    wanted = frozenset(_cpu_list(spec))
    outside = sorted(wanted - allowed)
    if outside:
        raise ConfigError(
            f"--side-cpus={spec}: CPU(s) {','.join(map(str, outside))} are not among those "
            f"this process may use ({_ranges(allowed)}); pick from those"
        )
    return wanted


def pin(pid: int, cpus: frozenset[int] | None) -> None:
    """Pin a side's process, right after it starts and before it starts threads, which
    inherit its CPUs (torch's intra-op threads: one per CPU it may use)."""
    if cpus is None:
        return
    with contextlib.suppress(ProcessLookupError):  # it died at once: its log says why
        os.sched_setaffinity(pid, cpus)


def cpus_text(cpus: frozenset[int] | None) -> str:
    """What the run log says: ``CPU 1``, ``CPUs 0-3`` or ``the CPUs the OS picks``."""
    if cpus is None:
        return "the CPUs the OS picks"
    return f"CPU {_ranges(cpus)}" if len(cpus) == 1 else f"CPUs {_ranges(cpus)}"


def _allowed() -> frozenset[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None or not hasattr(os, "sched_setaffinity"):
        return None
    return frozenset(getter(0))


def _cpu_list(text: str) -> list[int]:
    found: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*(?:-\s*([0-9]{1,4})\s*)?", part)
        if match is None:
            raise ConfigError(f"expected one, all or a CPU list such as 0-3,6, got {text[:40]!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ConfigError(f"the CPU range {part.strip()!r} runs backwards: write it low-high")
        found.extend(range(low, high + 1))
    return found


def _ranges(cpus: frozenset[int]) -> str:
    ordered = sorted(cpus)
    spans: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], -1]:
        if cpu == prev + 1:
            prev = cpu
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(spans)
