"""The HTML report (issue 27): what the page holds, ``llmenergy report``, and
``--energy-report`` run the way users run it.  Drawing in a real browser:
``test_html_report_browser.py``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import compare_cases, delta, parse_gates
from pytest_llmenergy.figures import FIGURES
from pytest_llmenergy.html import render_report, write_report
from pytest_llmenergy.html.casedata import case_table, ratio_interval
from pytest_llmenergy.html.charts import CHARTS
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.storage.runfile import dumps
from tests.casefactory import make_case, synthetic_run
from tests.test_plugin import assert_one_line_usage_error
from tests.test_plugin_keep import CASES, REPO
from tests.test_plugin_suite import TRACE_METER

pytest.importorskip("vl_convert")


def _specs(page: str) -> dict[str, dict]:
    found = re.search(
        r'<script type="application/json" id="llmenergy-specs">\n(.*?)\n</script>', page, re.S
    )
    assert found is not None
    return json.loads(found.group(1))


def _saved(tmp_path: Path, run, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(dumps(run))
    return path


# -- the page ----------------------------------------------------------------------------
def test_one_file_with_everything_inside_and_no_way_out() -> None:
    page = render_report([synthetic_run(12)])
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)
    assert len(scripts) == 4  # the library, the specs, the table's rows, the page's script
    assert "window.vegaEmbed" in scripts[0]  # the library itself, inlined
    markup = page
    for script in scripts:
        markup = markup.replace(script, "")
    # no external script, style, font or image; the policy forbids the page any request
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", markup)
    assert "@import" not in markup and "url(" not in markup
    assert "default-src 'none'" in markup


def test_each_chart_has_a_point_per_case_with_its_interval() -> None:
    run = synthetic_run(54)  # 3 models x 9 sizes x 2 sweeps
    specs = _specs(render_report([run]))
    assert set(specs) == {"jpt_in", "jpt_out", "prefill_in", "decode_out"}  # one batch size
    for key, spec in specs.items():
        values = spec["data"]["values"]
        sweep = next(c.sweep for c in CHARTS if c.key == key)
        assert len(values) == sum(1 for c in run.cases if c.labels["sweep"] == sweep) == 27
        figure = next(c.figure for c in CHARTS if c.key == key)
        for point in values:
            case = next(c for c in run.cases if c.name == point["case"])
            summary = FIGURES[figure].summary(case)
            assert point["y"] == pytest.approx(summary.mean)
            assert point["lo"] == pytest.approx(summary.low)
            assert point["hi"] == pytest.approx(summary.high)
            assert point["estimated"] is True  # the synthetic run is an estimate
        assert [layer["mark"]["type"] for layer in spec["layer"]] == ["area", "line", "point"]
        assert spec["encoding"]["x"]["scale"]["type"] == "log"
        assert "hollow points: estimated" in " ".join(spec["title"]["subtitle"])


def _batched(q: int) -> CaseResult:
    case = make_case([0.2, 0.21, 0.2], input_tokens=64, watts=50.0 * q)
    trials = tuple(dataclasses.replace(t, queries=q) for t in case.trials)
    return dataclasses.replace(case, queries=q, trials=trials, name=f"{case.name}-bs{q}")


def test_batch_curves_appear_only_with_several_batch_sizes() -> None:
    run = dataclasses.replace(synthetic_run(6), cases=tuple(_batched(q) for q in (1, 8, 32)))
    values = _specs(render_report([run]))["batch"]["data"]["values"]
    assert [p["x"] for p in values] == [1, 8, 32]
    assert [p["y"] for p in values] == pytest.approx(
        [FIGURES["j_per_token"].value(c) for c in run.cases]
    )
    assert "batch" not in _specs(render_report([synthetic_run(6)]))


def test_the_case_table_has_every_figure_some_case_has() -> None:
    run = synthetic_run(6)
    table = case_table([("a", run.cases)])
    keys = [c.key for c in table.columns]
    with_values = [k for k, f in FIGURES.items() if any(f.value(c) is not None for c in run.cases)]
    assert keys == ["case", *(k for k in with_values if k != "name")]
    assert "req_ttft_s" not in keys  # no server: no latency column
    j = keys.index("j_per_token")
    shown, value = table.rows[0][j]
    assert shown.startswith("~") and value == pytest.approx(
        FIGURES["j_per_token"].value(run.cases[0])
    )


def test_ratio_interval_is_the_t_interval_of_the_log_means() -> None:
    base = make_case([1.0, 1.1, 0.9, 1.05, 0.95])
    head = make_case([1.2, 1.3, 1.1, 1.25, 1.15])
    d = delta(base, head, "energy_j", session_noise=0.02)
    assert d is not None and d.test is not None
    ratio, low, high = ratio_interval(d)
    assert ratio == pytest.approx(1.2)
    # the gate's own interval: sessions compared, the noise between them counted
    assert math.log(high / ratio) == pytest.approx(1.959964 * d.test.se, rel=1e-4)
    assert low < 1.2 < high and low > 1.0  # a significant 20 % rise excludes 1
    assert math.log(high / ratio) == pytest.approx(math.log(ratio / low))  # symmetric in logs
    same = delta(base, base, "energy_j")
    assert same is not None
    r, lo, hi = ratio_interval(same)
    assert r == 1.0 and lo < 1.0 < hi


def test_two_runs_compared_with_verdicts_and_highlighted_rows() -> None:
    base, head = synthetic_run(54, seed=1), synthetic_run(54, seed=2, slower=1.3)
    comparison = compare_cases(
        base.cases,
        head.cases,
        gates=parse_gates("j_per_token:5%"),
        current_label="head",
        session_noise=0.02,
    )
    page = render_report([base, head], ["base", "head"], [comparison])
    assert "energy gate FAILED (j_per_token:5%)" in page
    found = re.search(
        r'<script type="application/json" id="comparison-0-data">(.*?)</script>', page
    )
    assert found is not None
    table = json.loads(found.group(1))
    assert table["classes"].count("worse") == len(comparison.failures) == 54
    assert len(table["rows"]) == 54 and "FAIL" in table["rows"][0]
    assert "ratio CI" in page
    specs = _specs(page)
    assert len(specs["jpt_in"]["data"]["values"]) == 2 * 27  # one mark per case and run
    assert specs["jpt_in"]["layer"][2]["encoding"]["shape"]["field"] == "run"


def test_an_existing_report_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old")
    write_report(target, [synthetic_run(6)])
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temp file left


# -- llmenergy report ----------------------------------------------------------------------
def test_cli_report_of_two_runs_with_a_gate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = _saved(tmp_path, synthetic_run(12, seed=1), "base")
    b = _saved(tmp_path, synthetic_run(12, seed=2, slower=1.3), "head")
    out = tmp_path / "report.html"
    gate = ["--gate", "j_per_token:5%", "--session-noise", "2%"]
    assert main(["report", str(a), str(b), "--out", str(out), *gate]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    assert f"llmenergy: wrote {out}: 2 run(s), 24 case(s)" in captured.err
    assert "head: energy gate FAILED (j_per_token:5%)" in captured.err  # shown, not failing
    page = out.read_text()
    assert "<h3>head against base (baseline)</h3>" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "nope.json", "--out", "r.html"], "nope.json"),
        (["report", "{run}", "--out", "missing/r.html"], "folder missing does not exist"),
        (["report", "{run}", "--out", "."], "is a folder"),
    ],
)
def test_cli_report_bad_input_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    run = _saved(tmp_path, synthetic_run(6), "run")
    assert main([a.replace("{run}", str(run)) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmenergy: error: ") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_cli_report_bad_gate_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", "a.json", "--out", "r.html", "--gate", "j_per_token"])
    assert exit_.value.code == 2
    assert "expected FIGURE:AMOUNT" in capsys.readouterr().err


# -- --energy-report -----------------------------------------------------------------------
@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(test_cases=CASES)
    return pytester


COMMON = ("--energy-backend=trace", "--energy-rule=research", "--energy-max-background=off")


def test_energy_report_is_written_at_session_end(project: pytest.Pytester) -> None:
    result = project.runpytest(*COMMON, "--energy-report=report.html", "--energy-save=base")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["llmenergy: HTML report of 2 case(s): report.html (*MB)"])
    page = (project.path / "report.html").read_text()
    assert "<h3>this run</h3>" in page and "test_case[8]" in page
    # the ini twin, and a comparison with the saved run; the old report is replaced
    project.makeini("[pytest]\nllmenergy_report = again.html\n")
    (project.path / "again.html").write_text("old")
    compared = project.runpytest(*COMMON, "--energy-compare-fail=j_per_token:50%")
    compared.assert_outcomes(passed=2)
    page = (project.path / "again.html").read_text()
    assert "this run against 0001_base (baseline)" in page
    assert "energy gate passed (j_per_token:50%)" in page


def test_energy_report_without_a_saved_run_still_has_the_header(project: pytest.Pytester) -> None:
    result = project.runpytest(*COMMON, "--energy-report=r.html")
    result.assert_outcomes(passed=2)
    page = (project.path / "r.html").read_text()
    assert "this run (complete)" in page and "__no-gpu__trace" in page


def test_energy_report_bad_folder_stops_at_start(project: pytest.Pytester) -> None:
    result = project.runpytest(*COMMON, "--energy-report=missing/r.html")
    assert_one_line_usage_error(
        result, "--energy-report=missing/r.html: folder missing does not exist"
    )


def test_without_the_report_extra_both_front_ends_say_what_to_install(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # import fails as if not installed
    result = project.runpytest(*COMMON, "--energy-report=r.html")
    assert_one_line_usage_error(
        result, "--energy-report: the HTML report needs vl-convert-python", "[report]"
    )
    run = _saved(tmp_path, synthetic_run(6), "run")
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'pytest-llmenergy[report]'" in err and len(err.splitlines()) == 1
