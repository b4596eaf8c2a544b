"""The NVML meter against a fake pynvml whose GPUs follow traces of known energy."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types
from typing import Any

import pytest

from pytest_llmenergy import (
    ConfigError,
    MeterError,
    MeterSettings,
    MeterUnavailable,
    Method,
    open_meter,
)
from pytest_llmenergy.meters.nvml import (
    PERIOD_PROBE_MAX_S,
    SAMPLER_THREAD_NAME,
    NvmlMeter,
    counter_periods_s,
    create,
)
from pytest_llmenergy.meters.readings import duration_text
from tests.fakes.fake_pynvml import (
    NVML_DEVICE_ARCH_AMPERE,
    NVML_DEVICE_ARCH_HOPPER,
    NVML_DEVICE_ARCH_PASCAL,
    NVML_DEVICE_ARCH_VOLTA,
    NVML_ERROR_DRIVER_NOT_LOADED,
    FakeGPU,
    fake_mig_uuid,
    fake_uuid,
    install_fake_pynvml,
    install_fake_pynvml_without_library,
)
from tests.fakes.trace import PowerTrace

ARCH_NAMES = {
    NVML_DEVICE_ARCH_PASCAL: "Tesla P100",
    NVML_DEVICE_ARCH_VOLTA: "Tesla V100",
    NVML_DEVICE_ARCH_AMPERE: "NVIDIA A100",
    NVML_DEVICE_ARCH_HOPPER: "NVIDIA H100",
}


def make_gpu(
    n: int, arch: int | None = NVML_DEVICE_ARCH_AMPERE, trace: PowerTrace | None = None, **kw: Any
) -> FakeGPU:
    name = f"{ARCH_NAMES.get(arch or 0, 'Fake GPU')} #{n}"
    return FakeGPU(name, fake_uuid(n), arch, trace or PowerTrace([(60.0, 100.0)]), **kw)


def resolution_j(gpu: FakeGPU) -> float:
    """What a counter refreshed every period can be off by: a period at full power per edge."""
    return 2 * gpu.counter_period_s * gpu.trace.max_power() + 0.001


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SAMPLER_THREAD_NAME]


@pytest.fixture(autouse=True)
def _clean_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


# -- counter GPUs ----------------------------------------------------------------------


def test_counter_window_matches_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = PowerTrace([(0.06, 80.0), (0.1, 300.0), (0.08, 150.0), (60.0, 220.0)])
    gpu = make_gpu(0, NVML_DEVICE_ARCH_VOLTA, trace, counter_period_s=0.005)
    gpu.energy_offset_mj = 987_654_321_000  # the counter counts since the driver loaded
    install_fake_pynvml(monkeypatch, [gpu])
    with open_meter("nvml") as meter, meter.measure() as m:
        time.sleep(0.3)
    true_j = trace.energy_between(m.measurement.t_start, m.measurement.t_end)
    assert m.methods == {"gpu:0": Method.COUNTER}
    assert m.measurement.backend == "nvml"
    assert true_j > 40
    assert abs(m.by_domain["gpu:0"] - true_j) <= resolution_j(gpu)
    assert m.samples == ()


def test_counter_phases_split_at_a_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = PowerTrace([(0.1, 60.0), (60.0, 280.0)])
    gpu = make_gpu(0, NVML_DEVICE_ARCH_HOPPER, trace, counter_period_s=0.005)
    install_fake_pynvml(monkeypatch, [gpu])
    with open_meter("nvml") as meter, meter.measure("prefill") as m:
        time.sleep(0.1)
        m.mark("decode")
        time.sleep(0.15)
    assert list(m.phases) == ["prefill", "decode"]
    t_start = m.measurement.t_start
    for phase in m.phases.values():
        t0 = t_start + phase.offset_s
        true_j = trace.energy_between(t0, t0 + phase.seconds)
        assert abs(phase.by_domain["gpu:0"] - true_j) <= resolution_j(gpu), phase.name
    decode_w = m.phases["decode"].by_domain["gpu:0"] / m.phases["decode"].seconds
    assert decode_w > 200  # the phase after the step really sees the higher power
    total = sum(p.by_domain["gpu:0"] for p in m.phases.values())
    assert m.by_domain["gpu:0"] == pytest.approx(total)


def test_nested_counter_windows_each_match_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = PowerTrace([(0.08, 120.0), (0.1, 250.0), (60.0, 90.0)])
    gpu = make_gpu(0, NVML_DEVICE_ARCH_AMPERE, trace, counter_period_s=0.005)
    install_fake_pynvml(monkeypatch, [gpu])
    with open_meter("nvml") as meter:
        with meter.measure() as outer:
            time.sleep(0.06)
            with meter.measure() as inner:
                time.sleep(0.12)
            time.sleep(0.06)
        assert sampler_threads() == []  # counters need no thread
    for window in (outer, inner):
        true_j = trace.energy_between(window.measurement.t_start, window.measurement.t_end)
        assert abs(window.by_domain["gpu:0"] - true_j) <= resolution_j(gpu)
    assert inner.by_domain["gpu:0"] < outer.by_domain["gpu:0"] - 5


def test_counter_is_quantized_to_its_refresh_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default 100 ms refresh, a 20 ms window sees 0 or one whole refresh."""
    gpu = make_gpu(0, NVML_DEVICE_ARCH_AMPERE, PowerTrace([(60.0, 200.0)]))
    install_fake_pynvml(monkeypatch, [gpu])
    with open_meter("nvml") as meter:
        seen = []
        for _ in range(12):
            with meter.measure() as m:
                time.sleep(0.02)
            seen.append(m.by_domain["gpu:0"])
    one_refresh_j = 200.0 * gpu.counter_period_s
    assert all(
        j == pytest.approx(0.0, abs=0.002) or j == pytest.approx(one_refresh_j, abs=0.002)
        for j in seen
    ), seen
    assert min(seen) == pytest.approx(0.0, abs=0.002)


# -- resolution ------------------------------------------------------------------------


@pytest.mark.serial  # a counter's period, timed from sleeps
def test_counter_resolution_is_its_measured_update_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two counters refreshed every 100 ms and 20 ms: each is timed, the meter is the coarser."""
    gpus = [make_gpu(0, counter_period_s=0.1), make_gpu(1, counter_period_s=0.02)]
    install_fake_pynvml(monkeypatch, gpus)
    for selected, period_s in (((0,), 0.1), ((1,), 0.02)):
        started = time.perf_counter()
        with open_meter("nvml", gpus=selected) as meter:
            opened_s = time.perf_counter() - started
            assert meter.resolution_s == pytest.approx(period_s, rel=0.1)
        assert opened_s < PERIOD_PROBE_MAX_S + 0.3  # timing the counter stays within its cap
    with open_meter("nvml") as meter:
        assert [d.resolution_s for d in meter.devices] == [
            pytest.approx(0.1, rel=0.1),
            pytest.approx(0.02, rel=0.25),  # 4 ms late on a busy machine is 20 %
        ]
        assert meter.resolution_s == pytest.approx(0.1, rel=0.1)
        line = meter.describe()
        for device in meter.devices:  # e.g. "updates every 100 ms", as timed
            period = duration_text(device.resolution_s or 0.0)
            assert f"{device.name}: counter (NVML total energy, mJ), updates every {period}" in line


@pytest.mark.serial  # a counter's period, timed from sleeps
def test_a_fast_counter_is_timed_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 5 ms counter needs only a few updates: opening does not wait for the cap."""
    install_fake_pynvml(monkeypatch, [make_gpu(0, counter_period_s=0.005)])
    started = time.perf_counter()
    with open_meter("nvml") as meter:
        assert time.perf_counter() - started < PERIOD_PROBE_MAX_S / 2
        # timed from sleeps: a busy machine wakes the probe late, never early
        assert meter.resolution_s == pytest.approx(0.005, rel=0.5)


def test_a_counter_that_never_moves_is_taken_as_coarse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not timed is not fine (issue 60, item 5): taken as NVML's 100 ms, and said."""
    install_fake_pynvml(monkeypatch, [make_gpu(0, trace=PowerTrace([(60.0, 0.0)]))])
    with open_meter("nvml") as meter:
        assert meter.domains["gpu:0"].method is Method.COUNTER
        assert meter.resolution_s == 0.1 and meter.devices[0].resolution_s == 0.1
        assert "update period not timed" in meter.describe()
        assert "taken as 100 ms" in meter.describe()


@pytest.mark.serial  # a counter's period, timed from sleeps
def test_sampled_resolution_is_the_sampling_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [make_gpu(0, NVML_DEVICE_ARCH_PASCAL), make_gpu(1, counter_period_s=0.02)]
    install_fake_pynvml(monkeypatch, gpus)
    with open_meter("nvml", gpus=(0,), sample_interval_s=0.05) as meter:
        assert meter.resolution_s == 0.05
    with open_meter("nvml", sample_interval_s=0.01) as meter:  # the 20 ms counter is coarser
        periods = [d.resolution_s for d in meter.devices]
        assert periods == [0.01, pytest.approx(0.02, rel=0.25)]  # timed on a busy machine
        assert meter.resolution_s == pytest.approx(0.02, rel=0.1)
    with open_meter("nvml", sample_interval_s=0.2) as meter:  # now the sampler is
        assert meter.resolution_s == 0.2


def test_counter_periods_on_a_scripted_clock() -> None:
    """Counters of 7 ms and 13 ms, and one that never changes, polled in one loop."""
    now = [0.0]

    def clock() -> float:
        now[0] += 0.0002  # each look at the clock moves it on
        return now[0]

    def read_mj(period_s: float) -> int:
        return int(now[0] // period_s)

    periods = counter_periods_s(read_mj, [0.007, 0.013, 1e9], max_s=0.2, clock=clock)
    assert periods[0] == pytest.approx(0.007, abs=0.0005)
    assert periods[1] == pytest.approx(0.013, abs=0.0005)
    assert periods[2] is None
    assert now[0] == pytest.approx(0.2, abs=0.001)  # the never-changing one kept it to the cap
    assert counter_periods_s(read_mj, []) == []


def test_a_counter_period_survives_late_looks_and_a_tick_that_added_nothing() -> None:
    """A 20 ms counter seen at 8, 4, 0 and 0 ms late (a busy machine): the intervals are
    16, 16 and 20 ms, but the span says 20; a tick that added nothing counts as two."""
    from pytest_llmenergy.meters.gpu_meter import period_s as _period_s

    assert _period_s([0.008, 0.024, 0.040, 0.060]) == pytest.approx(0.0173, abs=0.0001)
    assert _period_s([0.008, 0.024, 0.040, 0.060, 0.080, 0.100]) == pytest.approx(0.0184, 1e-2)
    assert _period_s([0.0, 0.02, 0.06, 0.08]) == pytest.approx(0.02)  # 40 ms: two ticks
    assert _period_s([0.5]) is None


# -- sampled GPUs ----------------------------------------------------------------------


def test_sampled_and_counter_gpus_in_one_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pascal with and without the instant field, next to a Volta counter: 3 s, 1 s steps."""
    traces = [
        PowerTrace([(1.0, 150.0), (1.0, 250.0), (60.0, 200.0)]),
        PowerTrace([(1.0, 60.0), (1.0, 100.0), (60.0, 80.0)]),
        PowerTrace([(1.0, 180.0), (1.0, 120.0), (60.0, 150.0)]),
    ]
    gpus = [
        make_gpu(0, NVML_DEVICE_ARCH_VOLTA, traces[0]),
        make_gpu(1, NVML_DEVICE_ARCH_PASCAL, traces[1], instant_field=True),
        make_gpu(2, NVML_DEVICE_ARCH_PASCAL, traces[2], instant_field=False),
    ]
    fake = install_fake_pynvml(monkeypatch, gpus).fake
    with open_meter("nvml", sample_interval_s=0.1) as meter, meter.measure() as m:
        time.sleep(2.9)
    t0, t1 = m.measurement.t_start, m.measurement.t_end
    assert m.methods == {"gpu:0": Method.COUNTER, "gpu:1": Method.SAMPLED, "gpu:2": Method.SAMPLED}
    assert list(m.by_domain) == ["gpu:0", "gpu:1", "gpu:2"]
    assert abs(m.by_domain["gpu:0"] - traces[0].energy_between(t0, t1)) <= resolution_j(gpus[0])
    for domain, trace in (("gpu:1", traces[1]), ("gpu:2", traces[2])):
        true_j = trace.energy_between(t0, t1)
        assert m.by_domain[domain] == pytest.approx(true_j, rel=0.02), domain
    # gpu:1 was read through the instant field, gpu:2 through power usage.
    assert fake.calls["nvmlDeviceGetFieldValues"] > 25
    assert fake.calls["nvmlDeviceGetPowerUsage"] > 25
    assert 25 <= len(m.samples) <= 40
    assert all(t0 <= s.t <= t1 and set(s.power_w) == {"gpu:1", "gpu:2"} for s in m.samples)


def test_instant_field_is_preferred_to_the_ampere_one_second_average(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ampere's power usage lags by a second: the instant field must win when it exists."""
    trace = PowerTrace([(0.25, 100.0), (60.0, 300.0)])
    gpus = [
        make_gpu(0, NVML_DEVICE_ARCH_AMPERE, trace, instant_field=True, energy_counter=False),
        make_gpu(1, NVML_DEVICE_ARCH_AMPERE, trace, instant_field=False, energy_counter=False),
    ]
    install_fake_pynvml(monkeypatch, gpus)
    with open_meter("nvml", sample_interval_s=0.01) as meter, meter.measure() as m:
        time.sleep(0.5)
    true_j = trace.energy_between(m.measurement.t_start, m.measurement.t_end)
    assert m.by_domain["gpu:0"] == pytest.approx(true_j, rel=0.03)
    assert m.by_domain["gpu:1"] < 0.85 * true_j  # the average lags behind the step
    assert "instant power field" in meter.notes[0]
    assert "1 s average" in meter.notes[1]


def test_methods_and_notes_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        make_gpu(0, NVML_DEVICE_ARCH_HOPPER),
        make_gpu(1, NVML_DEVICE_ARCH_PASCAL, instant_field=True),
        make_gpu(2, NVML_DEVICE_ARCH_AMPERE, energy_counter=False),
        make_gpu(3, None),  # architecture query unsupported: try the counter
    ]
    install_fake_pynvml(monkeypatch, gpus)
    meter = create(MeterSettings())
    try:
        assert isinstance(meter, NvmlMeter)
        assert {name: d.method for name, d in meter.domains.items()} == {
            "gpu:0": Method.COUNTER,
            "gpu:1": Method.SAMPLED,
            "gpu:2": Method.SAMPLED,
            "gpu:3": Method.COUNTER,
        }
        notes = meter.notes
        assert notes[0].startswith("gpu:0 NVIDIA H100 #0: counter")
        assert notes[1].startswith("gpu:1 Tesla P100 #1: sampled")
        assert "energy counter unsupported before Volta" in notes[1]
        assert "instant power field" in notes[1]
        assert "energy counter unavailable: Not Supported" in notes[2]
        assert "1 s average" in notes[2]
        assert "CUDA_DEVICE_ORDER" in notes[-1]  # different GPUs: CUDA may reorder them
        line = meter.describe()
        assert line.startswith("nvml: ") and "\n" not in line and "Tesla P100 #1" in line
    finally:
        meter.close()


# -- which GPUs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2,0", [2, 0]),
        (" 3 , 1 ", [3, 1]),
        ("1,-1,3", [1]),  # parsing stops at the first invalid entry
        ("0,9,1", [0]),  # ... an index that does not exist is one
        ("1gpu,2", [1, 2]),  # read like strtoul
        (f"{fake_uuid(3)},0", [3, 0]),
        ("GPU-00000002,GPU-00000001-1a2b", [2, 1]),  # unique prefixes
        ("1,GPU-ffffffff", [1]),  # unknown UUID stops
        (f"0,{fake_uuid(2)},9", [0, 2]),
    ],
)
def test_cuda_visible_devices_selects_and_orders(
    monkeypatch: pytest.MonkeyPatch, spec: str, expected: list[int]
) -> None:
    install_fake_pynvml(monkeypatch, [make_gpu(n) for n in range(4)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with open_meter("nvml") as meter:
        assert [d.index for d in meter.devices] == expected
        assert list(meter.domains) == [f"gpu:{i}" for i in range(len(expected))]
        assert [d.uuid for d in meter.devices] == [fake_uuid(n) for n in expected]


@pytest.mark.parametrize("spec", ["", "-1", "9", "GPU-0000000", "0,1,0", "MIG-00000009"])
def test_cuda_visible_devices_hiding_every_gpu(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    """Empty, invalid first, ambiguous prefix, a repeated GPU (CUDA then sees none)."""
    fake = install_fake_pynvml(monkeypatch, [make_gpu(n) for n in range(4)]).fake
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with pytest.raises(MeterUnavailable, match="hides all GPUs") as info:
        open_meter("nvml")
    assert f"CUDA_VISIBLE_DEVICES={spec!r}" in str(info.value)
    assert fake.init_count == 0  # nvmlShutdown after the failed open


def test_cuda_visible_devices_maps_counters_to_the_right_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = [
        make_gpu(0, trace=PowerTrace([(60.0, 50.0)]), counter_period_s=0.005),
        make_gpu(1, trace=PowerTrace([(60.0, 120.0)]), counter_period_s=0.005),
        make_gpu(2, trace=PowerTrace([(60.0, 300.0)]), counter_period_s=0.005),
    ]
    install_fake_pynvml(monkeypatch, gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    with open_meter("nvml") as meter, meter.measure() as m:
        time.sleep(0.2)
    assert m.by_domain["gpu:0"] / m.seconds == pytest.approx(300.0, abs=10)
    assert m.by_domain["gpu:1"] / m.seconds == pytest.approx(50.0, abs=10)


@pytest.mark.parametrize("form", ["new", "old"])
def test_mig_devices_measure_their_parent_gpu_once(
    monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    migs = (fake_mig_uuid(1), fake_mig_uuid(2))
    gpus = [
        make_gpu(0, NVML_DEVICE_ARCH_AMPERE, mig_uuids=migs, counter_period_s=0.005),
        make_gpu(1, NVML_DEVICE_ARCH_AMPERE),
    ]
    fake = install_fake_pynvml(monkeypatch, gpus).fake
    old_form = f"MIG-{fake_uuid(0)}/1/0,MIG-{fake_uuid(0)}/2/0"
    spec = ",".join(migs) if form == "new" else old_form
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with open_meter("nvml") as meter:
        assert [d.index for d in meter.devices] == [0]
        assert list(meter.domains) == ["gpu:0"]
        assert "whole GPU" in meter.notes[0]
        with meter.measure() as m:
            time.sleep(0.1)
    true_j = gpus[0].trace.energy_between(m.measurement.t_start, m.measurement.t_end)
    assert abs(m.by_domain["gpu:0"] - true_j) <= resolution_j(gpus[0])
    if form == "new":
        assert fake.calls["nvmlDeviceGetDeviceHandleFromMigDeviceHandle"] == 2


def test_energy_gpus_selects_among_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_pynvml(monkeypatch, [make_gpu(n) for n in range(3)])
    with open_meter("nvml", gpus=(2, 0)) as meter:
        assert list(meter.domains) == ["gpu:0", "gpu:2"]
        assert [d.index for d in meter.devices] == [0, 2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    with open_meter("nvml", gpus=[1]) as meter:
        assert list(meter.domains) == ["gpu:1"]
        assert [d.index for d in meter.devices] == [1]


@pytest.mark.parametrize(("spec", "gpus", "visible"), [(None, (0, 3), 3), ("1", (1,), 1)])
def test_energy_gpus_out_of_range(
    monkeypatch: pytest.MonkeyPatch, spec: str | None, gpus: tuple[int, ...], visible: int
) -> None:
    fake = install_fake_pynvml(monkeypatch, [make_gpu(n) for n in range(3)]).fake
    if spec is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with pytest.raises(ConfigError, match=f"{visible} GPU\\(s\\) are visible"):
        open_meter("nvml", gpus=gpus)
    assert fake.init_count == 0


# -- unavailable -----------------------------------------------------------------------


def test_real_pynvml_without_a_driver_is_unavailable_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    pytest.importorskip("pynvml")
    try:
        meter = create(MeterSettings())
    except MeterUnavailable as exc:
        message = str(exc)
    else:
        meter.close()
        pytest.skip("this machine has a working NVIDIA driver")
    assert "\n" not in message
    assert message.startswith("energy backend 'nvml' is unavailable: ")
    assert "NVML Shared Library Not Found: no NVIDIA driver on this machine" in message
    assert "--energy-backend=auto" in message


def test_missing_library_and_driver_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_pynvml_without_library(monkeypatch)
    with pytest.raises(MeterUnavailable) as info:
        open_meter("nvml")
    assert info.value.backend == "nvml"
    assert info.value.reason == (
        "NVML Shared Library Not Found: no NVIDIA driver on this machine; "
        "use --energy-backend=auto or estimate"
    )
    install_fake_pynvml(monkeypatch, [], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(MeterUnavailable, match="Driver Not Loaded: the NVIDIA kernel driver"):
        open_meter("nvml")


def test_without_nvidia_ml_py_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(MeterUnavailable, match=r"pip install 'pytest-llmenergy\[nvml\]'"):
        open_meter("nvml")


def test_no_gpu_at_all_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_pynvml(monkeypatch, []).fake
    with pytest.raises(MeterUnavailable, match="no NVIDIA GPU"):
        open_meter("nvml")
    assert fake.init_count == 0


def test_importing_the_package_does_not_import_pynvml() -> None:
    code = (
        "import sys, pytest_llmenergy, pytest_llmenergy.plugin, pytest_llmenergy.meters.nvml\n"
        "print(sorted(m for m in ('pynvml', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- lifecycle -------------------------------------------------------------------------


def test_sampler_runs_only_while_a_window_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_pynvml(monkeypatch, [make_gpu(0, NVML_DEVICE_ARCH_PASCAL)]).fake
    with open_meter("nvml", sample_interval_s=0.01) as meter:
        assert sampler_threads() == []
        with meter.measure() as outer:
            with meter.measure():
                time.sleep(0.05)
            assert len(sampler_threads()) == 1  # the outer window still needs it
            before = fake.calls["nvmlDeviceGetPowerUsage"]
            time.sleep(0.05)
            assert fake.calls["nvmlDeviceGetPowerUsage"] >= before + 3
        assert sampler_threads() == []
        closed_at = fake.total_calls
        time.sleep(0.1)
        assert fake.total_calls == closed_at  # nothing polls NVML between windows
        assert len(outer.samples) >= 8
        with meter.measure() as again:  # and it restarts for the next window
            time.sleep(0.05)
        assert len(again.samples) >= 3
    assert sampler_threads() == []


def test_close_shuts_nvml_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_pynvml(monkeypatch, [make_gpu(0)]).fake
    first = open_meter("nvml")
    second = open_meter("nvml")
    assert fake.init_count == 2
    first.close()
    first.close()
    assert fake.calls["nvmlShutdown"] == 1
    with second.measure() as m:  # NVML counts inits: the other meter still works
        pass
    assert m.by_domain["gpu:0"] >= 0
    second.close()
    assert fake.init_count == 0


@pytest.mark.parametrize("every_gpu", [False, True])
def test_cuda_is_synchronized_before_each_reading(
    monkeypatch: pytest.MonkeyPatch, every_gpu: bool
) -> None:
    """Before each reading, the GPUs read where this process has a context (GPU 1 here):
    never GPU 0, where waiting would open one, even when every GPU is read."""
    fake = install_fake_pynvml(monkeypatch, [make_gpu(0), make_gpu(1)]).fake
    synced: list[tuple[int, int]] = []
    initialized = True

    def synchronize(device: int | None = None) -> None:
        synced.append((device, fake.calls["nvmlDeviceGetTotalEnergyConsumption"]))

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_initialized=lambda: initialized, synchronize=synchronize, device_count=lambda: 2
    )
    torch._C = types.SimpleNamespace(_cuda_hasPrimaryContext=lambda i: i == 1)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    with open_meter("nvml", every_gpu=every_gpu) as meter:
        reads = fake.calls["nvmlDeviceGetTotalEnergyConsumption"]
        with meter.measure() as m:
            m.mark("decode")
        # a sync of GPU 1 before each of the 3 readings (of 2 counters, or GPU 1's alone)
        per_reading = 2 if every_gpu else 1
        assert synced == [(1, reads + per_reading * k) for k in range(3)]
        assert list(m.by_domain) == (["gpu:0", "gpu:1"] if every_gpu else ["gpu:1"])
        initialized = False
        with meter.measure():
            pass
        assert len(synced) == 3  # CUDA not initialized: nothing to wait for


def test_a_lost_gpu_fails_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [make_gpu(0, NVML_DEVICE_ARCH_AMPERE), make_gpu(1, NVML_DEVICE_ARCH_PASCAL)]
    install_fake_pynvml(monkeypatch, gpus)
    with open_meter("nvml", sample_interval_s=0.01) as meter:
        with pytest.raises(MeterError, match="GPU is lost"), meter.measure():
            gpus[0].lost = True
        gpus[0].lost = False
        with pytest.raises(MeterError, match="GPU is lost"), meter.measure():
            gpus[1].lost = True
            time.sleep(0.03)
        assert sampler_threads() == []


def test_a_gpu_lost_while_opening_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_pynvml(monkeypatch, [make_gpu(0), make_gpu(1, lost=True)]).fake
    with pytest.raises(MeterUnavailable, match="NVML failed while listing GPUs: GPU is lost"):
        open_meter("nvml")
    assert fake.init_count == 0
    with open_meter("nvml", gpus=(0,)) as meter:  # the healthy one alone still works
        assert list(meter.domains) == ["gpu:0"]
