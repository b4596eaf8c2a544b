"""Issue 61, item 7: every line the package prints fits the terminal, errors included.

At COLUMNS=80 a session's usage errors were one line of 132-199 characters (a meter that
cannot open, an unknown figure, a bad marker argument), the count-work line 81-82, and
``llmenergy``'s errors one line however long; continuation lines are indented as the
package's notes are (past ``ERROR: `` or ``llmenergy: `` in a session, two spaces in the
``llmenergy`` command)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from tests.test_plugin import TRACE_CONFTEST

WIDTH = 80
SESSION = ("--energy-max-background=off", "-p", "no:randomly", "-p", "no:cacheprovider")


def _too_wide(text: str, width: int = WIDTH) -> list[str]:
    """Lines past ``width`` that could have been broken: a single word longer than the
    terminal (a temporary path) cannot."""
    return [line for line in text.splitlines() if len(line) > width and " " in line.strip()]


def _ours(lines: list[str]) -> list[str]:
    """A session's lines from the package: ``llmenergy: `` lines and their continuations
    (pytest's and pytest-benchmark's header lines are theirs)."""
    out: list[str] = []
    for line in lines:
        if line.startswith("llmenergy") or (out and out[-1] and line.startswith(" ")):
            out.append(line)
        elif line.strip():
            out.append("")  # a line of another's: what follows does not continue ours
    return [line for line in out if line]


def _joined(lines: list[str]) -> str:
    """Wrapped lines as the one line they continue."""
    return re.sub(r"\s+", " ", " ".join(lines))


MARKED = """
import pytest

@pytest.mark.llmenergy(tries_per_trial=3)
def test_marked(energy_benchmark):
    energy_benchmark(lambda: None)
"""


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--energy-columns=bogus",), "--energy-columns=bogus: unknown figure 'bogus'"),
        (("--energy-backend=rapl",), "--energy-backend=rapl: no RAPL zones under"),
        (("--energy-compare-fail=bogus:5%",), "unknown figure 'bogus'"),
        (("test_marked.py",), "@pytest.mark.llmenergy: unknown argument tries_per_trial"),
    ],
    ids=["unknown-column", "rapl-unavailable", "unknown-gate-figure", "bad-marker-argument"],
)
def test_a_sessions_usage_error_fits_the_terminal(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: tuple[str, ...],
    said: str,
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setenv("LLMENERGY_POWERCAP_ROOT", str(tmp_path))  # no RAPL zone there
    pytester.makepyfile(test_plain="def test_x(energy_meter): pass", test_marked=MARKED)
    if "test_marked.py" not in args:
        args = ("test_plain.py", *args)
    result = pytester.runpytest(*args, *SESSION)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = [line for line in result.stderr.lines if line.strip()]
    assert len(err) > 1 and err[0].startswith("ERROR: ")  # long: wrapped, not cut
    assert all(line.startswith(" " * 9) for line in err[1:]), err  # past "ERROR: "
    assert not _too_wide("\n".join([*_ours(result.stdout.lines), *result.stderr.lines]))
    assert said in _joined(err)
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_pytests_own_usage_error_is_left_as_it_is(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the package's lines are fitted: another plugin's and pytest's stay theirs."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    missing = "no_such_file_" + "x" * 80 + ".py"
    result = pytester.runpytest(missing, *SESSION)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"ERROR: file or directory not found: {missing}" in result.stderr.lines


COUNTED = """
import torch

def test_op(energy_benchmark):
    x = torch.ones(32, 32)
    energy_benchmark(lambda: x @ x, input_tokens=8, output_tokens=4)
"""


def test_the_count_work_line_fits_the_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """79 characters for one case (81-82 for 18 cases): at 60 columns it must wrap."""
    pytest.importorskip("torch")
    monkeypatch.setenv("COLUMNS", "60")
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(test_counted=COUNTED)
    result = pytester.runpytest(
        "--energy-backend=trace",
        "--energy-count-work=on",
        "--energy-min-trials=3",
        "--energy-max-trials=3",
        *SESSION,
    )
    result.assert_outcomes(passed=1)
    lines = result.stdout.lines
    at = next(i for i, line in enumerate(lines) if line.startswith("llmenergy: the work of"))
    assert lines[at + 1].startswith(" " * 13)  # continued past "llmenergy: "
    assert "(outside the measured trials)" in _joined(lines[at : at + 2])
    assert not _too_wide("\n".join(lines[at:]), 60)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse's usage errors
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("show", "a-run-that-was-never-saved"), "llmenergy: error: no saved run"),
        (("compare", "a", "b", "--fail-on", "bogus:5%"), "unknown figure 'bogus'"),
        (("report", "a", "--gate", "nope"), "unknown figure 'nope'"),
        (("export", "--format", "bogus", "a"), "invalid choice: 'bogus'"),
    ],
    ids=["unknown-run", "compare-gate", "report-gate", "export-format"],
)
def test_llmenergy_errors_fit_the_terminal(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    argv: tuple[str, ...],
    said: str,
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == ""
    assert not _too_wide(err), _too_wide(err)
    errors = err[err.index("llmenergy") if "usage:" not in err else err.index("\nllmenergy") :]
    lines = errors.strip().splitlines()
    assert len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    assert said in _joined(lines)


@pytest.mark.parametrize("width", [80, 100])
def test_the_check_meter_table_fits_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """Every built-in meter, most of them unavailable here, their reasons folded."""
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = _cli(capsys, "check", "--sessions", "0")
    assert code == 0 and "meters on this machine" in out
    assert not _too_wide(out + err, width), _too_wide(out + err, width)


def test_a_session_in_a_log_fits_its_lines_to_the_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CI log: a long case's notes named it, its latest trial and its limits in one
    line of 300 characters.  Every line of the package's is fitted, header to summary."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    pytester.makeconftest("import pytest_llmenergy.plugin.progress as p\np.LONG_CASE_S = 0.3\n")
    pytester.makepyfile(
        test_long="""
        import time

        def test_long(energy_benchmark):
            energy_benchmark(time.sleep, 0.1, input_tokens=1, output_tokens=1)
        """
    )
    result = pytester.runpytest_subprocess(
        "--energy-min-trials=6", "--energy-max-trials=6", *SESSION
    )
    result.assert_outcomes(passed=1)
    ours = _ours(result.stdout.lines)
    assert any("test_long still running after" in line for line in ours), ours
    assert not _too_wide("\n".join(ours)), _too_wide("\n".join(ours))
