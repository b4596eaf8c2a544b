"""A fake Linux powercap tree in a temp dir, laid out as the kernel lays it out.

``root/intel-rapl/intel-rapl:S[/intel-rapl:S:Z]`` holds the zones, and ``root`` has the
flat ``intel-rapl:S`` and ``intel-rapl:S:Z`` links that /sys/class/powercap has.  While
started, a writer thread advances every ``energy_uj`` from its power trace and wraps it
at ``max_energy_range_uj``, replacing files atomically as sysfs values appear.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .trace import PowerTrace


@dataclass
class FakeZone:
    name: str  # "package-0", "core", "uncore", "dram", "psys"
    trace: PowerTrace
    max_range_uj: int = 262_143_328_850
    offset_uj: int = 0
    max_power_uw: int | None = None
    path: Path = field(default=Path(), init=False)

    def raw_at(self, t: float) -> int:
        return (self.offset_uj + int(self.trace.energy_until(t) * 1e6)) % self.max_range_uj

    def wraps_between(self, t0: float, t1: float) -> int:
        total0 = self.offset_uj + int(self.trace.energy_until(t0) * 1e6)
        total1 = self.offset_uj + int(self.trace.energy_until(t1) * 1e6)
        return total1 // self.max_range_uj - total0 // self.max_range_uj


class FakePowercap:
    """``sockets`` maps socket index -> (package zone, [subzones]); ``extra`` are top-level."""

    def __init__(
        self,
        root: Path,
        sockets: dict[int, tuple[FakeZone, list[FakeZone]]],
        extra: list[FakeZone] | None = None,
        tick_s: float = 0.002,
    ) -> None:
        self.root = root
        self.tick_s = tick_s
        self.zones: list[FakeZone] = []
        self.max_gap_s = 0.0  # longest time between two writes: the counters' resolution
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        control = root / "intel-rapl"
        control.mkdir(parents=True)
        top = dict(sockets)
        for i, zone in enumerate(extra or [], start=len(sockets)):
            top[i] = (zone, [])
        for s, (pkg, subs) in top.items():
            pkg.path = control / f"intel-rapl:{s}"
            self._make(pkg, root / f"intel-rapl:{s}")
            for z, sub in enumerate(subs):
                sub.path = pkg.path / f"intel-rapl:{s}:{z}"
                self._make(sub, root / f"intel-rapl:{s}:{z}")
        self._write_all(time.perf_counter())

    def _make(self, zone: FakeZone, link: Path) -> None:
        zone.path.mkdir()
        (zone.path / "name").write_text(zone.name + "\n")
        (zone.path / "max_energy_range_uj").write_text(f"{zone.max_range_uj}\n")
        if zone.max_power_uw is not None:
            (zone.path / "constraint_0_max_power_uw").write_text(f"{zone.max_power_uw}\n")
        (zone.path / "enabled").write_text("1\n")
        os.symlink(zone.path, link)
        self.zones.append(zone)

    def _write_all(self, t: float) -> None:
        for zone in self.zones:
            tmp = zone.path / ".energy_uj.tmp"
            tmp.write_text(f"{zone.raw_at(t)}\n")
            os.replace(tmp, zone.path / "energy_uj")

    def _run(self, last: float) -> None:
        while not self._stop.wait(self.tick_s):
            now = time.perf_counter()
            self._write_all(now)
            self.max_gap_s = max(self.max_gap_s, now - last)
            last = now

    def start(self) -> FakePowercap:
        """Write once now, so that readers never see the values written at construction."""
        now = time.perf_counter()
        self._write_all(now)
        self._thread = threading.Thread(
            target=self._run, args=(now,), name="fake powercap", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FakePowercap:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
