"""``llmenergy check``: the meters of this machine, the noise between sessions, and what
a gate can see here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmenergy.check import NoiseCheck, check_meters, run_sessions
from pytest_llmenergy.cli import main
from pytest_llmenergy.errors import ConfigError, MeterUnavailable
from pytest_llmenergy.meters import open_meter
from pytest_llmenergy.storage.runfile import Run, dumps
from tests.casefactory import make_case

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


def _busy_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for the sessions' ``python``: it saves, where ``--energy-json`` says, a
    run whose one case has every trial disturbed (a machine busy throughout), and keeps
    the arguments it was given."""
    case = make_case([1.0, 1.1, 0.9])
    busy = replace(case, trials=(), disturbed=case.trials)
    saved = tmp_path / "busy.json"
    saved.write_text(
        dumps(
            Run("", "busy", "2026-01-01T00:00:00Z", "complete", "hw", {}, {}, {}, {}, cases=(busy,))
        )
    )
    argv = tmp_path / "argv.json"
    script = tmp_path / "python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, shutil, sys\n"
        f"json.dump(sys.argv[1:], open({str(argv)!r}, 'w'))\n"
        "out = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--energy-json='))\n"
        f"shutil.copy({str(saved)!r}, out)\n"
    )
    script.chmod(0o755)
    return script, argv


@pytest.mark.parametrize(
    ("share", "given", "advice"),
    [
        (0.25, "--energy-max-background=0.25", "(--max-background=off)"),
        (0.5, "--energy-max-background=0.5", "(--max-background=off)"),
        (None, "--energy-max-background=off", "stop them and run check again"),
    ],
)
def test_a_session_too_busy_to_measure_says_what_to_do_in_one_line(
    tmp_path: Path, share: float | None, given: str, advice: str
) -> None:
    """Every trial of a session disturbed: check stops with one line that says how busy
    was too busy and what to do, and the sessions were given the share it was asked for."""
    python, argv = _busy_python(tmp_path)
    with pytest.raises(ConfigError) as raised:
        run_sessions("estimate", 2, python=str(python), max_background=share)
    line = str(raised.value)
    assert "\n" not in line and line.startswith("check: session 1: every trial was disturbed")
    assert line.endswith(advice)
    if share is not None:
        assert f"more than {share:.0%} of the CPUs busy" in line
    assert given in json.loads(argv.read_text())


def test_the_share_of_a_busy_machine_is_checked_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for bad in ("0", "1e400", "-5%", "nan", "lots"):
        with pytest.raises(SystemExit) as stop:  # argparse's usage error
            main(["check", f"--max-background={bad}"])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("llmenergy check: error: argument --max-background: ")
        assert f"got {bad!r}" in err[-1] and "Traceback" not in "".join(err)


def _check(
    where: Path, env: dict[str, str], *args: str, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """``llmenergy check ARGS`` in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_llmenergy", "check", *args],
        cwd=where,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.slow  # three sessions of the suite
@pytest.mark.serial  # its sessions judge trials by the machine's load, as a user's do
def test_check_on_this_machine_the_way_a_user_runs_it(tmp_path: Path, tiny_cache: Path) -> None:
    """The whole command, in a fresh process: here only the estimate opens, and two
    sessions of the small case are measured with it.  On a machine busy throughout (a
    CI runner shared with other jobs) every trial is disturbed; check then says so, naming
    the way through, which is taken, and exits 3 (issue 61)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMENERGY_CACHE": str(tiny_cache)}
    done = _check(tmp_path, env, "--format", "json")
    said = " ".join(done.stderr.split())  # its lines wrapped to the terminal, joined
    if done.returncode == 3 and "every trial was disturbed by other work" in said:
        assert "llmenergy: check: session " in said and said.endswith("(--max-background=off)")
        print(f"busy here: {said}")
        done = _check(tmp_path, env, "--format", "json", "--max-background=off")
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
    text = _check(tmp_path, env, "--sessions", "0", timeout_s=120)
    assert text.returncode == 0, text.stderr
    assert "meters on this machine" in text.stdout and "estimate (auto)" in text.stdout
