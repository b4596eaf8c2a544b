"""Saved runs, comparisons and energy gates, run through pytest the way users run them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_plugin import assert_one_line_usage_error
from tests.test_plugin_suite import TRACE_METER

REPO = Path(__file__).resolve().parent.parent

# Each case sleeps through a scripted list of durations, one per round, under a constant
# 200 W meter: its joules are 200 x the sleeps, so a run's figures are chosen by the test.
CASES = """
import os, time, pytest

SLEEPS = [float(s) for s in os.environ.get("SLEEPS", "0.01,0.01,0.01").split(",")]

@pytest.mark.parametrize("n_in", [8, 64])
def test_case(energy_benchmark, n_in):
    durations = iter(SLEEPS)
    energy_benchmark.pedantic(
        lambda: time.sleep(next(durations)),
        rounds=len(SLEEPS),
        warmup_rounds=0,
        input_tokens=n_in,
        output_tokens=4,
    )
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(test_cases=CASES)
    return pytester


# the research rule: the scripted sleeps below decide the trial counts
RESEARCH_SESSION = (
    "--energy-backend=trace",
    "--energy-shuffle=off",
    "--energy-rule=research",
    "--energy-max-background=off",  # scripted trials: no busy-machine check
)


def run(p: pytest.Pytester, *args: str, sleeps: str | None = None) -> pytest.RunResult:
    if sleeps is not None:
        os.environ["SLEEPS"] = sleeps
    try:
        return p.runpytest(*RESEARCH_SESSION, *args)
    finally:
        os.environ.pop("SLEEPS", None)


def saved(p: pytest.Pytester) -> list[Path]:
    return sorted((p.path / ".llmenergy").glob("*/*.json"))


def test_save_writes_everything_a_run_needs(project: pytest.Pytester) -> None:
    result = run(project, "--energy-save=base", "--energy-idle=0.05", sleeps="0.01,0.012,0.011")
    result.assert_outcomes(passed=2)
    [path] = saved(project)
    assert path.name == "0001_base.json"
    assert path.parent.name.endswith("__no-gpu__trace")  # CPU, GPUs and meter name the folder
    result.stdout.fnmatch_lines(
        [
            f"llmenergy: saving this run to .llmenergy/{path.parent.name}/0001_base.json",
            f"llmenergy: saved 2 case(s) to .llmenergy/{path.parent.name}/0001_base.json",
        ]
    )
    data = json.loads(path.read_text())
    assert data["format"] == "pytest-llmenergy-run" and data["schema_version"] == 2
    assert data["run"]["status"] == "complete" and data["run"]["exit_status"] == 0
    assert data["run"]["name"] == "base" and data["run"]["id"] == "0001"
    assert data["machine"]["cpu"]["logical_cores"] >= 1 and data["machine"]["memory_bytes"] > 0
    assert "torch" in data["machine"]["packages"] and "python" in data["machine"]
    assert data["commit"] == {}  # pytester's folder is not a git repository
    # the explicit options record: every option by name, with the value in effect
    from pytest_llmenergy.plugin.options import OPTIONS

    assert set(data["options"]) == {o.name for o in OPTIONS}
    assert data["options"]["max_trials"] == 25 and data["options"]["save"] == "base"
    assert data["options"]["ci_target"] == ["time_s:0.5s"] and data["options"]["idle"] == 0.05
    assert isinstance(data["options"]["seed"], int)  # the seed in effect, chosen or given
    assert data["meter"]["domains"] == {"gpu:0": {"method": "counter", "counted": True}}
    assert data["meter"]["idle_power_w"]["gpu:0"] == pytest.approx(200.0, rel=1e-3)
    case = data["cases"][0]
    assert [t["index"] for t in case["trials"]] == [1, 2, 3]
    # each trial slept 10-12 ms (a busy machine may stretch a sleep, never shorten it)
    assert all(0.0095 <= t["seconds"] < 1.0 for t in case["trials"])
    for trial in case["trials"]:
        assert trial["joules"] == pytest.approx(200.0 * trial["seconds"], rel=1e-3)
        assert trial["net_joules"] == pytest.approx(0.0, abs=1e-3)  # idle is 200 W too


def test_autosave_never_overwrites_and_numbers_runs(project: pytest.Pytester) -> None:
    run(project, "--energy-autosave").assert_outcomes(passed=2)
    first = saved(project)[0].read_text()
    run(project, "--energy-autosave").assert_outcomes(passed=2)
    paths = saved(project)
    assert [p.name[:5] for p in paths] == ["0001_", "0002_"]
    assert paths[0].read_text() == first


def test_json_path_and_its_existing_file_check(project: pytest.Pytester) -> None:
    run(project, "--energy-json=out.json").assert_outcomes(passed=2)
    data = json.loads((project.path / "out.json").read_text())
    assert len(data["cases"]) == 2 and saved(project) == []  # only where it was asked
    result = run(project, "--energy-json=out.json")
    assert_one_line_usage_error(result, "--energy-json", "out.json already exists")
    result.stdout.no_fnmatch_line("*passed*")


def test_compare_with_the_latest_named_or_missing_run(project: pytest.Pytester) -> None:
    none = run(project, "--energy-compare")
    none.assert_outcomes(passed=2)
    assert none.ret == 0
    none.stdout.fnmatch_lines(["llmenergy: nothing to compare with: no complete run saved in *"])
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    result = run(project, "--energy-compare")
    assert result.ret == 0
    result.stdout.re_match_lines(
        [
            r"^=+ llmenergy: compared with 0001_base =+$",
            r"^this run \(current\) against 0001_base \(baseline\)$",
            r"^8\s+j_per_token\s+.*%\s+\S+\s+(yes|no)$",
            r"^llmenergy: compared \d+ figures against 0001_base$",
        ]
    )
    assert run(project, "--energy-compare=base").ret == 0
    missing = run(project, "--energy-compare=nope")
    assert_one_line_usage_error(missing, "--energy-compare=nope", "no saved run 'nope'")


def test_gate_fails_a_significant_regression(project: pytest.Pytester) -> None:
    run(project, "--energy-save=base", sleeps="0.01,0.01,0.01,0.01").assert_outcomes(passed=2)
    result = run(project, "--energy-compare-fail=j_per_token:5%", sleeps="0.02,0.02,0.02,0.02")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.re_match_lines(
        [
            r"^8\s+j_per_token\s+.*\+\d+\.\d %\s+\S+\s+yes\s+j_per_token:5%\s+FAIL$",
            r"^llmenergy: energy gate FAILED \(j_per_token:5%\): 2 significant "
            r"regression\(s\) in 2 case\(s\): 64, 8$",
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_gate_passes_a_large_regression_that_is_not_significant(project: pytest.Pytester) -> None:
    """Also: 0.1.0's name of the figure (``joules``) still works, with a deprecation note."""
    run(project, "--energy-save=base", sleeps="0.01,0.05,0.01").assert_outcomes(passed=2)
    result = run(project, "--energy-compare-fail=joules:10%", sleeps="0.05,0.01,0.05")
    assert result.ret == 0
    result.stdout.re_match_lines(
        [
            r"^8\s+energy_j\s+.*\+\d\d\.\d %\s+\S+\s+no\s+energy_j:10%\s+"
            r"not significant$",
            r"^llmenergy: energy gate passed \(energy_j:10%\): no significant regression; "
            r"2 over the threshold but not significant$",
        ]
    )
    result.stderr.fnmatch_lines(
        ["llmenergy: warning: figure name 'joules' is deprecated, use 'energy_j'*"]
    )


def test_an_old_figure_name_warns_in_one_line_under_the_projects_warning_filters(
    project: pytest.Pytester,
) -> None:
    """Issue 46: under this repository's own pytest settings (its filterwarnings make the
    package's deprecation and future warnings errors) an old figure name stopped the
    session at configure time with an INTERNALERROR traceback, exit 3.  It works, and
    says so in one line on stderr, once; a bad name is still one line."""
    pyproject = (REPO / "pyproject.toml").read_text()
    section = pyproject.split("[tool.pytest.ini_options]", 1)[1].split("\n[", 1)[0]
    assert "error::DeprecationWarning:pytest_llmenergy" in section
    project.makepyprojecttoml(f"[tool.pytest.ini_options]{section}")
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    for strict in ((), ("-W", "error")):  # and where every warning is an error
        gate = "--energy-compare-fail=energy_per_token:5000%"
        result = run(project, "test_cases.py", "--energy-compare=base", gate, *strict)
        assert result.ret == 0, result.stderr.str()
        result.assert_outcomes(passed=2)
        assert [line for line in result.stderr.lines if line.strip()] == [
            "llmenergy: warning: figure name 'energy_per_token' is deprecated, use "
            "'j_per_token' (the old name works until pytest-llmenergy 0.3)"
        ]
        result.stdout.fnmatch_lines(["llmenergy: energy gate passed (j_per_token:5000%)*"])
        assert "deprecated" not in result.stdout.str()  # no warnings summary besides
        assert "Traceback" not in result.stdout.str()
    bad = run(project, "--energy-compare=base", "--energy-compare-fail=energy_per_tokn:5%")
    assert_one_line_usage_error(bad, "unknown figure 'energy_per_tokn'")


def test_gate_passes_an_unchanged_run_and_reads_the_ini(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nllmenergy_save = base\n")
    run(project).assert_outcomes(passed=2)
    assert [p.name for p in saved(project)] == ["0001_base.json"]
    project.makeini("[pytest]\nllmenergy_compare_fail = time_s:50%, energy_j:50%\n")
    result = run(project)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["llmenergy: energy gate passed (time_s:50%, energy_j:50%): no significant regression"]
    )


def test_a_gate_that_compared_nothing_fails_the_session(project: pytest.Pytester) -> None:
    """Issue 33: the tests renamed, the gate compared nothing and the session passed."""
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    project.makepyfile(test_cases=CASES.replace("def test_case(", "def test_renamed("))
    for strict in ((), ("--energy-strict",)):
        result = run(project, "--energy-compare-fail=j_per_token:5%", *strict)
        result.assert_outcomes(passed=2)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        assert (
            "llmenergy: energy gate FAILED (j_per_token:5%): nothing compared: none of the "
            "2 case(s) of this run is in 0001_base (renamed tests, or other tests); compare "
            "with a run of the same tests, or save a new baseline"
        ) in _flat(result)
    # a session whose gated tests all left (none measured): the gate compared nothing too
    project.makepyfile(test_cases="def test_plain():\n    pass\n")
    result = run(project, "--energy-compare-fail=j_per_token:5%", "--energy-compare=base")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "nothing compared: this run measured no case; run the gated tests" in _flat(result)
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_strict_fails_a_gate_that_left_a_case_out(project: pytest.Pytester) -> None:
    """Issue 33: a case on one side only is not judged; under --energy-strict the session
    fails and the line lists it."""
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    gate = ("--energy-compare-fail=energy_j:50%", "-k", "8")
    lenient = run(project, *gate)
    assert lenient.ret == 0
    verdict = (
        "energy gate passed (energy_j:50%): no significant regression; not judged, on one "
        "side only: only in 0001_base: test_cases.py::test_case[64] (--energy-strict fails "
        "on this)"
    )
    assert f"llmenergy: {verdict}" in _flat(lenient)
    strict = run(project, *gate, "--energy-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    assert f"llmenergy: FAILED (strict): {verdict}" in _flat(strict)


def _flat(result: pytest.RunResult) -> str:
    """The output with every run of whitespace one space: a long line is wrapped to the
    terminal's width."""
    return " ".join(result.stdout.str().split())


def test_interrupted_session_keeps_the_cases_it_finished(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_zz_interrupt="""
        def test_interrupt():
            raise KeyboardInterrupt
        """
    )
    # the interrupt is the last test: see the crash test below about pytest-randomly
    result = project.runpytest_subprocess(
        "--energy-backend=trace", "--energy-shuffle=off", "--energy-save=cut", "-p", "no:randomly"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    [path] = saved(project)
    data = json.loads(path.read_text())
    assert data["run"]["status"] == "interrupted"
    assert [c["name"] for c in data["cases"]] == ["test_case[8]", "test_case[64]"]


def test_the_latest_baseline_is_the_latest_complete_run(project: pytest.Pytester) -> None:
    """An interrupted or unreadable run is skipped, and the session says which."""
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    [base] = saved(project)
    (base.parent / "0002_cut.json").write_text(
        base.read_text().replace('"status": "complete"', '"status": "interrupted"')
    )
    (base.parent / "0003_junk.json").write_text('{"format": "pytest-llmenergy-run", "sch')
    result = run(project, "--energy-compare")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmenergy: comparing with *0001_base.json"])
    text = " ".join(result.stdout.str().split())  # the note wraps to the terminal
    assert "llmenergy: baseline: skipped 0003_junk.json (unreadable: not a readable" in text
    assert "delete the file), 0002_cut.json (interrupted)" in text
    result.stdout.fnmatch_lines(["*compared with 0001_base*"])


def test_a_hostile_file_in_the_storage_leaves_a_gated_saving_session_whole(
    project: pytest.Pytester,
) -> None:
    """Issue 33: a file named like a run holding 200,000 ``[`` crashed a gated, saving
    session at its end (RecursionError): its run stayed "running", no verdict, no report."""
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    [base] = saved(project)
    (base.parent / "0002_evil.json").write_text("[" * 200_000)
    gate = ("--energy-compare-fail=j_per_token:50%", "--energy-report=report.html")
    notes = []
    for baseline in ("--energy-compare", "--energy-compare=base"):  # the latest, and named
        # a subprocess: the report's converter loads once per process
        result = project.runpytest_subprocess(
            *RESEARCH_SESSION, "-p", "no:randomly", baseline, *gate, "--energy-autosave"
        )
        assert result.ret == 0, result.stdout.str()
        assert "Traceback" not in result.stdout.str() + result.stderr.str()
        result.stdout.fnmatch_lines(["llmenergy: energy gate passed (j_per_token:50%)*"])
        assert (project.path / "report.html").stat().st_size > 0
        latest = json.loads(saved(project)[-1].read_text())
        assert latest["run"]["status"] == "complete" and len(latest["cases"]) == 2
        notes.append(" ".join(result.stdout.str().split()))  # the note wraps to the terminal
    assert "skipped 0002_evil.json (unreadable: not a readable run file: nested more" in notes[0]


def test_crashed_session_keeps_the_cases_it_finished(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_zz_crash="""
        import os, signal
        def test_crash():
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    # the crash is the last test of the session: pytest-randomly, if installed, would move
    # it (it is not an energy case, so its order is randomly's, not this plugin's)
    result = project.runpytest_subprocess(
        "--energy-backend=trace",
        "--energy-shuffle=off",
        "--energy-save=crash",
        "--energy-rule=research",
        "--energy-max-background=off",
        "-p",
        "no:randomly",
    )
    assert result.ret == -9
    [path] = saved(project)
    data = json.loads(path.read_text())
    assert data["run"]["status"] == "running"  # it never got to say goodbye
    assert len(data["cases"]) == 2 and all(len(c["trials"]) == 3 for c in data["cases"])


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"format": "pytest-llmenergy-run", "schema_version": 1, "run": {', "truncated"),
        ('{"benchmarks": []}', "not a pytest-llmenergy run file"),
        ('{"format": "pytest-llmenergy-run", "schema_version": 7}', "newer pytest-llmenergy"),
        ("[" * 200_000, "nested more than 32 levels deep"),  # issue 33: was INTERNALERROR
    ],
)
def test_bad_baseline_stops_the_session_at_start(
    project: pytest.Pytester, content: str, needle: str
) -> None:
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    [path] = saved(project)
    path.write_text(content)
    result = run(project, "--energy-compare=base")
    assert_one_line_usage_error(result, str(path.relative_to(project.path)), needle)


def test_bad_gate_and_name_are_one_line_errors(project: pytest.Pytester) -> None:
    assert_one_line_usage_error(
        run(project, "--energy-compare-fail=speed:5%"),
        "--energy-compare-fail",
        "unknown figure 'speed'",
    )
    assert_one_line_usage_error(run(project, "--energy-save=a/b"), "bad run name 'a/b'")
    assert_one_line_usage_error(
        run(project, "--energy-columns=energy_j,nope"), "unknown figure 'nope'"
    )


def test_table_options(project: pytest.Pytester) -> None:
    result = run(
        project,
        "--energy-columns=tokens_in,j_per_token,power_w",
        "--energy-group-by=none",
        "--energy-sort=-tokens_in",
    )
    result.stdout.re_match_lines(
        [
            r"^all cases$",
            r"^\s*in\s+J/token\s+avg W$",
            r"^\s*64\s+\S+\s+200$",
            r"^\s+8\s+\S+\s+200$",
        ]
    )


def test_concurrent_sessions_saving_to_one_storage_lose_nothing(project: pytest.Pytester) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--energy-backend=trace"]
    procs = [
        subprocess.Popen(
            [*args, f"--energy-save=run{i}"],
            cwd=project.path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    paths = saved(project)
    assert sorted(p.name[:4] for p in paths) == ["0001", "0002"]
    assert sorted(p.name[5:] for p in paths) == ["run0.json", "run1.json"]
    for path in paths:
        data = json.loads(path.read_text())
        assert data["run"]["status"] == "complete" and len(data["cases"]) == 2


def test_nothing_measured_nothing_saved(project: pytest.Pytester) -> None:
    result = run(project, "--energy-save=empty", "-k", "no_such_test")
    result.stdout.fnmatch_lines(["llmenergy: no energy benchmark case ran; no run saved"])
    assert saved(project) == []


def test_a_baseline_from_other_hardware_is_named(project: pytest.Pytester) -> None:
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    [path] = saved(project)
    other = project.path / "elsewhere.json"
    data = json.loads(path.read_text())
    data["run"]["hardware"] = "apple-m1-pro__no-gpu__powermetrics"
    other.write_text(json.dumps(data))
    result = run(project, f"--energy-compare={other}")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "llmenergy: the baseline ran on other hardware: apple-m1-pro__no-gpu__powermetrics",
            "this run (current) against elsewhere (baseline)",
        ]
    )


def test_a_baseline_from_other_hardware_gets_a_routing_section(
    project: pytest.Pytester,
) -> None:
    """The baseline halves the joules at 8 tokens and doubles them at 64: it should take
    the small queries, up to where the power law through 1 J and 4 J crosses 2 J (~22)."""
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    [path] = saved(project)
    data = json.loads(path.read_text())
    data["run"]["hardware"] = "apple-m1-pro__no-gpu__powermetrics"
    for case in data["cases"]:
        scale = 0.5 if case["input_tokens"] == 8 else 2.0
        for trial in case["trials"]:
            trial["joules"] = 200.0 * 0.01 * scale
            trial["seconds"] = 0.01
    (project.path / "elsewhere.json").write_text(json.dumps(data))
    (project.path / "queries.csv").write_text(
        "input_tokens,output_tokens\n" + "".join(f"{n},4\n" for n in range(1, 101))
    )
    result = run(
        project,
        "--energy-compare=elsewhere.json",
        "--energy-route-workload=queries.csv",
        "--energy-plots=figs",
    )
    assert result.ret == 0
    result.stdout.re_match_lines(
        [
            r"^=+ llmenergy: routing between this run's and the baseline's hardware =+$",
            r"^routing test_cases.py::test_case: by input, lambda 1 \(energy only\), workload "
            r"queries.csv "
            r"\(100 queries\)$",
            r"^apple-m1-pro__no-gpu__powermetrics\s+0\.\.(\d+)\s+",
            r"^.*__no-gpu__trace\s+\d+ and more\s+",
            r"^llmenergy: \d+ figure\(s\) written to figs$",
        ]
    )
    line = next(x for x in result.outlines if x.startswith("apple-m1-pro__no-gpu__powermetrics"))
    threshold = int(line.split()[1].split("..")[1])
    assert 18 <= threshold <= 27
    figures = {p.name for p in (project.path / "figs").iterdir()}
    assert any(f.endswith("test-case-pareto.png") for f in figures), figures
    assert any(f.endswith("test-case-workload-vs-threshold.png") for f in figures), figures


def test_plots_without_matplotlib_stop_the_session_at_start(
    project: pytest.Pytester,
) -> None:
    project.makeconftest(TRACE_METER + "\nimport sys\nsys.modules['matplotlib'] = None\n")
    result = run(project, "--energy-plots=figs")
    assert_one_line_usage_error(result, "--energy-plots", "matplotlib is not installed")


def test_a_bad_route_workload_stops_the_session_at_start(project: pytest.Pytester) -> None:
    (project.path / "bad.csv").write_text("input_tokens,output_tokens\n1,2\n3\n")
    result = run(project, "--energy-route-workload=bad.csv")
    assert_one_line_usage_error(result, "--energy-route-workload", "bad.csv:3")


# -- output targets: checked before anything runs, never over what the store owns -----------
def store_listing(p: pytest.Pytester) -> list[str]:
    """Everything in the storage folder, dot files (claim markers, temp files) too."""
    root = p.path / ".llmenergy"
    return sorted(str(f.relative_to(root)) for f in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize(
    "option", ["--energy-report={}", "--energy-export=csv:{}", "--energy-json={}"]
)
def test_no_output_option_replaces_a_saved_run(project: pytest.Pytester, option: str) -> None:
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    [path] = saved(project)
    before, listing = path.read_bytes(), store_listing(project)
    inside = str(path.relative_to(project.path))
    result = run(project, option.format(inside), "--energy-save=next")
    assert_one_line_usage_error(result, option.format(inside), "belongs to the store")
    result.stdout.no_fnmatch_line("*passed*")  # stopped before anything was measured
    # a copy of a run outside the storage folder is a saved run too (for derived files);
    # --energy-json never replaces any file
    copy = project.path / "kept.json"
    copy.write_bytes(before)
    result = run(project, option.format("kept.json"), "--energy-save=next")
    needle = "already exists" if "json" in option else "kept.json is a saved run"
    assert_one_line_usage_error(result, option.format("kept.json"), needle)
    assert path.read_bytes() == before and copy.read_bytes() == before
    assert store_listing(project) == listing  # no run number used up, no temp file


def test_an_output_in_a_hardware_folder_is_refused_even_under_a_new_name(
    project: pytest.Pytester,
) -> None:
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    folder = saved(project)[0].parent.relative_to(project.path)
    result = run(project, f"--energy-report={folder}/report.html")
    assert_one_line_usage_error(result, "--energy-report=", "report.html: inside", str(folder))
    result = run(project, "--energy-report=.llmenergy/report.html")  # the root is not a run's
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        ("--energy-json={long}.json", "is too long for a file (at most 255)"),
        ("--energy-report={long}.html", "is too long for a file (at most 255)"),
        ("--energy-export=csv:{long}.csv", "is too long for a file (at most 255)"),
        ("--energy-plots={long}", "is too long for a file (at most 255)"),
        ("--energy-compare={long}", "names no file"),
        ("--energy-save={long}", "at most 200, as it becomes a file name"),
        ("--energy-json=/proc/run.json", "cannot create files in /proc"),
        ("--energy-export=csv:/proc/cases.csv", "cannot create files in /proc"),
    ],
)
def test_bad_output_paths_stop_the_session_at_start(
    project: pytest.Pytester, option: str, needle: str
) -> None:
    """Long names and unwritable folders: one line naming the option, before anything is
    measured, and no run number used up."""
    if needle.startswith("cannot create") and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    given = option.format(long="a" * 300)
    saving = [] if given.startswith("--energy-save=") else ["--energy-save=s"]
    result = run(project, *saving, given)
    assert_one_line_usage_error(result, given.split("=", 1)[0] + "=", needle)
    result.stdout.no_fnmatch_line("*passed*")
    assert store_listing(project) == []


def test_two_sessions_given_one_json_path_keep_both(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both sessions find the path free at start; the one that writes second keeps its
    run beside the other's and says where, once."""
    monkeypatch.setenv("COLUMNS", "300")  # the summary's lines unwrapped
    project.makeconftest(
        TRACE_METER
        + "\ndef pytest_sessionstart(session):  # the other session writes first\n"
        + "    open('shared.json', 'x').write('the other run')\n"
    )
    result = run(project, "--energy-json=shared.json")
    result.assert_outcomes(passed=2)
    assert (project.path / "shared.json").read_text() == "the other run"
    assert len(json.loads((project.path / "shared-2.json").read_text())["cases"]) == 2
    lines = [line for line in result.stdout.lines if "shared.json" in line]
    assert lines == [
        "llmenergy: saving this run to shared.json",
        "llmenergy: saved 2 case(s) to shared-2.json (shared.json was taken meanwhile, by "
        "another session?)",
    ]


def test_two_outputs_of_one_session_never_share_a_path(project: pytest.Pytester) -> None:
    """An export at the end would replace the run's own JSON: refused at start."""
    result = run(project, "--energy-json=run.json", "--energy-export=csv:./run.json")
    assert_one_line_usage_error(
        result, "--energy-export=csv:run.json: --energy-json=run.json writes there too"
    )
    assert not (project.path / "run.json").exists()


def test_a_baseline_saved_three_times_in_a_git_project_teaches_the_gate(
    project: pytest.Pytester,
) -> None:
    # the gating guide's advice, in a project of one's own: the runs the first session
    # saved into the work tree must not make the next sessions' code "uncommitted"
    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=project.path, check=True, capture_output=True)

    (project.path / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    git("init", "--quiet")
    git("add", ".")
    git("-c", "user.name=u", "-c", "user.email=u@example.org", "commit", "--quiet", "-m", "1")
    for sleeps in ("0.010,0.011,0.010", "0.011,0.010,0.011", "0.010,0.010,0.011"):
        run(project, "--energy-save=baseline", sleeps=sleeps).assert_outcomes(passed=2)
    commits = [json.loads(p.read_text())["commit"] for p in saved(project)]
    assert [c["dirty"] for c in commits] == [False, False, False]
    result = run(project, "--energy-compare=baseline", "--energy-compare-fail=j_per_token:50%")
    result.stdout.fnmatch_lines(["*between-session noise*saved runs of the same code*"])
