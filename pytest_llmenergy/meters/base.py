"""The one small interface every energy source implements.

A meter takes *readings* at the edges of a window (and at marks inside it); the
energy between two readings is its own business: counter meters subtract, sampling
meters integrate the power samples taken in between.  Windows therefore nest
freely and can be split into phases at marks (prefill | decode).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any, TypeVar

_T = TypeVar("_T")


class Method(str, Enum):
    """How a domain's joules came about; reports mark anything not measured."""

    COUNTER = "counter"  # a hardware energy counter read at the edges
    SAMPLED = "sampled"  # power samples integrated over time
    ESTIMATED = "estimated"  # a model (TDP x utilization), not a sensor
    # a measured total shared out by CPU time (RAPL package x this tree's share)
    ATTRIBUTED = "attributed"

    def __str__(self) -> str:
        return self.value


# The domain of energy that belongs to this process tree alone (estimated, attributed,
# or sampled per process), whatever the meter.
PROCESS_DOMAIN = "cpu:process"


@dataclass(frozen=True)
class Domain:
    """One place energy is measured, e.g. ``gpu:0`` or ``cpu:package-0``.

    ``counted`` is False for domains contained in another one (RAPL core is part of
    package), so that totals count every joule once.
    """

    name: str
    method: Method
    counted: bool = True


@dataclass(frozen=True)
class PowerSample:
    """Power per domain at time ``t`` (meter clock: ``time.perf_counter``).

    ``span_s`` is 0 for an instantaneous reading and the averaging interval for a
    reading that is the mean power over ``(t - span_s, t]`` (powermetrics).
    """

    t: float
    power_w: Mapping[str, float]
    span_s: float = 0.0


@dataclass(frozen=True)
class Reading:
    """What a meter saw at one instant; ``state`` is private to the meter."""

    t: float
    state: Any = None


@dataclass(frozen=True)
class EnergySpan:
    """Energy of a stretch of time, gross and net of the idle baseline."""

    seconds: float
    by_domain: Mapping[str, float]
    domains: Mapping[str, Domain]
    idle_power_w: Mapping[str, float] = field(default_factory=dict)

    @property
    def joules(self) -> float:
        """Gross total: every counted domain once."""
        return sum(j for name, j in self.by_domain.items() if self.domains[name].counted)

    @property
    def net_by_domain(self) -> dict[str, float]:
        """Gross minus idle power x duration (not clipped at 0, so noise stays unbiased)."""
        return {
            name: j - self.idle_power_w.get(name, 0.0) * self.seconds
            for name, j in self.by_domain.items()
        }

    @property
    def net_joules(self) -> float:
        net = self.net_by_domain
        return sum(j for name, j in net.items() if self.domains[name].counted)

    @property
    def methods(self) -> dict[str, Method]:
        return {name: d.method for name, d in self.domains.items()}

    @property
    def estimated(self) -> bool:
        """True when any counted joule is an estimate rather than a measurement."""
        return any(d.method is Method.ESTIMATED for d in self.domains.values() if d.counted)

    @property
    def power_w(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Phase(EnergySpan):
    """The part of a window between two marks."""

    name: str = ""
    offset_s: float = 0.0  # start of the phase, seconds after the window opened


@dataclass(frozen=True)
class Measurement(EnergySpan):
    """The result of one closed window."""

    phases: Mapping[str, Phase] = field(default_factory=dict)
    samples: tuple[PowerSample, ...] = ()
    t_start: float = 0.0  # meter clock (time.perf_counter) at open
    t_end: float = 0.0
    backend: str = ""


class Meter(ABC):
    """A source of energy readings.

    Subclasses implement ``domains``, ``_read`` and ``_energy_j``; sampling meters
    also ``_start``/``_stop`` (called when the first window opens and the last one
    closes) and ``_samples``.
    """

    backend: str = "?"
    # Lines for the report header: where each domain's figures come from, and caveats.
    notes: Sequence[str] = ()

    def __init__(self) -> None:
        self.idle_power_w: dict[str, float] = {}
        self._active = 0
        self._active_lock = threading.Lock()
        # Set by subclasses that know it once they are open; see ``resolution_s``.
        self._resolution_s: float | None = None
        # Whether windows must call _start/_stop: a meter that overrides neither has no
        # background work, and its windows skip the lock that orders them (a subclass
        # that overrides them may still clear this when, once open, they do nothing).
        self._uses_start_stop = (
            type(self)._start is not Meter._start or type(self)._stop is not Meter._stop
        )

    # -- what subclasses provide -------------------------------------------------
    @property
    @abstractmethod
    def domains(self) -> Mapping[str, Domain]:
        """Every domain this meter reports, in a stable order."""

    @abstractmethod
    def _read(self) -> Reading:
        """Take a reading now (counter values, or a forced power sample)."""

    @abstractmethod
    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        """Joules per domain between two readings of this meter."""

    def _start(self) -> None:
        """First window opened: start background sampling if the meter needs it."""

    def _stop(self) -> None:
        """Last window closed: stop background sampling."""

    def _samples(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        """Power samples taken within [t0, t1]; counter meters have none."""
        return ()

    @property
    def kind(self) -> str:
        """The meter that actually measures, whatever name chose it: ``auto`` resolving to
        the estimate is the estimate.  Runs of different kinds are not comparable."""
        return self.backend

    def settings(self) -> dict[str, str]:
        """Settings that change the figures themselves (the estimate's TDP), by label."""
        return {}

    def identity(self) -> dict[str, str]:
        """What two runs must share for their energies to be compared."""
        counted = [name for name, d in self.domains.items() if d.counted]
        return {"meter": self.kind, "domains": ", ".join(counted), **self.settings()}

    @property
    def resolution_s(self) -> float | None:
        """The shortest stretch of time whose energy this meter can tell apart.

        A counter's update period, a sampler's interval; None when unknown.  A window
        much shorter than this sees the energy of whole update periods or none at all.
        """
        return self._resolution_s

    def describe(self) -> str:
        """One line for the report header: what measures which domain, and how."""
        doms = ", ".join(f"{d.name} ({d.method})" for d in self.domains.values())
        resolution_s = self.resolution_s
        if resolution_s is None:
            return f"{self.backend}: {doms}"
        return f"{self.backend}: {doms}; resolution {duration_text(resolution_s)}"

    def close(self) -> None:
        """Release the library or device handles."""

    # -- public API --------------------------------------------------------------
    def measure(self, phase: str = "main") -> Window:
        """A window to use as ``with meter.measure() as m: ...``.

        ``phase`` names the stretch up to the first ``m.mark(...)``.
        """
        return Window(self, phase)

    def measure_idle(self, seconds: float) -> dict[str, float]:
        """Measure idle power per domain and keep it as this meter's baseline."""
        with self.measure() as window:
            time.sleep(seconds)
        m = window.measurement
        self.idle_power_w = {name: j / m.seconds for name, j in m.by_domain.items()}
        return dict(self.idle_power_w)

    def _acquire(self) -> None:
        if not self._uses_start_stop:
            return
        with self._active_lock:
            self._active += 1
            if self._active == 1:
                try:
                    self._start()
                except BaseException:
                    self._active -= 1  # the next window must try to start again
                    raise

    def _release(self) -> None:
        if not self._uses_start_stop:
            return
        with self._active_lock:
            self._active -= 1
            if self._active == 0:
                self._stop()

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def duration_text(seconds: float) -> str:
    """A short duration for people: ``100 ms``, ``1 ms``, ``15.6 ms``, ``1 us``, ``2 s``."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


class MeasuredShortcuts:
    """``m.seconds``, ``m.joules``...: what ``with meter.measure() as m`` bound reads as
    its measurement, for every kind of window (local, or spanning the ranks of a job)."""

    __slots__ = ()

    @property
    def measurement(self) -> Measurement:  # pragma: no cover - each window has its own
        raise NotImplementedError

    @property
    def seconds(self) -> float:
        return self.measurement.seconds

    @property
    def joules(self) -> float:
        return self.measurement.joules

    @property
    def by_domain(self) -> Mapping[str, float]:
        return self.measurement.by_domain

    @property
    def net_joules(self) -> float:
        return self.measurement.net_joules

    @property
    def methods(self) -> dict[str, Method]:
        return self.measurement.methods

    @property
    def phases(self) -> Mapping[str, Phase]:
        return self.measurement.phases

    @property
    def samples(self) -> tuple[PowerSample, ...]:
        return self.measurement.samples


class Window(MeasuredShortcuts):
    """One measurement window; after the ``with`` block it carries the result."""

    __slots__ = ("_first_phase", "_marks", "_meter", "_result", "_token")  # cheaper per window

    def __init__(self, meter: Meter, phase: str) -> None:
        self._meter = meter
        self._marks: list[tuple[str, Reading]] = []
        self._first_phase = phase
        self._result: Measurement | None = None
        self._token: contextvars.Token[Window | None] | None = None

    def __enter__(self) -> Window:
        if self._marks:
            raise RuntimeError("a measurement window can be entered only once")
        meter = self._meter
        uses_start_stop = meter._uses_start_stop
        if uses_start_stop:
            meter._acquire()
        try:
            self._marks.append((self._first_phase, meter._read()))
        except BaseException:
            if uses_start_stop:
                meter._release()
            raise
        self._token = _innermost.set(self)
        return self

    def mark(self, phase: str, *, ending: str | None = None) -> None:
        """End the current phase here and start one called ``phase``.

        ``ending`` renames the phase that ends here, for code that knows what it was
        (``mark("decode", ending="prefill")``) while the window's opener did not.
        """
        if not self._marks or self._result is not None:
            raise RuntimeError("mark() works only inside the with block")
        names = [name for name, _ in self._marks]
        if ending is not None and ending != names[-1]:
            if ending in names:
                raise ValueError(f"phase {ending!r} was already marked in this window")
            self._marks[-1] = (ending, self._marks[-1][1])
            names[-1] = ending
        if phase in names:
            raise ValueError(f"phase {phase!r} was already marked in this window")
        self._marks.append((phase, self._meter._read()))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        meter = self._meter
        if self._token is not None:
            _innermost.reset(self._token)
            self._token = None
        if not meter._uses_start_stop:
            self._result = _build(meter, self._marks, meter._read())
            return
        try:
            end = meter._read()
            self._result = _build(meter, self._marks, end)
        finally:
            meter._release()

    @property
    def measurement(self) -> Measurement:
        if self._result is None:
            raise RuntimeError("the window is still open: read the result after the with block")
        return self._result


_innermost: contextvars.ContextVar[Window | None] = contextvars.ContextVar(
    "llmenergy_innermost_window", default=None
)


def current_window() -> Window | None:
    """The innermost open window of this thread/context, for code that marks it from
    other threads (a burst's requests each run in their own)."""
    return _innermost.get()


def mark_phase(phase: str, *, ending: str | None = None) -> bool:
    """Mark the innermost open window of this thread/context, if there is one.

    Lets code that cannot see the window (a model's generate loop) split it at the
    moment it knows about, e.g. the first output token.  Returns whether a window
    was marked; outside any window it marks nothing.  Every ``phase_listener`` of this
    context hears the mark, window or not.
    """
    for listener in _listeners.get():
        listener(phase)
    window = _innermost.get()
    if window is None:
        return False
    window.mark(phase, ending=ending)
    return True


# Who else hears the marks of this context: work counted outside any window
# (predict.work_count) learns from the same mark where a generation's prefill ends.
_listeners: contextvars.ContextVar[tuple[Callable[[str], None], ...]] = contextvars.ContextVar(
    "llmenergy_phase_listeners", default=()
)


@contextlib.contextmanager
def phase_listener(callback: Callable[[str], None]) -> Iterator[None]:
    """Call ``callback(phase)`` at every ``mark_phase`` in this context, window or not."""
    token = _listeners.set((*_listeners.get(), callback))
    try:
        yield
    finally:
        _listeners.reset(token)


# Who hears each generated token: counted work samples a generation's decode steps
# (predict.work_count) and needs to know where one step ends and the next begins.
_token_listeners: contextvars.ContextVar[tuple[Callable[[int, int], None], ...]] = (
    contextvars.ContextVar("llmenergy_token_listeners", default=())
)


def mark_token(index: int, total: int) -> None:
    """A generation's streamer has just emitted its ``index``-th token of ``total``
    (0: the prompt, before the first forward pass).  Costs a lookup when nobody listens."""
    for listener in _token_listeners.get():
        listener(index, total)


@contextlib.contextmanager
def token_listener(callback: Callable[[int, int], None]) -> Iterator[None]:
    """Call ``callback(index, total)`` at every ``mark_token`` in this context."""
    token = _token_listeners.set((*_token_listeners.get(), callback))
    try:
        yield
    finally:
        _token_listeners.reset(token)


_object_new = object.__new__
_object_setattr = object.__setattr__


def _frozen(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` made from every one of its fields.

    A window's close builds a measurement (and a phase per mark, when read); the frozen
    ``__init__`` sets each field through ``object.__setattr__``, which costs more than
    the counter reads themselves.  ``fields`` must name them all (a test checks it).
    """
    obj = _object_new(cls)
    _object_setattr(obj, "__dict__", fields)
    return obj


class _Phases(Mapping[str, Phase]):
    """A window's phases, made into :class:`Phase` objects the first time one is read.

    Their energies are computed when the window closes (a sampling meter forgets its
    samples soon after); only the objects wait.  Most windows have a single phase whose
    figures are the window's own and that no one reads: building it would cost as much
    as a counter read.
    """

    __slots__ = ("_built", "_domains", "_idle", "_spans", "_start_t")

    def __init__(
        self,
        spans: list[tuple[str, float, float, dict[str, float]]],
        domains: dict[str, Domain],
        idle: dict[str, float],
        start_t: float,
    ) -> None:
        self._spans = spans  # (name, t0, t1, joules by domain), in time order
        self._domains = domains
        self._idle = idle
        self._start_t = start_t
        self._built: dict[str, Phase] | None = None

    def _phases(self) -> dict[str, Phase]:
        built = self._built
        if built is None:
            domains, idle, start_t = self._domains, self._idle, self._start_t
            built = {
                name: _frozen(
                    Phase,
                    {
                        "seconds": t1 - t0,
                        "by_domain": by_domain,
                        "domains": domains,
                        "idle_power_w": idle,
                        "name": name,
                        "offset_s": t0 - start_t,
                    },
                )
                for name, t0, t1, by_domain in self._spans
            }
            self._built = built
        return built

    def __getitem__(self, name: str) -> Phase:
        return self._phases()[name]

    def __iter__(self) -> Iterator[str]:
        return (span[0] for span in self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def __contains__(self, name: object) -> bool:
        return any(span[0] == name for span in self._spans)

    def __repr__(self) -> str:
        return repr(self._phases())


def _build(meter: Meter, marks: list[tuple[str, Reading]], end: Reading) -> Measurement:
    domains = dict(meter.domains)
    idle = dict(meter.idle_power_w)
    start = marks[0][1]
    energy_j = meter._energy_j
    spans: list[tuple[str, float, float, dict[str, float]]]
    if len(marks) == 1:  # no mark: one phase, the whole window
        by_domain = energy_j(start, end)
        spans = [(marks[0][0], start.t, end.t, dict(by_domain))]
    else:
        edges = [*marks, ("", end)]
        spans = [
            (name, a.t, b.t, energy_j(a, b)) for (name, a), (_, b) in itertools.pairwise(edges)
        ]
        by_domain = {name: sum(span[3][name] for span in spans) for name in domains}
    return _frozen(
        Measurement,
        {
            "seconds": end.t - start.t,
            "by_domain": by_domain,
            "domains": domains,
            "idle_power_w": idle,
            "phases": _Phases(spans, domains, idle, start.t),
            "samples": meter._samples(start.t, end.t),
            "t_start": start.t,
            "t_end": end.t,
            "backend": meter.backend,
        },
    )
