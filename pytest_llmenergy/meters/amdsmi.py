"""AMD GPUs through amdsmi (ROCm's ``amdsmi`` Python package, over ``libamd_smi``).

Instinct GPUs keep an energy accumulator: ``amdsmi_get_energy_count`` returns a count
and the microjoules one count is worth (``counter_resolution``, 15.3 µJ on the parts
seen), so reading it at the window's edges costs two calls and no thread.  The count's
key changed with ROCm (``power`` up to 6.2, ``energy_accumulator`` from 6.3, ``power``
gone from 6.4): each is read.  AMD documents no update period, so the meter times it
when it opens, as for NVML, and checks that the counter moves with the power the GPU
reports: a counter that stands still while the GPU draws power (stuck counters exist on
some parts), or that moves at a rate far from that power, is left aside and the GPU's
power is sampled instead, which the meter's line says.  Power comes from
``amdsmi_get_power_info``: ``current_socket_power`` where it is valid (MI300),
``average_socket_power`` where that one is (MI200 and MI210, an average, so its edges
blur); a field a part lacks reads ``"N/A"``.

An MI250 or MI250X is two dies the system lists as two GPUs: the first reports the
power and energy of both, the second reports 0 or ``"N/A"``.  The meter measures such a
board once, under the first of its dies that is measured, and says that its joules are
both dies': never twice, and never 0 J for the second die.

The GPUs measured are the ones HIP sees (``ROCR_VISIBLE_DEVICES``, then
``HIP_VISIBLE_DEVICES``, or ``CUDA_VISIBLE_DEVICES`` when that one is unset, as HIP
reads them), numbered as HIP numbers them, so ``gpu:i`` is what torch on ROCm calls
``cuda:i``; amdsmi is taken to list the GPUs in HIP's order (both sort by PCI bus).

amdsmi is opened, numbered and made visible by the device layer (``gpu/amd.py``), when a
meter is opened, never when this module is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

from ..errors import MeterError, MeterUnavailable
from ..gpu.amd import POWER_FIELDS, AmdLibrary, visibility_text, visible_indices, watts
from ..gpu.device import GpuDeviceError, one_line, vendor_named
from .gpu_meter import (
    GpuMeter,
    ordinal_of,
    period_s,
    probe_counters,
    select_gpus,
    sync_torch_gpus,
    unavailable,
    with_period,
)
from .marks import _frozen
from .meter_settings import MeterSettings
from .readings import Method, Reading

_modules = sys.modules  # read at every reading: is torch (and so maybe the GPUs) in use?
BACKEND = "amdsmi"
VENDOR = vendor_named("amd")
DEFAULT_INTERVAL_S = VENDOR.interval_s
FALLBACK_HINT = "use --energy-backend=auto or estimate"
SAMPLER_THREAD_NAME = "llmenergy-amdsmi-sampler"
# The count's key, newest first: ROCm 6.3 added energy_accumulator, 6.4 dropped power.
COUNT_KEYS = ("energy_accumulator", "power")
_AVERAGE_FIELDS = frozenset({"average_socket_power"})
# A counter whose power over the probe is further than this factor from the power the
# GPU reports does not measure it (Zeus rules out the same obvious failures).
COUNTER_AGREEMENT = 4.0
# Below this the GPU's power says nothing about whether its counter moves.
MIN_CHECK_W = 1.0
_MI250 = "MI250"


@dataclass(frozen=True)
class AmdGpu:
    """One measured GPU: ``domain`` is ``gpu:<HIP ordinal>``, ``index`` its amdsmi index
    (the die whose counter and power are read: the first die of an MI250 board)."""

    domain: str
    index: int
    name: str
    method: Method
    note: str
    # Counter: the measured update period; sampled: the sampling interval; None: unknown.
    resolution_s: float | None = None


def create(options: MeterSettings) -> AmdSmiMeter:
    """Registry entry point: open amdsmi on the GPUs HIP sees (or ``options.gpus`` of them)."""
    return AmdSmiMeter(options)


# -- reading amdsmi's replies ---------------------------------------------------------------
def energy_count(reply: Mapping[str, Any]) -> tuple[int, float]:
    """``(count, µJ per count)`` of an ``amdsmi_get_energy_count`` reply, whichever key
    its ROCm used for the count; ValueError when the reply holds no usable count."""
    count: Any = None
    for key in COUNT_KEYS:
        count = reply.get(key)
        if count is not None and count != "N/A":
            break
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"no energy count in amdsmi's reply {dict(reply)!r}")
    resolution = reply.get("counter_resolution")
    if isinstance(resolution, bool) or not isinstance(resolution, (int, float)):
        raise ValueError(f"no counter_resolution in amdsmi's reply {dict(reply)!r}")
    if not 0 < resolution < 1e9:  # also NaN and infinity
        raise ValueError(f"counter_resolution {resolution!r} is not a positive number")
    return count, float(resolution)


def count_delta(before: int, after: int) -> int:
    """Counts between two readings.  A count that went down wrapped: at 32 bits if it
    never needed more, else at 64 (an accumulator reset by a driver reload would read
    as a wrap; the window then fails its sanity check upstream, not here)."""
    if after >= before:
        return after - before
    width = 32 if before < 2**32 else 64
    return after - before + 2**width


# -- timing and checking the counters --------------------------------------------------------
def counter_problem(
    changes: Sequence[tuple[float, int]],
    uj_per_count: float,
    power_w: float | None,
    probed_s: float,
) -> str | None:
    """Why this counter does not measure the GPU's power, or None when it seems to.

    A counter that never moved while the GPU drew power is stuck; one whose power between
    its first and last change is further than ``COUNTER_AGREEMENT`` from the GPU's
    reported power counts something else.  Too little to tell (no power reading, one
    change) is no problem: the counter is believed, as NVML's is.
    """
    if power_w is None or power_w < MIN_CHECK_W:
        return None
    if not changes:
        return (
            f"its energy counter did not move in {probed_s:.2g} s while the GPU reported "
            f"{power_w:.0f} W (a stuck counter)"
        )
    if len(changes) < 2:
        return None
    (t0, c0), (t1, c1) = changes[0], changes[-1]
    counter_w = count_delta(c0, c1) * uj_per_count / 1e6 / (t1 - t0)
    ratio = counter_w / power_w
    if 1 / COUNTER_AGREEMENT <= ratio <= COUNTER_AGREEMENT:
        return None
    return (
        f"its energy counter reads {counter_w:.3g} W while the GPU reported {power_w:.0f} W "
        "(a counter that does not follow power)"
    )


COUNTER_TEXT = "counter (amdsmi energy accumulator, µJ)"


def _power_or_none(read: Callable[[], float] | None) -> float | None:
    return None if read is None else read()


def _board_text(served: Sequence[int], first_die_measured: bool) -> str:
    """What a domain read through an MI250's first die covers."""
    if first_die_measured and len(served) > 1:
        dies = " and ".join(f"gpu:{o}" for o in served)
        return (
            f"; {dies} are the two dies of one board, measured once: the first die reports "
            "both dies' power, the second none of its own"
        )
    if first_die_measured:
        return (
            "; both dies of its board: the first die reports both dies' power (the second "
            "die's work included), the second none of its own"
        )
    return (
        f"; gpu:{served[0]} is the second die of a board whose first die reports both dies' "
        "power: that die is read, so these are both dies' joules (the other die's work "
        "included)"
    )


def _sampled_note(
    domain: str, name: str, why: str | None, field: str | None, interval_s: float
) -> str:
    source = f"{field} every {interval_s:g} s"
    if field in _AVERAGE_FIELDS:
        source += ", an average over the firmware's window, so edges blur"
    return f"{domain} {name}: sampled ({why}; {source})"


@dataclass(frozen=True)
class _Opened:
    """One measured GPU while the meter opens: its description, and what judging its
    counter needs (the counter's µJ per count, None once sampled; its power reader and
    field, None where it reports no power; what its board adds to its note)."""

    device: AmdGpu
    uj_per_count: float | None
    reader: Callable[[], float] | None
    field: str | None
    board: str


def _visible_ordinals(count: int) -> list[int]:
    """The amdsmi index of each GPU HIP sees, in HIP's order; none is no meter."""
    ordinals = visible_indices(count)
    if not ordinals:
        shown = visibility_text()
        if count and shown:
            raise MeterUnavailable(BACKEND, f"{shown} hides all GPUs; {FALLBACK_HINT}")
        raise MeterUnavailable(BACKEND, f"amdsmi found no AMD GPU; {FALLBACK_HINT}")
    return ordinals


def _boards(
    ordinals: Sequence[int], selected: Sequence[int], silent: set[int]
) -> list[tuple[int, list[int], str]]:
    """One domain per board, in HIP's order: ``(amdsmi index read, HIP ordinals it
    measures, what its note says of its board)``; the silent second die of an MI250 is
    read through its first."""
    boards: dict[int, list[int]] = {}
    for ordinal in selected:
        index = ordinals[ordinal]
        boards.setdefault(index - 1 if index in silent else index, []).append(ordinal)
    return [
        (index, served, _board_text(served, ordinals[served[0]] == index))
        if index + 1 in silent
        else (index, served, "")
        for index, served in sorted(boards.items(), key=lambda kv: kv[1][0])
    ]


def _judged(
    opened: _Opened,
    seen: Sequence[tuple[float, int]],
    w_before: float | None,
    probed_s: float,
    interval_s: float,
) -> _Opened:
    """A counter GPU after the probe: its counter's period in its note, or its power
    sampled instead when its counter does not follow that power."""
    known = [w for w in (w_before, _power_or_none(opened.reader)) if w is not None]
    power_w = sum(known) / len(known) if known else None
    assert opened.uj_per_count is not None  # only counter GPUs are probed
    problem = counter_problem(seen, opened.uj_per_count, power_w, probed_s)
    device = opened.device
    if problem is None:
        timed = with_period(device, COUNTER_TEXT, period_s([t for t, _ in seen]))
        return replace(opened, device=timed)
    assert opened.reader is not None  # counter_problem needs a power reading to find one
    note = _sampled_note(device.domain, device.name, problem, opened.field, interval_s)
    sampled = replace(
        device, method=Method.SAMPLED, note=note + opened.board, resolution_s=interval_s
    )
    return replace(opened, device=sampled, uj_per_count=None)


class AmdSmiMeter(GpuMeter):
    """Energy of AMD GPUs: the energy accumulator where it works, sampled power elsewhere."""

    backend = BACKEND

    def __init__(self, options: MeterSettings | None = None) -> None:
        super().__init__()
        options = options or MeterSettings()
        try:
            self._library = AmdLibrary()
        except GpuDeviceError as exc:
            raise MeterUnavailable(BACKEND, unavailable(exc, FALLBACK_HINT)) from exc
        smi = self._library.smi
        self._error: type[BaseException] = smi.AmdSmiException
        self._smi = smi
        try:
            self._open(options)
        except smi.AmdSmiException as exc:
            self._shutdown()
            reason = f"amdsmi failed while listing GPUs: {one_line(exc)}"
            raise MeterUnavailable(BACKEND, reason) from exc
        except ValueError as exc:  # a reply energy_count cannot read
            self._shutdown()
            raise MeterUnavailable(BACKEND, f"{exc}; {FALLBACK_HINT}") from exc
        except BaseException:
            self._shutdown()
            raise

    # -- opening -------------------------------------------------------------------------
    def _open(self, options: MeterSettings) -> None:
        handles = list(self._smi.amdsmi_get_processor_handles())
        ordinals = _visible_ordinals(len(handles))
        shown = visibility_text()
        selected = select_gpus(options.gpus, len(ordinals), f" with {shown}" if shown else "")

        names = [self._name(h) for h in handles]
        silent = self._silent_dies(handles, names)
        interval_s = options.interval_s(DEFAULT_INTERVAL_S)
        boards = _boards(ordinals, selected, silent)
        opened = [
            self._describe(handles[index], index, served, names[index], interval_s, board)
            for index, served, board in boards
        ]
        checked = self._checked(opened, handles, interval_s)
        devices = [o.device for o in checked]
        self._measure(devices)

        self.devices: tuple[AmdGpu, ...] = tuple(devices)
        kept = [o for o in checked if o.uj_per_count is not None]
        self._counter_names = tuple(o.device.domain for o in kept)
        self._every_counters = tuple((handles[o.device.index], o.uj_per_count) for o in kept)
        self._use_counters(tuple(range(len(kept))))
        sampled = [(o.device.domain, o.reader) for o in checked if o.uj_per_count is None]
        self._sample(sampled, interval_s, SAMPLER_THREAD_NAME)
        served = {f"gpu:{ordinals_of[0]}": ordinals_of for _, ordinals_of, _ in boards}
        gpus = [((ordinal_of(d.domain),), d) for d in self._library.devices(selected)]
        self._choose_gpus(options, served, gpus, VENDOR.torch)

    def _silent_dies(self, handles: Sequence[Any], names: Sequence[str]) -> set[int]:
        """The amdsmi indices of MI250 second dies that report no power of their own."""
        return {
            i
            for i in range(1, len(handles))
            if self._second_die(names, i) and self._power_field(handles[i]) is None
        }

    def _describe(
        self,
        handle: Any,
        index: int,
        served: Sequence[int],
        name: str,
        interval_s: float,
        board: str,
    ) -> _Opened:
        """One board's GPU as opened: its counter where it has one, else its power sampled."""
        domain = f"gpu:{served[0]}"
        field = self._power_field(handle)
        uj_per_count, why_not = self._counter(handle)
        if field is None and uj_per_count is None:
            raise MeterUnavailable(
                BACKEND,
                f"{domain} {name} reports neither an energy counter ({why_not}) nor power; "
                f"{FALLBACK_HINT}",
            )
        reader = self._power_reader(handle, field) if field is not None else None
        if uj_per_count is not None:
            note = f"{domain} {name}: {COUNTER_TEXT}{board}"
            device = AmdGpu(domain, index, name, Method.COUNTER, note)
        else:
            note = _sampled_note(domain, name, why_not, field, interval_s) + board
            device = AmdGpu(domain, index, name, Method.SAMPLED, note, interval_s)
        return _Opened(device, uj_per_count, reader, field, board)

    def _checked(
        self, opened: Sequence[_Opened], handles: Sequence[Any], interval_s: float
    ) -> list[_Opened]:
        """Time the counters, and leave aside any that does not move with the GPU's power."""
        counted = [i for i, o in enumerate(opened) if o.uj_per_count is not None]
        before = [_power_or_none(opened[i].reader) for i in counted]
        started = perf_counter()
        changes = probe_counters(self._count, [handles[opened[i].device.index] for i in counted])
        probed_s = perf_counter() - started
        checked = list(opened)
        for i, seen, w_before in zip(counted, changes, before):
            checked[i] = _judged(opened[i], seen, w_before, probed_s, interval_s)
        return checked

    def _name(self, handle: Any) -> str:
        try:
            name = str(self._smi.amdsmi_get_gpu_asic_info(handle).get("market_name", ""))
        except self._error:
            name = ""
        return name if name and name != "N/A" else "AMD GPU"

    def _power_field(self, handle: Any) -> str | None:
        """The best power field this GPU fills, or None (0 W counts as none: only a die
        that reports no power of its own reads 0)."""
        try:
            info = self._smi.amdsmi_get_power_info(handle)
        except self._error:
            return None
        for field in POWER_FIELDS:
            value = watts(info.get(field))
            if value:
                return field
        return None

    @staticmethod
    def _second_die(names: Sequence[str], index: int) -> bool:
        """The second die of an MI250 board: odd, silent, right after a die of its name."""
        name = names[index]
        return _MI250 in name and index % 2 == 1 and names[index - 1] == name

    def _counter(self, handle: Any) -> tuple[float | None, str | None]:
        """µJ per count of this GPU's accumulator, or why it has none."""
        try:
            _, uj = energy_count(self._smi.amdsmi_get_energy_count(handle))
        except self._error as exc:
            return None, f"energy counter unavailable: {one_line(exc)}"
        except ValueError as exc:
            return None, f"energy counter unreadable: {exc}"
        return uj, None

    def _count(self, handle: Any) -> int:
        return energy_count(self._smi.amdsmi_get_energy_count(handle))[0]

    def _power_reader(self, handle: Any, field: str) -> Callable[[], float]:
        get_info = self._smi.amdsmi_get_power_info

        def read_w() -> float:
            value = watts(get_info(handle).get(field))
            if value is None:
                raise MeterError(f"amdsmi stopped reporting {field} of a GPU")
            return value

        return read_w

    # -- the Meter interface -----------------------------------------------------------------
    def _use_counters(self, positions: tuple[int, ...]) -> None:
        every = self._every_counters
        self._counter_handles = tuple(every[i][0] for i in positions)
        self._uj_per_count = tuple(every[i][1] for i in positions)

    def _read(self) -> Reading:
        if "torch" in _modules:  # only a program using torch may have queued GPU work
            sync_torch_gpus(self._read_ordinals, VENDOR.torch)
        try:
            sampler = self._sampler
            t = sampler.sample_now() if sampler is not None else perf_counter()
            state = tuple(map(self._count, self._counter_handles))
        except self._error as exc:
            raise MeterError(f"amdsmi reading failed: {one_line(exc)}") from exc
        except ValueError as exc:
            raise MeterError(f"amdsmi reading failed: {exc}") from exc
        return _frozen(Reading, {"t": t, "state": state})

    def _counter_energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        return {
            name: count_delta(count_a, count_b) * uj / 1e6
            for name, uj, count_a, count_b in zip(
                self._counter_names, self._uj_per_count, a.state, b.state
            )
        }

    def _library_shutdown(self) -> None:
        self._library.close()
