"""How fast this machine runs right now: a fixed reference workload, timed.

A virtual machine's CPU speed drifts between sessions (other tenants, frequency), by
tens of per cent on a shared runner, and a saved baseline was measured at some other
speed.  The same few milliseconds of fixed work, timed at a session's start and end,
tell how much of a difference between two runs the machine itself could explain.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

_LOOP = 100_000  # about 5 ms of CPython on a 2020s core
# A case's reading runs every 20th iteration of the loop, once (about 0.3 ms): the session's
# speed is the median of its cases' readings (compare.session_speeds), so many cheap
# readings serve it, and the harness's cost per trial stays within its budget
# (tests/perf/test_harness_overhead.py).  Read after a generate, the median of 18 such
# readings spread 0.8 % (every 10th: 1.3 %, the longer one catches more disturbances);
# every 40th read 2 % long (the call's own cost, multiplied by the step).
CASE_STEP = 20


def _fixed_work(n: int = _LOOP, step: int = 1) -> int:
    total = 0
    for i in range(0, n, step):
        total += i * i % 7
    return total


def reference_s(
    repeats: int = 9,
    work: Callable[[], object] = _fixed_work,
    clock: Callable[[], float] = time.thread_time,
) -> float:
    """Median CPU seconds of the fixed work (CPU time: a busy machine's waiting is not
    slowness, the busy-machine check is for that).  This thread's alone: the process's
    would add other threads' work, such as a math library's workers still spinning
    after a ``generate`` (a reading right after one read up to twice the time)."""
    times = []
    for _ in range(repeats):
        start = clock()
        work()
        times.append(clock() - start)
    return statistics.median(times)


def case_reference_s(step: int = CASE_STEP, clock: Callable[[], float] = time.thread_time) -> float:
    """One case's reading, in the full loop's seconds: every ``step``-th iteration, timed
    once and multiplied by ``step``.  Strided, not a shorter range, so that it keeps the
    loop's mix of one- and two-digit integers (``i * i`` passes 2**30 at i = 32768) and a
    run read this way compares with one read in full."""
    return step * reference_s(1, work=functools.partial(_fixed_work, step=step), clock=clock)


# How much the reference's time varies by itself between sessions of unchanged code:
# on a shared 2-core VM it read 5.0-5.5 ms or 7.7-8.3 ms at a session's start, at random,
# while the sessions' energy per token did not follow (issue 24's A/A sessions).  Only a
# difference beyond this says the machine itself ran at another speed; below it, a gate
# widened by the reading would be blinded by the reference's own noise.
REFERENCE_NOISE = 0.7


def speed_drift(
    baseline_s: float | None,
    start_s: float | None,
    end_s: float | None,
    noise: float = REFERENCE_NOISE,
) -> float:
    """The largest relative difference in the reference's time beyond its own noise:
    this session against the baseline's, and this session's end against its start (0
    where nothing is known or nothing exceeds the noise)."""
    drifts = [0.0]
    if baseline_s and start_s:
        drifts.append(abs(start_s / baseline_s - 1.0))
    if start_s and end_s:
        drifts.append(abs(end_s / start_s - 1.0))
    return max(0.0, max(drifts) - noise)
