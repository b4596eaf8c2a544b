"""The plugin as users run it: options, ini twins, bad input, fixtures, hooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmenergy.plugin.options import OPTIONS
from tests.fakes.powercap import FakePowercap, FakeZone
from tests.fakes.trace import PowerTrace

TRACE_CONFTEST = """
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace
def pytest_llmenergy_meters(config):
    return {"trace": lambda options: TraceMeter({"gpu:0": PowerTrace([(3600, 200.0)])})}
"""


def assert_one_line_usage_error(result: pytest.RunResult, *needles: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = [line for line in result.stderr.lines if line.strip()]
    # one line, wrapped to the terminal: its continuations indented (issue 61)
    assert err and all(line.startswith(" ") for line in err[1:]), result.stderr.str()
    assert err[0].startswith("ERROR: ")
    said = " ".join(line.strip() for line in err)
    for needle in needles:
        assert needle in said
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_unknown_backend_stops_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--energy-backend=bogus")
    assert_one_line_usage_error(result, "--energy-backend=bogus", "unknown backend", "estimate")
    result.stdout.no_fnmatch_line("*1 passed*")


def test_nvml_without_a_driver_stops_the_session_at_start(pytester: pytest.Pytester) -> None:
    """The real nvidia-ml-py on a machine with no NVIDIA driver, in a fresh process."""
    pytester.makepyfile("def test_x(energy_meter): pass")
    result = pytester.runpytest_subprocess("--energy-backend=nvml")
    assert_one_line_usage_error(result, "--energy-backend=nvml")
    assert "collected" not in result.stdout.str()  # stopped before collecting anything


def test_rapl_without_powercap_stops_the_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMENERGY_POWERCAP_ROOT", str(tmp_path / "none"))
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--energy-backend=rapl")
    assert_one_line_usage_error(result, "--energy-backend=rapl", "no RAPL zones")


@pytest.mark.parametrize(
    ("arg", "needle"),
    [
        ("--energy-gpus=zero", "comma-separated GPU indices"),
        ("--energy-gpus=-1", "comma-separated GPU indices"),
        ("--energy-sample-interval=-1", "expected seconds > 0"),
        ("--energy-sample-interval=fast", "expected seconds > 0"),
        ("--energy-idle=soon", "seconds >= 0"),
        ("--energy-cpu-tdp=0", "expected watts > 0"),
    ],
)
def test_bad_option_values_are_one_line_errors(
    pytester: pytest.Pytester, arg: str, needle: str
) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(arg)
    assert_one_line_usage_error(result, arg, needle)


def test_ini_twin_is_read_and_the_command_line_wins(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nllmenergy_backend = bogus-from-ini\n")
    pytester.makepyfile("def test_x(): pass")
    assert_one_line_usage_error(pytester.runpytest(), "--energy-backend=bogus-from-ini")
    pytester.makeini("[pytest]\nllmenergy_cpu_tdp = -5\n")
    assert_one_line_usage_error(pytester.runpytest(), "llmenergy_cpu_tdp = -5 (ini)")
    pytester.makeini("[pytest]\nllmenergy_backend = bogus-from-ini\n")
    result = pytester.runpytest("--energy-backend=estimate")
    result.assert_outcomes(passed=1)


def test_every_option_has_an_ini_twin_in_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    out = result.stdout.str()
    assert len(OPTIONS) >= 19
    for option in OPTIONS:
        assert option.flag in out and f"{option.ini} (" in out  # the ini list's entry
        assert option.ini.startswith("llmenergy_")


def test_energy_meter_fixture_measures_a_user_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "powercap"
    pkg = FakeZone("package-0", PowerTrace([(3600, 65.0)]))
    dram = FakeZone("dram", PowerTrace([(3600, 4.0)]))
    fake = FakePowercap(root, {0: (pkg, [dram])})
    monkeypatch.setenv("LLMENERGY_POWERCAP_ROOT", str(root))
    pytester.makepyfile(
        """
        import time

        def test_measure(energy_meter):
            with energy_meter.measure() as m:
                time.sleep(0.2)
            assert set(m.by_domain) == {"cpu:package-0", "cpu:dram-0", "cpu:process"}
            assert m.methods["cpu:process"] == "attributed"  # beside the totals
            assert m.methods["cpu:package-0"] == "counter"
            print(f"MEASURED {m.joules!r} {m.seconds!r}")
        """
    )
    with fake:
        result = pytester.runpytest("--energy-backend=rapl", "-v", "-s")
    result.assert_outcomes(passed=1)
    joules, seconds = (float(x) for x in result.stdout.str().split("MEASURED ")[1].split()[:2])
    # the fake counters move in steps of the writer thread's gaps, at each window edge
    resolution_j = 2 * 69.0 * fake.max_gap_s + 1e-5
    assert abs(joules - 69.0 * seconds) <= resolution_j
    result.stdout.fnmatch_lines(["llmenergy: backend rapl -> rapl: cpu:package-0 (counter)*"])


def test_hook_registers_a_meter_and_idle_gives_net_energy(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(
        """
        import time

        def test_net(energy_meter):
            assert energy_meter.idle_power_w == {"gpu:0": 200.0} or \\
                abs(energy_meter.idle_power_w["gpu:0"] - 200.0) < 1e-6
            with energy_meter.measure() as m:
                time.sleep(0.05)
            assert abs(m.joules - 200.0 * m.seconds) < 1e-6
            assert abs(m.net_joules) < 1e-6  # all of it was idle power
        """
    )
    result = pytester.runpytest("--energy-backend=trace", "--energy-idle=0.1", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmenergy: idle power over 0.1 s: gpu:0 200.00 W"])


def test_hook_cannot_replace_a_builtin_backend(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_llmenergy_meters(config):\n    return {'nvml': lambda options: None}\n"
    )
    pytester.makepyfile("def test_x(): pass")
    assert_one_line_usage_error(pytester.runpytest(), "'nvml'", "built in")


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:llmenergy", "--energy-backend=bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # the option no longer exists
    assert "unrecognized arguments" in result.stderr.str()


REJECTING_TEST = """
import time
from pytest_llmenergy.errors import TrialRejected

calls = {"n": 0}

def test_every_third_run_is_off(energy_benchmark):
    def run():
        calls["n"] += 1
        time.sleep(0.01)
        if calls["n"] % 3 == 0:  # the warm-up is run 1
            raise TrialRejected(f"run {calls['n']} generated 9 tokens, not 8")
    energy_benchmark(run, input_tokens=4, output_tokens=8)

def test_never_right(energy_benchmark):
    def run():
        raise TrialRejected("the server counted 5 output tokens, not 8")
    energy_benchmark(run, input_tokens=4, output_tokens=8)
"""


def test_a_rejected_trial_is_kept_left_out_and_repeated(pytester: pytest.Pytester) -> None:
    """A target that raises TrialRejected in a trial: that trial is kept with its reason,
    left out of the figures, repeated within the limit; a case never done fails."""
    import json

    pytester.makepyfile(test_rejecting=REJECTING_TEST)
    result = pytester.runpytest(
        "-p",
        "no:randomly",
        "--energy-shuffle=off",
        "--energy-backend=estimate",
        "--energy-min-trials=6",
        "--energy-max-trials=6",
        "--energy-min-time=0",  # one call a trial: no window of calls to reach a minimum
        "--energy-json=run.json",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*4 ✗ +2x*",
            "*+Nx: N more trials were rejected*",
            "*test_never_right*every trial (6) was rejected; the first: the server counted 5*",
        ]
    )
    run = json.loads((pytester.path / "run.json").read_text())
    first, never = run["cases"]
    assert len(first["trials"]) == 4
    assert [t["rejected"] for t in first["disturbed_trials"]] == [
        "run 3 generated 9 tokens, not 8",
        "run 6 generated 9 tokens, not 8",
    ]
    assert never["trials"] == [] and len(never["disturbed_trials"]) == 6


def test_a_fast_function_is_grouped_into_windows_that_reach_the_minimum_time(
    pytester: pytest.Pytester,
) -> None:
    """Issue 61: a 2 ms function, one call a trial, stopped at the trial limit with
    0.05 s measured against the 1 s minimum; its calls are now grouped into windows of
    1/12 s, so it reaches the minimum within the limit, each trial's figures per call."""
    import json

    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(
        """
        import time

        def test_fast(energy_benchmark):
            energy_benchmark(time.sleep, 0.002, input_tokens=8, output_tokens=4)
        """
    )
    result = pytester.runpytest(
        "--energy-backend=trace", "--energy-max-background=off", "--energy-json=run.json"
    )
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*would measure it*")
    [case] = json.loads((pytester.path / "run.json").read_text())["cases"]
    trials = case["trials"]
    assert len(trials) <= 25 and case["status"] == "converged"
    assert sum(t["seconds"] * t["passes"] for t in trials) >= 1.0
    assert all(t["passes"] >= 20 for t in trials)  # 1/12 s of 2 ms calls
    assert all(0.002 <= t["seconds"] < 0.004 for t in trials)  # per call


def test_a_short_case_says_it_stopped_before_its_minimum_time(pytester: pytest.Pytester) -> None:
    # loose targets hold at once; a call of a microsecond fills no window of calls (at
    # most 10,000 of them), so 10 trials measure far below the 1 s minimum
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(
        """
        def test_quick(energy_benchmark):
            energy_benchmark(int, input_tokens=8, output_tokens=4)
        """
    )
    result = pytester.runpytest(
        "--energy-backend=trace",
        "--energy-max-background=off",
        "--energy-ci-target=time_s:90%,energy_j:90%",
        "--energy-max-trials=10",
    )
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines(
        [
            r"^test_quick\s+8\s+4\s+10 \u2713<\s",
            r"^\u2713<: the CI targets held, but the case stopped at the trial limit with less ",
            r"^test_quick: stopped at the trial limit with 0\.\d+ s measured, below the "
            r"1 s minimum; --energy-max-trials=\d+ would measure it$",
        ]
    )


def test_the_legend_under_the_tables_fits_a_100_column_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46: at COLUMNS=100 the legend's ``✓<`` line was 100 characters and filled the
    terminal's last column (a terminal that wraps there shows a line and an empty one).
    What the session writes under its tables stops short of it, wrapped, indented."""
    monkeypatch.setenv("COLUMNS", "100")
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(
        """
        def test_quick(energy_benchmark):
            energy_benchmark(int, input_tokens=8, output_tokens=4)
        """
    )
    result = pytester.runpytest(
        "--energy-backend=trace",
        "--energy-max-background=off",
        "--energy-ci-target=time_s:90%,energy_j:90%",
        "--energy-max-trials=10",
    )
    result.assert_outcomes(passed=1)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("s \u00b1 CI, J \u00b1 CI"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("="))
    under = lines[start:end]  # the legend and the notes
    assert any(line.startswith("\u2713<: the CI targets held") for line in under), under
    assert all(len(line) < 100 for line in under), "\n".join(under)
    starts = ("  ", "s ", "trials:", "\u2713<:", "test_quick:", "columns left out")
    assert all(line.startswith(starts) for line in under), under
