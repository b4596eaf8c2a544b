"""Exports for other tools: github-action-benchmark's JSON and CSV, from a session or a run."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.export import (
    DASHBOARD_FIGURES,
    dashboard_entries,
    export_text,
    parse_export,
    parse_exports,
)
from pytest_llmenergy.figures import FIGURES, value
from tests.casefactory import make_case
from tests.test_cli import cli, save
from tests.test_plugin_keep import project, run  # noqa: F401  (the pytester project fixture)


def test_dashboard_entries_carry_each_cases_mean_and_interval() -> None:
    measured = make_case([0.1, 0.12, 0.11])  # 100 W, 8 in + 4 out tokens
    estimated = make_case([0.2, 0.2], input_tokens=64, method="estimated")
    entries = dashboard_entries([measured, estimated])
    assert len(entries) == 2 * len(DASHBOARD_FIGURES)
    first = {e["name"]: e for e in entries[:3]}
    ept = first[f"{measured.name} j_per_token"]
    assert ept["unit"] == "J/token" and ept["value"] == pytest.approx(100 * 0.11 / 12)
    summary = FIGURES["j_per_token"].summary(measured)
    assert summary is not None and ept["range"] == f"± {summary.half_width:.2g}"
    assert first[f"{measured.name} time_s"]["unit"] == "s"
    assert "3 trials, 95% CI" in str(ept["extra"]) and "estimated" not in str(ept["extra"])
    assert "estimated" in str(entries[3]["extra"])  # the second case's energy is an estimate
    assert "estimated" not in str(entries[5]["extra"])  # ... its runtime is not
    json.dumps(entries, allow_nan=False)


def test_csv_has_every_figure_of_every_case() -> None:
    cases = [make_case([0.1, 0.1]), make_case([0.2, 0.2], input_tokens=64)]
    rows = list(csv.DictReader(io.StringIO(export_text(cases, "csv"))))
    assert len(rows) == 2 and set(FIGURES) <= set(rows[0])
    assert float(rows[1]["energy_j"]) == pytest.approx(value(cases[1], "energy_j"))


def test_bad_exports_are_one_config_error() -> None:
    assert parse_exports("csv:a.csv,github-action-benchmark:b.json") == (
        ("csv", Path("a.csv")),
        ("github-action-benchmark", Path("b.json")),
    )
    for text, needle in (("a.csv", "FORMAT:PATH"), ("xml:a.xml", "unknown format 'xml'")):
        with pytest.raises(ConfigError, match=needle):
            parse_export(text)


def test_a_session_exports_what_it_measured(project: pytest.Pytester) -> None:  # noqa: F811
    result = run(
        project,
        "--energy-export=github-action-benchmark:dash.json",
        "--energy-export=csv:cases.csv",
        "--energy-json=run.json",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["llmenergy: exported 2 case(s) as github-action-benchmark to dash.json"]
    )
    entries = json.loads((project.path / "dash.json").read_text())
    saved_run = json.loads((project.path / "run.json").read_text())
    assert len(entries) == 2 * len(DASHBOARD_FIGURES)
    assert saved_run["options"]["export"] == [
        "github-action-benchmark:dash.json",
        "csv:cases.csv",
    ]
    seconds = [t["seconds"] for t in saved_run["cases"][0]["trials"]]
    name = saved_run["cases"][0]["name"]
    runtime = next(e for e in entries if e["name"] == f"{name} time_s")
    assert runtime["value"] == pytest.approx(sum(seconds) / len(seconds))
    assert len((project.path / "cases.csv").read_text().splitlines()) == 3
    again = run(project, "--energy-export=csv:cases.csv")
    assert again.ret == pytest.ExitCode.USAGE_ERROR  # never over an existing file
    assert "cases.csv already exists" in again.stderr.str()
    again.stdout.no_fnmatch_line("*passed*")


def test_llmenergy_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(tmp_path, [make_case([0.1, 0.1, 0.1])])
    code, out, _ = cli(capsys, "--storage", tmp_path, "export", "1", "--format", "csv")
    assert code == 0 and out.startswith("group,name,tokens_in")
    target = tmp_path / "dash.json"
    argv = ("--storage", tmp_path, "export", "1", "--format", "github-action-benchmark")
    code, out, err = cli(capsys, *argv, "--out", target)
    assert code == 0 and out.strip() == str(target) and "exported 1 case(s)" in err
    assert len(json.loads(target.read_text())) == len(DASHBOARD_FIGURES)
    code, _, err = cli(capsys, *argv, "--out", target)
    assert code == 2 and "already exists" in err
