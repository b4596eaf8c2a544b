"""Not alone on the GPU (issue 37, item 2): another process on a measured stand-in GPU
(NVIDIA and AMD) marks the trials it overlaps disturbed, as a busy CPU does; the run keeps
who was there; ``--energy-gpu-isolation=error`` (or its ini twin) refuses at start in one
line naming the pids; this session's own children are not others."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pytest_llmenergy import Method, open_meter
from pytest_llmenergy.gpu.device import SmSample
from pytest_llmenergy.meters.nvml import sm_share
from pytest_llmenergy.meters.readings import Domain
from pytest_llmenergy.storage.runfile import loads
from tests.fakes.fake_pynvml import (
    NVML_DEVICE_ARCH_AMPERE,
    FakeGPU,
    fake_uuid,
    install_fake_pynvml,
)
from tests.fakes.gpu_project import install_for_test, neighbour
from tests.fakes.trace import PowerTrace

FOREIGN_PID = 4_000_001  # no process of this session's tree (pid_max is at most 2**22)

# The other program starts during the second measured trial (call 3: call 1 is the
# warm-up) and is gone by the end of the third's call: trial 2 sees it at its end,
# trial 3 at its start; trials 1, 4 and 5 are alone on the GPU.
SHARED_TEST = f"""
from tests.fakes.gpu_project import QUERIES, neighbour, run

CALLS = []


def target(q):
    CALLS.append(1)
    if len(CALLS) == 4:
        neighbour({FOREIGN_PID}, "other-llm-server", present=False)
    out = run(q)
    if len(CALLS) == 3:
        neighbour({FOREIGN_PID}, "other-llm-server")
    return out


def test_query(energy_benchmark):
    q = QUERIES[1]
    energy_benchmark(target, q, input_tokens=q.input_tokens, output_tokens=q.output_tokens)
"""

# A child of the session itself uses the GPU: its work is the session's own.
CHILD_TEST = """
import subprocess
import sys

from tests.fakes.gpu_project import QUERIES, neighbour, run

CHILD = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def target(q):
    neighbour(CHILD.pid, "tokenizer-worker")
    return run(q)


def test_query(energy_benchmark):
    q = QUERIES[1]
    try:
        energy_benchmark(target, q, input_tokens=q.input_tokens, output_tokens=q.output_tokens)
    finally:
        CHILD.kill()
        CHILD.wait()
"""

TRIALS = (
    "-p",
    "no:randomly",
    "--energy-min-trials=3",
    "--energy-max-trials=5",
    "--energy-warmup=1",
    "--energy-max-background=off",  # the shared test machine's CPU load is not the point
    "--energy-min-time=0",  # one call a trial, as the calls above are counted
    "--energy-json=run.json",
)


@pytest.fixture(params=["nvidia", "amd"])
def vendor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLMENERGY_GPU_STATE", str(tmp_path / "llmenergy-gpu-state.json"))
    if request.param == "amd":
        monkeypatch.setenv("FAKE_GPU_VENDOR", "amd")
    else:
        monkeypatch.delenv("FAKE_GPU_VENDOR", raising=False)
    install_for_test(monkeypatch)
    return request.param


def backend(vendor: str) -> str:
    return "--energy-backend=" + ("amdsmi" if vendor == "amd" else "nvml")


def test_a_second_process_marks_the_trials_it_overlaps_disturbed(
    pytester: pytest.Pytester, vendor: str
) -> None:
    pytester.makepyfile(test_shared=SHARED_TEST)
    result = pytester.runpytest(backend(vendor), *TRIALS)
    assert result.ret == 0, result.stdout.str()
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    (case,) = run.cases
    assert [t.index for t in case.disturbed] == [2, 3]
    assert [t.index for t in case.trials] == [1, 4, 5]
    for trial in case.disturbed:  # the run keeps who was there
        assert trial.gpu is not None
        assert [(n.gpu, n.pid, n.name) for n in trial.gpu.neighbours] == [
            ("gpu:0", FOREIGN_PID, "other-llm-server")
        ]
    assert all(t.gpu is None for t in case.trials)  # alone: nothing to record


def test_error_refuses_at_start_naming_the_pids(pytester: pytest.Pytester, vendor: str) -> None:
    neighbour(FOREIGN_PID, "other-llm-server")
    pytester.makepyfile(test_shared=SHARED_TEST)
    result = pytester.runpytest(backend(vendor), "--energy-gpu-isolation=error", *TRIALS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --energy-gpu-isolation=error: other processes use the measured GPUs: "
            f"gpu:0 pid {FOREIGN_PID} other-llm-server; stop them, or pass *"
        ]
    )
    assert "Traceback" not in result.stderr.str()
    assert not (pytester.path / "run.json").exists()


def test_the_ini_twin_refuses_too_and_warn_says_who_is_there(
    pytester: pytest.Pytester, vendor: str
) -> None:
    neighbour(FOREIGN_PID + 1, "resident-server")  # there all along
    pytester.makepyfile(test_shared=SHARED_TEST)
    pytester.makeini("[pytest]\nllmenergy_gpu_isolation = error\n")
    refused = pytester.runpytest(backend(vendor), *TRIALS)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    warned = pytester.runpytest(backend(vendor), "--energy-gpu-isolation=warn", *TRIALS)
    warned.assert_outcomes(skipped=1)  # nothing measured: no pass
    warned.stdout.no_fnmatch_line("*the machine is busy*")  # the CPUs were not
    warned.stdout.fnmatch_lines(
        [
            f"*WARNING: other processes use the measured GPUs: gpu:0 pid {FOREIGN_PID + 1}*",
            "*not measured: all 5 trials were disturbed by other processes on the measured GPUs "
            f"(gpu:0 pid {FOREIGN_PID + 1} resident-server, gpu:0 pid {FOREIGN_PID} *",
            "*machine busy in 1 case(s): other processes shared the measured GPUs "
            f"(gpu:0 pid {FOREIGN_PID + 1}*",
        ]
    )


def test_off_does_not_look(pytester: pytest.Pytester, vendor: str) -> None:
    neighbour(FOREIGN_PID, "other-llm-server")
    pytester.makepyfile(test_shared=SHARED_TEST)
    result = pytester.runpytest(backend(vendor), "--energy-gpu-isolation=off", *TRIALS)
    assert result.ret == 0, result.stdout.str()
    assert "other processes use the measured GPUs" not in result.stdout.str()
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    assert not run.cases[0].disturbed


def test_the_sessions_own_children_are_not_others(pytester: pytest.Pytester, vendor: str) -> None:
    pytester.makepyfile(test_child=CHILD_TEST)
    result = pytester.runpytest(backend(vendor), "--energy-gpu-isolation=error", *TRIALS)
    assert result.ret == 0, result.stdout.str()
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    assert not run.cases[0].disturbed and len(run.cases[0].trials) >= 3


# -- this process's share of a shared GPU's joules, where NVML keeps per-process use ------
def test_gpu_process_is_the_share_of_sm_use_labelled_an_attribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the window only the other program used the SMs; during it this process
    used 60 % and the other 20 %: gpu:process is 3/4 of the GPU's joules, not counted
    in the total, and marked attributed."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    trace = PowerTrace([(60.0, 200.0)])
    gpu = FakeGPU("NVIDIA A100", fake_uuid(0), NVML_DEVICE_ARCH_AMPERE, trace,
                  counter_period_s=0.005, process_utilization=True)  # fmt: skip
    install_fake_pynvml(monkeypatch, [gpu])
    with open_meter("nvml") as meter:
        assert meter.domains["gpu:process"] == Domain("gpu:process", Method.ATTRIBUTED, False)
        now_us = int(time.time() * 1e6)
        gpu.util_samples += [(now_us - 400_000 + 20_000 * i, FOREIGN_PID, 90) for i in range(20)]
        with meter.measure() as m:
            start_us = int(time.time() * 1e6)
            for i in range(10):
                t_us = start_us + 1 + 20_000 * i
                gpu.util_samples += [(t_us, os.getpid(), 60), (t_us, FOREIGN_PID, 20)]
            time.sleep(0.25)
    assert m.methods["gpu:process"] == Method.ATTRIBUTED
    assert m.by_domain["gpu:process"] == pytest.approx(0.75 * m.by_domain["gpu:0"], rel=1e-9)
    assert m.by_domain["gpu:0"] > 40


def test_sm_share_over_known_samples() -> None:
    def S(pid: int, t: int, sm: int) -> SmSample:
        return SmSample(pid, sm, t)

    mine, other = 10, 20
    samples = [S(mine, 5, 30), S(other, 5, 10), S(other, 50, 100)]
    assert sm_share(samples, {mine}, until_us=10) == pytest.approx(0.75)  # the late one: out
    assert sm_share(samples, {mine}, until_us=60) == pytest.approx(30 / 140)
    assert sm_share([], {mine}, until_us=60) == 1.0  # nobody seen: all of it
    assert sm_share([S(other, 5, 50)], {mine}, until_us=60) == 0.0
