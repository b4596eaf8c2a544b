"""The resolution the RAPL and estimate meters report (the other meters' is tested in
their own files): the shortest stretch whose energy each can tell apart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pytest_llmenergy import open_meter
from pytest_llmenergy.meters.rapl import RAPL_UPDATE_PERIOD_S
from tests.fakes.powercap import FakePowercap, FakeZone
from tests.fakes.trace import PowerTrace


def test_rapl_reports_the_registers_update_period(tmp_path: Path) -> None:
    FakePowercap(tmp_path, {0: (FakeZone("package-0", PowerTrace([(10, 40.0)])), [])})
    with open_meter("rapl", powercap_root=str(tmp_path)) as meter:
        assert RAPL_UPDATE_PERIOD_S == 0.001
        assert meter.resolution_s == 0.001
        assert meter.describe().endswith("; resolution 1 ms")


def test_estimate_reports_the_cpu_time_clock_resolution() -> None:
    with open_meter("estimate", cpu_tdp_w=65) as meter:
        expected_s = time.get_clock_info("process_time").resolution
        assert meter.resolution_s == expected_s
        assert meter.resolution_s is not None and 0 < meter.resolution_s <= 0.02


@pytest.mark.parametrize("interval_s", [0.05, 0.25])
def test_an_interval_option_does_not_change_rapl_resolution(
    tmp_path: Path, interval_s: float
) -> None:
    """RAPL's option sets how often its wrap guard reads, not what the counters resolve."""
    FakePowercap(tmp_path, {0: (FakeZone("package-0", PowerTrace([(10, 40.0)])), [])})
    meter = open_meter("rapl", powercap_root=str(tmp_path), sample_interval_s=interval_s)
    with meter:
        assert meter.resolution_s == RAPL_UPDATE_PERIOD_S
