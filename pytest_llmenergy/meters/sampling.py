"""Background sampling and the integration of power samples into joules.

Two kinds of sample exist: instantaneous readings (NVML's instant power), which are
integrated with the trapezoid rule and linearly interpolated at the window's edges,
and interval averages (powermetrics: mean power over the last ``span_s``), which are
piecewise constant and are cut exactly at the edges.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ..errors import MeterError
from .readings import PowerSample

Clock = Callable[[], float]


class PeriodicThread:
    """Calls ``fn`` every ``interval_s`` in a daemon thread until stopped.

    An exception in ``fn`` stops the thread and is re-raised by ``check()``, so a
    reader that dies is reported at the window's close instead of going unnoticed.
    """

    def __init__(self, fn: Callable[[], None], interval_s: float, name: str) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval must be positive, got {interval_s}")
        self._fn = fn
        self._interval_s = interval_s
        self._name = name
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def interval_s(self) -> float:
        """Time between calls: what a sampler built on it can resolve."""
        return self._interval_s

    def start(self) -> None:
        self._stop_event.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def check(self) -> None:
        if self._error is not None:
            raise MeterError(f"{self._name} failed: {self._error}") from self._error

    def _run(self) -> None:
        # Ticks are scheduled on a fixed grid so that slow calls do not drift the rate.
        next_t = time.perf_counter()
        while not self._stop_event.is_set():
            try:
                self._fn()
            except BaseException as exc:  # reported through check()
                self._error = exc
                return
            next_t += self._interval_s
            delay = next_t - time.perf_counter()
            if delay < 0:  # fell behind: skip missed ticks rather than burst
                next_t = time.perf_counter()
                delay = 0.0
            self._stop_event.wait(delay)


class SampleBuffer:
    """Power samples in time order; one thread adds while others read windows out of it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: list[float] = []
        self._samples: list[PowerSample] = []

    def add(self, sample: PowerSample) -> None:
        with self._lock:
            # Samples from different threads can arrive a few microseconds out of order.
            i = bisect.bisect_right(self._times, sample.t)
            self._times.insert(i, sample.t)
            self._samples.insert(i, sample)

    def clear(self) -> None:
        with self._lock:
            self._times.clear()
            self._samples.clear()

    def last_t(self) -> float | None:
        with self._lock:
            return self._times[-1] if self._times else None

    def between(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        """Samples taken within [t0, t1]."""
        with self._lock:
            lo = bisect.bisect_left(self._times, t0)
            hi = bisect.bisect_right(self._times, t1)
            return tuple(self._samples[lo:hi])

    def bracket(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        """Samples in [t0, t1] plus the nearest one on each side, for interpolation."""
        with self._lock:
            lo = max(bisect.bisect_left(self._times, t0) - 1, 0)
            hi = bisect.bisect_right(self._times, t1) + 1
            return tuple(self._samples[lo:hi])

    def covering(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        """Interval samples whose span (t - span_s, t] overlaps (t0, t1)."""
        with self._lock:
            lo = bisect.bisect_right(self._times, t0)
            return tuple(s for s in self._samples[lo:] if s.t - s.span_s < t1)


class PowerSampler:
    """Samples instantaneous power in a thread while any window is open."""

    def __init__(
        self,
        read_power_w: Callable[[], Mapping[str, float]],
        interval_s: float,
        name: str,
        clock: Clock = time.perf_counter,
        read_background_w: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._read_power_w = read_power_w
        # The thread's reader may leave out a device it failed to read (the window's
        # telemetry says so, meters/validity.py); the edges' must read them all.
        self._read_background_w = read_background_w or read_power_w
        self._clock = clock
        self._buffer = SampleBuffer()
        self._thread = PeriodicThread(self._sample_background, interval_s, name)

    @property
    def interval_s(self) -> float:
        """The sampling interval: the meter's resolution for the domains it samples."""
        return self._thread.interval_s

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
        self._buffer.clear()

    def sample_now(self) -> float:
        """Take a sample immediately (used at window edges) and return its time."""
        return self._sample(self._read_power_w)

    def _sample_background(self) -> None:
        self._sample(self._read_background_w)

    def _sample(self, read: Callable[[], Mapping[str, float]]) -> float:
        before = self._clock()
        power = read()
        t = (before + self._clock()) / 2  # a driver call can take a millisecond
        self._buffer.add(PowerSample(t=t, power_w=dict(power)))
        return t

    def between(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        self._thread.check()
        return self._buffer.between(t0, t1)

    def bracket(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        """Samples in [t0, t1] plus the nearest one on each side, for interpolation."""
        self._thread.check()
        return self._buffer.bracket(t0, t1)


def integrate_instant(
    samples: Sequence[PowerSample], t0: float, t1: float, domains: Sequence[str]
) -> dict[str, float]:
    """Trapezoid integral of instantaneous samples over [t0, t1], in joules.

    Power at the edges is interpolated linearly between the neighbouring samples;
    beyond the first or last sample it is held constant.  A sample that missed a domain
    (its read failed) is skipped for that domain, which is bridged as a gap instead.
    """
    out = {d: 0.0 for d in domains}
    if t1 <= t0 or not samples:
        return out
    for d in domains:
        own = [s for s in samples if d in s.power_w]
        if not own:
            continue
        times = [s.t for s in own]
        values = [s.power_w[d] for s in own]
        points = [(t0, _interp(times, values, t0))]
        points += [(t, v) for t, v in zip(times, values) if t0 < t < t1]
        points.append((t1, _interp(times, values, t1)))
        out[d] = sum((tb - ta) * (va + vb) / 2 for (ta, va), (tb, vb) in itertools.pairwise(points))
    return out


def integrate_intervals(
    samples: Sequence[PowerSample], t0: float, t1: float, domains: Sequence[str]
) -> dict[str, float]:
    """Integral over [t0, t1] of interval-average samples (power constant over each span).

    Time that no sample covers contributes nothing; callers make sure the window is
    covered (powermetrics waits for the sample that covers the window's end).
    """
    out = {d: 0.0 for d in domains}
    for s in samples:
        overlap = min(s.t, t1) - max(s.t - s.span_s, t0)
        if overlap > 0:
            for d in domains:
                out[d] += s.power_w[d] * overlap
    return out


def _interp(times: Sequence[float], values: Sequence[float], t: float) -> float:
    i = bisect.bisect_left(times, t)
    if i <= 0:
        return values[0]
    if i >= len(times):
        return values[-1]
    ta, tb = times[i - 1], times[i]
    if tb == ta:
        return values[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (t - ta) / (tb - ta)
