"""Linux powercap (RAPL): package, core, uncore and DRAM energy counters per socket.

The counters are microjoule registers that wrap at ``max_energy_range_uj``.  While a
window is open a guard thread reads them often enough that no wrap is missed, so a
window may span any number of wrap periods.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import MeterError, MeterUnavailable, one_line
from ..probes.process_tree import attributed_note, cpu_reader, machine_busy_cpu_seconds
from .base import Meter
from .meter_settings import MeterSettings
from .readings import PROCESS_DOMAIN, Domain, Method, Reading
from .sampling import PeriodicThread

BACKEND = "rapl"
_ZONE_RE = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")
# Without a published limit, assume a zone never draws more than this: guard period
# = range / power / 4 keeps at least four reads per wrap.
_ASSUMED_MAX_POWER_W = 1000.0
_GUARD_MAX_S = 1.0
_GUARD_MIN_S = 0.001
RAPL_UPDATE_PERIOD_S = 0.001  # the registers update about every millisecond: the resolution

PERMISSION_HINT = (
    "energy_uj is readable only by root on most kernels since 2020 (CVE-2020-8694); "
    "grant read access with `sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj "
    "/sys/class/powercap/intel-rapl:*:*/energy_uj` (until reboot, or a udev rule to keep it), "
    "or run as root"
)


class CounterUnwrapper:
    """Turns a wrapping counter into a monotonic total; must see every wrap period."""

    def __init__(self, max_range: int) -> None:
        if max_range <= 0:
            raise ValueError(f"counter range must be positive, got {max_range}")
        self.max_range = max_range
        self._last: int | None = None
        self.total = 0

    def update(self, raw: int) -> int:
        if self._last is not None:
            delta = raw - self._last
            if delta < 0:  # wrapped once since the last read
                delta += self.max_range
            self.total += delta
        self._last = raw
        return self.total


@dataclass(frozen=True)
class Zone:
    """One powercap zone and the files it is read from."""

    domain: Domain
    energy_path: str
    max_range_uj: int
    max_power_w: float | None


def discover_zones(root: str) -> list[Zone]:
    """Every RAPL zone under ``root``, subzones named after their socket."""
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    zones: list[Zone] = []
    for entry in entries:
        match = _ZONE_RE.match(entry)
        if match is None:
            continue  # intel-rapl-mmio duplicates package-N: reading both double counts
        path = os.path.join(root, entry)
        name = _read_text(os.path.join(path, "name"))
        top, sub = int(match.group(1)), match.group(2)
        if sub is None:
            domain = _top_domain(name, top)
        else:
            parent = _read_text(os.path.join(root, f"intel-rapl:{top}", "name"))
            socket = parent.split("-", 1)[1] if parent.startswith("package-") else str(top)
            domain = _sub_domain(name, socket)
        range_path = os.path.join(path, "max_energy_range_uj")
        max_range_uj = int(_read_text(range_path))
        if max_range_uj <= 0:
            raise ValueError(f"{range_path} is {max_range_uj}, not a counter's range")
        zones.append(
            Zone(
                domain=domain,
                energy_path=os.path.join(path, "energy_uj"),
                max_range_uj=max_range_uj,
                max_power_w=_max_power_w(path),
            )
        )
    return zones


def _top_domain(name: str, index: int) -> Domain:
    if name.startswith("package-"):
        return Domain(f"cpu:{name}", Method.COUNTER)
    if name == "dram":
        return Domain(f"cpu:dram-{index}", Method.COUNTER)
    # psys covers the whole platform, package included: report it, don't add it.
    return Domain(f"cpu:{name}", Method.COUNTER, counted=False)


def _sub_domain(name: str, socket: str) -> Domain:
    # DRAM is outside the package's budget; core and uncore are parts of it.
    return Domain(f"cpu:{name}-{socket}", Method.COUNTER, counted=name == "dram")


def _max_power_w(zone_path: str) -> float | None:
    try:
        uw = int(_read_text(os.path.join(zone_path, "constraint_0_max_power_uw")))
    except (OSError, ValueError):
        return None
    return uw / 1e6 if uw > 0 else None


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _read_int(path: str) -> int:
    """A counter's value; a file that holds no whole number (empty, garbage: not a
    powercap counter) is a MeterError naming it."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return int(raw)
    except ValueError:
        text = one_line(raw[:40].decode("utf-8", "replace").strip())
        held = repr(text) if text else "nothing"
        raise MeterError(
            f"{path} holds {held}, not a counter in microjoules (a whole number); "
            "point LLMENERGY_POWERCAP_ROOT at the real powercap tree (/sys/class/powercap)"
        ) from None


def guard_interval_s(zones: list[Zone], requested_s: float | None) -> float:
    """How often to read so that no counter can wrap twice between reads."""
    periods = [z.max_range_uj / 1e6 / (z.max_power_w or _ASSUMED_MAX_POWER_W) / 4 for z in zones]
    interval = min([_GUARD_MAX_S, *periods])
    if requested_s is not None:
        interval = min(interval, requested_s)
    return max(interval, _GUARD_MIN_S)


PROCESS = PROCESS_DOMAIN


def attributed_share(tree_s: float, machine_s: float) -> float:
    """This process tree's share of the machine's busy CPU time over a window.  The
    machine counts 10 ms ticks, so a window shorter than a tick may see none: then the
    tree had it all if it used any."""
    if machine_s <= 0:
        return 1.0 if tree_s > 0 else 0.0
    return min(1.0, max(0.0, tree_s / machine_s))


class RaplMeter(Meter):
    """Package, core, uncore and DRAM counters; with CPU-time sources, also ``cpu:process``:
    the packages' energy x this process tree's share of the machine's CPU time, as the
    research attributed CPU energy to the process on macOS.  It is reported beside the
    package figures, not added to them (marked ``attributed``)."""

    backend = BACKEND

    def __init__(
        self,
        zones: list[Zone],
        guard_s: float,
        root: str,
        *,
        tree_cpu_s: Callable[[], float] | None = None,
        machine_busy_s: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()
        self._zones = zones
        self._domains = {z.domain.name: z.domain for z in zones}
        self._packages = [z.domain.name for z in zones if z.domain.name.startswith("cpu:package-")]
        self._cpu_time = (
            (tree_cpu_s, machine_busy_s)
            if tree_cpu_s is not None and machine_busy_s is not None and self._packages
            else None
        )
        if self._cpu_time is not None:
            self._domains[PROCESS] = Domain(PROCESS, Method.ATTRIBUTED, counted=False)
        self._names = [z.domain.name for z in zones]
        self._paths = [z.energy_path for z in zones]
        self._unwrappers = [CounterUnwrapper(z.max_range_uj) for z in zones]
        self._lock = threading.Lock()
        self._guard = PeriodicThread(self._poll, guard_s, "rapl wrap guard")
        self.guard_s = guard_s
        self._resolution_s = RAPL_UPDATE_PERIOD_S
        self.notes = (
            f"rapl: {len(zones)} zones under {root}, read every {guard_s:g} s "
            "while a window is open so that no counter wrap is missed",
        )

    @property
    def domains(self) -> Mapping[str, Domain]:
        return self._domains

    def _totals_uj(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(u.update(_read_int(p)) for u, p in zip(self._unwrappers, self._paths))

    def _poll(self) -> None:
        self._totals_uj()

    def _read(self) -> Reading:
        totals = self._totals_uj()
        if self._cpu_time is None:
            return Reading(t=time.perf_counter(), state=(totals, None))
        tree, machine = self._cpu_time
        return Reading(t=time.perf_counter(), state=(totals, (tree(), machine())))

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        self._guard.check()
        (ta, cpu_a), (tb, cpu_b) = a.state, b.state
        out = {n: (vb - va) / 1e6 for n, va, vb in zip(self._names, ta, tb)}
        if cpu_a is not None and cpu_b is not None:
            share = attributed_share(cpu_b[0] - cpu_a[0], cpu_b[1] - cpu_a[1])
            out[PROCESS] = share * sum(out[p] for p in self._packages)
        return out

    def _start(self) -> None:
        self._guard.start()

    def _stop(self) -> None:
        self._guard.stop()


def create(options: MeterSettings) -> RaplMeter:
    root = options.resolved_powercap_root()
    try:
        zones = discover_zones(root)
    except PermissionError as exc:
        raise MeterUnavailable(BACKEND, f"cannot read {exc.filename}: {PERMISSION_HINT}") from exc
    except (OSError, ValueError) as exc:
        raise MeterUnavailable(BACKEND, f"unreadable powercap tree under {root}: {exc}") from exc
    if not zones:
        raise MeterUnavailable(
            BACKEND,
            f"no RAPL zones under {root} (not a Linux machine with Intel/AMD RAPL, or the "
            "intel_rapl_common module is not loaded; set LLMENERGY_POWERCAP_ROOT if the tree "
            "is elsewhere)",
        )
    for zone in zones:  # energy_uj is where permissions bite; fail at open, not mid-run
        try:
            _read_int(zone.energy_path)
        except PermissionError as exc:
            raise MeterUnavailable(
                BACKEND, f"cannot read {zone.energy_path}: {PERMISSION_HINT}"
            ) from exc
        except OSError as exc:
            raise MeterUnavailable(
                BACKEND, f"cannot read {zone.energy_path}: {exc.strerror or exc}"
            ) from exc
        except MeterError as exc:
            raise MeterUnavailable(BACKEND, str(exc)) from exc
    meter = RaplMeter(
        zones,
        guard_interval_s(zones, options.sample_interval_s),
        root,
        tree_cpu_s=cpu_reader(options.attributed_pids),
        machine_busy_s=machine_busy_cpu_seconds,
    )
    if options.attributed_pids:  # cpu:process covers the server's tree too
        meter.notes = (*meter.notes, attributed_note(options.attributed_pids))
    return meter
