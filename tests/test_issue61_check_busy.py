"""Issue 61, item 6: ``llmenergy check`` on a machine too busy to read the noise between
sessions ran, then exited 2 ("bad input") with one 250-character line, and the meter
table it had built was lost.  It shows the meters, says in lines that fit the terminal
that the machine was too busy and what to do, and exits 3, as docs/exit-codes.md says."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from pytest_llmenergy import check
from pytest_llmenergy.cli import main
from tests.test_check import _busy_python

DOC = Path(__file__).resolve().parents[1] / "docs" / "exit-codes.md"


@pytest.fixture
def busy_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """check's sessions run by a stand-in python whose session saves a case with every
    trial disturbed, as on a machine busy throughout; returns the file of its arguments."""
    python, argv = _busy_python(tmp_path)
    sessions = functools.partial(check.run_sessions, python=str(python))
    monkeypatch.setattr(check, "run_sessions", sessions)
    return argv


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", "--backend", "estimate", "--backend", "nvml", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_a_busy_machine_shows_the_meters_then_says_so_in_lines_that_fit(
    busy_machine: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = _check(capsys, "--max-background=25%")
    assert code == 3
    # the meters it read, as on a quiet machine
    assert out.startswith("meters on this machine") and "estimate (auto)" in out
    assert "nvml" in out
    # then what happened and what to do, in lines that fit, not one error line
    assert "error" not in err
    said = re.sub(r"\n +", " ", err)
    assert "every trial was disturbed by other work on this machine (more than 25%" in said
    assert "stop it and run check again" in said and "(--max-background=off)" in said
    too_wide = [line for line in (out + err).splitlines() if len(line) > 80]
    assert not too_wide, "\n".join(too_wide)
    assert "--energy-max-background=0.25" in json.loads(busy_machine.read_text())


def test_a_busy_machine_in_json_keeps_the_meters_and_says_why(
    busy_machine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _check(capsys, "--format", "json")
    assert code == 3
    report = json.loads(out)
    assert {m["backend"] for m in report["meters"]} == {"estimate", "nvml"}
    assert report["sessions"] is None
    assert report["busy"][0].startswith("check: session 1: every trial was disturbed")
    assert "every trial was disturbed" in err


def test_the_exit_codes_page_gives_check_on_a_busy_machine_3() -> None:
    rows = re.findall(r"^\| `llmenergy check` \| (\d+) \| (.*) \|$", DOC.read_text(), re.M)
    assert [code for code, _ in rows] == ["3"]
    assert "busy" in rows[0][1]
