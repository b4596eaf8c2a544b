"""RAPL through a fake powercap tree whose counters advance and wrap while measured."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_llmenergy import MeterUnavailable, Method, open_meter
from pytest_llmenergy.meters.rapl import (
    PROCESS,
    CounterUnwrapper,
    RaplMeter,
    attributed_share,
    discover_zones,
    guard_interval_s,
)
from tests.fakes.powercap import FakePowercap, FakeZone
from tests.fakes.trace import PowerTrace


def two_socket_tree(root: Path) -> FakePowercap:
    """Two packages with core, uncore and dram; small ranges so counters wrap often."""
    sockets = {}
    for s in (0, 1):
        pkg = FakeZone(
            f"package-{s}",
            PowerTrace([(0.25, 40.0 + 10 * s), (0.25, 95.0), (10, 60.0)]),
            max_range_uj=4_000_000,  # 4 J: wraps every ~40-100 ms
            offset_uj=3_900_000,  # the first wrap comes almost at once
            max_power_uw=120_000_000,
        )
        core = FakeZone("core", PowerTrace([(0.25, 25.0), (10, 70.0)]), max_range_uj=3_000_000)
        uncore = FakeZone("uncore", PowerTrace([(10, 4.0)]), max_range_uj=262_143_328_850)
        dram = FakeZone("dram", PowerTrace([(0.3, 3.0), (10, 9.0)]), max_range_uj=65_712_999_613)
        sockets[s] = (pkg, [core, uncore, dram])
    psys = FakeZone("psys", PowerTrace([(10, 150.0)]))
    return FakePowercap(root, sockets, extra=[psys])


def test_unwrapper_counts_every_wrap() -> None:
    unwrap = CounterUnwrapper(max_range=1000)
    raws = [990, 10, 500, 999, 3, 700, 200, 201]  # wraps after 990, 999 and 700
    totals = [unwrap.update(r) for r in raws]
    assert totals == [0, 20, 510, 1009, 1013, 1710, 2210, 2211]


def test_zones_and_domains_follow_the_kernel_layout(tmp_path: Path) -> None:
    two_socket_tree(tmp_path)
    zones = {z.domain.name: z.domain for z in discover_zones(str(tmp_path))}
    assert set(zones) == {
        "cpu:package-0", "cpu:core-0", "cpu:uncore-0", "cpu:dram-0",
        "cpu:package-1", "cpu:core-1", "cpu:uncore-1", "cpu:dram-1", "cpu:psys",
    }  # fmt: skip
    counted = {name for name, d in zones.items() if d.counted}
    assert counted == {"cpu:package-0", "cpu:dram-0", "cpu:package-1", "cpu:dram-1"}
    assert all(d.method is Method.COUNTER for d in zones.values())


def test_guard_reads_four_times_per_wrap_period(tmp_path: Path) -> None:
    two_socket_tree(tmp_path)
    zones = discover_zones(str(tmp_path))
    # package: 4 J at <= 120 W wraps after 33 ms; the core zone has no limit (1 kW assumed)
    assert guard_interval_s(zones, None) == pytest.approx(0.001)
    big = [z for z in zones if z.domain.name == "cpu:uncore-0"]
    assert guard_interval_s(big, None) == 1.0  # capped
    assert guard_interval_s(big, 0.2) == 0.2


def test_energy_over_many_wraps_matches_the_trace(tmp_path: Path) -> None:
    fake = two_socket_tree(tmp_path)
    meter = open_meter("rapl", powercap_root=str(tmp_path))
    with fake, meter.measure(phase="first") as m:
        time.sleep(0.35)
        m.mark("second")
        time.sleep(0.35)
    res = m.measurement
    zones = {z.path.name: z for z in fake.zones}
    names = {
        "cpu:package-0": "intel-rapl:0", "cpu:core-0": "intel-rapl:0:0",
        "cpu:uncore-0": "intel-rapl:0:1", "cpu:dram-0": "intel-rapl:0:2",
        "cpu:package-1": "intel-rapl:1", "cpu:psys": "intel-rapl:2",
    }  # fmt: skip
    # resolution: what the counter can lag behind the trace, at each edge
    for domain, zone_dir in names.items():
        zone = zones[zone_dir]
        truth = zone.trace.energy_between(res.t_start, res.t_end)
        resolution_j = 2 * zone.trace.max_power() * fake.max_gap_s + 2e-6
        assert abs(res.by_domain[domain] - truth) <= resolution_j, domain
        split = res.t_start + res.phases["second"].offset_s
        first_truth = zone.trace.energy_between(res.t_start, split)
        assert abs(res.phases["first"].by_domain[domain] - first_truth) <= resolution_j
    pkg0 = zones["intel-rapl:0"]
    assert pkg0.wraps_between(res.t_start, res.t_end) >= 5  # the point of the test
    counted = ["cpu:package-0", "cpu:dram-0", "cpu:package-1", "cpu:dram-1"]
    assert res.joules == pytest.approx(sum(res.by_domain[d] for d in counted))


def test_guard_thread_runs_only_while_a_window_is_open(tmp_path: Path) -> None:
    two_socket_tree(tmp_path)
    meter = open_meter("rapl", powercap_root=str(tmp_path))
    assert meter._guard._thread is None
    with meter.measure():
        assert meter._guard._thread is not None and meter._guard._thread.is_alive()
    assert meter._guard._thread is None


def test_no_powercap_tree_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailable, match="no RAPL zones under") as err:
        open_meter("rapl", powercap_root=str(tmp_path / "missing"))
    assert "\n" not in str(err.value)


def test_powercap_root_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_socket_tree(tmp_path)
    monkeypatch.setenv("LLMENERGY_POWERCAP_ROOT", str(tmp_path))
    assert "cpu:package-1" in open_meter("rapl").domains


def test_unreadable_energy_uj_says_how_to_grant_access(tmp_path: Path) -> None:
    """A real PermissionError: as root, the check runs without the capabilities that bypass
    file permissions (CAP_DAC_OVERRIDE), like an ordinary user."""
    two_socket_tree(tmp_path)
    for z in (tmp_path / "intel-rapl").rglob("energy_uj"):
        z.chmod(0)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
        caps = "-dac_override,-dac_read_search"
        prefix = [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]
    code = (
        "from pytest_llmenergy import open_meter, MeterUnavailable\n"
        f"try:\n    open_meter('rapl', powercap_root={str(tmp_path)!r})\n"
        "except MeterUnavailable as e:\n    print(e)\nelse:\n    print('OPENED')\n"
    )
    out = subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "OPENED" not in out.stdout
    assert "energy_uj is readable only by root" in out.stdout
    assert "chmod a+r" in out.stdout


def test_the_process_share_of_the_packages_is_attributed(tmp_path: Path) -> None:
    """Scripted CPU counters: this tree used a quarter of the machine's busy CPU time, so
    it is attributed a quarter of both packages' energy, beside (not in) the totals."""
    fake = two_socket_tree(tmp_path)
    cpu = {"tree": 0.0, "machine": 0.0}
    zones = discover_zones(str(tmp_path))
    meter = RaplMeter(
        zones,
        guard_interval_s(zones, None),
        str(tmp_path),
        tree_cpu_s=lambda: cpu["tree"],
        machine_busy_s=lambda: cpu["machine"],
    )
    assert meter.domains[PROCESS].method is Method.ATTRIBUTED
    assert not meter.domains[PROCESS].counted
    with fake, meter.measure() as m:
        time.sleep(0.2)
        cpu["tree"] += 0.1
        cpu["machine"] += 0.4
    res = m.measurement
    packages = res.by_domain["cpu:package-0"] + res.by_domain["cpu:package-1"]
    assert res.by_domain[PROCESS] == pytest.approx(0.25 * packages)
    counted = ["cpu:package-0", "cpu:dram-0", "cpu:package-1", "cpu:dram-1"]
    assert res.joules == pytest.approx(sum(res.by_domain[d] for d in counted))


def test_the_share_within_a_tick() -> None:
    assert attributed_share(0.1, 0.4) == 0.25
    assert attributed_share(0.5, 0.4) == 1.0  # tick rounding: never more than all
    assert attributed_share(0.001, 0.0) == 1.0  # no tick passed, but this tree ran
    assert attributed_share(0.0, 0.0) == 0.0
