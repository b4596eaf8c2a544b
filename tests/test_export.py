"""Exports for other tools: github-action-benchmark's JSON and CSV, from a session or a run."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from pytest_llmenergy.case_tables import case_tables
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
    ept = first[f"{measured.nodeid} j_per_token"]
    assert ept["unit"] == "J/token" and ept["value"] == pytest.approx(100 * 0.11 / 12)
    summary = FIGURES["j_per_token"].summary(measured)
    assert summary is not None and ept["range"] == f"± {summary.half_width:.2g}"
    assert first[f"{measured.nodeid} time_s"]["unit"] == "s"
    assert "3 trials, 95% CI" in str(ept["extra"]) and "estimated" not in str(ept["extra"])
    assert "estimated" in str(entries[3]["extra"])  # the second case's energy is an estimate
    assert "estimated" not in str(entries[5]["extra"])  # ... its runtime is not
    json.dumps(entries, allow_nan=False)


def test_export_names_tell_same_named_tests_apart_and_one_trial_has_no_range() -> None:
    """Three tests named test_small in two files and a class: three names per figure, the
    same in every run whatever the order; one trial: no interval, so no "range"."""
    ids = ("t/test_a.py::test_small", "t/test_b.py::test_small", "t/test_b.py::TestK::test_small")
    cases = [
        dataclasses.replace(make_case([0.1, 0.12, 0.11]), nodeid=n, name="test_small") for n in ids
    ]
    names = [e["name"] for e in dashboard_entries(cases)]
    assert len(set(names)) == len(names) == 3 * len(DASHBOARD_FIGURES)
    assert set(names) == {e["name"] for e in dashboard_entries(cases[::-1])}
    assert f"{ids[2]} j_per_token" in names
    (table,) = case_tables(cases, group_by=())
    shown = [dict(zip(table.keys, c))["name"] for c in table.cells]
    assert shown == ["test_a.py::test_small", "test_b.py::test_small", "TestK::test_small"]
    [single] = dashboard_entries([make_case([0.1])])[:1]
    assert "range" not in single and str(single["extra"]).startswith("1 trial;")


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
    nodeid = saved_run["cases"][0]["nodeid"]
    runtime = next(e for e in entries if e["name"] == f"{nodeid} time_s")
    assert runtime["value"] == pytest.approx(sum(seconds) / len(seconds))
    assert len((project.path / "cases.csv").read_text().splitlines()) == 3
    # a CI re-run in a workspace not cleaned: an export is derived, so it is replaced
    again = run(project, "--energy-export=csv:cases.csv", "--energy-export=csv:new/x.csv")
    assert again.ret == pytest.ExitCode.USAGE_ERROR  # but its folder must exist
    assert "new/x.csv: folder new does not exist" in again.stderr.str()
    again = run(project, "--energy-export=csv:cases.csv")
    assert again.ret == 0
    assert len((project.path / "cases.csv").read_text().splitlines()) == 3
    # ... and a session that ran no case writes an empty export, not none
    none = run(project, "--energy-export=github-action-benchmark:dash.json", "-k", "nothing")
    assert none.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert json.loads((project.path / "dash.json").read_text()) == []


def test_llmenergy_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(tmp_path, [make_case([0.1, 0.1, 0.1])])
    code, out, _ = cli(capsys, "--storage", tmp_path, "export", "1", "--format", "csv")
    assert code == 0 and out.startswith("group,name,tokens_in")
    target = tmp_path / "dash.json"
    argv = ("--storage", tmp_path, "export", "1", "--format", "github-action-benchmark")
    code, out, err = cli(capsys, *argv, "--out", target)
    assert code == 0 and err == ""
    assert out == f"wrote {target} (1 case(s) of 0001_baseline as github-action-benchmark)\n"
    assert len(json.loads(target.read_text())) == len(DASHBOARD_FIGURES)
    target.write_text("an earlier export")
    code, _, err = cli(capsys, *argv, "--out", target)  # replaced: exports are derived
    assert code == 0 and len(json.loads(target.read_text())) == len(DASHBOARD_FIGURES)


# -- Bencher's BMF JSON, checked against the schema Bencher documents ----------------------
# https://bencher.dev/docs/reference/bencher-metric-format (its JSON schema, as data)
BMF_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema",
    "type": "object",
    "patternProperties": {
        ".+": {
            "type": "object",
            "patternProperties": {
                ".+": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "number"},
                        "lower_value": {"type": "number"},
                        "upper_value": {"type": "number"},
                    },
                    "required": ["value"],
                }
            },
        }
    },
}


def _bmf(cases: list) -> dict:
    import jsonschema

    data = json.loads(export_text(cases, "bencher"))
    jsonschema.validate(data, BMF_SCHEMA)
    for name, measures in data.items():  # Bencher's limits on names and slugs
        assert len(name) <= 1024
        assert all(len(slug) <= 64 and slug == slug.lower() for slug in measures)
    return data


def test_bencher_metrics_carry_the_mean_and_the_interval_as_lower_and_upper() -> None:
    measured = make_case([0.1, 0.12, 0.11])
    single = dataclasses.replace(make_case([0.1]), nodeid="t.py::test_once", name="test_once")
    data = _bmf([measured, single])
    ept = data[measured.nodeid]["j-per-token"]
    summary = FIGURES["j_per_token"].summary(measured)
    assert summary is not None and ept["value"] == pytest.approx(summary.mean)
    assert ept["lower_value"] == pytest.approx(summary.mean - summary.half_width)
    assert ept["upper_value"] == pytest.approx(summary.mean + summary.half_width)
    assert set(data[measured.nodeid]) == {"j-per-token", "energy-j", "time-s"}
    assert set(data["t.py::test_once"]["j-per-token"]) == {"value"}  # one trial: no interval


def test_bencher_names_survive_hostile_and_long_node_ids() -> None:
    ids = ['t.py::test_x["\n</script>]', "t.py::test_" + "y" * 2000, "t.py::test_" + "y" * 2001]
    cases = [dataclasses.replace(make_case([0.1, 0.11]), nodeid=i, name=i) for i in ids]
    data = _bmf(cases)
    assert len(data) == 3 and ids[0] in data  # JSON keeps the text as it is, escaped


def test_the_default_suites_export_validates() -> None:
    from tests.casefactory import synthetic_run

    run = synthetic_run(57)
    assert len(_bmf(list(run.cases))) == len(run.cases) > 50
