"""docs/exit-codes.md's table, row by row: each row is run here the way a user runs it, so
the table and the code cannot drift apart.  A row without a scenario, or a scenario
without its row, fails; so does a command whose help promises an exit 1 the table lacks."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_llmenergy.cli import _parser, main
from tests.casefactory import make_case
from tests.fakes.signals import ctrl_c_reaches_it
from tests.test_cli import logical, save
from tests.test_plugin import assert_one_line_usage_error
from tests.test_plugin_keep import run

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "exit-codes.md"


def table_rows() -> list[tuple[str, int]]:
    """(command, exit code) of every row of the page's table."""
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \|", PAGE.read_text(), re.M)
    return [(command, int(code)) for command, code in rows]


# -- pytest sessions with the plugin ------------------------------------------------------
def _pytest_ok(project: pytest.Pytester, tmp_path: Path) -> None:
    run(project, "--energy-save=base").assert_outcomes(passed=2)
    result = run(project, "--energy-compare=base", "--energy-compare-fail=j_per_token:5000%")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmenergy: energy gate passed (j_per_token:5000%)*"])


def _pytest_failed(project: pytest.Pytester, tmp_path: Path) -> None:
    run(project, "--energy-save=base", sleeps="0.01,0.01,0.01,0.01").assert_outcomes(passed=2)
    result = run(project, "--energy-compare-fail=j_per_token:5%", sleeps="0.02,0.02,0.02,0.02")
    assert result.ret == 1
    result.assert_outcomes(passed=2)  # the tests passed: the gate is what failed
    # the last lines a user reads say so: pytest's red line, then its outcome counts
    last = [line for line in result.stdout.lines if line.strip()][-2:]
    assert re.fullmatch(
        r"!+ llmenergy: energy gate FAILED \(j_per_token:5%\): 2 case\(s\) significantly "
        r"worse !+",
        last[0],
    ), last
    assert re.fullmatch(r"=+ 2 passed, 1 energy gate failed in [\d.]+s =+", last[1]), last
    # an export that cannot be written: exit 1, and the last line says that too
    # (a folder there at start is refused at once, exit 4: it becomes one meanwhile)
    project.makeconftest(
        (project.path / "conftest.py").read_text()
        + "\n\nimport pytest, pathlib\n\n\n@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_sessionfinish(session):\n    pathlib.Path('out.csv').mkdir()\n"
    )
    result = run(project, "--energy-export=csv:out.csv")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*could not export csv to out.csv*", "*1 file not written*"])
    (project.path / "out.csv").rmdir()
    assert run(project, "--energy-export=csv:a-folder-that-is/x.csv").ret == 4
    # a failing test is pytest's own 1
    project.makepyfile(test_fails="def test_fails(): assert False")
    assert run(project).ret == 1


def _pytest_interrupted(project: pytest.Pytester, tmp_path: Path) -> None:
    project.makepyfile(test_zz_interrupt="def test_interrupt(): raise KeyboardInterrupt")
    result = project.runpytest_subprocess(  # a real interrupt ends the process
        "--energy-backend=trace", "--energy-shuffle=off", "--energy-save=cut", "-p", "no:randomly"
    )
    assert result.ret == 2
    [path] = (project.path / ".llmenergy").glob("*/*.json")
    assert '"status": "interrupted"' in path.read_text()


def _pytest_usage(project: pytest.Pytester, tmp_path: Path) -> None:
    assert_one_line_usage_error(run(project, "--energy-max-trials=0"), "--energy-max-trials")
    assert_one_line_usage_error(run(project, "--energy-compare=nosuch"), "no saved run")


def _pytest_nothing(project: pytest.Pytester, tmp_path: Path) -> None:
    assert run(project, "-k", "nothing_matches").ret == 5


# -- the llmenergy command ----------------------------------------------------------------
def _two_runs(tmp_path: Path, slower: float) -> Path:
    root = tmp_path / ".llmenergy"
    times = [0.100, 0.101, 0.099, 0.100, 0.102, 0.098]
    save(root, [make_case(times), make_case(times, input_tokens=64)], name="base")
    worse = [t * slower for t in times]
    save(root, [make_case(worse), make_case(worse, input_tokens=64)], name="head")
    return root


def _cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


GATE = ("--session-noise", "1%")


def _compare_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _two_runs(tmp_path, slower=1.5)
    code, out, _ = _cli(capsys, "--storage", root, "compare", "base", "head", "--fail-on",
                        "j_per_token:5%", *GATE)  # fmt: skip
    assert code == 1 and "energy gate FAILED (j_per_token:5%)" in out
    code, _, _ = _cli(capsys, "--storage", root, "compare", "base", "head")
    assert code == 0  # shown, not gated


def _compare_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / ".llmenergy"
    times = [0.100, 0.101, 0.099]
    for name, meter in (("base", "rapl"), ("head", "estimate")):  # energies not comparable
        save(root, [make_case(times)], name=name, meter={"identity": {"meter": meter}})
    argv = ("--storage", root, "compare", "base", "head", "--fail-on", "j_per_token:5%")
    code, out, _ = _cli(capsys, *argv)
    assert code == 0 and "not gated: " in out
    assert _cli(capsys, *argv, "--strict")[0] == 1


def _report_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _two_runs(tmp_path, slower=1.5)
    page = tmp_path / "report.html"
    argv = ("--storage", root, "report", "base", "head", "--out", page)
    code, out, _ = _cli(capsys, *argv, "--gate", "j_per_token:5%", *GATE)
    assert code == 1 and page.is_file()  # written all the same
    assert out.splitlines()[0].startswith(f"wrote {page} (2 runs, 2 cases, ")
    assert "head: energy gate FAILED (j_per_token:5%)" in out
    assert _cli(capsys, *argv)[0] == 0


def _commands_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _two_runs(tmp_path, slower=1.001)  # two sessions: merge pools distinct runs
    storage = ("--storage", root)
    for argv in (
        ("list",),
        ("show", "base"),
        ("compare", "base", "head", "--fail-on", "j_per_token:5%", *GATE),
        ("report", "base", "head", "--out", tmp_path / "r.html", "--gate", "j_per_token:5%"),
        ("merge", "base", "head", "--out", tmp_path / "pooled.json"),
        ("export", "base", "--format", "csv"),
        ("metrics",),
    ):
        code, _, err = _cli(capsys, *storage, *argv)
        assert (code, err) == (0, ""), argv


def _commands_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _two_runs(tmp_path, slower=1.0)
    code, out, err = _cli(capsys, "--storage", root, "show", "nosuch")
    assert (code, out) == (2, "") and err.startswith("llmenergy: error: no saved run 'nosuch'")
    assert len(logical(err)) == 1  # one line, wrapped to the terminal
    code, _, err = _cli(capsys, "--storage", root, "merge", "1", "2", "--out", root.parent)
    assert code == 2 and len(logical(err)) == 1
    for name in _leaf_commands(_parser()):  # every command: an unknown flag is argparse's 2
        with pytest.raises(SystemExit) as stop:
            main([*name, "--no-such-flag"])
        assert stop.value.code == 2, name
        assert "error: " in capsys.readouterr().err.splitlines()[-1]  # argparse's one line


def _ab_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_pairing import COMMON, _ab, _project

    base = _project(tmp_path, "base")
    head = _project(tmp_path, "head", extra="\nSLOWER = 0.3\n")
    done = _ab(tmp_path, str(base), str(head), "--gate", "j_per_token:5%", *COMMON)
    assert done.returncode == 1, done.stderr
    assert "energy gate FAILED (j_per_token:5%)" in done.stdout
    unchanged = _ab(tmp_path, str(base), str(base), *COMMON)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr


def _ab_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_pairing import COMMON, _ab, _project

    base = _project(tmp_path, "base")
    extra = (
        "\n\ndef test_new(energy_benchmark):\n"
        "    energy_benchmark(work, 0.01, input_tokens=1, output_tokens=8)\n"
    )
    head = _project(tmp_path, "head", extra=extra)
    assert _ab(tmp_path, str(base), str(head), "--strict", *COMMON).returncode == 1


def _ab_side_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_pairing import COMMON, _ab, _project

    base = _project(tmp_path, "base")
    done = _ab(tmp_path, str(base), str(base), "--base-arg=--energy-backend=nosuch", *COMMON)
    assert done.returncode == 3 and "the base side failed" in done.stderr


def _commands_interrupted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tests.test_cli import BLOCKING

    (tmp_path / "driver.py").write_text(BLOCKING)
    child = subprocess.Popen(
        [sys.executable, "driver.py", "list"],
        cwd=tmp_path,
        env={**os.environ, "BLOCK_AT": "runs"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    try:
        assert child.stderr is not None and child.stderr.readline() == "blocked\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130 and "Traceback" not in err and len(err.splitlines()) == 1


def _check_busy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every trial of check's first session disturbed (a stand-in python saves such a
    session): the meters, then what to do, exit 3."""
    import functools

    from pytest_llmenergy import check
    from tests.test_check import _busy_python

    python, _ = _busy_python(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(check, "run_sessions", functools.partial(check.run_sessions, python=str(python)))
        code, out, err = _cli(capsys, "check", "--backend", "estimate")
    assert code == 3 and "meters on this machine" in out
    assert "every trial was disturbed" in err and "error" not in err


def _proof_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An H100 stand-in whose counter counts 1.5 x its instantaneous power: caught."""
    from tests.fakes.fake_pynvml import build_fake_pynvml
    from tests.fakes.hopper import MiscountedTrace, make_h100

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "pynvml", build_fake_pynvml([make_h100(trace=MiscountedTrace())]))
        mp.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        code, out, err = _cli(
            capsys, "proof", "--out", tmp_path / "p", "--plan", "smoke", "--stage", "meter"
        )
    assert code == 1, err
    assert "FAIL  meter: counter vs instantaneous integral" in out
    assert (tmp_path / "p" / "proof.md").exists()


def _proof_no_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(sys.modules, "pynvml", raising=False)  # the real one: no driver here
        code, out, err = _cli(capsys, "proof", "--out", tmp_path / "p")
    assert (code, out.strip()) == (4, "") and err.startswith("llmenergy: proof: no NVIDIA GPU")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def _leaf_commands(parser: argparse.ArgumentParser) -> list[list[str]]:
    found: list[list[str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _leaf_commands(sub)
                found += [[name, *n] for n in nested] or [[name]]
    return found


PYTEST_SCENARIOS: dict[tuple[str, int], Callable[[pytest.Pytester, Path], None]] = {
    ("python -m pytest", 0): _pytest_ok,
    ("python -m pytest", 1): _pytest_failed,
    ("python -m pytest", 2): _pytest_interrupted,
    ("python -m pytest", 4): _pytest_usage,
    ("python -m pytest", 5): _pytest_nothing,
}
CLI_SCENARIOS: dict[tuple[str, int], Callable[[Path, pytest.CaptureFixture[str]], None]] = {
    ("llmenergy compare --fail-on", 1): _compare_fails,
    ("llmenergy compare --strict", 1): _compare_strict,
    ("llmenergy report --gate", 1): _report_fails,
    ("llmenergy ab --gate", 1): _ab_fails,
    ("llmenergy ab --strict", 1): _ab_strict,
    ("llmenergy ab", 3): _ab_side_failed,
    ("llmenergy check", 3): _check_busy,
    ("llmenergy proof --out", 1): _proof_fails,
    ("llmenergy proof", 4): _proof_no_gpu,
    ("llmenergy COMMAND", 130): _commands_interrupted,
    ("llmenergy COMMAND", 0): _commands_ok,
    ("llmenergy COMMAND", 2): _commands_bad_input,
}


def test_every_row_has_a_scenario_and_every_scenario_a_row() -> None:
    rows = table_rows()
    assert len(rows) == len(set(rows))
    assert set(rows) == set(PYTEST_SCENARIOS) | set(CLI_SCENARIOS)


def test_every_flag_that_exits_1_has_its_row() -> None:
    """A command's help that promises an exit 1 names a row of the table."""
    promised = set()
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for flag in sub._actions:
                    if re.search(r"\bexits? 1\b", flag.help or ""):
                        promised.add((f"llmenergy {name} {flag.option_strings[0]}", 1))
    assert promised == {row for row in table_rows() if row[1] == 1 and "llmenergy" in row[0]}


@pytest.mark.serial  # a gate on sleeps' energies
@pytest.mark.parametrize("row", sorted(PYTEST_SCENARIOS))
def test_pytest_sessions_exit_as_the_table_says(
    row: tuple[str, int], pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_plugin_keep import CASES, REPO
    from tests.test_plugin_suite import TRACE_METER

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(test_cases=CASES)
    PYTEST_SCENARIOS[row](pytester, pytester.path)


@pytest.mark.parametrize("row", sorted(CLI_SCENARIOS))
def test_llmenergy_exits_as_the_table_says(
    row: tuple[str, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    CLI_SCENARIOS[row](tmp_path, capsys)
