"""The GPU is always given back as it was (issue 14, item 2): a failing test, Ctrl-C,
SIGTERM, and SIGKILL followed by a new session or ``llmenergy gpu restore``.

Each session is a real process whose ``import pynvml`` gives the fake A100
(tests/fakes/driver), whose settings persist in a file as a driver keeps them between
processes; after each scenario the GPU is read back through a new fake on that file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fake_pynvml import build_fake_pynvml
from tests.fakes.gpu_project import TEST_FILE, install_for_test, make_gpu

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "fakes" / "driver"

STOPPING_TEST = """
import os
import signal

from tests.fakes.gpu_project import QUERIES, run

HOW = os.environ.get("STOP_HOW", "")


def target(q):
    out = run(q)
    if HOW == "fail":
        raise AssertionError("the model broke")
    if HOW == "int":
        raise KeyboardInterrupt
    if HOW in ("term", "kill"):
        os.kill(os.getpid(), signal.SIGTERM if HOW == "term" else signal.SIGKILL)
    return out


def test_query(energy_benchmark):
    q = QUERIES[0]
    energy_benchmark(target, q, input_tokens=q.input_tokens, output_tokens=q.output_tokens)


def test_plain():
    pass
"""


def read_back(driver_state: Path) -> tuple[float, Any]:
    """The GPU's power limit (W) and locked clocks, as a new process would read them."""
    nvml = build_fake_pynvml([make_gpu()], state_path=driver_state)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    return nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000, nvml.fake.gpus[0].locked_clocks_mhz


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(DRIVER), str(REPO)]))
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "driver-state.json"))
    monkeypatch.setenv("LLMENERGY_GPU_STATE", str(tmp_path / "llmenergy-gpu-state.json"))
    (tmp_path / "test_stop.py").write_text(STOPPING_TEST)
    return tmp_path


def session(project: Path, how: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STOP_HOW": how, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


CAPPED = (
    "--energy-backend=nvml",
    "--energy-gpu-power-limits=150W",
    "--energy-gpu-clocks=1005MHz",
    "-k",
    "pl150W-sm1005MHz",  # only the changed setting: stopped while the GPU is changed
    "--energy-min-trials=2",
    "--energy-max-trials=2",
    "--energy-max-background=off",
    "test_stop.py",
)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("fail", "*GPU settings restored (session end)*power limit 400 W, clocks unlocked*"),
        ("int", "*GPU settings restored (session end)*power limit 400 W, clocks unlocked*"),
        ("term", "*GPU settings restored (SIGTERM)*power limit 400 W, clocks unlocked*"),
    ],
)
def test_the_gpu_is_given_back_however_the_session_ends(project: Path, how: str, said: str) -> None:
    done = session(project, how, *CAPPED)
    out = done.stdout + done.stderr
    assert done.returncode in (1, 2), out  # failed, or interrupted
    assert said.strip("*").split("*")[0] in out, out
    assert read_back(project / "driver-state.json") == (400.0, None)
    assert not (project / "llmenergy-gpu-state.json").exists()


def test_sigkill_then_a_new_session_restores_and_says_so(project: Path) -> None:
    killed = session(project, "kill", *CAPPED)
    assert killed.returncode == -9
    assert read_back(project / "driver-state.json") == (150.0, (1005, 1005))  # left changed
    assert (project / "llmenergy-gpu-state.json").exists()  # with what is needed
    after = session(project, "", "-k", "test_plain", "test_stop.py")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "restored GPU settings a session left changed (pid" in after.stdout
    assert "power limit 400 W, clocks unlocked" in after.stdout
    assert read_back(project / "driver-state.json") == (400.0, None)


def test_sigkill_then_llmenergy_gpu_restore(project: Path) -> None:
    assert session(project, "kill", *CAPPED).returncode == -9
    cli = [sys.executable, "-m", "pytest_llmenergy", "gpu", "restore"]
    done = subprocess.run(cli, cwd=project, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "restored the GPU settings a session left changed" in done.stdout
    assert "gpu:0 NVIDIA A100-SXM4-40GB: power limit 400 W, clocks unlocked" in done.stdout
    assert read_back(project / "driver-state.json") == (400.0, None)
    again = subprocess.run(cli, cwd=project, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing to restore" in again.stdout


def test_without_root_one_line_at_start(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("FAKE_GPU_ROOT", "0")
    monkeypatch.setenv("LLMENERGY_GPU_STATE", str(tmp_path / "state.json"))
    gpu = install_for_test(monkeypatch)
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest("--energy-backend=nvml", "--energy-gpu-power-limits=200W")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: changing GPU power limits and clocks needs root or CAP_SYS_ADMIN: run the "
         "session as root (sudo -E python -m pytest ...)*"]
    )  # fmt: skip
    assert gpu.fake.gpus[0].power_limit_mw == 400_000
    assert not (tmp_path / "state.json").exists()
