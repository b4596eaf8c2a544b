"""How long a trial's window lasts, and what happens at its edges.

A counter that refreshes every ``R`` seconds reads a window's energy up to one refresh's
worth off at each edge: a 20 ms trial on a 100 ms counter reads as 0 or as 100 ms worth.
pytest-benchmark calibrates iterations per round so that each round outlasts its timer's
precision; the same is done here against the meter's resolution, and against the rule's
minimum measured time (a call of a few milliseconds could not reach it in the trial
limit otherwise).  A trial's window holds
as many back-to-back calls as it takes to last ``R / (WINDOW_ERROR_SHARE x target)``,
where ``target`` is the stopping rule's relative energy CI target (10 % by default): one
refresh's energy is then at most a third of that target (on a 100 ms counter, windows of
3 s: ML.ENERGY finds counter readings stable from a few seconds, Yang et al. from 5 s or
32 iterations).  The figures of such a trial are its window's divided by its calls.  A
meter of microsecond resolution keeps one call a trial.

The edges are clean: queued GPU work is waited for at both edges of every window (Zeus
synchronizes at ``begin_window`` and ``end_window``).  Where the meter's counters can be
waited for (``Meter.tick_period_s``: NVML's, amdsmi's), a window opens and closes on
their refreshes (``meters/edges.py``), so no edge rounds; other coarse meters' windows
open after a random delay shorter than their resolution, so that back-to-back trials of
fixed length never lock step with the counter's refreshes and its rounding stays random
from trial to trial (a bias remains where the power differs across an edge: at rest
before, under load after).
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..figures import FIGURES
from ..meters.readings import Measurement
from ..results import PhaseRecord
from .rule import ControllerSettings

# One refresh of the meter is at most this share of the relative energy CI target.
WINDOW_ERROR_SHARE = 1 / 3
# The energy target assumed when the rule has no relative one (the default rule's).
DEFAULT_ENERGY_TARGET = 0.10
# A bound on the calls of one window (a 10 µs target on a 1 s counter).
MAX_WINDOW_CALLS = 10_000
# A bound on a window's length, whatever the meter (optimum-benchmark's 10 s).
MAX_WINDOW_S = 10.0
# Meters finer than this need no window of several calls, nor a random delay.
FINE_RESOLUTION_S = 1e-4


def window_target_s(resolution_s: float | None, options: ControllerSettings) -> float:
    """How long a trial's window must last for this meter; 0: one call is enough.

    At most ``MAX_WINDOW_S`` (optimum-benchmark's energy window), and short enough that
    the case's minimum trials fit its measured-time budget: a meter as coarse as a 1 s
    power average gets 5 s windows under the default rule, not 30."""
    if resolution_s is None or resolution_s < FINE_RESOLUTION_S:
        return 0.0
    targets = options.targets
    relative = [t.value for t in targets if t.relative and FIGURES[t.metric].energy]
    target = min(relative) if relative else DEFAULT_ENERGY_TARGET
    window_s = min(resolution_s / (WINDOW_ERROR_SHARE * target), MAX_WINDOW_S)
    if options.max_time:
        window_s = min(window_s, options.max_time / options.min_trials)
    return window_s


# The share of the trial limit in which a case of short calls should reach the rule's
# minimum measured time: half, so that its intervals have trials to spare.
MIN_TIME_TRIALS_SHARE = 0.5


def min_time_window_s(options: ControllerSettings) -> float:
    """How long a trial's window must last for the rule's minimum measured time to be
    reached in half the trial limit; 0: no minimum.  A 2 ms function, one call a trial,
    stopped at 25 trials with 0.05 s measured against the 1 s minimum; grouped into
    80 ms windows it reaches it by the 13th (pytest-benchmark likewise calibrates the
    iterations of a round).  At most ``MAX_WINDOW_S``, and short enough for the minimum
    trials to fit the measured-time budget, as a coarse meter's windows."""
    if not options.min_time:
        return 0.0
    trials = max(options.min_trials, math.floor(options.max_trials * MIN_TIME_TRIALS_SHARE))
    window_s = min(options.min_time / trials, MAX_WINDOW_S)
    if options.max_time:  # the minimum trials fit the measured-time budget, as above
        window_s = min(window_s, options.max_time / options.min_trials)
    return window_s


@dataclass(frozen=True)
class WindowPlan:
    """How long a trial's window lasts: calls run back to back until it has lasted
    ``target_s`` (as optimum-benchmark loops its energy window until it has lasted its
    minimum), so no calibration can be off when a call's length moves."""

    target_s: float  # 0: one call a trial

    @property
    def windowed(self) -> bool:
        return self.target_s > 0.0

    def more(self, elapsed_s: float, calls: int) -> bool:
        """Whether the window needs another call after ``calls`` calls in ``elapsed_s``."""
        return calls < MAX_WINDOW_CALLS and elapsed_s < self.target_s


class EdgeDelay:
    """A random wait before a coarse meter's window opens (never inside a window)."""

    def __init__(self, resolution_s: float | None, seed: int | None = None) -> None:
        coarse = resolution_s is not None and resolution_s >= FINE_RESOLUTION_S
        self.max_s = float(resolution_s) if coarse and resolution_s is not None else 0.0
        # its own generator: pytest-randomly reseeds the global one for every test
        self._random = random.Random(seed)

    def wait(self) -> float:
        """Sleep a uniform share of the resolution; the seconds slept."""
        if self.max_s <= 0.0:
            return 0.0
        delay_s = self._random.uniform(0.0, self.max_s)
        time.sleep(delay_s)
        return delay_s


def synchronize_devices() -> None:
    """Wait for the work queued on the CUDA devices of this process, so that none of it
    crosses a window's edge: the devices where it holds a context, and no other (waiting
    on a device it never used would open a context there, about 0.5 GB, in every rank of
    a torchrun job: ``gpu/in_use.py``).  Costs nothing where torch is not imported or CUDA
    was never used (``is_initialized`` starts no context)."""
    if "torch" in sys.modules:  # a program without torch queued nothing through it
        from ..gpu.in_use import synchronize

        synchronize()


def summed_phases(parts: Sequence[Measurement], calls: int) -> dict[str, PhaseRecord]:
    """Each phase's seconds and joules over a window's calls, per call (the calls' own
    windows, nested in the trial's); empty when no call was split into phases."""
    seconds: dict[str, float] = {}
    joules: dict[str, float] = {}
    by_domain: dict[str, dict[str, float]] = {}
    if not parts or any(len(part.phases) < 2 for part in parts):
        return {}  # a call that was not split: no phase stands for the window
    for part in parts:
        for name, phase in part.phases.items():
            seconds[name] = seconds.get(name, 0.0) + phase.seconds
            joules[name] = joules.get(name, 0.0) + phase.joules
            into = by_domain.setdefault(name, {})
            for domain, j in phase.by_domain.items():
                into[domain] = into.get(domain, 0.0) + j
    return {
        name: PhaseRecord(seconds[name] / calls, joules[name] / calls, _per(by_domain[name], calls))
        for name in seconds
    }


def _per(values: Mapping[str, float], calls: int) -> dict[str, float]:
    return {name: v / calls for name, v in values.items()}
