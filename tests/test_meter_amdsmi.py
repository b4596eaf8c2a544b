"""The amdsmi meter against a fake amdsmi whose GPUs follow traces of known energy: an
MI300X-like, an MI210-like and an MI250X-like device, under each ROCm's key for the
count, on the counter path and the sampled one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmenergy import ConfigError, MeterError, MeterUnavailable, Method, open_meter
from pytest_llmenergy.gpu.amd import INSTALL_HINT, visible_indices, watts
from pytest_llmenergy.meters import amdsmi as amd
from pytest_llmenergy.meters.amdsmi import (
    COUNT_KEYS,
    SAMPLER_THREAD_NAME,
    AmdSmiMeter,
    count_delta,
    counter_problem,
    energy_count,
)
from tests.fakes.fake_amdsmi import (
    AMDSMI_STATUS_DRIVER_NOT_LOADED,
    AMDSMI_STATUS_NO_PERM,
    NA,
    ROCM_VERSIONS,
    UJ_PER_COUNT,
    FakeAmdGpu,
    install_fake_amdsmi,
    mi210,
    mi250x,
    mi300x,
)
from tests.fakes.trace import PowerTrace

PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None)


def edge_error_j(gpu: FakeAmdGpu) -> float:
    """What a counter refreshed every period can be off by: a period at full power per edge,
    and one count per edge."""
    return 2 * gpu.counter_period_s * gpu.trace.max_power() + 2 * UJ_PER_COUNT / 1e6


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SAMPLER_THREAD_NAME]


def later(steps: list[tuple[float, float]]) -> PowerTrace:
    """A trace that starts now: set on a GPU after the meter opened (which takes up to
    0.3 s timing the counters), so the window sees all of its steps."""
    return PowerTrace(steps)


@pytest.fixture(autouse=True)
def _clean_visible_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


# -- the counter path ----------------------------------------------------------------------


@pytest.mark.parametrize("rocm", ROCM_VERSIONS)
def test_mi300x_counter_matches_the_trace_under_every_rocm(
    monkeypatch: pytest.MonkeyPatch, rocm: str
) -> None:
    """ROCm 6.2 names the count ``power``, 6.3 both, 6.4 ``energy_accumulator``: the
    same joules, within 1 % of the truth and within the counter's own quantization."""
    gpu = mi300x(0, PowerTrace([(60.0, 100.0)]), rocm=rocm, counter_period_s=0.002)
    gpu.counter_offset = 123_456_789_012  # counts since the driver loaded
    install_fake_amdsmi(monkeypatch, [gpu])
    with open_meter("amdsmi") as meter:
        gpu.trace = trace = later([(0.1, 180.0), (0.15, 650.0), (0.1, 320.0), (60.0, 240.0)])
        with meter.measure() as m:
            time.sleep(0.5)
    true_j = trace.energy_between(m.measurement.t_start, m.measurement.t_end)
    assert m.methods == {"gpu:0": Method.COUNTER}
    assert m.measurement.backend == "amdsmi"
    assert true_j > 100
    assert abs(m.by_domain["gpu:0"] - true_j) <= edge_error_j(gpu)
    assert m.by_domain["gpu:0"] == pytest.approx(true_j, rel=0.01)
    assert m.samples == ()
    assert "gpu:0 AMD Instinct MI300X: counter (amdsmi energy accumulator, µJ)" in meter.notes[0]


@pytest.mark.parametrize("rocm", ROCM_VERSIONS)
@pytest.mark.parametrize("silent_value", [0, NA])
def test_mi250x_board_is_measured_once_and_never_as_zero(
    monkeypatch: pytest.MonkeyPatch, rocm: str, silent_value: int | str
) -> None:
    """The first die reports both dies' power, the second 0 or "N/A": one domain, whose
    joules are the board's, within 1 % of the truth; no gpu:1 of 0 J."""
    dies = mi250x(0, PowerTrace([(60.0, 90.0)]), silent_value, rocm=rocm, counter_period_s=0.002)
    install_fake_amdsmi(monkeypatch, dies)
    with open_meter("amdsmi") as meter:
        dies[0].trace = trace = later([(0.15, 150.0), (0.2, 520.0), (60.0, 300.0)])
        with meter.measure() as m:
            time.sleep(0.5)
        assert list(meter.domains) == ["gpu:0"]
        assert "gpu:0 and gpu:1 are the two dies of one board, measured once" in meter.describe()
    true_j = trace.energy_between(m.measurement.t_start, m.measurement.t_end)
    assert m.methods == {"gpu:0": Method.COUNTER}
    assert m.by_domain["gpu:0"] == pytest.approx(true_j, rel=0.01)
    assert m.joules == pytest.approx(true_j, rel=0.01)  # counted once


@pytest.mark.parametrize(
    ("env", "gpus", "expected_note"),
    [
        ({"HIP_VISIBLE_DEVICES": "1"}, None, "is the second die of a board"),
        ({}, (1,), "is the second die of a board"),
        ({}, (0,), "both dies of its board"),
    ],
)
def test_mi250x_second_die_alone_reads_its_board(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    gpus: tuple[int, ...] | None,
    expected_note: str,
) -> None:
    """A session on one die of an MI250X gets the board's joules, said to be both dies'."""
    dies = mi250x(0, PowerTrace([(60.0, 200.0)]), counter_period_s=0.002)
    fake = install_fake_amdsmi(monkeypatch, dies).fake
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with open_meter("amdsmi", gpus=gpus) as meter, meter.measure() as m:
        time.sleep(0.2)
    domain = "gpu:0" if env else f"gpu:{gpus[0]}"  # type: ignore[index]
    assert list(m.by_domain) == [domain]
    assert m.by_domain[domain] == pytest.approx(200.0 * m.seconds, rel=0.03)
    assert expected_note in meter.describe()
    assert meter.devices[0].index == 0  # the first die is what is read
    assert fake.init_count == 0


def test_mi250x_pair_among_other_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two MI250X boards (four dies): two domains, gpu:0 and gpu:2."""
    boards = [
        *mi250x(0, PowerTrace([(60.0, 300.0)]), counter_period_s=0.002),
        *mi250x(2, PowerTrace([(60.0, 120.0)]), NA, counter_period_s=0.002),
    ]
    install_fake_amdsmi(monkeypatch, boards)
    with open_meter("amdsmi") as meter, meter.measure() as m:
        time.sleep(0.2)
    assert list(m.by_domain) == ["gpu:0", "gpu:2"]
    assert m.by_domain["gpu:0"] == pytest.approx(300.0 * m.seconds, rel=0.03)
    assert m.by_domain["gpu:2"] == pytest.approx(120.0 * m.seconds, rel=0.03)


def test_counter_wrapping_at_32_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 32-bit accumulator a few joules before its wrap: the window across it is right."""
    gpu = mi300x(0, PowerTrace([(60.0, 400.0)]), counter_bits=32, counter_period_s=0.002)
    install_fake_amdsmi(monkeypatch, [gpu])
    with open_meter("amdsmi") as meter:
        now = int(gpu.trace.energy_until(time.perf_counter()) * 1e6 / UJ_PER_COUNT)
        gpu.counter_offset = 2**32 - now - int(40.0 * 1e6 / UJ_PER_COUNT)  # 40 J before it
        with meter.measure() as m:
            time.sleep(0.3)  # 120 J
    assert m.by_domain["gpu:0"] == pytest.approx(400.0 * m.seconds, rel=0.02)


@pytest.mark.serial  # a counter's period, timed from sleeps
def test_counter_resolution_is_its_measured_update_period(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        mi300x(0, PowerTrace([(60, 300.0)]), counter_period_s=0.02),
        mi210(1, PowerTrace([(60, 200.0)]), counter_period_s=0.005),
    ]
    install_fake_amdsmi(monkeypatch, gpus)
    with open_meter("amdsmi") as meter:
        assert [d.resolution_s for d in meter.devices] == [
            pytest.approx(0.02, rel=0.25),
            pytest.approx(0.005, rel=0.5),  # timed from sleeps: a busy machine wakes late
        ]
        assert meter.resolution_s == pytest.approx(0.02, rel=0.25)
        assert "updates every" in meter.notes[0]


# -- the sampled path ----------------------------------------------------------------------


@pytest.mark.parametrize("why", ["no counter", "stuck", "wrong rate"])
def test_mi300x_without_a_working_counter_samples_instant_power(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """No counter, one stuck, one counting a thousandth of the energy: the GPU's
    current_socket_power is sampled instead, within 1 % of the truth, and the line says why."""
    kw: dict[str, Any] = {
        "no counter": {"energy_counter": False},
        "stuck": {"stuck_counter": True},
        "wrong rate": {"counter_scale": 0.001, "counter_period_s": 0.002},
    }[why]
    gpu = mi300x(0, PowerTrace([(60.0, 250.0)]), **kw)
    install_fake_amdsmi(monkeypatch, [gpu])
    with open_meter("amdsmi", sample_interval_s=0.01) as meter:
        gpu.trace = trace = later([(0.2, 200.0), (0.4, 600.0), (60.0, 200.0)])
        with meter.measure() as m:
            time.sleep(0.8)
    true_j = trace.energy_between(m.measurement.t_start, m.measurement.t_end)
    assert m.methods == {"gpu:0": Method.SAMPLED}
    assert m.by_domain["gpu:0"] == pytest.approx(true_j, rel=0.01)
    line = meter.describe()
    expected = {
        "no counter": "energy counter unavailable: Error code: 2 | AMDSMI_STATUS_NOT_SUPPORTED",
        "stuck": "its energy counter did not move",
        "wrong rate": "a counter that does not follow power",
    }[why]
    assert expected in line, line
    assert "current_socket_power every 0.01 s" in line
    assert "\n" not in line
    assert meter.resolution_s == 0.01


@pytest.mark.parametrize("rocm", ROCM_VERSIONS)
def test_mi250x_stuck_counter_samples_the_average(
    monkeypatch: pytest.MonkeyPatch, rocm: str
) -> None:
    """An MI250X whose counter is stuck: its average_socket_power (the instant one is
    "N/A" there) is sampled, within 1 % where the power is the same at both edges of the
    window (an average lags by half its window, which then cancels)."""
    dies = mi250x(0, PowerTrace([(60.0, 120.0)]), rocm=rocm, stuck_counter=True)
    install_fake_amdsmi(monkeypatch, dies)
    with open_meter("amdsmi", sample_interval_s=0.01) as meter:
        dies[0].trace = trace = later([(0.3, 120.0), (0.35, 480.0), (60.0, 120.0)])
        with meter.measure() as m:
            time.sleep(0.9)
    true_j = trace.energy_between(m.measurement.t_start, m.measurement.t_end)
    assert list(m.by_domain) == ["gpu:0"]
    assert m.methods == {"gpu:0": Method.SAMPLED}
    assert m.by_domain["gpu:0"] == pytest.approx(true_j, rel=0.01)
    line = meter.describe()
    assert "stuck counter" in line and "average_socket_power every 0.01 s" in line
    assert "edges blur" in line and "two dies of one board" in line


def test_sampler_runs_only_while_a_window_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_amdsmi(
        monkeypatch, [mi300x(0, PowerTrace([(60, 100.0)]), energy_counter=False)]
    ).fake
    with open_meter("amdsmi", sample_interval_s=0.01) as meter:
        assert sampler_threads() == []
        with meter.measure() as outer:
            time.sleep(0.05)
            assert len(sampler_threads()) == 1
        assert sampler_threads() == []
        closed_at = fake.total_calls
        time.sleep(0.05)
        assert fake.total_calls == closed_at  # nothing polls amdsmi between windows
        assert len(outer.samples) >= 3
    assert sampler_threads() == []


def test_counter_and_sampled_gpus_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        mi300x(0, PowerTrace([(60, 300.0)]), counter_period_s=0.002),
        mi300x(1, PowerTrace([(60, 150.0)]), stuck_counter=True),
    ]
    install_fake_amdsmi(monkeypatch, gpus)
    with open_meter("amdsmi", sample_interval_s=0.01) as meter, meter.measure() as m:
        time.sleep(0.3)
    assert m.methods == {"gpu:0": Method.COUNTER, "gpu:1": Method.SAMPLED}
    assert list(m.by_domain) == ["gpu:0", "gpu:1"]
    assert m.by_domain["gpu:0"] == pytest.approx(300.0 * m.seconds, rel=0.02)
    assert m.by_domain["gpu:1"] == pytest.approx(150.0 * m.seconds, rel=0.02)
    assert meter.resolution_s == 0.01  # the sampler is coarser than the 2 ms counter


# -- which GPUs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [0, 1, 2, 3]),
        ({"HIP_VISIBLE_DEVICES": "2,0"}, [2, 0]),
        ({"CUDA_VISIBLE_DEVICES": "3"}, [3]),
        ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "3"}, [1]),  # HIP's wins
        ({"ROCR_VISIBLE_DEVICES": "1,3"}, [1, 3]),
        ({"ROCR_VISIBLE_DEVICES": "1,3", "HIP_VISIBLE_DEVICES": "1"}, [3]),  # HIP's indexes ROCR's
        ({"HIP_VISIBLE_DEVICES": "1,9,2"}, [1]),  # parsing stops at a device that is not there
        ({"HIP_VISIBLE_DEVICES": "-1"}, []),
        ({"HIP_VISIBLE_DEVICES": ""}, []),
    ],
)
def test_visible_devices(env: dict[str, str], expected: list[int]) -> None:
    assert visible_indices(4, env) == expected


def test_hiding_every_gpu_says_which_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_amdsmi(monkeypatch, [mi300x(0, PowerTrace([(60, 100.0)]))])
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "-1")
    with pytest.raises(MeterUnavailable, match="HIP_VISIBLE_DEVICES='-1' hides all GPUs"):
        open_meter("amdsmi")


def test_energy_gpus_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_amdsmi(monkeypatch, [mi300x(0, PowerTrace([(60, 100.0)]))]).fake
    with pytest.raises(ConfigError, match=r"names GPU 3, but 1 GPU\(s\) are visible"):
        open_meter("amdsmi", gpus=(3,))
    assert fake.init_count == 0


# -- unavailable ---------------------------------------------------------------------------


def test_without_the_amdsmi_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # makes `import amdsmi` fail
    with pytest.raises(MeterUnavailable) as info:
        open_meter("amdsmi")
    assert info.value.reason == INSTALL_HINT
    assert "pip install /opt/rocm/share/amd_smi" in str(info.value)


def test_an_amdsmi_that_cannot_load_its_library_is_one_quiet_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real package prints to stdout and raises OSError when libamd_smi.so is missing."""
    package = tmp_path / "amdsmi"
    package.mkdir()
    (package / "__init__.py").write_text(
        "print('Unable to find amdsmi library try installing amd-smi-lib from your package "
        "manager')\nraise OSError('libamd_smi.so: cannot open shared object file')\n"
    )
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MeterUnavailable) as info:
        open_meter("amdsmi")
    message = str(info.value)
    assert "\n" not in message
    assert "cannot load libamd_smi (libamd_smi.so: cannot open shared object file)" in message
    assert "ROCM_PATH" in message and "--energy-backend=auto" in message
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (AMDSMI_STATUS_DRIVER_NOT_LOADED, "the amdgpu kernel driver is not loaded"),
        (AMDSMI_STATUS_NO_PERM, "add the user to the render and video groups"),
    ],
)
def test_init_failures_say_what_to_do(
    monkeypatch: pytest.MonkeyPatch, code: int, hint: str
) -> None:
    install_fake_amdsmi(monkeypatch, [], init_error=code)
    with pytest.raises(MeterUnavailable) as info:
        open_meter("amdsmi")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("energy backend 'amdsmi' is unavailable: Error code: ")
    assert hint in message and message.endswith("use --energy-backend=auto or estimate")


def test_no_gpu_at_all_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_amdsmi(monkeypatch, []).fake
    with pytest.raises(MeterUnavailable, match="amdsmi found no AMD GPU"):
        open_meter("amdsmi")
    assert fake.init_count == 0


def test_a_gpu_with_neither_counter_nor_power_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = mi300x(0, PowerTrace([(60, 100.0)]), energy_counter=False, silent=True)
    fake = install_fake_amdsmi(monkeypatch, [gpu]).fake
    with pytest.raises(MeterUnavailable, match="reports neither an energy counter"):
        open_meter("amdsmi")
    assert fake.init_count == 0


def test_importing_the_package_does_not_import_amdsmi() -> None:
    code = (
        "import sys, pytest_llmenergy, pytest_llmenergy.plugin, pytest_llmenergy.meters.amdsmi\n"
        "print(sorted(m for m in ('amdsmi', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- lifecycle -----------------------------------------------------------------------------


def test_close_shuts_amdsmi_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_amdsmi(monkeypatch, [mi300x(0, PowerTrace([(60, 100.0)]))]).fake
    first = open_meter("amdsmi")
    second = open_meter("amdsmi")
    assert fake.init_count == 2
    first.close()
    first.close()
    assert fake.calls["amdsmi_shut_down"] == 1
    with second.measure() as m:
        pass
    assert m.by_domain["gpu:0"] >= 0
    second.close()
    assert fake.init_count == 0


def test_a_lost_gpu_fails_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        mi300x(0, PowerTrace([(60, 100.0)])),
        mi300x(1, PowerTrace([(60, 100.0)]), energy_counter=False),
    ]
    install_fake_amdsmi(monkeypatch, gpus)
    with open_meter("amdsmi", sample_interval_s=0.01) as meter:
        with pytest.raises(MeterError, match="Device Not found"), meter.measure():
            gpus[0].lost = True
        gpus[0].lost = False
        with pytest.raises(MeterError, match="Device Not found"), meter.measure():
            gpus[1].lost = True
            time.sleep(0.03)
        assert sampler_threads() == []


@pytest.mark.parametrize("every_gpu", [False, True])
def test_gpus_are_synchronized_before_each_reading(
    monkeypatch: pytest.MonkeyPatch, every_gpu: bool
) -> None:
    """Before each reading, the GPUs read where this process has a context (GPU 1 here),
    never GPU 0, where waiting would open one, even when every GPU is read."""
    fake = install_fake_amdsmi(
        monkeypatch, [mi300x(0, PowerTrace([(60, 100.0)])), mi300x(1, PowerTrace([(60, 90.0)]))]
    ).fake
    synced: list[tuple[int | None, int]] = []

    def synchronize(device: int | None = None) -> None:
        synced.append((device, fake.calls["amdsmi_get_energy_count"]))

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_initialized=lambda: True, synchronize=synchronize, device_count=lambda: 2
    )
    torch._C = types.SimpleNamespace(_cuda_hasPrimaryContext=lambda i: i == 1)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    with open_meter("amdsmi", every_gpu=every_gpu) as meter:
        reads = fake.calls["amdsmi_get_energy_count"]
        with meter.measure() as m:
            pass
    per_reading = 2 if every_gpu else 1  # both counters, or GPU 1's alone
    assert synced == [(1, reads + per_reading * k) for k in range(2)]
    assert list(m.by_domain) == (["gpu:0", "gpu:1"] if every_gpu else ["gpu:1"])


def test_meter_is_the_amdsmi_class(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_amdsmi(monkeypatch, [mi300x(0, PowerTrace([(60, 100.0)]))])
    with amd.create(amd.MeterSettings()) as meter:
        assert isinstance(meter, AmdSmiMeter)
        assert meter.identity()["meter"] == "amdsmi"


# -- reading amdsmi's replies (generated input) ---------------------------------------------

counts = st.integers(min_value=0, max_value=2**64 - 1)
resolutions = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)


@PROPERTY
@given(count=counts, resolution=resolutions, rocm=st.sampled_from(ROCM_VERSIONS))
def test_energy_count_reads_every_rocm_key(count: int, resolution: float, rocm: str) -> None:
    reply: dict[str, Any] = {"counter_resolution": resolution, "timestamp": 1}
    if rocm in ("6.2", "6.3"):
        reply["power"] = count
    if rocm != "6.2":
        reply["energy_accumulator"] = count
    assert energy_count(reply) == (count, resolution)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=5,
)


@PROPERTY
@given(
    reply=st.dictionaries(
        st.sampled_from([*COUNT_KEYS, "counter_resolution", "timestamp", "other"]), json_values
    )
)
def test_energy_count_reads_or_refuses_any_reply(reply: dict[str, Any]) -> None:
    """Whatever amdsmi returns: a non-negative count and a positive resolution, or one
    ValueError, never another exception."""
    try:
        count, resolution = energy_count(reply)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(count, int) and count >= 0
    assert resolution > 0


@PROPERTY
@given(value=json_values | st.sampled_from([NA, 0xFFFF, 0xFFFFFFFF, 2**64 - 1]))
def test_watts_is_a_reading_or_none(value: Any) -> None:
    out = watts(value)
    if out is not None:
        assert isinstance(out, float) and out >= 0 and out < 0xFFFF
    if value in (NA, 0xFFFF, 0xFFFFFFFF, 2**64 - 1) and not isinstance(value, bool):
        assert out is None


@PROPERTY
@given(
    bits=st.sampled_from([32, 64]),
    start=st.integers(min_value=0, max_value=2**64 - 1),
    step=st.integers(min_value=0, max_value=2**31),
)
def test_count_delta_survives_a_wrap(bits: int, start: int, step: int) -> None:
    start %= 2**bits
    assert count_delta(start, (start + step) % 2**bits) == step


@PROPERTY
@given(
    period_s=st.floats(min_value=1e-4, max_value=0.05),
    power_w=st.floats(min_value=5, max_value=1000),
    scale=st.floats(min_value=1e-4, max_value=1e4),
)
def test_counter_problem_finds_a_counter_off_by_a_factor(
    period_s: float, power_w: float, scale: float
) -> None:
    uj = UJ_PER_COUNT
    changes = [(k * period_s, int(k * period_s * power_w * scale * 1e6 / uj)) for k in range(1, 6)]
    problem = counter_problem(changes, uj, power_w, 0.3)
    if 0.3 < scale < 3 and changes[-1][1] - changes[0][1] > 100:
        assert problem is None
    if scale < 0.2 or scale > 5:
        assert problem is not None and "does not follow power" in problem


# -- the stand-in's settings behave as a board's -------------------------------------------


def test_fake_power_cap_needs_root_an_int_and_outlives_the_process(tmp_path: Path) -> None:
    """What a power-cap sweep on AMD will rely on: µW, root only, an int, within the
    range, shared by an MI250X's dies, and kept by the "driver" for the next process."""
    from tests.fakes.fake_amdsmi import (
        AmdSmiLibraryException,
        AmdSmiParameterException,
        build_fake_amdsmi,
    )

    state = tmp_path / "driver.json"
    smi = build_fake_amdsmi(mi250x(0, PowerTrace([(60, 100.0)])), state_path=state, root=False)
    smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    first, second = smi.amdsmi_get_processor_handles()
    info = smi.amdsmi_get_power_cap_info(first)
    assert (info["min_power_cap"], info["power_cap"]) == (200_000_000, 560_000_000)
    with pytest.raises(AmdSmiLibraryException) as denied:
        smi.amdsmi_set_power_cap(first, 0, 300_000_000)
    assert denied.value.get_error_code() == AMDSMI_STATUS_NO_PERM
    smi.fake.root = True
    with pytest.raises(AmdSmiParameterException):
        smi.amdsmi_set_power_cap(first, 0, 300.0e6)  # type: ignore[arg-type]
    with pytest.raises(AmdSmiLibraryException):
        smi.amdsmi_set_power_cap(first, 0, 900_000_000)  # above the maximum
    smi.amdsmi_set_power_cap(first, 0, 300_000_000)
    assert smi.amdsmi_get_power_cap_info(second)["power_cap"] == 300_000_000  # one board
    smi.amdsmi_shut_down()
    with pytest.raises(AmdSmiLibraryException):  # NOT_INIT after the last shut-down
        smi.amdsmi_get_power_cap_info(first)

    again = build_fake_amdsmi(mi250x(0, PowerTrace([(60, 100.0)])), state_path=state)
    again.amdsmi_init(again.AmdSmiInitFlags.INIT_AMD_GPUS)
    handle = again.amdsmi_get_processor_handles()[0]
    assert again.amdsmi_get_power_cap_info(handle)["power_cap"] == 300_000_000
    power = again.amdsmi_get_power_info(again.amdsmi_get_processor_handles()[1])
    assert power["current_socket_power"] == NA and power["average_socket_power"] == 0
    assert (
        again.amdsmi_get_temp_metric(
            handle, again.AmdSmiTemperatureType.HOTSPOT, again.AmdSmiTemperatureMetric.CURRENT
        )
        == 35
    )  # °C
