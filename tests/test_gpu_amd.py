"""GPU settings on AMD (issue 37, item 1): the device layer over the fake amdsmi, the
power-cap axis and the time-energy frontier on an MI300X-like stand-in whose physics
gives the true time and energy at every cap, and the cap given back on every exit path,
a killed session included (its state file says the GPU is AMD's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.conditions.control import GpuControl, GpuControlError, StateFile, recover
from pytest_llmenergy.conditions.settings import GpuSetting
from pytest_llmenergy.frontier import Point, frontier
from pytest_llmenergy.gpu.amd import AmdLibrary
from pytest_llmenergy.gpu.device import GpuDeviceError, GpuProcess
from pytest_llmenergy.storage.runfile import loads
from tests.fakes.fake_amdsmi import build_fake_amdsmi, install_fake_amdsmi, mi250x
from tests.fakes.gpu_project import (
    AMD_MAX_UW,
    QUERIES,
    TEST_FILE,
    FakeQuery,
    install_for_test,
    make_amd_gpu,
)
from tests.fakes.trace import PowerTrace
from tests.test_gpu_restore import STOPPING_TEST, session

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "fakes" / "driver"
CAPS_W = (750.0, 500.0, 300.0)  # 750 W: the default
LAM = 0.6


def truth_points(query: FakeQuery) -> list[Point]:
    return [
        Point(f"pl{w:g}W", *query.amd_truth(w), default=w == 750.0, power_limit_w=w) for w in CAPS_W
    ]


@pytest.fixture(autouse=True)
def _amd_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_GPU_VENDOR", "amd")
    monkeypatch.setenv("LLMENERGY_GPU_STATE", str(tmp_path / "llmenergy-gpu-state.json"))
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "driver-state.json"))


# -- the device layer over amdsmi ----------------------------------------------------------
def test_the_amd_device_reads_and_sets_in_the_projects_units(tmp_path: Path) -> None:
    smi = build_fake_amdsmi([make_amd_gpu(0)], state_path=tmp_path / "driver.json")
    smi.fake.gpus[0].processes = [
        {"name": "python3", "pid": 4242, "mem": 3 * 2**30, "engine_usage": {"gfx": 0, "enc": 0},
         "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 3 * 2**30}},
        {"name": "N/A", "pid": 77, "mem": "N/A", "engine_usage": {}, "memory_usage": {}},
    ]  # fmt: skip
    library = AmdLibrary(smi)
    (gpu,) = library.devices()
    assert (gpu.domain, gpu.name) == ("gpu:0", "AMD Instinct MI300X")
    limits = gpu.power_limits()  # µW in amdsmi, W here
    assert (limits.min_w, limits.max_w, limits.default_w) == (200.0, 750.0, 750.0)
    gpu.set_power_limit_w(412.5)
    assert smi.fake.gpus[0].power_cap_uw == 412_500_000 and gpu.power_limit_w() == 412.5
    again = build_fake_amdsmi([make_amd_gpu(0)], state_path=tmp_path / "driver.json")
    assert again.fake.gpus[0].power_cap_uw == 412_500_000  # the cap outlives the process
    assert gpu.temperature_c() == 35.0  # no edge sensor on an MI300X: the hotspot
    assert gpu.sm_clock_mhz() == 500 and gpu.event_reasons() == 0x1  # idle: deep sleep
    assert gpu.supported_clocks_mhz() == () and library.no_clock_lock is not None
    assert gpu.processes() == (
        GpuProcess(4242, "python3", 3072.0),
        GpuProcess(77, "", None),  # "N/A": not said
    )
    assert gpu.sm_samples(0) is None  # amdsmi keeps no per-process utilization
    with pytest.raises(GpuDeviceError) as info:
        gpu.set_power_limit_w(900.0)  # beyond max_power_cap: amdsmi's INVAL, one line
    assert "\n" not in str(info.value) and not info.value.permission
    library.close()
    assert smi.fake.init_count == 0


def test_without_root_the_device_says_permission() -> None:
    library = AmdLibrary(build_fake_amdsmi([make_amd_gpu(0)], root=False))
    (gpu,) = library.devices()
    with pytest.raises(GpuDeviceError) as info:
        gpu.set_power_limit_w(400.0)
    assert info.value.permission


def test_an_mi250x_board_is_capped_once_for_both_dies_and_restored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    smi = install_fake_amdsmi(monkeypatch, mi250x(0, PowerTrace([(1.0, 300.0)])))
    state = StateFile(tmp_path / "state.json")
    control = GpuControl(state, backend="amdsmi")
    assert [d.domain for d in control.devices] == ["gpu:0", "gpu:1"]
    control.apply(GpuSetting(300.0))
    assert [g.power_cap_uw for g in smi.fake.gpus] == [300_000_000] * 2
    saved = state.read()
    assert saved is not None and {g["vendor"] for g in saved["gpus"]} == {"amd"}
    control.restore()
    assert [g.power_cap_uw for g in smi.fake.gpus] == [560_000_000] * 2
    control.close()


def test_a_killed_amd_session_is_recovered_through_amdsmi(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    smi = install_fake_amdsmi(monkeypatch, [make_amd_gpu(0)])
    state = StateFile(tmp_path / "state.json")
    control = GpuControl(state, backend="amdsmi")
    control.apply(GpuSetting(300.0))
    data = state.read()
    assert data is not None
    data["pid"] = 2**22 + 12345  # "killed": nothing restored, a dead pid in the file
    state.path.write_text(json.dumps(data))
    found = recover(state)  # no module given: the vendor in the file picks amdsmi
    assert found is not None and found[1][0].power_limit_w == 750.0
    assert smi.fake.gpus[0].power_cap_uw == AMD_MAX_UW and not state.path.exists()


def test_locking_clocks_on_amd_is_one_line_at_start(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = install_for_test(monkeypatch)
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest("--energy-backend=amdsmi", "--energy-gpu-clocks=1500MHz")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --energy-gpu-clocks: locking clocks is not supported*"])
    assert gpu.fake.gpus[0].power_cap_uw == AMD_MAX_UW


def test_a_missing_permission_on_amd_is_one_line_at_start(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GPU_ROOT", "0")
    install_for_test(monkeypatch)
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest("--energy-backend=amdsmi", "--energy-gpu-power-limits=300W")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: changing GPU power limits and clocks needs root*"])


# -- the sweep, as users run it -------------------------------------------------------------
SWEEP = (
    "-p",
    "no:randomly",
    "--energy-backend=amdsmi",
    "--energy-gpu-power-limits=500W,300W",
    f"--energy-route-lambda={LAM}",
    "--energy-min-trials=3",
    "--energy-max-trials=3",
    "--energy-warmup=1",
    "--energy-min-time=0",  # one call a trial: the stand-in's sleeps are ranked per call
)


def test_the_amd_sweep_finds_the_true_frontier_and_gives_the_cap_back(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = install_for_test(monkeypatch)
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    out = pytester.path / "frontier.json"
    result = pytester.runpytest(*SWEEP, f"--energy-frontier-json={out}", "--energy-json=run.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*GPU settings: 3 per case on gpu:0 AMD Instinct MI300X*pl750W, pl500W, pl300W*",
            "*time-energy frontier over GPU settings*",
            "*GPU settings restored (session end)*power limit 750 W, clocks unlocked*",
        ]
    )
    result.assert_outcomes(passed=6)
    assert gpu.fake.gpus[0].power_cap_uw == AMD_MAX_UW  # the GPU as it was
    assert not Path(os.environ["LLMENERGY_GPU_STATE"]).exists()

    data = json.loads(out.read_text())
    assert data["system"].endswith("__1x-amd-instinct-mi300x__amdsmi")  # the hardware key
    by_case = {(c["input_tokens"], c["output_tokens"]): c for c in data["cases"]}
    optima = set()
    for query in QUERIES:
        case = by_case[(query.input_tokens, query.output_tokens)]
        truth = {p.setting: p for p in truth_points(query)}
        for point in case["points"]:  # every cap measured as the physics says
            true = truth[point["setting"]]
            assert point["energy_j"] == pytest.approx(true.energy_j, rel=0.01)
            assert point["time_s"] == pytest.approx(true.time_s, rel=0.01)
        true_front = frontier("t", {}, 0, 0, list(truth.values()), lam=LAM, p_ref_w=750.0)
        assert case["min_energy"] == true_front.min_energy.setting
        assert case["lambda_best"] == true_front.lam_best.setting
        assert case["pareto"] == [p.setting for p in true_front.pareto]
        assert case["p_ref_w"] == 750.0  # the highest cap amdsmi allows
        optima.add(case["lambda_best"])
    assert optima == {"pl500W", "pl300W"}  # prefill and decode: different true optima

    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    for case in run.cases:  # the cap in force, read through amdsmi on every trial
        for trial in case.trials:
            assert trial.gpu is not None
            assert trial.gpu.power_limit_w == float(case.labels["power_limit_w"])
            assert trial.gpu.temperature_c_max is not None


# -- every exit path, each session a real process --------------------------------------------
@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(DRIVER), str(REPO)]))
    (tmp_path / "test_stop.py").write_text(STOPPING_TEST)
    return tmp_path


def cap_w(project: Path) -> float:
    """The power cap as a new process reads it through amdsmi."""
    smi = build_fake_amdsmi([make_amd_gpu(0)], state_path=project / "driver-state.json")
    return smi.fake.gpus[0].power_cap_uw / 1e6


CAPPED = (
    "--energy-backend=amdsmi",
    "--energy-gpu-power-limits=300W",
    "-k",
    "pl300W",
    "--energy-min-trials=2",
    "--energy-max-trials=2",
    "--energy-max-background=off",
    "test_stop.py",
)


@pytest.mark.parametrize(
    ("how", "code", "why"),
    [("", 0, "session end"), ("fail", 1, "session end"), ("int", 2, "session end"),
     ("term", 2, "SIGTERM")],
)  # fmt: skip
def test_the_amd_cap_is_given_back_however_the_session_ends(
    project: Path, how: str, code: int, why: str
) -> None:
    done = session(project, how, *CAPPED)
    out = done.stdout + done.stderr
    assert done.returncode == code, out
    assert f"GPU settings restored ({why}): gpu:0 AMD Instinct MI300X: power limit 750 W" in out
    assert cap_w(project) == 750.0
    assert not (project / "llmenergy-gpu-state.json").exists()


def test_amd_sigkill_then_a_new_session_or_the_command_restores(project: Path) -> None:
    killed = session(project, "kill", *CAPPED)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert cap_w(project) == 300.0  # left changed, with what is needed to restore
    data = json.loads((project / "llmenergy-gpu-state.json").read_text())
    assert data["gpus"][0]["vendor"] == "amd"
    after = session(project, "", "-k", "test_plain", "test_stop.py")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "restored GPU settings a session left changed (pid" in after.stdout
    assert "gpu:0 AMD Instinct MI300X: power limit 750 W" in after.stdout
    assert cap_w(project) == 750.0

    assert session(project, "kill", *CAPPED).returncode == -9
    cli = [sys.executable, "-m", "pytest_llmenergy", "gpu", "restore"]
    done = subprocess.run(cli, cwd=project, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "gpu:0 AMD Instinct MI300X: power limit 750 W, clocks unlocked" in done.stdout
    assert cap_w(project) == 750.0


def test_a_restore_that_fails_names_amd_smi(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    smi = install_fake_amdsmi(monkeypatch, [make_amd_gpu(0)])
    control = GpuControl(StateFile(tmp_path / "state.json"), backend="amdsmi")
    control.apply(GpuSetting(300.0))
    smi.fake.root = False  # someone dropped our rights meanwhile
    with pytest.raises(GpuControlError, match="amd-smi reset --power-cap"):
        control.restore()
    assert (tmp_path / "state.json").exists()  # kept, for a restore that works
