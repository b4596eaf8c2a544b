"""A meter's window and the marks inside it: ``with meter.measure() as m`` opens one,
``mark_phase`` splits it (prefill | decode) wherever the code under test says, and
listeners hear the marks and each generated token (counted work samples decode steps
by them).  Windows nest: the innermost open one is the context's ``current_window``."""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .edges import TickEdges
from .readings import Domain, Measurement, Method, Phase, PowerSample, Reading

if TYPE_CHECKING:
    from .metered import WindowMeter

_T = TypeVar("_T")


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
    """One measurement window; after the ``with`` block it carries the result.

    ``aligned``: its edges wait for the meter's counter to refresh where the meter has a
    coarse one (``Meter.tick_period_s``), so that no edge rounds its energy
    (``meters/edges.py``); the marks inside it read as they are."""

    __slots__ = ("_aligned", "_edges", "_first_phase", "_marks", "_meter", "_result", "_token")

    def __init__(self, meter: WindowMeter, phase: str, aligned: bool = False) -> None:
        self._meter = meter
        self._marks: list[tuple[str, Reading]] = []
        self._first_phase = phase
        self._result: Measurement | None = None
        self._token: contextvars.Token[Window | None] | None = None
        self._aligned = aligned
        self._edges: TickEdges | None = None

    def __enter__(self) -> Window:
        if self._marks:
            raise RuntimeError("a measurement window can be entered only once")
        meter = self._meter
        uses_start_stop = meter._uses_start_stop
        if uses_start_stop:
            meter._acquire()
        try:
            # after _acquire: a meter may choose what it reads as its first window opens
            edges = self._edges = TickEdges.of(meter) if self._aligned else None
            start = edges.open() if edges is not None else meter._read()
            self._marks.append((self._first_phase, start))
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
            self._result = self._built(meter._read())
            return
        try:
            self._result = self._built(meter._read())
        finally:
            meter._release()

    def _built(self, end: Reading) -> Measurement:
        """The result from the marks to ``end``, its totals read on the counter's
        refreshes when the window is aligned (the last phase takes the difference)."""
        edges = self._edges
        aligned = edges.close(self._marks[0][1], end) if edges is not None else None
        return _build(self._meter, self._marks, end, aligned)

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


def _build(
    meter: WindowMeter,
    marks: list[tuple[str, Reading]],
    end: Reading,
    aligned: Mapping[str, float] | None = None,
) -> Measurement:
    """A window's measurement; ``aligned``: the joules of the counters read on their
    refreshes (``meters/edges.py``), which replace the plain edges' in the totals and in
    the last phase (so that the phases still add up to the window)."""
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
    if aligned:
        last = spans[-1][3]
        for name, joules in aligned.items():
            last[name] = last.get(name, 0.0) + joules - by_domain.get(name, 0.0)
        by_domain = {**by_domain, **aligned}
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
