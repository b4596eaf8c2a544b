"""``llmenergy check``: the meters of this machine, the noise between sessions, and what
a gate can see here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.check import NoiseCheck, check_meters
from pytest_llmenergy.cli import main
from pytest_llmenergy.errors import MeterUnavailable
from pytest_llmenergy.meters import open_meter

ROOT = Path(__file__).resolve().parents[1]


def test_each_backend_opens_or_says_why_in_one_line() -> None:
    def opener(name: str) -> object:
        if name == "gone":
            raise MeterUnavailable("gone", "no such device here\nsecond line never shown")
        if name == "broken":
            raise RuntimeError("the vendor library fell over")
        return open_meter("estimate", cpu_tdp_w=40.0)

    found = {m.backend: m for m in check_meters(["gone", "broken", "estimate"], opener, 0.2)}
    assert not found["gone"].available and found["gone"].why == "no such device here"
    assert found["broken"].why == "RuntimeError: the vendor library fell over"
    estimate = found["estimate"]
    assert estimate.available and estimate.estimated
    assert "TDP 40 W" in estimate.why
    # idle: the estimate's CPU share of 40 W over a quiet 0.2 s, near nothing
    assert estimate.idle_w is not None and 0 <= estimate.idle_w < 40


def test_what_a_gate_can_see_follows_the_noise_or_the_assumed_one() -> None:
    same = NoiseCheck("estimate", (1.0, 1.0), (0.01, 0.01), (5.0, 5.0))
    # no difference measured: the assumed 15 % between sessions decides (the 63 % an
    # in-session gate against one baseline prints)
    assert same.between == 0.0
    expected = math.expm1((1.6448536 + 0.8416212) * math.log(1.15) * math.sqrt(2))
    assert same.detectable() == pytest.approx(expected, rel=1e-4)
    wide = NoiseCheck("estimate", (1.0, 1.5), (0.01, 0.01), (5.0, 5.0))
    assert wide.between == pytest.approx(0.5)
    assert wide.detectable() > same.detectable()


def test_bad_session_count_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--sessions", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sessions 1" in err[0] and "Traceback" not in err[0]


@pytest.mark.slow  # three sessions of the suite
@pytest.mark.serial  # its sessions judge trials by the machine's load, as a user's do
def test_check_on_this_machine_the_way_a_user_runs_it(tmp_path: Path, tiny_cache: Path) -> None:
    """The whole command, in a fresh process: here only the estimate opens, and two
    sessions of the small case are measured with it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMENERGY_CACHE": str(tiny_cache)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest_llmenergy", "check", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    meters = {m["backend"]: m for m in report["meters"]}
    assert meters["estimate"]["available"]
    assert not meters["rapl"]["available"] and meters["rapl"]["why"]  # no powercap here
    assert not meters["nvml"]["available"] and meters["nvml"]["why"]  # no GPU
    sessions = report["sessions"]
    assert sessions["backend"] == report["auto"] == "estimate"
    assert len(sessions["j_per_token"]) == 2 and min(sessions["j_per_token"]) > 0
    assert sessions["between"] == pytest.approx(
        abs(sessions["j_per_token"][1] / sessions["j_per_token"][0] - 1)
    )
    assert sessions["one_session_gate_detects"] >= 0.6  # at least the assumed noise's
    # the table form says the same in words
    text = subprocess.run(
        [sys.executable, "-m", "pytest_llmenergy", "check", "--sessions", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert text.returncode == 0, text.stderr
    assert "meters on this machine" in text.stdout and "estimate (auto)" in text.stdout
