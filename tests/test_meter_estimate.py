"""The estimate backend: TDP lookup, the TDP x utilization arithmetic, and a real run."""

from __future__ import annotations

import os
import sys
import time

import pytest

from pytest_llmenergy.errors import MeterUnavailable
from pytest_llmenergy.meters import Method, open_meter
from pytest_llmenergy.meters.cpu_tdp import (
    DEFAULT_W_PER_CPU,
    _table,
    brand_from_cpuinfo,
    cpu_brand,
    lookup_tdp,
    parse_table,
    resolve_tdp,
    tokens,
)
from pytest_llmenergy.meters.estimate import (
    DOMAIN,
    EstimateMeter,
    create,
    machine_logical_cpus,
)
from pytest_llmenergy.meters.meter_settings import MeterSettings


# -- TDP table lookup -------------------------------------------------------------
@pytest.mark.parametrize(
    ("brand", "model", "watts"),
    [
        ("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", "Xeon Platinum 8380", 270),
        ("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", "Xeon Gold 6148", 150),
        ("Intel(R) Xeon(R) Gold 6248R CPU @ 3.00GHz", "Xeon Gold 6248R", 205),
        ("Intel(R) Xeon(R) Platinum 8480+", "Xeon Platinum 8480+", 350),
        ("INTEL(R) XEON(R) PLATINUM 8592+", "Xeon Platinum 8592+", 350),
        ("Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz", "Xeon E5-2680 v4", 120),
        ("Intel(R) Xeon(R) CPU E5-2670 0 @ 2.60GHz", "Xeon E5-2670", 115),
        ("Intel(R) Xeon(R) CPU E5-2670 v3 @ 2.30GHz", "Xeon E5-2670 v3", 120),
        ("Intel(R) Xeon(R) E-2288G CPU @ 3.70GHz", "Xeon E-2288G", 95),
        ("Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz", "Core i7-8700K", 95),
        ("13th Gen Intel(R) Core(TM) i9-13900K", "Core i9-13900K", 125),
        ("Intel(R) Core(TM) i7-1065G7 CPU @ 1.30GHz", "Core i7-1065G7", 15),
        ("11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", "Core i7-1165G7", 28),
        ("Intel(R) Core(TM) Ultra 7 155H", "Core Ultra 7 155H", 28),
        ("AMD EPYC 7763 64-Core Processor", "EPYC 7763", 280),
        ("AMD EPYC 7702P 64-Core Processor", "EPYC 7702P", 200),
        ("AMD EPYC 9654 96-Core Processor", "EPYC 9654", 360),
        ("AMD Ryzen 9 5950X 16-Core Processor", "Ryzen 9 5950X", 105),
        ("AMD Ryzen 7 5800X3D 8-Core Processor", "Ryzen 7 5800X3D", 105),
        ("AMD Ryzen 7 4800U with Radeon Graphics", "Ryzen 7 4800U", 15),
        ("AMD Ryzen Threadripper PRO 5995WX 64-Cores", "Ryzen Threadripper PRO 5995WX", 280),
        ("AMD Ryzen Threadripper 3990X 64-Core Processor", "Ryzen Threadripper 3990X", 280),
        ("Apple M1", "M1", 20),
        ("Apple M1 Pro", "M1 Pro", 30),
        ("Apple M1 Max", "M1 Max", 30),
        ("Apple M2 Ultra", "M2 Ultra", 70),
        ("Apple M3 Max", "M3 Max", 50),
        ("AWS Graviton2 (Neoverse-N1)", "Graviton2", 110),
    ],
)
def test_lookup_known_brands(brand: str, model: str, watts: float) -> None:
    found = lookup_tdp(brand)
    assert found is not None, brand
    assert (found.model, found.watts, found.kind) == (model, watts, "table")
    assert found.source == f"table: {model} = {watts:g} W"


@pytest.mark.parametrize(
    "brand",
    [
        "Intel(R) Xeon(R) Processor",  # VM with the model hidden
        "Intel(R) Core(TM) i7-10650 CPU",  # not i7-1065G7, not i7-10650H
        "Intel(R) Core(TM) i7-1065 CPU",
        "Intel(R) Core(TM) i9-13900KF",  # a different SKU than the 13900K row
        "Intel(R) Xeon(R) Platinum 8480C",  # cloud SKU, not 8480+
        "Intel(R) Xeon(R) CPU E5-2680 v2 @ 2.80GHz",  # no v2 row; v3/v4 must not match
        "Intel(R) Xeon(R) CPU E5-2690 0 @ 2.90GHz",  # only v3/v4 rows exist
        "AMD EPYC 7R13 Processor",
        "AMD EPYC 776 Processor",  # a prefix of 7763
        "AMD Ryzen 9 59500X",
        "Intel(R) Xeon(R) CPU E5-2670 v4",  # made up: must not fall back to the v1 row
        "Apple M3 Ultra",  # must not fall back to the M3 row
        "Apple M4 Max",
        "Apple M5",
        "Neoverse-N1",
        "",
        "unknown",
    ],
)
def test_lookup_has_no_false_match(brand: str) -> None:
    assert lookup_tdp(brand) is None


def test_longest_row_wins_over_its_prefix() -> None:
    m1 = lookup_tdp("Apple M1 Ultra")
    assert m1 is not None and m1.model == "M1 Ultra"
    v3 = lookup_tdp("Intel(R) Xeon(R) CPU E5-2670 v3 @ 2.30GHz")
    assert v3 is not None and v3.model == "Xeon E5-2670 v3"


def test_tokens_drop_noise_and_clock() -> None:
    assert tokens("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz") == ("xeon", "platinum", "8380")
    assert tokens("Intel(R) Xeon(R) Platinum 8480+") == ("xeon", "platinum", "8480+")


def test_table_is_well_formed_and_every_row_finds_itself() -> None:
    rows = _table()
    assert len(rows) >= 120
    names = [model for _, model, _ in rows]
    assert len(names) == len(set(names)), "duplicate model rows"
    keys = [toks for toks, _, _ in rows]
    assert len(keys) == len(set(keys)), "two rows normalize to the same tokens"
    for toks, model, watts in rows:
        assert toks, model
        assert 5 <= watts <= 600, model
        found = lookup_tdp(model)
        assert found is not None and found.model == model, model


def test_parse_table_rejects_bad_rows() -> None:
    assert parse_table("# c\nmodel,tdp_w\nFoo 1,10\n") == [("Foo 1", 10.0)]
    with pytest.raises(ValueError, match="row 1"):
        parse_table("model,tdp_w\nFoo 1,0\n")


def test_resolve_override_beats_table_and_default() -> None:
    brand = "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz"
    over = resolve_tdp(brand, 160, 65.0)
    assert (over.watts, over.kind, over.source) == (65.0, "override", "--energy-cpu-tdp=65")
    assert resolve_tdp("Intel(R) Xeon(R) Processor", 2, 12.5).watts == 12.5
    table = resolve_tdp(brand, 160, None)
    assert (table.watts, table.kind) == (270.0, "table")
    with pytest.raises(ValueError):
        resolve_tdp(brand, 4, 0.0)


def test_resolve_default_is_10_w_per_logical_cpu() -> None:
    found = resolve_tdp("Intel(R) Xeon(R) Processor", 2, None)
    assert found.kind == "default"
    assert found.watts == 2 * DEFAULT_W_PER_CPU == 20.0
    assert found.source == (
        "default: unknown CPU model 'Intel(R) Xeon(R) Processor', 10 W per logical CPU x 2;"
        " pass --energy-cpu-tdp=WATTS"
    )
    assert resolve_tdp("mystery", 0, None).watts == DEFAULT_W_PER_CPU  # never 0 W


# -- brand detection ----------------------------------------------------------------
def test_brand_from_cpuinfo() -> None:
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6148\n"
    assert brand_from_cpuinfo(x86) == "Intel(R) Xeon(R) Gold 6148"
    arm = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    assert brand_from_cpuinfo(arm, "Amazon EC2\n") == "AWS Graviton2 (Neoverse-N1)"
    assert brand_from_cpuinfo(arm, "Ampere(R)\n") == "Neoverse-N1"
    assert brand_from_cpuinfo("processor\t: 0\n") is None


def test_cpu_brand_is_a_nonempty_string() -> None:
    brand = cpu_brand()
    assert isinstance(brand, str) and brand.strip()


# -- the energy arithmetic against a known truth ----------------------------------
class FakeProcess:
    """A scripted clock and CPU-time counter: the test decides how both advance."""

    def __init__(self) -> None:
        self.t_s = 1000.0
        self.cpu_s = 5.0

    def advance(self, wall_s: float, cpu_s: float) -> None:
        self.t_s += wall_s
        self.cpu_s += cpu_s

    def clock(self) -> float:
        return self.t_s

    def cpu_seconds(self) -> float:
        return self.cpu_s


def fake_meter(watts: float = 80.0, cpus: int = 4) -> tuple[EstimateMeter, FakeProcess]:
    proc = FakeProcess()
    tdp = resolve_tdp("fake", cpus, watts)
    return EstimateMeter(tdp, cpus, proc.cpu_seconds, proc.clock, brand="fake"), proc


def test_energy_is_tdp_times_cpu_seconds_over_cpus() -> None:
    meter, proc = fake_meter(watts=80.0, cpus=4)  # 20 J per CPU-second
    with meter.measure("prefill") as w:
        proc.advance(wall_s=2.0, cpu_s=3.0)  # 1.5 CPUs busy
        w.mark("decode")
        proc.advance(wall_s=1.0, cpu_s=0.5)
    m = w.measurement
    assert m.seconds == 3.0
    assert m.by_domain == {DOMAIN: 70.0}
    assert m.phases["prefill"].by_domain[DOMAIN] == 60.0
    assert m.phases["decode"].by_domain[DOMAIN] == 10.0
    assert m.phases["decode"].offset_s == 2.0
    assert m.joules == 70.0
    assert m.power_w == pytest.approx(70.0 / 3.0)


def test_all_cpus_busy_draws_the_full_tdp_and_idle_draws_nothing() -> None:
    meter, proc = fake_meter(watts=65.0, cpus=8)
    with meter.measure() as busy:
        proc.advance(wall_s=2.0, cpu_s=16.0)
    assert busy.joules == pytest.approx(65.0 * 2.0)
    assert busy.measurement.power_w == pytest.approx(65.0)
    with meter.measure() as idle:
        proc.advance(wall_s=5.0, cpu_s=0.0)
    assert idle.joules == 0.0


def test_nested_windows_share_the_counter() -> None:
    meter, proc = fake_meter(watts=40.0, cpus=2)  # 20 J per CPU-second
    with meter.measure() as outer:
        proc.advance(1.0, 0.25)
        with meter.measure() as inner:
            proc.advance(1.0, 1.0)
        proc.advance(1.0, 0.25)
    assert inner.joules == 20.0
    assert outer.joules == 30.0


def test_domain_is_estimated() -> None:
    meter, proc = fake_meter()
    assert dict(meter.domains) == {DOMAIN: meter.domains[DOMAIN]}
    assert meter.domains[DOMAIN].method is Method.ESTIMATED
    with meter.measure() as w:
        proc.advance(1.0, 1.0)
    assert w.methods == {DOMAIN: Method.ESTIMATED}
    assert w.measurement.estimated is True
    assert w.measurement.backend == "estimate"
    assert "--energy-cpu-tdp=80" in meter.describe()
    assert any("estimated" in note for note in meter.notes)
    assert any("--energy-cpu-tdp=80" in note for note in meter.notes)


def test_meter_rejects_zero_cpus() -> None:
    with pytest.raises(ValueError):
        EstimateMeter(resolve_tdp("x", 1, 10.0), 0, lambda: 0.0)


# -- the real thing -------------------------------------------------------------------
def _spin_cpu(cpu_s: float) -> None:
    """Burn ``cpu_s`` of this process's CPU time, however long a busy machine makes it take."""
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def test_real_busy_loop_and_sleep() -> None:
    meter = create(MeterSettings())
    per_cpu_w = meter.tdp.watts / meter.logical_cpus
    assert meter.watts_per_cpu == pytest.approx(per_cpu_w)

    cpu0 = time.process_time()
    with meter.measure() as busy:
        _spin_cpu(0.3)
    cpu_s = time.process_time() - cpu0
    wall_s = busy.seconds
    assert wall_s >= 0.3
    # The meter reads the same nanosecond clock, a few microseconds inside these reads.
    assert busy.joules == pytest.approx(per_cpu_w * cpu_s, rel=0.01)
    # One thread cannot use more CPU than wall time; on an idle machine the two are
    # equal.  No lower bound: a shared machine may stretch the wall time arbitrarily.
    assert busy.joules <= per_cpu_w * (wall_s + 0.001)

    with meter.measure() as idle:
        time.sleep(0.3)
    assert idle.seconds >= 0.3
    assert idle.joules <= per_cpu_w * 0.01  # bookkeeping only (other threads may tick)


def test_open_meter_with_tdp_override() -> None:
    with open_meter("estimate", cpu_tdp_w=65) as meter:
        assert isinstance(meter, EstimateMeter)
        assert meter.tdp.watts == 65.0
        assert meter.tdp.kind == "override"
        assert meter.watts_per_cpu == pytest.approx(65.0 / meter.logical_cpus)
        with meter.measure() as w:
            _spin_cpu(0.05)
        assert w.measurement.estimated


def test_logical_cpus_are_the_machines_not_the_affinity_mask() -> None:
    import psutil

    assert machine_logical_cpus(psutil) == psutil.cpu_count()
    assert machine_logical_cpus() == os.cpu_count()


def test_missing_psutil_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(MeterUnavailable, match="pip install psutil") as info:
        create(MeterSettings())
    assert info.value.backend == "estimate"
