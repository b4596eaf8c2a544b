"""Issue 62, items 4 to 12: a hand-edited shard count, extreme numbers, a killed run in a
pool, control characters in csv on a terminal, a gate's bare number, ``proof``'s blank
line, an unknown figure's list, and a run file too large to read: each one line or
done, quickly, in bounded memory."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import parse_gates
from pytest_llmenergy.errors import ConfigError, MeterUnavailable
from pytest_llmenergy.figures import format_amount, parse_figure_threshold, per_trial_keys
from pytest_llmenergy.meters.base import MAX_IDLE_S
from pytest_llmenergy.plugin.interleaving import Interleaving
from pytest_llmenergy.proof import stages
from pytest_llmenergy.storage.runfile import (
    ABANDONED,
    COMPLETE,
    INTERRUPTED,
    RUNNING,
    dumps,
    load,
    this_writer,
)
from tests.casefactory import make_case
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace
from tests.hostile import hostile_run
from tests.test_cli import cli, save
from tests.test_plugin import assert_one_line_usage_error
from tests.test_storage_runfile import sample_run

ESCAPE = "\x1b[2J\x1b]0;pwn\x07"


def _write(path: Path, seconds: float = 0.1, **changes: object) -> Path:
    """A saved run of one case, its trials lasting about ``seconds`` (runs of distinct
    sessions: a pool refuses one whose trials another holds)."""
    case = make_case([seconds, seconds * 1.1])
    path.write_text(dumps(dataclasses.replace(sample_run((case,)), **changes)))
    return path


def _shard(path: Path, part: int, of: int, nodeid: str) -> Path:
    case = dataclasses.replace(make_case([0.1, 0.11]), nodeid=nodeid, name=nodeid)
    run = sample_run((case,))
    return _write(path, cases=(case,), options={**run.options, "shard": [part, of]})


# -- item 4: a shard count of 10**12 ---------------------------------------------------------
def test_a_hand_edited_shard_count_is_named_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The missing parts are ranges built from the parts there are, never a list as long
    as the count a file claims (10**12 parts: 2.4 GB, killed at 20 s)."""
    huge = 10**12
    parts = [_shard(tmp_path / f"s{i}.json", i, huge, f"t.py::test_{i}") for i in (1, 3)]
    start = time.monotonic()
    code, _, err = cli(capsys, "merge", *parts, "--out", tmp_path / "j.json")
    assert code == 2 and err.count("\n") == 1
    assert f"shard 2/{huge}, 4/{huge} to {huge}/{huge} missing" in err
    assert time.monotonic() - start < 5


def test_a_partial_join_of_a_huge_split_says_what_it_lacks_in_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --partial, the note naming what is missing is one short line (10**7 parts
    made it 180 MB)."""
    parts = [_shard(tmp_path / f"s{i}.json", i, 10**7, f"t.py::test_{i}") for i in (1, 5)]
    code, _, err = cli(capsys, "merge", *parts, "--partial", "--out", tmp_path / "j.json")
    assert code == 0 and len(err) < 600
    assert "shard 2/10000000 to 4/10000000, 6/10000000 to 10000000/10000000 missing" in err
    assert load(tmp_path / "j.json").status == INTERRUPTED


# -- items 5 and 6: numbers no session means ----------------------------------------------------
def test_an_idle_measurement_past_an_hour_is_one_line(pytester: pytest.Pytester) -> None:
    """1e10 s overflowed time.sleep: INTERNALERROR, exit 3, with no test selected."""
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:randomly", "--energy-idle=1e10", "-k", "nothing")
    assert_one_line_usage_error(result, "--energy-idle", "0 to 3600 s", "1e+10 s")
    meter = TraceMeter({"cpu": PowerTrace([(3600, 10.0)])})
    for seconds in (float("nan"), -1.0, MAX_IDLE_S + 1):
        with pytest.raises(ConfigError, match=f"0 to 3600 s \\(an hour\\), not {seconds:g} s"):
            meter.measure_idle(seconds)
    assert meter.measure_idle(0.01) == {"cpu": pytest.approx(10.0)}


def test_a_visit_count_past_the_bound_is_one_line(pytester: pytest.Pytester) -> None:
    """10**12 visits looped in the schedule, with no case selected, for minutes."""
    pytester.makepyfile("def test_x(): pass")
    start = time.monotonic()
    result = pytester.runpytest("-p", "no:randomly", "--energy-interleave=1000000000000")
    assert_one_line_usage_error(result, "--energy-interleave", "at most 1000 visits")
    assert time.monotonic() - start < 20


def test_a_schedule_without_energy_cases_is_the_items_once() -> None:
    assert Interleaving(10**12, seed=1, group=lambda item: 0).schedule([]) == []


# -- item 7: pooling a killed run ------------------------------------------------------------
def test_pooling_refuses_a_killed_run_unless_partial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose writer was killed reads as abandoned: the pool named it nowhere and
    wrote ``abandoned`` (a status no writer writes), exit 0 and the dead writer."""
    me = this_writer()
    dead = {**me, "started": me["started"] - 3600}  # its pid now another process's
    done = _write(tmp_path / "done.json", exit_status=0)
    killed = _write(tmp_path / "killed.json", 0.2, status=RUNNING, writer=dead, name="killed")
    assert load(killed).status == ABANDONED
    code, _, err = cli(capsys, "merge", done, killed, "--out", tmp_path / "p.json")
    assert code == 2 and err.count("\n") == 1
    assert "killed still says running: killed or cancelled (1 case(s) saved)" in err
    assert "--partial" in err and not (tmp_path / "p.json").exists()
    code, _, err = cli(capsys, "merge", done, killed, "--partial", "--out", tmp_path / "p.json")
    assert code == 0 and "its cases are pooled as they are" in err
    pooled = json.loads((tmp_path / "p.json").read_text())["run"]
    assert pooled["status"] == INTERRUPTED
    assert "writer" not in pooled and pooled.get("exit_status") is None
    # finished runs pool as before, complete, the worst exit status kept
    other = _write(tmp_path / "other.json", 0.3, exit_status=1)
    code, _, _ = cli(capsys, "merge", done, other, "--out", tmp_path / "q.json")
    assert code == 0
    whole = load(tmp_path / "q.json")
    assert (whole.status, whole.exit_status, dict(whole.writer)) == (COMPLETE, 1, {})
    # a status no writer writes, hostile: named, escaped
    odd = _write(tmp_path / "odd.json", 0.4, status=ESCAPE)
    code, _, err = cli(capsys, "merge", done, odd, "--out", tmp_path / "r.json")
    assert code == 2 and "odd is \\x1b[2J\\x1b]0;pwn\\x07 (1 case(s) saved)" in err
    assert "\x1b" not in err and err.count("\n") == 1


# -- item 8: csv on a terminal ---------------------------------------------------------------
def _hostile_saved(root: Path) -> None:
    run = hostile_run(3)
    cases = [
        dataclasses.replace(c, name=f"test_x[{ESCAPE}{i}]", nodeid=f"t.py::test_x[{ESCAPE}{i}]")
        for i, c in enumerate(run.cases)
    ]
    save(root, cases, name="a")
    save(root, cases, name="b")


@pytest.mark.parametrize(
    "argv",
    [["export", "1", "--format", "csv"], ["compare", "1", "2", "--format", "csv"]],
    ids=["export", "compare"],
)
def test_csv_shows_control_characters_as_escapes_on_a_terminal(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    """The other formats escape a name's escape sequences; csv printed on a terminal did
    not (piped or written to a file, it keeps every name exactly, for the program)."""
    root = tmp_path / "S"
    _hostile_saved(root)
    code, piped, _ = cli(capsys, "--storage", root, *argv)
    assert code == 0 and ESCAPE in piped  # data for a program: exact
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, shown, _ = cli(capsys, "--storage", root, *argv)
    assert code == 0 and "\x1b" not in shown and "\x07" not in shown
    assert "\\x1b[2J\\x1b]0;pwn\\x07" in shown
    assert shown.count("\n") == piped.count("\n")  # row for row


# -- item 9: a bare number on a figure per token -----------------------------------------------
def test_a_bare_number_on_a_figure_per_token_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``j_per_token:5`` read as 5 J a token and passed what ``:5%`` failed."""
    with pytest.raises(SystemExit):
        main(["compare", "a", "b", "--fail-on", "j_per_token:5"])
    err = capsys.readouterr().err
    assert "bad 'j_per_token:5': a number without a unit on a figure per token" in err
    assert "write 5% for a share of the baseline" in err and "e.g. 5mj" in err
    for text in ("j_per_token:5mJ", "j_per_token:5%", "flops_per_token:0", "time_s:0.5"):
        parse_gates(text)  # a unit, a percentage, 0, or a figure not per token: as before
    for text in ("co2_g_per_1k_tokens:2", "ops_per_token:3", "bytes_per_token:1"):
        with pytest.raises(ConfigError, match="without a unit"):
            parse_gates(text)
    # an absolute gate's text parses back
    f, value, relative = parse_figure_threshold("flops_per_token:3kflop", "")
    assert parse_gates(format_amount(f, value, relative))[0].threshold == 3000


# -- item 10: proof without a GPU -------------------------------------------------------------
def test_proof_without_a_gpu_prints_nothing_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_gpu() -> None:
        raise MeterUnavailable("nvml", "no NVIDIA driver on this machine")

    monkeypatch.setattr(stages, "open_nvml", no_gpu)
    code, out, err = cli(capsys, "proof", "--out", tmp_path / "p")
    assert code == 4 and out == ""
    assert err.count("\n") == 1 and "no NVIDIA GPU to prove on" in err


# -- item 11: an unknown figure in a gate ------------------------------------------------------
def test_an_unknown_gate_figure_names_the_nearest_in_one_short_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The 43 figures a gate takes came on one line of about 1,000 characters, in the
    registry's order; the one meant is among the first few nearest."""
    with pytest.raises(SystemExit):
        main(["compare", "a", "b", "--fail-on", "j_per_tokn:5%"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and len(errors[0]) < 300
    line = errors[0]
    assert "argument --fail-on: bad 'j_per_tokn:5%': unknown figure 'j_per_tokn'" in line
    assert "the nearest a gate takes: j_per_token, " in line
    assert f"(llmenergy metrics lists all {len(per_trial_keys())}: those marked gated)" in line


# -- item 12: a run file too large to read -------------------------------------------------------
def test_a_run_file_past_the_limit_is_refused_before_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """387 MB kept ``show`` busy for over two minutes at 3.1 GB; now its size decides."""
    big = tmp_path / "big.json"
    with big.open("wb") as file:  # sparse: no disk, no time
        file.truncate(65 * 2**20)
    start = time.monotonic()
    code, out, err = cli(capsys, "show", big)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "big.json: is 65 MiB, larger than the 64 MiB a run file may be" in err
    assert "LLMENERGY_MAX_RUN_FILE_MB" in err and time.monotonic() - start < 2
    # the limit is the variable's where a real file is larger
    small = _write(tmp_path / "small.json")
    monkeypatch.setenv("LLMENERGY_MAX_RUN_FILE_MB", "1")
    assert load(small).status == COMPLETE
    with small.open("ab") as file:
        file.write(b" " * 2**20)
    code, _, err = cli(capsys, "show", small)
    assert code == 2 and "larger than the 1 MiB a run file may be" in err
    monkeypatch.setenv("LLMENERGY_MAX_RUN_FILE_MB", "lots")
    code, _, err = cli(capsys, "show", small)
    assert code == 2 and "LLMENERGY_MAX_RUN_FILE_MB=lots: give the largest run file" in err
