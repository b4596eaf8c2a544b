"""Runs saved by 0.1.0 (schema version 1) still load, show, compare and route."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import CompareOptions, compare_cases
from pytest_llmenergy.figures import value
from pytest_llmenergy.routing.decide import RouteSettings, route
from pytest_llmenergy.routing.profile import profiles_from_run
from pytest_llmenergy.routing.workload import alpaca
from pytest_llmenergy.storage.runfile import SCHEMA_VERSION, load

V1 = Path(__file__).parent / "data" / "runs" / "v1"


def test_the_checked_in_files_are_version_1() -> None:
    for name in ("machine-a.json", "machine-b.json"):
        data = json.loads((V1 / name).read_text())
        assert data["schema_version"] == 1
        assert "controller" in data["options"]  # 0.1.0's dump of its dataclasses
    assert SCHEMA_VERSION == 2


def test_a_version_1_run_loads_with_its_figures() -> None:
    run = load(V1 / "machine-a.json")
    assert run.schema_version == 1
    assert run.confidence == 0.95  # read from options.controller in version 1
    assert len(run.cases) == 6
    case = run.cases[0]
    # 0.1.0 saved CI targets as "time": read as the figure it meant
    assert [t.metric for t in case.options.targets] == ["time_s"]
    assert case.has_phases
    assert value(case, "j_per_token") == pytest.approx(
        value(case, "energy_j") / (case.input_tokens + case.output_tokens)
    )
    assert value(case, "prefill_j_per_in_token") is not None


def test_version_1_runs_compare_and_gate() -> None:
    a, b = load(V1 / "machine-a.json"), load(V1 / "machine-b.json")
    comparison = compare_cases(a.cases, b.cases, CompareOptions(metrics=["j_per_token"]))
    assert len(comparison.deltas) == 6
    assert not comparison.only_in_baseline and not comparison.only_in_current


def test_version_1_runs_route_as_two_systems() -> None:
    runs = [load(V1 / "machine-a.json"), load(V1 / "machine-b.json")]
    profiles = [p for run in runs for p in profiles_from_run(run)]
    assert {p.system for p in profiles} == {run.hardware for run in runs}
    routed = route(profiles, alpaca(), RouteSettings())
    assert len(routed) == 1
    decision = routed[0].decision
    assert decision.queries == len(alpaca())
    assert sum(decision.totals.queries.values()) == decision.queries


def test_the_cli_shows_compares_and_routes_version_1_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = tmp_path / "store"
    for name, hardware in (
        ("machine-a", "amd-epyc__no-gpu__estimate"),
        ("machine-b", "amd-epyc__no-gpu__auto-estimate"),
    ):
        (storage / hardware).mkdir(parents=True)
        shutil.copy(V1 / f"{name}.json", storage / hardware / f"0001_{name}.json")
    a = "amd-epyc__no-gpu__estimate/0001"
    b = "amd-epyc__no-gpu__auto-estimate/0001"
    assert main(["--storage", str(storage), "show", a, "--format", "csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("group,") and "j_per_token" in rows[0] and len(rows) == 7
    assert main(["--storage", str(storage), "compare", a, b, "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)["tables"][0]
    assert len(table["rows"]) == 6
    assert main(["--storage", str(storage), "route", "--profile", a, "--profile", b]) == 0
    assert "threshold" in capsys.readouterr().out.lower()
