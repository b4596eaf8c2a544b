"""pytest-benchmark users see energy: the joules of every ``benchmark`` test's rounds.

With pytest-benchmark installed, each test that uses its ``benchmark`` fixture runs inside
one window of the session's meter.  The window holds pytest-benchmark's calibration,
warm-up and rounds, so the joules per round are the window's mean power times the mean
round time; both go into the benchmark's ``extra_info``, which ``--benchmark-json``,
``--benchmark-save`` and ``pytest-benchmark compare`` carry.  And ``--benchmark-only`` does
not skip the energy benchmark cases: they are benchmarks too.

Only in a session that measures (``activity.py``): a plain pytest-benchmark session, with
none of this plugin's options or fixtures, leaves ``extra_info`` as its tests wrote it
(pytest-benchmark's own suite compares it whole).  ``--energy-benchmark-extra-info``
chooses: ``auto`` (that), ``on`` (every ``benchmark`` test measures, and the session with
it), ``off`` (never, in a measuring session too).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest

from .. import values
from ..meters import Meter
from .cases import uses_energy_benchmark
from .meter import Metering
from .option_rows import Option, Section

# --energy-benchmark-extra-info's values
EXTRA_INFO = ("auto", "on", "off")


@dataclass(frozen=True)
class BenchmarkSettings:
    # the energy_* keys in pytest-benchmark's extra_info: auto (in a session that
    # measures), on (always: its tests measure), off (never)
    extra_info: str = "auto"


BENCHMARK_FIXTURE = "benchmark"  # pytest-benchmark's
_ONLY_REASON = "--benchmark-only"  # in the reason of the skip marker it adds to other tests


class BenchmarkEnergy:
    """Owns nothing but the windows around ``benchmark`` tests; registered only when
    pytest-benchmark is."""

    def __init__(self, metering: Metering, settings: BenchmarkSettings) -> None:
        self.metering = metering
        self.settings = settings

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Undo ``--benchmark-only``'s skip for energy benchmark cases."""
        for item in items:
            if not uses_energy_benchmark(item):
                continue
            item.own_markers[:] = [
                m
                for m in item.own_markers
                if not (m.name == "skip" and _ONLY_REASON in str(m.kwargs.get("reason", "")))
            ]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, None]:
        meter = self.metering.meter  # None in a session that measures nothing
        off = self.settings.extra_info == "off"
        if off or meter is None or BENCHMARK_FIXTURE not in getattr(item, "fixturenames", ()):
            yield
            return
        with meter.measure() as window:
            yield
        fixture = getattr(item, "funcargs", {}).get(BENCHMARK_FIXTURE)
        if fixture is not None:
            fixture.extra_info.update(energy_info(meter, window.measurement, fixture))


def energy_info(meter: Meter, measurement: Any, fixture: Any) -> dict[str, object]:
    """What a benchmark's ``extra_info`` gets: joules of the window, mean power, and the
    joules of a mean round (mean power x mean round time)."""
    seconds = measurement.seconds
    power_w = measurement.joules / seconds if seconds > 0 else None
    metadata = getattr(fixture, "stats", None)
    stats = getattr(metadata, "stats", None)
    mean_s = getattr(stats, "mean", None) if stats else None
    estimated = any(str(d.method) == "estimated" for d in meter.domains.values() if d.counted)
    return {
        "energy_j": measurement.joules,
        "energy_window_s": seconds,
        "energy_power_w": power_w,
        "energy_per_round_j": power_w * mean_s if power_w is not None and mean_s else None,
        "energy_meter": meter.backend,
        "energy_estimated": estimated,
    }


BENCHMARK_OPTIONS = Section(
    "benchmark",
    "pytest-benchmark",
    BenchmarkSettings,
    (
        Option(
            "--energy-benchmark-extra-info",
            "extra_info",
            values.choice(
                EXTRA_INFO, {**dict.fromkeys(values.ON, "on"), **dict.fromkeys(values.OFF, "off")}
            ),
            "|".join(EXTRA_INFO),
            "with pytest-benchmark: the joules of each benchmark test's window in its "
            "extra_info (energy_j, energy_window_s, energy_power_w, energy_per_round_j, "
            "energy_meter, energy_estimated).  auto: in a session that measures (an option "
            "of this plugin given, or a test using its fixtures); a plain pytest-benchmark "
            "session's extra_info is left as its tests wrote it; on: always, every "
            "benchmark test measured; off: never",
            const="on",
        ),
    ),
)
