"""A trial's prefill | decode split where its marks cannot make it: a window of
prefill-only passes measured right after the trial.

The marks split a trial where the model says its first token came out: the meter is read
there.  A counter refreshed every ``R`` seconds (NVML's: 100 ms) holds at that moment the
energy up to its last refresh, so the mark moves, on average, ``R/2`` of the neighbouring
phase's power into each phase: a 30 ms prefill at 600 W between 300 W decodes read 47 %
low, its missing joules in the decode.  That is a bias, and no number of trials
averages it away.  Where a prefill is shorter than ``MARK_RESOLVED_MULTIPLE x R``
(figures.py), each trial is followed by a window of the case's prefill alone
(``prefill_pass``: one forward pass over the prompt), repeated back to back until the
window lasts ``ALIGNED_PASS_MULTIPLE x R``, its edges on the counter's refreshes
(``meters/edges.py``).  The window's joules per pass are the trial's prefill joules;
the trial's other joules are its decode's.  The phases' seconds stay the marks' (a
clock has no such bias).  Each trial has its own window, so the prefill's interval is
the trials' spread, as every other figure's is.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from ..figures import MARK_RESOLVED_MULTIPLE, PASS_WINDOW_MULTIPLE
from ..meters.base import Meter
from ..results import DECODE, PREFILL, SPLIT_PASSES, PhaseRecord, Trial
from .window import FINE_RESOLUTION_S, synchronize_devices

# A bound on the prefill passes of one window (a 10 µs "prefill" on a 1 s counter).
MAX_PREFILL_PASSES = 10_000
# A window of passes whose edges wait for the counter's refreshes lasts this many
# periods (others ``PASS_WINDOW_MULTIPLE``): no edge rounds, so what is left is the
# passes' own spread, which the trials' interval shows.
ALIGNED_PASS_MULTIPLE = 5.0


def needs_passes(trial: Trial, resolution_s: float | None) -> bool:
    """Whether the trial's marks cannot split it: a coarse meter, and a prefill shorter
    than ``MARK_RESOLVED_MULTIPLE`` times its resolution."""
    prefill = trial.phases.get(PREFILL)
    if prefill is None or DECODE not in trial.phases or len(trial.phases) != 2:
        return False
    if resolution_s is None or resolution_s < FINE_RESOLUTION_S:
        return False
    return prefill.seconds < MARK_RESOLVED_MULTIPLE * resolution_s


def pass_window(
    meter: Meter,
    prefill_pass: Callable[[], Any],
    *,
    index: int,
    input_tokens: int,
    queries: int,
) -> Trial:
    """One window of prefill passes back to back, long enough for the meter, as a trial
    whose figures are per pass (``passes``: how many)."""
    resolution_s = meter.resolution_s or 0.0
    # on the counter's refreshes no edge rounds: half as long is as good
    aligned = meter.tick_period_s is not None
    target_s = (ALIGNED_PASS_MULTIPLE if aligned else PASS_WINDOW_MULTIPLE) * resolution_s
    count = 0
    with meter.measure(aligned=True) as window:
        start_s = time.perf_counter()
        while True:
            prefill_pass()
            count += 1
            if count >= MAX_PREFILL_PASSES or time.perf_counter() - start_s >= target_s:
                break
        synchronize_devices()  # everything the window queued runs inside it
    m = window.measurement
    return Trial(
        index=index,
        seconds=m.seconds / count,
        joules=m.joules / count,
        net_joules=m.net_joules / count,
        joules_by_domain={d: j / count for d, j in m.by_domain.items()},
        net_joules_by_domain={d: j / count for d, j in m.net_by_domain.items()},
        input_tokens=input_tokens,
        output_tokens=0,
        passes=count,
        queries=queries,
    )


def split_by_passes(trial: Trial, passes: Trial) -> Trial:
    """The trial with its prefill's joules those of one pass of ``passes`` (a window
    measured right after it) and its decode's the rest of its own."""
    prefill, decode = trial.phases[PREFILL], trial.phases[DECODE]
    prefill_by = dict(passes.joules_by_domain)
    decode_by = {d: j - prefill_by.get(d, 0.0) for d, j in trial.joules_by_domain.items()}
    if not all(math.isfinite(j) for j in (*prefill_by.values(), *decode_by.values())):
        return trial
    if trial.joules < passes.joules or any(j < 0 for j in decode_by.values()):
        # the passes read more than the whole trial (a decode of next to nothing, and
        # noise): a negative decode is no figure, so the split stays at the mark (its
        # case then marked, never gated) and the window stays with the passes
        return trial
    phases = {
        PREFILL: PhaseRecord(prefill.seconds, passes.joules, prefill_by),
        DECODE: PhaseRecord(decode.seconds, trial.joules - passes.joules, decode_by),
    }
    return dataclasses.replace(trial, phases=phases, split=SPLIT_PASSES)
