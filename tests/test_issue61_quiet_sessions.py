"""A session that measures nothing costs nothing and says nothing (issue 61, items 11-12).

Installed in an environment, the plugin is in every pytest session.  It printed its header
in each, opened the meter in each, and put six ``energy_*`` keys into every pytest-benchmark
test's ``extra_info``; its test-only options stood beside the user's in ``--help``.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import NESTED_ADDOPTS
from tests.test_plugin import TRACE_CONFTEST  # a 200 W meter registered as "trace"
from tests.test_plugin_keep import REPO

# A conftest that says, in a file, whether the meter was opened (the backends are asked
# for only then) and which of the plugin's features are registered at the end.
OBSERVED = """
import json
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace

def pytest_llmenergy_meters(config):
    with open("opened.txt", "a") as f:
        f.write("opened\\n")
    return {"trace": lambda options: TraceMeter({"gpu:0": PowerTrace([(3600, 200.0)])})}

def pytest_unconfigure(config):
    names = sorted(
        name for name, _ in config.pluginmanager.list_name_plugin()
        if str(name).startswith("llmenergy-")
    )
    with open("registered.json", "w") as f:
        json.dump(names, f)
"""

PLAIN = "def test_plain():\n    assert 1 + 1 == 2\n"

ENERGY = """
import time

def test_plain():
    pass

def test_energy(energy_benchmark):
    energy_benchmark(time.sleep, 0.001, input_tokens=1, output_tokens=1)
"""

QUICK_INI = """
[pytest]
llmenergy_backend = trace
llmenergy_max_trials = 3
llmenergy_min_trials = 3
llmenergy_max_background = off
"""


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Sessions with none of the plugin's options on their command line: the suite's
    ``--energy-max-background=off`` in PYTEST_ADDOPTS (tests/conftest.py) is one, so the
    ini files here say it instead."""
    monkeypatch.setenv("PYTEST_ADDOPTS", NESTED_ADDOPTS)
    return pytester


def _ours(result: pytest.RunResult) -> list[str]:
    """Every line of the plugin's: its prefix, or one of its sections' titles."""
    return [line for line in result.outlines if "llmenergy" in line]


def test_a_session_that_measures_nothing_says_nothing_and_opens_no_meter(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(OBSERVED)
    pytester.makepyfile(test_a=PLAIN)
    for verbosity in ((), ("-v",)):
        result = pytester.runpytest(*verbosity, "-p", "no:benchmark")
        result.assert_outcomes(passed=1)
        assert [line for line in _ours(result) if "plugins:" not in line] == []
    assert not (pytester.path / "opened.txt").exists()  # the meter was never opened
    # after collection, only what gives back at unconfigure what it took at configure stays
    # (the SIGTERM handler; with pytest-xdist installed, its lock's folder): nothing runs
    kept = set(json.loads((pytester.path / "registered.json").read_text()))
    assert kept <= {"llmenergy-sigterm", "llmenergy-xdist"} and "llmenergy-sigterm" in kept


def test_ini_settings_of_how_to_measure_do_not_make_a_session_measure(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(OBSERVED)
    pytester.makeini(QUICK_INI)
    pytester.makepyfile(test_a=PLAIN)
    result = pytester.runpytest("-p", "no:benchmark")
    result.assert_outcomes(passed=1)
    assert [line for line in _ours(result) if "plugins:" not in line] == []
    assert not (pytester.path / "opened.txt").exists()


def test_a_test_using_the_fixtures_makes_the_session_measure_from_collection(
    pytester: pytest.Pytester,
) -> None:
    """The header follows pytest's collection line, and the tables come at the end."""
    pytester.makeconftest(OBSERVED)
    pytester.makeini(QUICK_INI)
    pytester.makepyfile(test_e=ENERGY)
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["collected 2 items", "llmenergy: backend trace -> *", "*llmenergy: energy per token*"]
    )
    assert result.stdout.str().count("llmenergy: backend trace") == 1  # once, not again
    assert (pytester.path / "opened.txt").read_text().count("opened") == 1
    quiet = pytester.runpytest("-p", "no:benchmark", "-q")
    quiet.stdout.no_fnmatch_line("llmenergy: backend*")
    quiet.stdout.fnmatch_lines(["*llmenergy: energy per token*"])


def test_the_marker_alone_makes_the_session_measure(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(OBSERVED)
    pytester.makeini(QUICK_INI)
    pytester.makepyfile(
        test_m="import pytest\n\n@pytest.mark.llmenergy()\ndef test_m():\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:benchmark")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["collected 1 item", "llmenergy: backend trace -> *"])


def test_an_option_on_the_command_line_makes_it_measure_from_the_start(
    pytester: pytest.Pytester,
) -> None:
    """As before: the header in pytest's header, above the collection line."""
    pytester.makeconftest(OBSERVED)
    pytester.makepyfile(test_a=PLAIN)
    result = pytester.runpytest("--energy-backend=trace", "-p", "no:benchmark")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmenergy: backend trace -> *", "collected 1 item"])
    assert (pytester.path / "opened.txt").exists()
    # -q hides pytest's header, and with it the plugin's, here as in a later session
    quiet = pytester.runpytest("--energy-backend=trace", "-p", "no:benchmark", "-q")
    quiet.stdout.no_fnmatch_line("llmenergy: backend*")


def test_an_ini_setting_that_acts_alone_makes_it_measure_from_the_start(
    pytester: pytest.Pytester,
) -> None:
    """A run to keep is kept (or said not kept) whether a test measures or not."""
    pytester.makeconftest(OBSERVED)
    pytester.makeini(QUICK_INI + "llmenergy_json = out.json\n")
    pytester.makepyfile(test_a=PLAIN)
    result = pytester.runpytest("-p", "no:benchmark")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmenergy: backend trace -> *", "collected 1 item"])


def test_the_meter_asked_for_by_name_makes_it_measure_and_say_so(
    pytester: pytest.Pytester,
) -> None:
    """Collection cannot see ``request.getfixturevalue``: the meter opens then, and the
    header opens the terminal summary."""
    pytester.makeconftest(OBSERVED)
    pytester.makeini(QUICK_INI)
    pytester.makepyfile(
        test_n="""
def test_by_name(request):
    meter = request.getfixturevalue("energy_meter")
    with meter.measure() as m:
        pass
    assert m.seconds >= 0
"""
    )
    result = pytester.runpytest("-p", "no:benchmark")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["collected 1 item", "*", "llmenergy: backend trace -> *"])


# -- pytest-benchmark's extra_info ---------------------------------------------------------
BENCHMARKED = """
import time

def test_sleep(benchmark):
    benchmark.extra_info["mine"] = 1
    benchmark.pedantic(time.sleep, args=(0.001,), rounds=3, iterations=1)
"""


def _extra_info(pytester: pytest.Pytester, *args: str) -> dict[str, object]:
    result = pytester.runpytest("--benchmark-json=out.json", *args)
    result.assert_outcomes(passed=1)
    [bench] = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    return bench["extra_info"]


@pytest.fixture
def benchmarked(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytest.importorskip("pytest_benchmark")
    # run under xdist, pytest-benchmark would take the inner session for a worker too
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(test_b=BENCHMARKED)
    return pytester


def test_a_plain_pytest_benchmark_session_leaves_extra_info_as_its_tests_wrote_it(
    benchmarked: pytest.Pytester,
) -> None:
    assert _extra_info(benchmarked) == {"mine": 1}


def test_extra_info_off_leaves_it_alone_in_a_measuring_session(
    benchmarked: pytest.Pytester,
) -> None:
    info = _extra_info(benchmarked, "--energy-backend=trace", "--energy-benchmark-extra-info=off")
    assert info == {"mine": 1}


def test_extra_info_in_a_measuring_session_and_where_the_ini_asks(
    benchmarked: pytest.Pytester,
) -> None:
    info = _extra_info(benchmarked, "--energy-backend=trace")
    assert info["mine"] == 1 and info["energy_meter"] == "trace"
    benchmarked.makeini(
        "[pytest]\nllmenergy_backend = trace\nllmenergy_benchmark_extra_info = on\n"
    )
    info = _extra_info(benchmarked)  # no option given: the ini's "on" makes it measure
    assert info["energy_meter"] == "trace" and info["energy_power_w"] == pytest.approx(200.0)


# -- --help ----------------------------------------------------------------------------------
def test_the_deliberate_faults_have_their_own_help_group(pytester: pytest.Pytester) -> None:
    lines = pytester.runpytest("--help").stdout.lines
    title = next(i for i, line in enumerate(lines) if line.startswith("pytest-llmenergy:"))
    assert "for testing" in lines[title]
    main = next(i for i, line in enumerate(lines) if line.startswith("LLM energy measurement"))
    flags = {
        i: m.group(1)
        for i, line in enumerate(lines)
        if (m := re.match(r"^\s+(--llm-inject-[a-z-]+)", line))
    }
    assert sorted(flags.values()) == ["--llm-inject-regression", "--llm-inject-work"]
    assert all(i > title for i in flags), "listed among the options that measure"
    # the group of the options that measure holds none of them
    assert not any(main < i < title for i in flags) and main < title


# -- pytest-xdist ----------------------------------------------------------------------------
def test_under_xdist_a_quiet_session_stays_quiet_and_a_measuring_one_measures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller collects nothing: it hands the workers the case order's seed and
    the meter's lock all the same, and hears of measuring from the first case."""
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makeini(QUICK_INI)
    pytester.makepyfile(test_a=PLAIN)
    quiet = pytester.runpytest_subprocess("-n", "2", "-p", "no:benchmark")
    quiet.assert_outcomes(passed=1)
    assert [line for line in _ours(quiet) if "plugins:" not in line] == []
    pytester.makepyfile(
        test_e=ENERGY.replace(
            "def test_energy(",
            "import pytest\n\n@pytest.mark.parametrize('n', [1, 2, 3, 4])\ndef test_energy(n, ",
        )
    )
    measured = pytester.runpytest_subprocess("-n", "2", "-p", "no:benchmark")
    measured.assert_outcomes(passed=6)
    measured.stdout.no_fnmatch_line("*Different tests were collected*")
    assert measured.stdout.str().count("llmenergy: energy per token") == 1
    measured.stdout.fnmatch_lines(["llmenergy: backend trace -> *", "*energy per token*"])


# -- what pytest's start imports --------------------------------------------------------------
HEAVY = ("torch", "transformers", "accelerate", "numpy", "pynvml", "matplotlib")


def test_pytest_s_start_imports_no_heavy_library() -> None:
    """Every pytest session imports the plugin: its options, hooks and fixtures, never
    the libraries of what a measuring session does (models, arrays, GPUs, figures)."""
    import subprocess
    import sys

    code = (
        "import sys, pytest_llmenergy.plugin; "
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.split() == []
