"""The pyJoules adapter, with the real pyJoules reading a fake powercap tree."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pytest_llmenergy import MeterError, MeterUnavailable, open_meter
from pytest_llmenergy.meters.pyjoules import domain_for
from tests.fakes.powercap import FakePowercap, FakeZone
from tests.fakes.trace import PowerTrace

pytest.importorskip("pyJoules", reason="pyJoules is in the dev extra; install .[dev]")


def test_domain_names_and_units_are_mapped() -> None:
    assert domain_for("package_1")[0].name == "cpu:package-1"
    assert domain_for("package_1")[1] == 1e-6
    assert domain_for("core_0")[0].counted is False
    assert domain_for("dram_0")[0].counted is True
    assert domain_for("nvidia_gpu_2") == (domain_for("nvidia_gpu_2")[0], 1e-3)
    assert domain_for("nvidia_gpu_2")[0].name == "gpu:2"
    with pytest.raises(MeterUnavailable, match="unknown domain"):
        domain_for("psys_0")


def test_energy_matches_the_trace(tmp_path: Path) -> None:
    pkg = FakeZone("package-0", PowerTrace([(0.15, 30.0), (10, 75.0)]))
    core = FakeZone("core", PowerTrace([(10, 20.0)]))
    dram = FakeZone("dram", PowerTrace([(10, 6.0)]))
    fake = FakePowercap(tmp_path, {0: (pkg, [core, dram])})
    meter = open_meter("pyjoules", powercap_root=str(tmp_path))
    assert set(meter.domains) == {"cpu:package-0", "cpu:core-0", "cpu:dram-0"}
    with fake, meter.measure() as m:
        time.sleep(0.3)
    res = m.measurement
    for zone, domain in [(pkg, "cpu:package-0"), (core, "cpu:core-0"), (dram, "cpu:dram-0")]:
        truth = zone.trace.energy_between(res.t_start, res.t_end)
        assert abs(res.by_domain[domain] - truth) <= 2 * zone.trace.max_power() * fake.max_gap_s
    assert res.joules == pytest.approx(res.by_domain["cpu:package-0"] + res.by_domain["cpu:dram-0"])
    # RAPL registers only: they update about every millisecond.
    assert meter.resolution_s == 0.001
    assert meter.describe().endswith("; resolution 1 ms")


def test_a_wrap_inside_the_window_is_an_error_not_a_negative_number(tmp_path: Path) -> None:
    # idle, then 1 J through a 2 J counter that is 1 mJ short of wrapping: it wraps once
    trace = PowerTrace([(0.3, 0.0), (10, 5.0)])
    pkg = FakeZone("package-0", trace, max_range_uj=2_000_000, offset_uj=1_999_000)
    fake = FakePowercap(tmp_path, {0: (pkg, [])})
    meter = open_meter("pyjoules", powercap_root=str(tmp_path))
    with fake, pytest.raises(MeterError, match="use --energy-backend=rapl"), meter.measure():
        assert time.perf_counter() < trace.origin + 0.3, "setup too slow for this test"
        time.sleep(trace.origin + 0.5 - time.perf_counter())


def test_no_devices_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailable, match="pyJoules found no RAPL"):
        open_meter("pyjoules", powercap_root=str(tmp_path))
