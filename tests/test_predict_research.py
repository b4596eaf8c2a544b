"""Issue 28: the research's GPU measurements as runs, configs without weights, and the
held-out error tables (examples/wilkins2024/, the authors' published CSVs)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.predict.calibrate import fit_both, points_from_cases, predict_work, rows_for
from pytest_llmenergy.predict.crossval import held_out
from pytest_llmenergy.predict.features import MATMUL, case_work, forward_work, load_shape
from pytest_llmenergy.results import Trial
from pytest_llmenergy.storage.store import Storage

EXAMPLE = Path(__file__).parents[1] / "examples" / "wilkins2024"
CSVS = [str(EXAMPLE / "all-input-stats.csv"), str(EXAMPLE / "all-output-stats.csv")]
SYSTEMS = ("m1-pro", "palmetto-intel-a100", "palmetto-intel-v100", "swing-amd-a100")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("research") / "store"
    assert main(["--storage", str(root), "import", *CSVS]) == 0
    return root


def _trials_in_csv() -> dict[tuple[str, str], int]:
    """Trials per (system, model), counted from the files directly."""
    out: dict[tuple[str, str], int] = {}
    for path in CSVS:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if "inference" in r["Phase"] and r["Iteration"] != "0":
                    key = (r["System"], r["Model"])
                    out[key] = out.get(key, 0) + 1
    return out


def test_import_makes_one_run_per_system_with_every_trial(store: Path) -> None:
    runs = {r.hardware: r.load() for r in Storage(store).runs()}
    assert sorted(runs) == sorted(SYSTEMS)
    expected = _trials_in_csv()
    for run in runs.values():
        system = run.machine["system"]
        for research_model in {c.labels["research_model"] for c in run.cases}:
            cases = [c for c in run.cases if c.labels["research_model"] == research_model]
            kept = sum(len(c.trials) + len(c.disturbed) for c in cases)
            assert kept == expected[(system, research_model)]
        assert run.meter["backend"] == "imported"
        assert "grantwilkins/energy-inference" in run.machine["imported"]["source"]
        for case in run.cases:
            for t in case.trials:  # two domains that add up to the trial's joules
                assert set(t.joules_by_domain) == {"cpu:package", "gpu:0"}
                assert sum(t.joules_by_domain.values()) == pytest.approx(t.joules)
    a100 = runs["palmetto-intel-a100"]
    case = next(c for c in a100.cases if c.name == "test_input_tokens[Llama-2-7b-hf-in2048-out32]")
    # the prompt of "2048" tokens tokenized to 2134 (the file's total 2166 - 32 out)
    assert {t.input_tokens for t in case.trials} == {2134}
    assert case.labels["kv_cache"] == "off" and case.labels["model"] == "meta-llama/Llama-2-7b-hf"


def test_negative_published_joules_are_kept_as_rejected_trials(store: Path) -> None:
    run = Storage(store).load("palmetto-intel-v100/0001")
    case = next(c for c in run.cases if c.name == "test_input_tokens[Mistral-7B-v0.1-in2048-out32]")
    assert len(case.rejected) == 10 and len(case.trials) == 3
    assert all("negative energy" in t.rejected for t in case.rejected)
    assert all(t.joules > 0 for t in case.trials)


def test_show_compare_and_route_read_imported_runs(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--storage", str(store)]
    assert main([*base, "show", "swing-amd-a100/0001", "--format", "csv"]) == 0
    assert "Llama-2-7b-hf" in capsys.readouterr().out
    assert main([*base, "compare", "swing-amd-a100/0001", "palmetto-intel-a100/0001"]) == 0
    assert "Mistral-7B-v0.1-in512-out32" in capsys.readouterr().out
    args = ["route", "--profile", "m1-pro/0001", "--profile", "swing-amd-a100/0001"]
    assert main([*base, *args, "--model", "all", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_a_malformed_row_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = Path(CSVS[0]).read_text().splitlines()
    lines[5] = lines[5].replace(lines[5].split(",")[1], "fast", 1)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    assert main(["--storage", str(tmp_path / "s"), "import", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"llmenergy: error: {bad} row 6: Runtime (s) is 'fast', not a number"
    assert not (tmp_path / "s").exists()  # nothing written
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert main(["--storage", str(tmp_path / "s"), "import", str(other)]) == 2
    assert "not one of the research's measurement CSVs" in capsys.readouterr().err


def _with_cells(tmp_path: Path, cells: dict[str, str]) -> Path:
    """The input sweep's file with cells of its sixth line (row 6) changed."""
    with open(CSVS[0], newline="") as f:
        rows = list(csv.reader(f))
    for column, value in cells.items():
        rows[5][rows[0].index(column)] = value
    path = tmp_path / "edited.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


@pytest.mark.parametrize(
    ("cells", "problem"),
    [  # issue 33: inf and 1e400 stopped `llmenergy import` with an OverflowError traceback
        ({"Iteration": "inf"}, "Iteration is 'inf'; expected a whole number >= 0"),
        ({"Iteration": "1e400"}, "Iteration is '1e400'; expected a whole number >= 0"),
        (
            {"Iteration": "1.5"},
            "Iteration is '1.5'; expected a whole number from 0 to 1,000,000,000",
        ),
        (
            {"Number of Input Tokens": "1e300"},
            "Number of Input Tokens is '1e300'; expected a whole number from 0 to 1,000,000,000",
        ),
        ({"Runtime (s)": "-inf"}, "Runtime (s) is '-inf'; expected a number >= 0"),
        ({"Runtime (s)": "-2"}, "Runtime (s) is '-2'; expected a number >= 0"),
        ({"CPU Energy (J)": "nan"}, "CPU Energy (J) is 'nan'; expected a number >= 0"),
        (  # finite, but its statistics would not be (and the run file refuses it)
            {"Runtime (s)": "1e300"},
            "Runtime (s) is '1e300'; no measurement is that large (at most 1e+15)",
        ),
    ],
)
def test_a_number_that_is_no_measurement_is_one_line_naming_file_row_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cells: dict[str, str], problem: str
) -> None:
    bad = _with_cells(tmp_path, cells)
    assert main(["--storage", str(tmp_path / "s"), "import", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"llmenergy: error: {bad} row 6: {problem}\n"
    assert not (tmp_path / "s").exists()  # nothing written


def test_a_csv_with_a_byte_order_mark_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33: a spreadsheet's "CSV UTF-8" starts with a BOM; it said "no column Phase"."""
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + Path(CSVS[0]).read_bytes())
    assert main(["--storage", str(tmp_path / "bom"), "import", str(bom)]) == 0
    assert main(["--storage", str(tmp_path / "plain"), "import", CSVS[0]]) == 0
    capsys.readouterr()

    def trials(root: Path) -> list[tuple[str, int]]:
        return [
            (r.hardware, sum(len(c.trials) for c in r.load().cases)) for r in Storage(root).runs()
        ]

    assert trials(tmp_path / "bom") == trials(tmp_path / "plain") != []


def test_builtin_configs_have_the_published_parameter_counts() -> None:
    # the models' parameter counts as their model cards state them
    published = {
        "meta-llama/Llama-2-7b-hf": 6.74e9,
        "mistralai/Mistral-7B-v0.1": 7.24e9,
        "tiiuae/falcon-7b": 6.92e9,
    }
    for hub_id, params in published.items():
        shape = load_shape(hub_id)
        embeddings = shape.vocab * shape.hidden * (1 if shape.family == "falcon" else 2)
        assert shape.layers * shape.layer_weights + embeddings == pytest.approx(params, rel=0.01)
    assert load_shape("Mistral-7B-v0.1").kv_heads == 8  # the short name, without the org
    assert load_shape("tiiuae/falcon-7b").kv_heads == 1  # multi-query


def test_without_a_kv_cache_every_step_recomputes_the_sequence() -> None:
    shape = load_shape("meta-llama/Llama-2-7b-hf", elem_bytes=2)
    cached = case_work(shape, 100, 5)["decode"]
    uncached = case_work(shape, 100, 5, kv_cache=False)["decode"]
    full = sum(forward_work(shape, 100 + k, 0).flops[MATMUL] for k in range(1, 5))
    assert uncached.flops[MATMUL] == pytest.approx(full)
    assert uncached.flops[MATMUL] > 90 * cached.flops[MATMUL]
    assert len(uncached.passes) == 4


def test_the_roofline_form_recovers_a_machine_that_is_bound_one_way_or_the_other() -> None:
    shape = load_shape("mistralai/Mistral-7B-v0.1", elem_bytes=2)
    k, s_per_byte, s_per_op = 2e-3, 1e-12, 1e-5
    points = []
    for n_in, n_out in [(n, 8) for n in (8, 64, 256, 1024, 2048)] + [(32, 64), (32, 256)]:
        work = case_work(shape, n_in, n_out, kv_cache=False)
        secs = sum(s_per_byte * w.roofline(k) + s_per_op * w.ops for w in work.values())
        points.append((n_in, n_out, secs))
    cases = [_case(shape.name, n_in, n_out, secs) for n_in, n_out, secs in points]
    fit = fit_both(rows_for(points_from_cases(cases)), "roofline", {})
    assert fit.time_k == pytest.approx(k, rel=0.35)  # the nearest balance point tried
    for point in points_from_cases(cases):
        predicted = predict_work(fit.time, point.work, fit.time_k)
        assert predicted == pytest.approx(point.time_s, rel=0.05)


def _case(model: str, n_in: int, n_out: int, secs: float, watts: float = 300.0) -> object:
    from pytest_llmenergy.controller.rule import ControllerSettings
    from pytest_llmenergy.results import ROUNDS, CaseResult

    trial = Trial(1, secs, watts * secs, watts * secs, {"gpu:0": watts * secs}, {}, n_in, n_out)
    return CaseResult(
        nodeid=f"t.py::t[{n_in}-{n_out}]",
        name=f"t[{n_in}-{n_out}]",
        labels={"model": model, "kv_cache": "off", "dtype": "bfloat16", "sweep": "input"},
        input_tokens=n_in,
        output_tokens=n_out,
        status=ROUNDS,
        options=ControllerSettings(),
        trials=(trial,),
    )


def test_the_fit_never_sees_the_held_out_rows(store: Path) -> None:
    """Spoil one model's times 10x: its predictions (fitted on the other two) do not
    follow, so they are off by the spoiling alone; the others', fitted on it, move."""
    run = Storage(store).load("swing-amd-a100/0001")
    falcon = "tiiuae/falcon-7b"
    spoiled = replace(
        run,
        cases=tuple(
            replace(c, trials=tuple(replace(t, seconds=10 * t.seconds) for t in c.trials))
            if c.labels["model"] == falcon
            else c
            for c in run.cases
        ),
    )
    before = {r.predicted: r for r in held_out([run], ["model"], "roofline")[0]}
    after = {r.predicted: r for r in held_out([spoiled], ["model"], "roofline")[0]}
    assert after["falcon-7b"].time_mean_err < -0.85  # predicted from the clean two
    assert after["falcon-7b"].time_mean_err == pytest.approx(
        (1 + before["falcon-7b"].time_mean_err) / 10 - 1, abs=0.01
    )
    assert after["Llama-2-7b-hf"].fitted_on == "Mistral-7B-v0.1, falcon-7b"
    # where the spoiled rows are fitted on, the others' predictions move
    moved = after["Llama-2-7b-hf"].time_mean_err - before["Llama-2-7b-hf"].time_mean_err
    assert abs(moved) > 0.01


def test_heldout_command_prints_the_three_tables(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [f"{s}/0001" for s in SYSTEMS]
    assert main(["--storage", str(store), "heldout", *runs, "--form", "roofline"]) == 0
    out = capsys.readouterr().out
    for title in ("(a) fitted on one sweep", "(b) leave one model out", "(c) leave one system"):
        assert title in out
    assert "AstraWattch" in out
    args = ["heldout", *runs, "--split", "system", "--format", "json"]
    assert main(["--storage", str(store), *args]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    # only the two A100 systems share a GPU: each predicts the other's three models
    assert {(r["system"], r["fitted_on"]) for r in rows} == {
        ("swing-amd-a100", "palmetto-intel-a100"),
        ("palmetto-intel-a100", "swing-amd-a100"),
    }
    assert len(rows) == 6 and all(np.isfinite(r["energy_mean_abs_err"]) for r in rows)


def test_calibrate_and_predict_a_7b_model_on_an_imported_system(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal = tmp_path / "cal.json"
    base = ["--storage", str(store)]
    args = ["calibrate", "swing-amd-a100/0001", "--out", str(cal), "--form", "roofline"]
    assert main([*base, *args]) == 0
    capsys.readouterr()
    assert json.loads(cal.read_text())["calibrations"][0]["kv_cache"] is False
    args = ["predict", "--calibration", str(cal), "--model", "tiiuae/falcon-7b"]
    assert main([*base, *args, "--input-tokens", "512", "--output-tokens", "32"]) == 0
    assert "predicted (not measured) on swing-amd-a100" in capsys.readouterr().out
    sizes = ["--input-tokens", "512", "--output-tokens", "32", "--format", "json"]
    assert main([*base, *args, *sizes]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    # measured there: 2.106 s, 717.8 J (Swing, Falcon, 512 in / 32 out), in the fit
    assert row["time_s"] == pytest.approx(2.106, rel=0.2)
    assert row["energy_j"] == pytest.approx(717.8, rel=0.2)
