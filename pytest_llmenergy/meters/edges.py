"""A window's edges put on its counter's updates ("ticks"), so that a coarse counter
reads a window's energy without the rounding of its edges.

An energy counter refreshed every ``R`` seconds (NVML's, about 100 ms) holds, between two
refreshes, the energy up to the last one.  A window read at arbitrary moments is off by
what the GPU drew since the last refresh at each edge: zero on average only where the
power is the same on both sides of both edges.  A trial's window opens after an idle
pause and closes under load, so the error is a bias, about
``-(1 - idle/load power) x R / (2 x window)`` of its energy (-1.3 % on 3 s windows).

Here the edges wait for the counter instead:

- **open**: poll until every counter has refreshed; the window starts then, so the
  counter's last value is the energy up to the window's start (give or take one poll);
- **close**: the work is done at ``t1``; poll until every counter has refreshed twice.
  The first refresh ``b`` after ``t1`` holds the energy up to ``b``, which is the
  window's plus the tail ``t1 .. b`` of the GPU at rest; the second refresh ``c`` tells
  the power of that rest (``(E(c) - E(b)) / (c - b)``), which takes the tail back out.

Where several counters refresh at different moments, each gets its own edges: a counter
that refreshed before the window opened had the GPU at rest since, which the same
power of rest takes back out.  The cost is the waits: about ``2 R`` a window (no random
edge delay is needed any more).  A counter that does not refresh within
``EDGE_WAIT_PERIODS`` periods leaves the window's edges as they were (plain readings).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .readings import Method, Reading

if TYPE_CHECKING:
    from .metered import WindowMeter

# Give up waiting for a refresh after this many periods (a counter that stopped).
EDGE_WAIT_PERIODS = 3.0
# Between two polls: short against any period worth aligning to (100 ms on NVML).
EDGE_POLL_S = 0.0005


def _poll_ticks(
    meter: WindowMeter, names: Sequence[str], count: int, period_s: float
) -> tuple[dict[str, list[Reading]], Reading] | None:
    """Read until each counter in ``names`` has refreshed ``count`` times: for each, the
    first reading after each of its refreshes; and the last reading.  None: a counter
    did not refresh in time."""
    deadline = time.perf_counter() + EDGE_WAIT_PERIODS * period_s * count
    prev = meter._read()
    seen: dict[str, list[Reading]] = {name: [] for name in names}
    poll_s = min(EDGE_POLL_S, period_s / 100)
    while any(len(found) < count for found in seen.values()):
        if time.perf_counter() > deadline:
            return None
        time.sleep(poll_s)
        now = meter._read()
        moved = meter._energy_j(prev, now)
        for name, found in seen.items():
            if len(found) < count and moved.get(name, 0.0) != 0.0:
                found.append(now)
        prev = now
    return seen, prev


class TickEdges:
    """The edges of one window, each on its counters' refreshes (see the module)."""

    def __init__(self, meter: WindowMeter, period_s: float, names: Sequence[str]) -> None:
        self._meter = meter
        self._period_s = period_s
        self._names = tuple(names)
        self._opened: dict[str, Reading] = {}  # each counter's refresh at the open

    @classmethod
    def of(cls, meter: WindowMeter) -> TickEdges | None:
        """The edges of a window of ``meter`` opening now, on the counters it reads now;
        None where it has no coarse counter to wait for (``Meter.tick_period_s``)."""
        period_s = meter.tick_period_s
        if period_s is None:
            return None
        names = [n for n, d in meter.domains.items() if d.method == Method.COUNTER]
        return cls(meter, period_s, names) if names else None

    def open(self) -> Reading:
        """Wait for every counter's next refresh; the reading the window starts with."""
        polled = _poll_ticks(self._meter, self._names, 1, self._period_s)
        if polled is None:
            return self._meter._read()  # a counter that does not move: plain edges
        seen, last = polled
        self._opened = {name: found[0] for name, found in seen.items()}
        return last

    def close(self, start: Reading, end: Reading) -> dict[str, float] | None:
        """The window's joules from ``start`` to ``end`` (the work's end) of the aligned
        counters, read on their refreshes; None: the edges stay plain."""
        if not self._opened:
            return None
        polled = _poll_ticks(self._meter, self._names, 2, self._period_s)
        if polled is None:
            return None
        seen, _ = polled
        joules_of = self._meter._energy_j
        out: dict[str, float] = {}
        for name in self._names:
            opened, (first, second) = self._opened[name], seen[name]
            rest_w = joules_of(first, second)[name] / max(second.t - first.t, 1e-9)
            counted = joules_of(opened, first)[name]
            before = max(start.t - opened.t, 0.0)  # at rest, before the work began
            after = max(first.t - end.t, 0.0)  # at rest, after it ended
            out[name] = counted - rest_w * (before + after)
        return out
