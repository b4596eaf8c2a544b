"""The ``llmenergy`` command: list, show, compare and gate saved runs, as a user and CI see it.

Exit codes are the contract with CI: 0 fine, 1 an energy gate failed, 2 bad input, and bad
input is one error line on stderr, never a traceback.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy import __version__
from pytest_llmenergy.cli import main
from pytest_llmenergy.figures import FIGURES
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.stats import welch_t_test
from pytest_llmenergy.storage.runfile import COMPLETE, INTERRUPTED, RUNNING, dumps
from pytest_llmenergy.storage.store import Storage
from tests.casefactory import make_case
from tests.fakes.signals import ctrl_c_reaches_it
from tests.test_storage_runfile import sample_run

HW_A = "cpu-x__no-gpu__trace"
HW_B = "cpu-y__1x-a100__nvml"
MACHINE_B = {
    "cpu": {"model": "CPU Y", "logical_cores": 16},
    "gpus": [{"name": "A100", "power_limit_w": 400, "driver": "550.54"}],
}
COMMIT = {"id": "0123456789abcdef", "dirty": True, "branch": "main"}
EPT = FIGURES["j_per_token"]


def save(
    root: Path,
    cases: Sequence[CaseResult],
    *,
    name: str = "baseline",
    hardware: str = HW_A,
    **changes: Any,
) -> Path:
    """A run saved as the plugin saves it: claimed in its hardware folder, then written."""
    run = dataclasses.replace(
        sample_run(tuple(cases)), name=name, hardware=hardware, status=COMPLETE, **changes
    )
    writer = Storage(root).claim(hardware, name)
    writer.write(dumps(run))
    return writer.path


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """Run ``llmenergy`` in-process: exit code, stdout, stderr."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    """An argparse error: exit 2 and stderr's error line (after the usage text)."""
    with pytest.raises(SystemExit) as stop:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert stop.value.code == 2
    assert out == "" and "Traceback" not in err
    errors = [line for line in logical(err) if "error:" in line]
    assert len(errors) == 1 and logical(err)[-1] == errors[0]
    return errors[0]


def logical(text: str) -> list[str]:
    """The lines the command said, each one again where the terminal's width (COLUMNS)
    wrapped it: its continuations start with two spaces (issue 61)."""
    return text.replace("\n  ", " ").splitlines()


def one_error_line(err: str) -> str:
    lines = logical(err)
    assert len(lines) == 1 and lines[0].startswith("llmenergy: error: "), err
    return lines[0]


def row_of(out: str, first: str) -> list[str]:
    """The table row whose first cell is ``first``, split into cells on whitespace."""
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == [first]]
    assert len(rows) == 1, out
    return rows[0]


CASE = "test_input_tokens[tiny-llama-in8-out4]"


def gate_row(out: str) -> list[str]:
    """The gate table's row of CASE: both tables name it by the shortest part of its node
    id that tells it apart (its parameter id), the side-by-side table first."""
    short = CASE.split("[", 1)[1].rstrip("]")
    names = ([short], [CASE])  # a lone case keeps its whole name
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in names]
    assert len(rows) == 2, out
    return rows[1]


def energy_per_token(case: CaseResult) -> list[float]:
    assert EPT.trial is not None
    return [v for v in map(EPT.trial, case.trials) if v is not None]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / ".llmenergy"


# -- list ----------------------------------------------------------------------------------
@pytest.fixture
def two_machines(root: Path) -> Path:
    save(root, [make_case([0.1, 0.1]), make_case([0.2, 0.2], input_tokens=64)], commit=COMMIT)
    save(root, [make_case([0.1, 0.1])], name="gpu-run", hardware=HW_B, machine=MACHINE_B)
    return root


def test_list_has_one_row_per_run_of_every_machine(
    two_machines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "--storage", two_machines, "list")
    assert code == 0 and err == ""
    a = row_of(out, f"{HW_A}/0001")
    assert (a[1], a[3], a[4], a[5], a[6]) == ("baseline", "complete", "0123456789ab+", "2", "trace")
    b = row_of(out, f"{HW_B}/0001")
    assert (b[1], b[3], b[4], b[5]) == ("gpu-run", "complete", "abc", "1")


def test_list_shows_an_unreadable_run_as_a_row(
    two_machines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(two_machines, [make_case([0.1, 0.1])], name="cut")
    path.write_text(path.read_text()[:200])  # a write cut off
    code, out, _ = cli(capsys, "--storage", two_machines, "list")
    assert code == 0
    row = row_of(out, f"{HW_A}/0002")
    assert (row[1], row[3]) == ("cut", "unreadable")
    # why, under the table: a long reason in the cell would push the status column out
    assert f"{HW_A}/0002: not a readable run file: the JSON is truncated" in out
    assert row_of(out, f"{HW_B}/0001")[1] == "gpu-run"  # the others are still listed
    code, out, _ = cli(capsys, "--storage", two_machines, "list", "--format", "csv")
    assert code == 0 and 'cut,,"unreadable: not a readable run file: the JSON is truncated' in out


def test_one_hostile_file_leaves_every_other_run_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33: a file named like a run holding 200,000 ``[`` took every command down
    with a RecursionError traceback, ``llmenergy list`` of every run included."""
    save(tmp_path, [make_case([0.1, 0.11, 0.12])], name="base")
    head = save(tmp_path, [make_case([0.2, 0.21, 0.22])], name="head")
    (head.parent / "0003_evil.json").write_text("[" * 200_000)
    code, out, err = cli(capsys, "--storage", tmp_path, "list")
    assert code == 0 and err == ""
    assert row_of(out, f"{HW_A}/0003")[1:4] == ["evil", "—", "unreadable"]
    assert f"{HW_A}/0003: not a readable run file: nested more than 32" in out
    assert row_of(out, f"{HW_A}/0002")[3] == "complete"
    code, out, _ = cli(capsys, "--storage", tmp_path, "compare", "base", "head")
    assert code == 0 and "test_input_tokens" in out
    code, _, _ = cli(
        capsys, "--storage", tmp_path, "report", "base", "head", "--out", tmp_path / "r.html"
    )
    assert code == 0 and (tmp_path / "r.html").stat().st_size > 0
    for command in (
        ["show", "evil"],
        ["compare", "base", "evil"],
        ["merge", "base", "evil", "--out", tmp_path / "m.json"],
    ):
        code, out, err = cli(capsys, "--storage", tmp_path, *command)
        assert code == 2 and out == ""
        assert logical(err) == [
            f"llmenergy: error: {head.parent / '0003_evil.json'}: not a readable run file: nested "
            "more than 32 levels deep; pytest-llmenergy never writes that, so the file was "
            "edited or damaged: delete it or move it elsewhere"
        ]


def test_list_of_an_empty_storage_folder(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "--storage", root, "list") == (0, f"no saved runs in {root}\n", "")
    root.mkdir()
    code, out, _ = cli(capsys, "--storage", root, "list", "--format", "json")
    assert code == 0 and json.loads(out)["tables"][0]["rows"] == []  # data, not a sentence
    code, out, _ = cli(capsys, "--storage", root, "list", "--format", "csv")
    assert code == 0 and out == "group,run,name,created,status,commit,cases,backend\n"


def test_list_one_hardware_folder(two_machines: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --storage may also follow the command.
    code, out, _ = cli(capsys, "list", "--hardware", HW_B, "--storage", two_machines)
    assert code == 0 and f"{HW_B}/0001" in out and HW_A not in out
    code, out, _ = cli(capsys, "--storage", two_machines, "list", "--hardware", "nope")
    assert code == 0
    assert out.startswith(f"no saved runs in {two_machines / 'nope'}") and HW_B in out


def test_list_as_json(two_machines: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--storage", two_machines, "list", "--format", "json")
    assert code == 0
    rows = json.loads(out)["tables"][0]["rows"]
    assert [(r["run"], r["name"], r["cases"], r["commit"]) for r in rows] == [
        (f"{HW_A}/0001", "baseline", 2, "0123456789ab+"),
        (f"{HW_B}/0001", "gpu-run", 1, "abc"),
    ]


def test_a_folder_that_cannot_be_listed(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Storage, hardware: str | None = None) -> None:
        raise PermissionError(13, "Permission denied", str(root))

    monkeypatch.setattr(Storage, "runs", refuse)
    code, out, err = cli(capsys, "--storage", root, "list")
    assert code == 2 and out == ""
    assert one_error_line(err) == f"llmenergy: error: {root}: Permission denied"


# -- show ----------------------------------------------------------------------------------
def test_show_prints_the_run_header_and_its_energy_table(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meter = {
        "backend": "nvml",
        "description": "NVML energy counters",
        "idle_power_w": {"gpu:0": 61},
    }
    save(
        root,
        [make_case([0.1, 0.1, 0.1])],
        hardware=HW_B,
        machine=MACHINE_B,
        commit=COMMIT,
        meter=meter,
    )
    code, out, err = cli(capsys, "--storage", root, "show", "baseline")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("run 0001_baseline: complete, 1 case(s), started ")
    assert lines[1:5] == [
        f"hardware {HW_B}: CPU CPU Y (16 logical cores), GPUs A100 (400 W limit, driver 550.54)",
        "commit 0123456789ab (uncommitted changes) on main",
        "meter NVML energy counters",
        "idle power gpu:0 61.00 W",
    ]
    assert "did not finish" not in out
    assert "sweep input · model tiny-llama" in lines
    row = row_of(out, "8")
    assert row[1] == "4" and "10" in row  # 4 output tokens, 10 J per query


def test_show_header_lines_leave_out_what_is_unknown(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(root, [make_case([0.1, 0.1])])
    code, out, _ = cli(capsys, "--storage", root, "show", "1")
    assert code == 0
    assert "commit abc" in out.splitlines()  # no branch: not "on None"
    assert f"hardware {HW_A}: CPU CPU X (2 logical cores), GPUs none" in out


def test_show_survives_odd_fields_in_a_hand_edited_file(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(
        root,
        [make_case([0.1, 0.1])],
        machine={"cpu": "x86", "gpus": "none"},
        commit={"id": 1234},
        meter={"idle_power_w": {"gpu:0": "lots"}},
    )
    code, out, err = cli(capsys, "--storage", root, "show", "1")
    assert (code, err) == (0, "")
    assert f"hardware {HW_A}: CPU unknown, GPUs none" in out and "commit unknown" in out
    assert "idle power" not in out


def test_show_as_csv_is_data_only(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = make_case([0.1, 0.12, 0.11])
    save(root, [case])
    code, out, _ = cli(capsys, "--storage", root, "show", "1", "--format", "csv")
    assert code == 0 and out.startswith("group,")  # no header lines before the csv
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 1
    assert float(rows[0]["energy_j"]) == case.energy.mean
    assert rows[0]["tokens_in"] == "8" and rows[0]["group"] == "sweep input · model tiny-llama"


def test_show_chosen_columns_as_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = make_case([0.1, 0.1])
    save(root, [case])
    argv = ("--storage", root, "show", "1", "--columns", "tokens_in,energy_j", "--format", "json")
    code, out, _ = cli(capsys, *argv)
    assert code == 0
    table = json.loads(out)["tables"][0]
    assert (
        table["columns"][:2] == ["tokens_in", "energy_j"] and "tokens_out" not in table["columns"]
    )
    assert table["rows"][0]["tokens_in"] == 8
    assert table["rows"][0]["energy_j"] == pytest.approx(case.energy.mean)


def test_show_sorted_by_energy_descending(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(root, [make_case([0.1, 0.1]), make_case([0.3, 0.3], input_tokens=64)])

    def order(*extra: str) -> list[str]:
        code, out, _ = cli(capsys, "--storage", root, "show", "1", "--format", "csv", *extra)
        assert code == 0
        return [row["tokens_in"] for row in csv.DictReader(io.StringIO(out))]

    assert order() == ["8", "64"]
    assert order("--sort", "-energy_j") == ["64", "8"]


@pytest.mark.parametrize("status", [INTERRUPTED, RUNNING])
def test_show_says_when_a_run_did_not_finish(
    root: Path, capsys: pytest.CaptureFixture[str], status: str
) -> None:
    path = save(root, [make_case([0.1, 0.1])])
    path.write_text(path.read_text().replace(f'"status": "{COMPLETE}"', f'"status": "{status}"'))
    code, out, _ = cli(capsys, "--storage", root, "show", "1")
    assert code == 0
    assert f"note: this run did not finish ({status}); it holds the cases it completed" in out


def test_show_an_unknown_run_lists_the_latest(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(root, [make_case([0.1, 0.1])])
    code, out, err = cli(capsys, "--storage", root, "show", "nope")
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert "'nope'" in line and "(saved: 0001_baseline)" in line  # as show takes it
    save(root, [make_case([0.1, 0.1])], name="gpu-run", hardware=HW_B)
    _, _, err = cli(capsys, "--storage", root, "show", "nope")
    assert f"(saved: {HW_A}/0001_baseline, {HW_B}/0001_gpu-run)" in one_error_line(err)
    for _ in range(5):
        save(root, [make_case([0.1, 0.1])], name="more")
    _, _, err = cli(capsys, "--storage", root, "show", "nope")
    assert f"(7 saved, the last 5 of llmenergy list: {HW_A}/0003_more, " in one_error_line(err)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("{\n not json\n}\n", "corrupt"), ('{"format": "other"}', "not a pytest-llmenergy run file")],
)
def test_show_a_bad_file_by_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    path = tmp_path / "broken.json"
    path.write_text(text)
    code, out, err = cli(capsys, "--storage", tmp_path / "none", "show", path)
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert str(path) in line and problem in line


def test_show_bad_options_are_usage_errors(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, "--storage", root, "show", "1", "--columns", "x")
    assert line.startswith("llmenergy show: error: argument --columns:")
    assert "unknown figure 'x'; choose from: name, tokens_in" in line
    assert "unknown sort" in usage_error(capsys, "--storage", root, "show", "1", "--sort", "x")
    line = usage_error(capsys, "--storage", root, "show", "1", "--columns", "j_per_out_token")
    assert "'j_per_out_token' is gone: " in line and "use decode_j_per_out_token" in line


def test_show_takes_old_column_names_with_a_warning_on_stderr(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(root, [make_case([0.1, 0.1])])
    argv = ("--storage", root, "show", "1", "--columns", "tokens_in,joules", "--format", "csv")
    code, out, err = cli(capsys, *argv)
    assert code == 0
    assert out.splitlines()[0] == "group,tokens_in,energy_j,name,estimated,nodeid"  # data only
    assert err.splitlines() == [
        "llmenergy: warning: figure name 'joules' is deprecated, use 'energy_j' (the old "
        "name works until pytest-llmenergy 0.3)"
    ]


def test_show_fits_the_table_to_columns_and_says_what_it_left_out(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    save(root, [make_case([0.1, 0.12, 0.11]), make_case([0.2, 0.21], input_tokens=64)])
    monkeypatch.setenv("COLUMNS", "60")
    code, out, _ = cli(capsys, "--storage", root, "show", "1")
    assert code == 0
    assert all(len(line) <= 60 for line in out.splitlines()), out
    joined = out.replace("\n  ", " ")  # wrapped lines continue after two spaces
    assert "columns left out to fit 60 characters: " in joined
    assert "avg W, GPU J, CPU J; choose with --columns" in joined
    assert row_of(out, "8")[:2] == ["8", "4"]  # tokens (priority 0) stay
    # stdout is no terminal and COLUMNS is unset: a file gets every column
    monkeypatch.delenv("COLUMNS")
    code, out, _ = cli(capsys, "--storage", root, "show", "1")
    assert code == 0 and "left out" not in out
    header = next(line for line in out.splitlines() if line.startswith("in "))
    assert len(header) > 100
    for label in ("J/token", "prefill J/in", "decode J/out", "out tok/s", "avg W", "CPU J"):
        assert label in header


# -- compare -------------------------------------------------------------------------------
@pytest.fixture
def across_hardware(root: Path) -> Path:
    """The same case at 100 W on A and 50 W on B, and one case only on each."""
    save(root, [make_case([0.1, 0.1, 0.1]), make_case([0.2, 0.2], input_tokens=64)])
    b_cases = [make_case([0.1, 0.1, 0.1], watts=50), make_case([0.1, 0.1], output_tokens=16)]
    save(root, b_cases, hardware=HW_B, machine=MACHINE_B)
    return root


A, B = f"{HW_A}/1", f"{HW_B}/1"
LABEL_A, LABEL_B = f"{HW_A}/0001_baseline", f"{HW_B}/0001_baseline"


def test_compare_puts_cases_side_by_side_with_ratios(
    across_hardware: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "--storage", across_hardware, "compare", A, B)
    assert (code, err) == (0, "")
    # Both runs are 0001_baseline: the labels say which machine each is.
    header = next(line for line in out.splitlines() if line.startswith("case"))
    assert header.split()[-3:] == ["#1", "base", "#2", "#2/#1"][-3:]
    assert f"#1 = {LABEL_A}, the baseline" in out.splitlines()
    assert f"#2 = {LABEL_B}" in out.splitlines()
    both = row_of(out, "tiny-llama-in8-out4")
    assert both[-1] == "0.5\u00d7"
    assert float(both[-2]) == pytest.approx(float(both[-3]) / 2, rel=1e-3)
    assert row_of(out, "tiny-llama-in64-out4")[-2:] == ["—", "—"]
    assert row_of(out, "tiny-llama-in8-out16")[-3] == "—"
    assert "energy gate" not in out


def test_runs_of_different_machines_are_named_with_their_machine(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs named apart, from two machines: the legend says which machine each ran on
    (their labels alone do not); runs of one machine are named as they were."""
    save(root, [make_case([0.1, 0.1, 0.1])], name="laptop")
    save(root, [make_case([0.1, 0.1, 0.1], watts=50)], name="server", hardware=HW_B)
    save(root, [make_case([0.1, 0.1, 0.1])], name="again")
    code, out, _ = cli(capsys, "--storage", root, "compare", f"{HW_A}/1", f"{HW_B}/1")
    assert code == 0
    assert f"#1 = 0001_laptop on {HW_A}, the baseline" in out.splitlines()
    assert f"#2 = 0001_server on {HW_B}" in out.splitlines()
    code, out, _ = cli(capsys, "--storage", root, "compare", f"{HW_A}/1", f"{HW_A}/2")
    assert code == 0
    assert out.splitlines()[-2:] == ["#1 = 0001_laptop, the baseline", "#2 = 0002_again"]


def test_compare_as_json_and_csv(across_hardware: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--storage", across_hardware, "compare", A, B, "--format", "json")
    assert code == 0
    rows = {r["case"]: r for r in json.loads(out)["tables"][0]["rows"]}
    assert rows["test_input_tokens[tiny-llama-in8-out4]"][f"{LABEL_B}/{LABEL_A}"] == 0.5
    assert rows["test_input_tokens[tiny-llama-in64-out4]"][LABEL_B] is None

    code, out, _ = cli(capsys, "--storage", across_hardware, "compare", A, B, "--format", "csv")
    assert code == 0
    rows = {r["case"]: r for r in csv.DictReader(io.StringIO(out))}
    assert len(rows) == 3
    assert float(rows["test_input_tokens[tiny-llama-in8-out4]"][f"{LABEL_B}/{LABEL_A}"]) == 0.5


def test_compare_several_metrics_and_markdown(
    across_hardware: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--storage", across_hardware, "compare", A, B, "--metric", "time_s")
    code, out, err = cli(
        capsys, *argv, "--metric", "energy_j", "--metric", "energy", "--format", "json"
    )
    assert code == 0  # "energy" is energy_j by its old name: no third table
    assert "warning: figure name 'energy' is deprecated, use 'energy_j'" in err
    assert [t["title"] for t in json.loads(out)["tables"]] == [
        "s ± CI (time_s), side by side",
        "J ± CI (energy_j), side by side",
    ]
    code, out, _ = cli(capsys, *argv, "--format", "markdown")
    assert code == 0 and "### s ± CI (time_s), side by side" in out
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) == 5  # header, rule, 3 cases
    assert "0.1" in rows[2] and "1\u00d7" in rows[2]  # same seconds on both machines


def test_compare_labels_stay_distinct(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two --energy-json files are both ``run``; a file named case.json must not become the
    ``case`` column; the same run twice is still two columns."""
    paths = []
    for folder in ("main", "branch"):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "run.json")
        paths[-1].write_text(dumps(sample_run((make_case([0.1, 0.1]),))))
    code, out, _ = cli(capsys, "compare", *paths, "--format", "json")
    assert code == 0
    assert json.loads(out)["tables"][0]["columns"][4:6] == [str(p) for p in paths]

    (tmp_path / "case.json").write_text(paths[0].read_text())
    code, out, _ = cli(capsys, "compare", tmp_path / "case.json", paths[1], "--format", "json")
    row = json.loads(out)["tables"][0]["rows"][0]
    assert code == 0 and row["case"] == "test_input_tokens[tiny-llama-in8-out4]"
    assert row["run case"] == pytest.approx(100 * 0.1 / 12)

    code, out, _ = cli(capsys, "compare", paths[0], paths[0], "--format", "json")
    assert code == 0
    assert json.loads(out)["tables"][0]["columns"][4:6] == [f"1:{paths[0]}", f"2:{paths[0]}"]


# -- energy gates --------------------------------------------------------------------------
def gate_runs(root: Path, baseline: Sequence[float], current: Sequence[float]) -> None:
    save(root, [make_case(baseline)], name="main")
    save(root, [make_case(current)], name="pr")


TIGHT = [0.100, 0.101, 0.099, 0.100, 0.1005]


def test_gate_fails_on_a_significant_regression(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS")  # as a CI log gets it: no terminal, each line whole
    gate_runs(root, TIGHT, [2.0 * s for s in TIGHT])
    code, out, _ = cli(
        capsys, "--storage", root, "compare", "main", "pr", "--fail-on", "j_per_token:5%"
    )
    assert code == 1
    assert "0002_pr (current) against 0001_main (baseline)" in out.splitlines()
    verdict = gate_row(out)
    assert verdict[-1] == "FAIL" and "+100.0" in verdict
    assert out.splitlines()[-3].startswith("0002_pr: energy gate FAILED (j_per_token:5%)")
    assert out.splitlines()[-2].startswith("0002_pr: gate detects >= ")
    # then why, per failed case: here nothing was counted, and it says how to count
    assert out.splitlines()[-1].startswith(
        "0002_pr: why test_input_tokens[tiny-llama-in8-out4]: work not counted "
        "(--energy-count-work on both runs"
    )


def test_gate_failure_with_data_formats_keeps_stdout_data(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate_runs(root, TIGHT, [2.0 * s for s in TIGHT])
    argv = ("--storage", root, "compare", "main", "pr", "--fail-on", "j_per_token:5%")
    code, out, err = cli(capsys, *argv, "--format", "json")
    assert code == 1
    gate = json.loads(out)["tables"][1]
    assert gate["rows"][0]["verdict"] == "FAIL"
    assert err.startswith("0002_pr: energy gate FAILED")  # why CI failed, outside the data
    code, out, err = cli(capsys, *argv, "--format", "csv")
    assert code == 1 and "energy gate" not in out
    assert [r["verdict"] for r in csv.DictReader(io.StringIO(out))][-1] == "FAIL"


def test_noisy_regression_is_not_significant(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate_runs(root, [0.05, 0.25, 0.05], [0.25, 0.05, 0.25])  # +57 % on average
    code, out, _ = cli(
        capsys, "--storage", root, "compare", "main", "pr", "--fail-on", "j_per_token:5%"
    )
    assert code == 0
    assert gate_row(out)[-2:] == ["not", "significant"]
    assert "energy gate passed" in out and "1 over the threshold but not significant" in out


def test_equal_runs_pass_the_gate(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS")  # as a CI log gets it: no terminal, each line whole
    gate_runs(root, TIGHT, TIGHT)
    code, out, _ = cli(
        capsys, "--storage", root, "compare", "main", "pr", "--fail-on", "energy_j:5%"
    )
    assert code == 0
    assert gate_row(out)[-1] == "ok"
    assert (
        out.splitlines()[-2]
        == "0002_pr: energy gate passed (energy_j:5%): no significant regression"
    )


def test_old_gate_and_metric_names_warn_on_stderr_and_still_gate(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS")  # as a CI log gets it: no terminal, each line whole
    gate_runs(root, TIGHT, [2.0 * s for s in TIGHT])
    argv = ("--storage", root, "compare", "main", "pr", "--fail-on", "energy_per_token:5%")
    code, out, err = cli(capsys, *argv, "--metric", "joules")
    assert code == 1  # the old name gates j_per_token: +100 %, significant
    assert out.splitlines()[-3].startswith("0002_pr: energy gate FAILED (j_per_token:5%)")
    assert out.splitlines()[-2].startswith("0002_pr: gate detects >= ")
    assert out.splitlines()[-1].startswith("0002_pr: why ")
    assert "J ± CI (energy_j), side by side" in out.splitlines()
    assert err.splitlines() == [
        f"llmenergy: warning: figure name {old!r} is deprecated, use {new!r} (the old name "
        "works until pytest-llmenergy 0.3)"
        for old, new in (("energy_per_token", "j_per_token"), ("joules", "energy_j"))
    ]


def test_removed_and_unpaired_figures_are_refused_by_compare(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--storage", root, "compare", "x", "y")
    line = usage_error(capsys, *argv, "--metric", "j_per_in_token")
    assert line.startswith("llmenergy compare: error: argument --metric: 'j_per_in_token' is gone")
    assert "use prefill_j_per_in_token" in line
    line = usage_error(capsys, *argv, "--fail-on", "energy_per_output_token:5%")
    assert "'energy_per_output_token' is gone" in line and "use decode_j_per_out_token" in line
    line = usage_error(capsys, *argv, "--metric", "tokens_in")
    assert "'tokens_in' has no value per trial, so it cannot be compared" in line


def test_bad_gate_is_refused_before_any_run_is_read(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The runs do not exist: the error is about the gate, found first.
    line = usage_error(capsys, "--storage", root, "compare", "x", "y", "--fail-on", "speed:5%")
    assert line.startswith("llmenergy compare: error: argument --fail-on: bad 'speed:5%'")
    line = usage_error(capsys, "--storage", root, "compare", "x", "y", "--fail-on", "energy_j:5W")
    assert "bad 'energy_j:5W': expected a unit of j, mj, kj or %" in line


def test_compare_needs_two_runs(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(root, [make_case([0.1, 0.1])])
    line = usage_error(capsys, "--storage", root, "compare", "1", "--fail-on", "energy_j:5%")
    assert "at least two runs" in line


def test_compare_an_unknown_run(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(root, [make_case([0.1, 0.1])])
    code, out, err = cli(capsys, "--storage", root, "compare", "1", "nope")
    assert code == 2 and out == ""
    assert "'nope'" in one_error_line(err)


# -- confidence ----------------------------------------------------------------------------
BORDERLINE_A = [0.10, 0.11, 0.09]
BORDERLINE_B = [0.125, 0.135, 0.115]  # +25 %, p between 0.01 and 0.05
# (between sessions too, with sessions assumed to differ by 8 %: one-sided p = 0.02)


def test_borderline_construction() -> None:
    p = welch_t_test(
        energy_per_token(make_case(BORDERLINE_A)), energy_per_token(make_case(BORDERLINE_B))
    ).p_value
    assert 0.01 < p < 0.05


@pytest.mark.parametrize(("confidence", "code"), [("0.95", 1), ("95%", 1), ("0.99", 0), ("99%", 0)])
def test_confidence_decides_a_borderline_case(
    root: Path, capsys: pytest.CaptureFixture[str], confidence: str, code: int
) -> None:
    gate_runs(root, BORDERLINE_A, BORDERLINE_B)
    argv = (
        "--storage",
        root,
        "compare",
        "main",
        "pr",
        "--fail-on",
        "j_per_token:5%",
        "--session-noise",
        "8%",
    )
    got, out, _ = cli(capsys, *argv, "--confidence", confidence)
    assert got == code
    verdict = " ".join(gate_row(out)[-2:])
    assert verdict.endswith(" FAIL" if code else "not significant")


def test_confidence_of_a_version_1_baseline_is_read_where_0_1_0_kept_it(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(root, [make_case(BORDERLINE_A)], name="main", options={"controller": {"confidence": 0.99}})
    path = next(root.rglob("*_main.json"))
    path.write_text(path.read_text().replace('"schema_version": 2', '"schema_version": 1'))
    save(root, [make_case(BORDERLINE_B)], name="pr")
    argv = (
        "--storage",
        root,
        "compare",
        "main",
        "pr",
        "--fail-on",
        "j_per_token:5%",
        "--session-noise",
        "8%",
    )
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and "(99% confidence)" in out


def test_confidence_defaults_to_the_baseline_runs(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(root, [make_case(BORDERLINE_A)], name="main", options={"confidence": 0.99})
    save(root, [make_case(BORDERLINE_B)], name="pr")
    argv = (
        "--storage",
        root,
        "compare",
        "main",
        "pr",
        "--fail-on",
        "j_per_token:5%",
        "--session-noise",
        "8%",
    )
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and "(99% confidence)" in out
    # A baseline file with nonsense there falls back to 0.95 instead of crashing.
    save(root, [make_case(BORDERLINE_A)], name="odd", options={"confidence": "fast"})
    code, out, _ = cli(
        capsys,
        "--storage",
        root,
        "compare",
        "odd",
        "pr",
        "--fail-on",
        "j_per_token:5%",
        "--session-noise",
        "8%",
    )
    assert code == 1 and "(95% confidence)" in out


@pytest.mark.parametrize("bad", ["95", "1", "0", "x", "nan"])
def test_bad_confidence(root: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    line = usage_error(capsys, "--storage", root, "compare", "a", "b", "--confidence", bad)
    assert f"expected a confidence level between 0 and 1 such as 0.95 or 95%, got {bad!r}" in line


# -- the command itself --------------------------------------------------------------------
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"llmenergy {__version__}\n"


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "required" in usage_error(capsys)


SCRIPT = Path(sys.executable).with_name("llmenergy")
MODULE = (sys.executable, "-m", "pytest_llmenergy")


def run_process(
    command: Sequence[object], cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )


def test_console_script(two_machines: Path, tmp_path: Path) -> None:
    assert SCRIPT.is_file(), f"no llmenergy script next to {sys.executable}"
    done = run_process([SCRIPT, "--storage", two_machines, "list"], tmp_path)
    assert done.returncode == 0 and f"{HW_B}/0001" in done.stdout
    # The default storage folder is .llmenergy in the working directory.
    done = run_process([SCRIPT, "show", "nope"], two_machines.parent)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("llmenergy: error: no saved run 'nope' in .llmenergy")
    assert len(logical(done.stderr)) == 1 and "Traceback" not in done.stderr


def test_python_dash_m_exits_1_on_a_failed_gate(root: Path, tmp_path: Path) -> None:
    gate_runs(root, TIGHT, [2.0 * s for s in TIGHT])
    gate = ("--fail-on", "j_per_token:5%")
    done = run_process([*MODULE, "--storage", root, "compare", "main", "pr", *gate], tmp_path)
    assert done.returncode == 1 and "energy gate FAILED" in done.stdout
    done = run_process([*MODULE, "--version"], tmp_path)
    assert (done.returncode, done.stdout) == (0, f"llmenergy {__version__}\n")


def test_every_gate_entry_point_fails_a_gate_that_compared_nothing(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: against a run sharing no case, ``compare --fail-on`` said "nothing
    compared" and exited 0.  It exits 1 with the reason; ``--strict`` also fails on a case
    in one run only, listed; ``report --gate`` shows the same verdict and exits 1 too."""
    monkeypatch.delenv("COLUMNS")  # as a CI log gets it: no terminal, each line whole
    save(root, [make_case(TIGHT)], name="main")
    save(root, [make_case(TIGHT, model="renamed")], name="pr")
    gate = ("--fail-on", "j_per_token:5%")
    done = run_process([*MODULE, "--storage", root, "compare", "main", "pr", *gate], tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout.splitlines()[-1] == (
        "0002_pr: energy gate FAILED (j_per_token:5%): nothing compared: none of the 1 "
        "case(s) of 0002_pr is in 0001_main (renamed tests, or other tests); compare with a "
        "run of the same tests, or save a new baseline"
    )
    out = tmp_path / "r.html"
    argv = ("--storage", root, "report", "main", "pr", "--gate", "j_per_token:5%", "--out", out)
    done = run_process([*MODULE, *argv], tmp_path)
    assert done.returncode == 1 and done.stdout.startswith(f"wrote {out} (")  # one exit rule
    assert "0002_pr: energy gate FAILED (j_per_token:5%): nothing compared" in done.stdout
    assert '<p class="verdict failed"' in out.read_text()
    # one case shared, one on each side only: passes, unless strict
    save(root, [make_case(TIGHT), make_case(TIGHT, input_tokens=64)], name="both")
    save(root, [make_case(TIGHT), make_case(TIGHT, input_tokens=128)], name="other")
    argv = ("--storage", root, "compare", "both", "other", *gate)
    done = run_process([*MODULE, *argv], tmp_path)
    assert done.returncode == 0 and "not judged, on one side only" in done.stdout
    # the command names its own options (issue 61, item 8), not the pytest plugin's
    assert "(--strict fails on this)" in done.stdout and "--energy-" not in done.stdout
    done = run_process([*MODULE, *argv, "--strict"], tmp_path)
    assert done.returncode == 1
    verdict = next(line for line in done.stdout.splitlines() if "(strict)" in line)
    assert verdict.startswith("0004_other: FAILED (strict): energy gate passed (j_per_token:5%)")
    assert "only in 0003_both: benchmarks/test_input_tokens.py::test_input_tokens[" in verdict


# Runs ``llmenergy`` with one function made to stop and wait (as a long report, a slow
# disk or a large storage folder would) once it is reached, after saying so on stderr.
BLOCKING = """
import os, sys, time
from pytest_llmenergy import cli
from pytest_llmenergy.html import page
from pytest_llmenergy.storage import store

def blocking(real):
    def wait(*args, **kwargs):
        print("blocked", file=sys.stderr, flush=True)
        time.sleep(60)
        return real(*args, **kwargs)
    return wait

where = os.environ["BLOCK_AT"]
if where == "render":
    page.render_report = blocking(page.render_report)
elif where == "fsync":  # the temp file written, not yet renamed into place
    os.fsync = blocking(os.fsync)
else:
    store.Storage.runs = blocking(store.Storage.runs)
sys.exit(cli.main())
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
@pytest.mark.parametrize(
    ("where", "command"),
    [("render", "report"), ("fsync", "report"), ("runs", "list")],
)
def test_ctrl_c_in_any_command_is_one_line_exit_130_and_no_file(
    tmp_path: Path, where: str, command: str
) -> None:
    """Issue 33: Ctrl-C in ``llmenergy report`` printed a KeyboardInterrupt traceback.  A
    real SIGINT, mid-command: one line, exit 130, and no report nor temp file left."""
    import signal

    (tmp_path / "run.json").write_text(dumps(sample_run((make_case([0.1, 0.1]),))))
    (tmp_path / "driver.py").write_text(BLOCKING)
    argv = ["report", "run.json", "--out", "r.html"] if command == "report" else ["list"]
    child = subprocess.Popen(
        [sys.executable, "driver.py", *argv],
        cwd=tmp_path,
        env={**os.environ, "BLOCK_AT": where},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    try:
        assert child.stderr is not None
        assert child.stderr.readline() == "blocked\n"
        left = sorted(p.name for p in tmp_path.iterdir())
        if where == "fsync":  # caught between writing the temp file and renaming it
            from pytest_llmenergy.storage.store import AtomicFile

            named = [n for n in left if n.startswith(".r.html.")]
            # Linux: the temp file has no name (O_TMPFILE) until it is put in place
            assert (named == []) if AtomicFile.unnamed else named, left
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert (child.returncode, out) == (130, "")
    line = "llmenergy: interrupted; stopped before finishing (no file is left half-written)"
    assert err == f"{line}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver.py", "run.json"]


def test_a_console_without_unicode_gets_replacements(root: Path, tmp_path: Path) -> None:
    save(root, [make_case([0.1, 0.12, 0.11])])
    done = run_process([SCRIPT, "--storage", root, "show", "1"], tmp_path, PYTHONIOENCODING="ascii")
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "?" in done.stdout and "sweep input ? model tiny-llama" in done.stdout


def test_a_closed_pipe_is_no_traceback(two_machines: Path, tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # like `llmenergy list | head -0`: nobody reads
    try:
        done = subprocess.run(
            [str(SCRIPT), "--storage", str(two_machines), "list"],
            cwd=tmp_path,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


# -- metrics ---------------------------------------------------------------------------
def test_metrics_lists_every_figure_with_unit_and_meaning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = cli(capsys, "metrics", "--format", "json")
    assert code == 0
    rows = json.loads(out)["tables"][0]["rows"]
    assert [r["key"] for r in rows] == list(FIGURES)
    by_key = {r["key"]: r for r in rows}
    assert by_key["j_per_token"]["unit"] == "J" and by_key["j_per_token"]["per_trial"] is True
    assert "input + output tokens" in by_key["j_per_token"]["meaning"]
    assert by_key["out_tokens_per_s"]["better"] == "higher"
    assert by_key["decode_j_per_out_token"]["needs_phases"] is True
    assert "energy_per_token" in by_key["j_per_token"]["old_names"]
    # every figure has a unit or is a count or name, and always a meaning
    assert all(r["meaning"] for r in rows)
    assert {r["key"]: r["unit"] for r in rows if r["per_trial"]} == {
        k: f.unit for k, f in FIGURES.items() if f.per_trial
    }
    assert by_key["time_s"]["unit"] == "s" and by_key["power_w"]["unit"] == "W"
    assert by_key["tokens_per_s"]["unit"] == "tokens/s"
    assert by_key["tokens_in"]["per_trial"] is False  # shown only: no gate, no CI target
    # removed names are nobody's old name: they are refused, not mapped
    assert not any("j_per_in_token" in r["old_names"].split(", ") for r in rows)


def test_metrics_as_a_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS")  # not a terminal: every column
    code, out, err = cli(capsys, "metrics")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("figures: columns (--columns), gates and compare")
    assert lines[1].split()[:3] == ["key", "label", "unit"]
    keys = [line.split()[0] for line in lines[3 : 3 + len(FIGURES)]]
    assert keys == list(FIGURES)
    j_per_token = row_of(out, "j_per_token")
    assert j_per_token[1:3] == ["J/token", "J"]
    assert j_per_token[-2:] == ["energy_per_token,", "joules_per_token"]
    assert "input + output tokens" in next(x for x in lines if x.startswith("j_per_token "))
    flat = " ".join(out.split())
    assert "gated: tested: a value per trial" in flat and "exact: counted once per case" in flat
    assert "exact" in row_of(out, "flops_per_token")  # counted: compared exactly, untested
    assert "tested" in j_per_token and "exact" not in j_per_token


@pytest.mark.parametrize("columns", [80, 100, 200])
def test_metrics_on_a_terminal_fold_their_meanings_to_fit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    """Issue 61, item 4: the meanings were pre-wrapped into cells that showed a literal
    ``\\n`` (44 of 68 rows) and lines of 377 characters at any width."""
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = cli(capsys, "metrics")
    assert code == 0 and "\\n" not in out
    assert max(len(line) for line in out.splitlines()) <= columns
    keys = [line.split()[0] for line in out.splitlines()[3:] if line and not line[0].isspace()]
    assert set(FIGURES) <= set(keys)  # every figure keeps its row


@pytest.mark.parametrize(
    "command",
    [
        ["report", "1", "--out", "{out}"],
        ["export", "1", "--format", "csv", "--out", "{out}"],
        ["merge", "1", "2", "--out", "{out}"],
        ["calibrate", "1", "--out", "{out}"],
        ["frontier", "1", "--json", "{out}"],
        ["route", "--profile", "1", "--policy-out", "{out}"],
    ],
)
def test_no_output_replaces_a_saved_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Onto a run file in the storage folder, or onto anything else in a hardware folder,
    or onto a saved run copied elsewhere: exit 2, one line, the run untouched."""
    cases = [make_case([0.1, 0.1, 0.1])]
    first = save(tmp_path, cases)
    save(tmp_path, cases)
    copy = tmp_path / "kept.json"
    copy.write_bytes(first.read_bytes())
    before = sorted((p.name, p.read_bytes()) for p in first.parent.iterdir())
    targets = {
        str(first): "belongs to the store",
        str(first.parent / "new-name.out"): "belongs to the store",
        str(copy): "is a saved run" if command[0] in ("report", "export") else "already exists",
    }
    for out, needle in targets.items():
        argv = [a.format(out=out) for a in command]
        code, stdout, err = cli(capsys, "--storage", tmp_path, *argv)
        assert code == 2 and stdout == ""
        [line] = logical(err)
        assert line.startswith("llmenergy: error: --")
        assert needle in line and out in line
    assert sorted((p.name, p.read_bytes()) for p in first.parent.iterdir()) == before
    assert copy.read_bytes() == first.read_bytes()
