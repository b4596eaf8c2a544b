"""What the GPU meters (NVML, amdsmi) share: energy counters read at a window's edges,
power sampled in a thread for the GPUs without a usable counter, and each counter's
update period, timed when the meter opens (a window shorter than the period sees a
whole period's energy or none, so the period is what the meter resolves).

A vendor's meter subclasses ``GpuMeter``: it opens its library, describes each GPU it
measures, reads its counters in ``_read`` and turns two readings into joules in
``_counter_energy_j``; the choice of GPUs (``--energy-gpus``), a counter's period in its
GPU's note, the domains, notes and resolution the descriptions make, the sampler, the
merging of sampled and counted GPUs, the window bookkeeping and closing live here.

Which GPUs a window reads.  A GPU that runs none of the session's work still draws its
idle power (60-100 W on a datacenter board), so a meter that read every GPU would put
seven idle GPUs into the J/token of a model on one GPU of eight.  By default the meter
opens every visible GPU (each described and its counter timed, through the vendor's
library: no CUDA context) and each window reads the GPUs **in use** as it opens:

1. the GPUs a model loaded by this package is placed on (``gpu/in_use.py``: the GPUs of
   its parameters, held while it lives);
2. where nothing is placed: the GPUs where this session's processes hold a GPU context,
   as torch in this process and the driver (for every process of the session's trees: a
   serving engine, a child) list them;
3. where none is in use (before the first model loads, a test that runs nothing on a
   GPU): every GPU opened, and the meter says so, never zero GPUs in silence.

A window holds its GPUs from its opening to its closing (windows nest: the outermost one
chooses), and the line ``news`` returns names them whenever they change.
``--energy-gpus=all`` reads every visible GPU and ``--energy-gpus=0,1`` those, as before;
either warns, in the same line, of a GPU read that runs none of the session's work.
"""

from __future__ import annotations

import itertools
import os
import statistics
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any, Protocol, TypeVar

from ..errors import ConfigError
from ..gpu import in_use
from ..gpu.device import GpuDevice, GpuDeviceError
from ..gpu.device import one_line as one_line  # the GPU meters' messages
from ..probes.process_tree import tree_pids
from .base import Meter
from .meter_settings import MeterSettings
from .readings import Domain, Method, PowerSample, Reading, duration_text
from .sampling import PowerSampler, integrate_instant

# Timing the counters' update period at open: every counter GPU is polled in turn in one
# tight loop, which stops once each has shown this many updates, or after the cap (so
# opening stays well under a second even with a 100 ms counter on every GPU; long enough
# that a 100 ms counter shows four updates, so one poll delayed by a busy machine cannot
# make the median interval)
PERIOD_PROBE_MAX_S = 0.5
PERIOD_PROBE_INTERVALS = 3

# How a meter chooses the GPUs its windows read (see the module's docstring).
LISTED, EVERY, IN_USE = "listed", "every", "in use"
RULE_NOTE = (
    "GPUs read: the ones in use, chosen as each window opens (a model's, else those this "
    "session's processes hold a context on, else every visible one; --energy-gpus=all: "
    "every visible one)"
)
NONE_IN_USE = (
    "no GPU in use yet (no model placed on one, no GPU context in this session), so every "
    "visible GPU"
)


@dataclass(frozen=True)
class GpuChoice:
    """The GPUs a window reads (domains, in the meter's order), why, and the ones of them
    known to run none of the session's work (``idle``: read all the same, as asked)."""

    names: tuple[str, ...]
    why: str
    idle: tuple[str, ...] = ()


class MeasuredGpu(Protocol):
    """What a vendor's description of one measured GPU (a frozen dataclass) gives the
    bookkeeping shared here."""

    @property
    def domain(self) -> str: ...
    @property
    def method(self) -> Method: ...
    @property
    def note(self) -> str: ...
    @property
    def resolution_s(self) -> float | None: ...


GpuT = TypeVar("GpuT", bound=MeasuredGpu)


def unavailable(exc: GpuDeviceError, fallback: str) -> str:
    """Why a GPU meter cannot open, from the device layer's error: its words, then
    ``fallback`` (what to use instead) unless the library is missing, whose install line
    is what to do."""
    return str(exc) if exc.missing else f"{exc}; {fallback}"


def select_gpus(gpus: Sequence[int] | None, visible: int, where: str) -> list[int]:
    """The positions among the ``visible`` GPUs that are measured: all, or the ones
    ``--energy-gpus`` names; ``where``: what makes them visible, for the message."""
    if gpus is None:
        return list(range(visible))
    bad = [i for i in gpus if i >= visible]
    if bad:
        raise ConfigError(
            f"--energy-gpus names GPU {bad[0]}, but {visible} GPU(s) are "
            f"visible{where} (valid: 0..{visible - 1})"
        )
    return sorted(set(gpus))


def ordinal_of(domain: str) -> int:
    """``gpu:3`` -> 3: the ordinal a GPU domain is named after (torch's ``cuda:3``)."""
    return int(domain.partition(":")[2])


def gpu_mode(options: MeterSettings) -> str:
    """How the GPUs are chosen: the ones ``--energy-gpus`` lists, every visible one
    (``--energy-gpus=all``), or, by default, the ones in use."""
    if options.gpus is not None:
        return LISTED
    return EVERY if options.every_gpu else IN_USE


def probe_counters(
    read_count: Callable[[Any], int],
    handles: Sequence[Any],
    max_s: float = PERIOD_PROBE_MAX_S,
    intervals: int = PERIOD_PROBE_INTERVALS,
    clock: Callable[[], float] = perf_counter,
) -> list[list[tuple[float, int]]]:
    """Each counter's changes ``(time, value)`` while all are polled in turn, within
    ``max_s``: what its update period (and, for amdsmi, its rate) is measured from."""
    last = [read_count(handle) for handle in handles]
    changes: list[list[tuple[float, int]]] = [[] for _ in handles]
    pending = list(range(len(handles)))
    deadline = clock() + max_s
    while pending and clock() < deadline:
        for i in pending:
            value = read_count(handles[i])
            if value != last[i]:
                last[i] = value
                changes[i].append((clock(), value))
        pending = [i for i in pending if len(changes[i]) <= intervals]
    return changes


def period_s(times: Sequence[float]) -> float | None:
    """The mean period over the whole span, its number of periods counted with the median
    interval: a change seen late (a busy machine) shortens one interval and lengthens the
    next, which the span evens out; a tick that added nothing (two periods between seen
    changes) is counted as two.  None: fewer than two changes."""
    if len(times) < 2:
        return None
    median_s = statistics.median(b - a for a, b in itertools.pairwise(times))
    span_s = times[-1] - times[0]
    periods = max(round(span_s / median_s), 1) if median_s > 0 else len(times) - 1
    return span_s / periods


# A counter whose period could not be timed (a busy machine held the probe up) is taken
# as this coarse, NVML's on recent boards: a resolution assumed too fine would split
# short phases at their marks and keep trials of one call, both biased on a 100 ms
# counter; one assumed too coarse costs longer windows, nothing else.
ASSUMED_PERIOD_S = 0.1


def period_text(period: float | None) -> str:
    if period is None:
        return (
            f"update period not timed (fewer than 2 updates in {PERIOD_PROBE_MAX_S:g} s): "
            f"taken as {duration_text(ASSUMED_PERIOD_S)}"
        )
    return f"updates every {duration_text(period)}"


def counter_resolution_s(period: float | None) -> float:
    """What a counter of this timed period resolves (``ASSUMED_PERIOD_S`` untimed)."""
    return ASSUMED_PERIOD_S if period is None else period


def with_period(device: GpuT, counter_text: str, period: float | None) -> GpuT:
    """A counter GPU once its counter's period is timed: the period follows
    ``counter_text`` in its note and is its resolution (``ASSUMED_PERIOD_S`` where it
    could not be timed)."""
    note = device.note.replace(counter_text, f"{counter_text}, {period_text(period)}", 1)
    return replace(device, note=note, resolution_s=counter_resolution_s(period))


def sync_torch_gpus(ordinals: Sequence[int], api: str = "cuda") -> None:
    """Let queued kernels finish on the GPUs read, so their energy lands inside the window
    they ran in; ``api``: the torch module of the vendor's GPUs (its ``Vendor.torch``:
    torch on ROCm keeps the ``torch.cuda`` names).  Only on those of them where torch holds
    a context in this process: waiting on any other would open one (``gpu/in_use.py``);
    we never import torch."""
    in_use.synchronize(frozenset(ordinals), api)


def session_ordinals(
    devices: Sequence[tuple[Sequence[int], GpuDevice]], roots: Sequence[int]
) -> tuple[int, ...]:
    """The ordinals of the GPUs where the driver lists a process of the trees of
    ``roots`` (this process, a serving engine): ``(ordinals, device)`` pairs.  A driver
    that keeps no list, or lists other PIDs (a container's own PID namespace, which the
    NVIDIA driver does not translate on every release), finds none here."""
    ours = tree_pids(tuple(roots))
    found: set[int] = set()
    for ordinals, device in devices:
        try:
            pids = device.process_ids()
        except GpuDeviceError:
            continue
        if pids & ours:
            found.update(ordinals)
    return tuple(sorted(found))


class GpuMeter(Meter):
    """GPUs with counters (read at the edges) and GPUs sampled in a thread, together."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self._closed = False
        self._sampler: PowerSampler | None = None
        self._names: tuple[str, ...] = ()  # every GPU domain read now, in order
        self._counter_names: tuple[str, ...] = ()
        self._sampled_names: tuple[str, ...] = ()
        self._sampled: tuple[tuple[str, Callable[[], float]], ...] = ()  # read now
        # How the GPUs read are chosen, among every one opened (_choose_gpus)
        self._mode = LISTED
        self._every: tuple[tuple[str, ...], tuple[str, ...], dict[str, Domain]] = ((), (), {})
        self._every_sampled: tuple[tuple[str, Callable[[], float]], ...] = ()
        self._served: dict[str, tuple[int, ...]] = {}  # domain -> the ordinals it measures
        self._gpu_names: dict[str, str] = {}  # domain -> the GPU's name, for the lines
        self._process_devices: tuple[tuple[tuple[int, ...], GpuDevice], ...] = ()
        self._roots: tuple[int, ...] = (os.getpid(),)
        self._torch_api = "cuda"
        self._read_ordinals: tuple[int, ...] = ()  # the ordinals read now: what to wait for
        self.choice: GpuChoice | None = None  # the GPUs read now, and why
        self._told: GpuChoice | None = None  # the last choice ``news`` named

    def _measure(self, devices: Sequence[MeasuredGpu]) -> None:
        """The domains, notes and resolution of the GPUs measured, in order."""
        self.notes.extend(d.note for d in devices)
        self._gpu_names = {d.domain: str(getattr(d, "name", "")) for d in devices}
        # The coarsest GPU sets what the meter resolves; one unknown makes it unknown.
        known_s = [d.resolution_s for d in devices if d.resolution_s is not None]
        self._resolution_s = max(known_s) if len(known_s) == len(devices) else None
        self._domains: dict[str, Domain] = {d.domain: Domain(d.domain, d.method) for d in devices}
        self._names = tuple(self._domains)

    def _sample(
        self,
        readers: Sequence[tuple[str, Callable[[], float]]],
        interval_s: float,
        thread: str,
        skipped: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Sample these GPUs' power (W) while a window is open; none: no thread at all.

        Between the edges, a GPU whose read raises one of ``skipped`` (the library's own
        error) is left out of that sample: the hole is the window's telemetry's to judge
        (meters/validity.py), not a reason to lose the other GPUs' samples.  The edges
        read every GPU or fail the window.
        """
        read_all = tuple(readers)
        self._every_sampled = self._sampled = read_all
        self._sampled_names = tuple(name for name, _ in read_all)
        if not read_all:
            self._uses_start_stop = False  # counters only: nothing to start or stop
            return

        # the GPUs read now (_apply changes them only while no window is open)
        def read_power_w() -> dict[str, float]:
            return {name: read() for name, read in self._sampled}

        def read_some_w() -> dict[str, float]:
            out: dict[str, float] = {}
            for name, read in self._sampled:
                try:
                    out[name] = read()
                except skipped:
                    continue
            return out

        background = read_some_w if skipped else None
        self._sampler = PowerSampler(read_power_w, interval_s, thread, read_background_w=background)

    # -- which GPUs are read -----------------------------------------------------------
    def _choose_gpus(
        self,
        options: MeterSettings,
        served: Mapping[str, Sequence[int]],
        devices: Sequence[tuple[Sequence[int], GpuDevice]] = (),
        api: str = "cuda",
    ) -> None:
        """Once every GPU is open (domains, counters, sampler): how windows choose among
        them.  ``served``: each domain's ordinals (a GPU CUDA sees as several MIG devices,
        an MI250's two dies); ``devices``: the device layer's GPUs whose process lists say
        where the session's processes run, with their ordinals; ``api``: torch's module."""
        self._mode = gpu_mode(options)
        if self._mode == IN_USE and len(self._names) < 2:
            self._mode = EVERY  # one GPU: nothing to choose, so windows pay nothing for it
        self._served = {name: tuple(served[name]) for name in self._names}
        self._every = (self._names, self._counter_names, dict(self._domains))
        self._process_devices = tuple((tuple(o), d) for o, d in devices)
        self._roots = (os.getpid(), *options.attributed_pids)
        self._torch_api = api
        if self._mode == IN_USE:
            self._uses_start_stop = True  # each outermost window chooses as it opens
            self._apply(self._choose())
        else:
            why = "every visible GPU" if self._mode == EVERY else "the GPUs --energy-gpus lists"
            self._apply(GpuChoice(self._names, why))

    def _in_use(self) -> tuple[tuple[int, ...], str] | None:
        """The ordinals in use now and why, or None where none is (the module's rule)."""
        placed = in_use.placements()
        if placed:
            what = ", ".join(dict.fromkeys(p.what for p in placed))
            ordinals = tuple(sorted({i for p in placed for i in p.ordinals}))
            return ordinals, f"where {what} is placed"
        found = set(in_use.context_ordinals(self._torch_api) or ())
        if self._process_devices:
            found.update(session_ordinals(self._process_devices, self._roots))
        if found:
            return tuple(sorted(found)), "where this session's processes hold a GPU context"
        return None

    def _choose(self) -> GpuChoice:
        """The GPUs in use, or every one opened where none is (said, never zero GPUs)."""
        every = self._every[0]
        found = self._in_use()
        if found is not None:
            ordinals, why = found
            names = tuple(n for n in every if set(self._served[n]) & set(ordinals))
            if names:
                return GpuChoice(names, why)
        return GpuChoice(every, NONE_IN_USE)

    def _apply(self, choice: GpuChoice) -> None:
        """Read these GPUs from now on (never while a window is open: its readings must
        all read the same GPUs)."""
        _, every_counters, every_domains = self._every
        if choice == self.choice and self._names == choice.names:
            return
        chosen = set(choice.names)
        positions = tuple(i for i, name in enumerate(every_counters) if name in chosen)
        self._names = choice.names
        self._counter_names = tuple(every_counters[i] for i in positions)
        self._use_counters(positions)
        self._sampled = tuple((name, read) for name, read in self._every_sampled if name in chosen)
        self._sampled_names = tuple(name for name, _ in self._sampled)
        others = {n: d for n, d in every_domains.items() if n not in self._served}  # gpu:process
        self._domains = {**{n: every_domains[n] for n in choice.names}, **others}
        self._read_ordinals = tuple(sorted({i for n in choice.names for i in self._served[n]}))
        self.choice = choice

    def _use_counters(self, positions: tuple[int, ...]) -> None:
        """Read only these of the counters opened (their positions, in order): the
        vendor's counter handles follow ``_counter_names``."""

    @property
    def domains(self) -> Mapping[str, Domain]:
        """The GPUs read now; with no window open, the ones the next window would read."""
        if self._mode == IN_USE:
            with self._active_lock:
                if self._active == 0:
                    self._apply(self._choose())
        return self._domains

    def settings(self) -> dict[str, str]:
        """Reading the GPUs in use leaves idle GPUs' joules out of every figure: a run that
        read every GPU is not comparable with one that read those in use."""
        return {"GPUs": "in use"} if self._mode == IN_USE else {}

    def identity(self) -> dict[str, str]:
        """As every meter's, with the GPUs it may read (every one opened), not the ones the
        last window chose: two runs of one model on different GPUs still compare."""
        every = self._every[2] or self._domains  # (a meter that never chose: its own)
        counted = [name for name, d in every.items() if d.counted]
        return {"meter": self.kind, "domains": ", ".join(counted), **self.settings()}

    def news(self) -> str | None:
        """One line naming the GPUs windows read, where that changed since the last line:
        chosen ones as they come into use; listed ones (``--energy-gpus``) when some of
        them run none of the session's work while others do, whose idle power is then in
        every joule.  None: nothing new."""
        choice = self.choice
        if choice is None:
            return None
        if self._mode != IN_USE:
            found = self._in_use()
            used = set(found[0]) if found is not None else set()
            idle = tuple(n for n in choice.names if found and not set(self._served[n]) & used)
            choice = replace(choice, idle=idle)
            if not idle and self._told is None:
                return None
        if choice == self._told:
            return None
        self._told = choice
        return self._choice_text(choice)

    def _choice_text(self, choice: GpuChoice) -> str:
        """The line: the GPUs read, by name (the run's reader matches them to boards),
        why, those not read, and those read that idle."""
        named = ", ".join(f"{n} {self._gpu_names.get(n, '')}".rstrip() for n in choice.names)
        line = f"{self.backend} reads {named}: {choice.why}"
        unread = [n for n in self._every[0] if n not in choice.names]
        if unread:
            line += f"; not read: {', '.join(unread)} (no work of this session there)"
        if choice.idle:
            one = len(choice.idle) == 1
            line += (
                f"; WARNING: {', '.join(choice.idle)} {'runs' if one else 'run'} none of this "
                f"session's work, so {'its' if one else 'their'} idle power is in every joule "
                "(leave --energy-gpus unset to read the GPUs in use)"
            )
        return line

    @abstractmethod
    def _counter_energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        """Joules of the counted GPUs between two readings."""

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        out = self._counter_energy_j(a, b)
        if self._sampler is not None:
            samples = self._sampler.bracket(a.t, b.t)
            out.update(integrate_instant(samples, a.t, b.t, self._sampled_names))
            if self._counter_names:
                out = {name: out[name] for name in self._names}
        return out

    def _start(self) -> None:
        """The first window opens: it (and every window nested in it) reads the GPUs in
        use now, chosen here before its first reading."""
        if self._mode == IN_USE:
            self._apply(self._choose())
        if self._sampler is not None:
            self._sampler.start()

    def _stop(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def _samples(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        return self._sampler.between(t0, t1) if self._sampler is not None else ()

    @property
    def tick_period_s(self) -> float | None:
        """The counters' period where every measured GPU is read by its counter: an
        aligned window's edges wait for their refreshes (``meters/edges.py``).  None
        where a GPU is sampled (its samples have no refreshes to wait for)."""
        if self._sampler is not None or not self._counter_names:
            return None
        return self.resolution_s

    def describe(self) -> str:
        """The GPUs' notes; chosen by use, which ones the next window reads and why."""
        line = f"{self.backend}: " + "; ".join(self.notes)
        if self._mode != IN_USE:
            return line
        choice = self._choose()
        named = ", ".join(choice.names)
        return f"{line}; {RULE_NOTE}: now {named} ({choice.why})"

    def close(self) -> None:
        if self._closed:
            return
        if self._sampler is not None:
            self._sampler.stop()
        self._shutdown()

    def _shutdown(self) -> None:
        """The library shut down once per init, however often close() is called."""
        self._closed = True
        self._library_shutdown()

    @abstractmethod
    def _library_shutdown(self) -> None:
        """Shut the vendor's library down, its own errors suppressed."""
