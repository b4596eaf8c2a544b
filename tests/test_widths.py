"""Issue 54, items 3 and 5: what ``llmenergy`` and a session print fits an 80- or
100-column terminal, keeps the values a reader looks for first, and says no more than the
printed table shows.  ``conftest.py`` sets COLUMNS=200 for every test; these set their own."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pytest_llmenergy.check import MeterCheck, NoiseCheck, Report
from pytest_llmenergy.cli import main
from pytest_llmenergy.plugin import DETAILS_HINT

RUNS = Path(__file__).parent / "data" / "runs" / "v1"
WIDTHS = (80, 100)

# the reasons ``llmenergy check`` printed in one unwrapped column (issue 54: 284 wide)
REASONS = {
    "nvml": "NVML Shared Library Not Found: no NVIDIA driver on this machine; use "
    "--energy-backend=auto or estimate",
    "amdsmi": "the amdsmi Python package is not installed: install the one that comes with "
    "your ROCm, pip install /opt/rocm/share/amd_smi (its version must match ROCm's)",
    "rapl": "no RAPL zones under /sys/class/powercap (not a Linux machine with Intel/AMD RAPL, "
    "or the intel_rapl_common module is not loaded; set LLMENERGY_POWERCAP_ROOT if the tree "
    "is elsewhere)",
}
ESTIMATE = (
    "estimate: cpu:process (estimated), TDP 20 W [default: unknown CPU model 'Intel(R) "
    "Xeon(R) Processor @ 2.50GHz', 10 W per logical CPU x 2; pass --energy-cpu-tdp=WATTS] x "
    "process-tree CPU-seconds / 2 logical CPUs"
)


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def assert_fits(text: str, width: int) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert not too_wide, "\n".join(too_wide)


def joined(text: str) -> str:
    """Wrapped prose as one line again: continuation lines start with two spaces."""
    return text.replace("\n  ", " ")


def table_after(lines: list[str], title: str) -> tuple[list[str], list[list[str]]]:
    """The headers and rows of the table under ``title``, each folded cell joined again:
    a folded first cell continues alone on the next line, a folded later cell on a line
    whose first cell is empty."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rule = next(i for i in range(start, len(lines)) if lines[i].startswith("---"))
    spans, at = [], 0
    for dashes in lines[rule].split("  "):
        spans.append((at, at + len(dashes)))
        at += len(dashes) + 2

    def in_table(line: str) -> bool:  # nothing between the columns, nothing beyond them
        gaps = [line[b : b + 2] for _, b in spans[:-1]]
        return bool(line.strip()) and len(line) <= spans[-1][1] and not "".join(gaps).strip()

    headers = [lines[rule - 1][a:b].strip() for a, b in spans]
    rows: list[list[str]] = []
    for line in lines[rule + 1 :]:
        if not in_table(line):
            break
        cells = [line[a:b].strip() for a, b in spans]
        if rows and cells[0] and not any(cells[1:]):  # a folded name, or text under the table
            if " " in cells[0]:
                break
            rows[-1][0] += cells[0]
        elif rows and not cells[0]:  # folded later cells
            for i, cell in enumerate(cells):
                if cell:
                    rows[-1][i] += " " + cell
        else:
            rows.append(cells)
    return headers, rows


# -- compare and report ----------------------------------------------------------------------
@pytest.mark.parametrize("width", WIDTHS)
def test_compare_fits_and_keeps_baseline_current_change_and_verdict(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(RUNS)
    monkeypatch.delenv("COLUMNS")
    _, whole, _ = run(
        capsys, "compare", "machine-a.json", "machine-a.json", "--fail-on", "j_per_token:5%"
    )
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = run(
        capsys, "compare", "machine-a.json", "machine-a.json", "--fail-on", "j_per_token:5%"
    )
    assert code == 0 and err == ""
    assert_fits(out, width)
    lines = out.splitlines()
    title = "2:machine-a.json (current) against 1:machine-a.json (baseline)"
    headers, rows = table_after(lines, title)
    for wanted in ("case", "baseline", "current", "change", "verdict"):
        assert wanted in headers, headers
    assert "significant" not in headers  # what goes first
    # every case whole again once its folded lines are joined, with its means
    whole_headers, whole_rows = table_after(whole.splitlines(), title)
    assert "significant" in whole_headers and "p" in whole_headers  # a file: every column
    assert len(rows) == 6 and [r[0] for r in rows] == [r[0] for r in whole_rows]
    for key in ("baseline", "current", "change", "verdict"):
        at, whole_at = headers.index(key), whole_headers.index(key)
        assert [r[at] for r in rows] == [r[whole_at] for r in whole_rows]
    # the legend about p went with its column; the gate's lines are wrapped, not lost
    assert "p: sessions compared" not in out and "p: sessions compared" in whole
    text = joined(out)
    assert "energy gate passed (j_per_token:5%): no significant regression" in text
    assert "gate detects >= " in text and "learns the noise)" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_across_hardware_fits(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(RUNS)
    monkeypatch.setenv("COLUMNS", str(width))
    argv = ("compare", "machine-a.json", "machine-b.json", "machine-a.json", "machine-b.json")
    code, out, _ = run(capsys, *argv, "--fail-on", "j_per_token:5%")
    assert code == 0
    assert_fits(out, width)
    headers, rows = table_after(out.splitlines(), "J/token (j_per_token), side by side")
    assert headers[:5] == ["case", "#1 base", "#2", "#3", "#4"] and len(rows) == 6
    assert all(r[0].startswith("test_") and r[0].endswith("]") for r in rows)
    assert "not gated: baseline: TDP 40 W" in joined(out)


@pytest.mark.parametrize("width", WIDTHS)
def test_report_lines_fit(
    width: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("machine-a.json", "machine-b.json"):
        shutil.copy(RUNS / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", str(width))
    argv = ("report", "machine-a.json", "machine-a.json", "--gate", "j_per_token:5%")
    code, out, err = run(capsys, *argv, "--out", "r.html")
    assert code == 0 and (tmp_path / "r.html").exists()
    assert_fits(out + err, width)
    assert "gate detects >= " in joined(out) and len(out.splitlines()) > 3


def test_a_pipe_without_columns_gets_each_line_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CI log (no terminal, no COLUMNS) keeps a verdict on one line, for grep."""
    monkeypatch.chdir(RUNS)
    monkeypatch.delenv("COLUMNS")
    _, out, _ = run(
        capsys, "compare", "machine-a.json", "machine-a.json", "--fail-on", "j_per_token:5%"
    )
    evidence = next(line for line in out.splitlines() if "gate detects" in line)
    assert evidence.endswith("learns the noise)") and len(evidence) > 200


# -- check ---------------------------------------------------------------------------------
def made_report() -> Report:
    meters = tuple(MeterCheck(name, False, why) for name, why in REASONS.items())
    estimate = MeterCheck("estimate", True, ESTIMATE, 1e-9, 0.0017, True)
    noise = NoiseCheck("estimate", (0.0123, 0.0131), (0.021, 0.034), (14.0, 13.0))
    note = "estimate estimates energy from CPU time and a TDP: it follows time, not power"
    return Report((*meters, estimate), "estimate", noise, (note,))


@pytest.mark.parametrize("width", WIDTHS)
def test_check_folds_its_reasons_and_keeps_resolution_and_idle_power(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_llmenergy.cli.check_cli.run_check", lambda **_: made_report())
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = run(capsys, "check")
    assert code == 0
    assert_fits(out, width)
    assert_fits(err, width)
    headers, rows = table_after(out.splitlines(), "meters on this machine")
    assert headers == ["backend", "opens", "what it reads, or why not", "resolution", "idle W"]
    reasons = {r[0]: r[2] for r in rows}
    for name, why in REASONS.items():
        assert " ".join(reasons[name].split()) == why  # folded at spaces, no word lost
    assert "left out" not in out
    assert "a one-session gate against one baseline detects >= " in joined(err)


@pytest.mark.parametrize("width", WIDTHS)
def test_check_of_this_machine_fits(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = run(capsys, "check", "--sessions", "0")
    assert code == 0 and "meters on this machine" in out
    assert_fits(out, width)
    assert_fits(err, width)


# -- a session -------------------------------------------------------------------------------
TRACE_CONFTEST = """
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace
def pytest_llmenergy_meters(config):
    return {"trace": lambda options: TraceMeter({"gpu:0": PowerTrace([(3600, 200.0)])})}
"""
# calls too fast to fill a window of 10,000 (controller/window.py): short cases
QUICK = """
import pytest

@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_quick(energy_benchmark, n):
    energy_benchmark(int, input_tokens=8 * n, output_tokens=4)
"""
QUICK_ARGS = (
    "--energy-backend=trace",
    "--energy-ci-target=time_s:90%,energy_j:90%",
    "--energy-max-trials=5",
    "-p",
    "no:randomly",
)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_quick_session_reads_at_a_glance(
    width: int, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(QUICK)
    # microsecond figures are wide: the columns the test reads, chosen; a time budget of
    # 10 ms holds the windows of calls to 3 ms, so the cases stop short of the minimum
    result = pytester.runpytest(
        *QUICK_ARGS, "--energy-columns=name,trials,time_s,j_per_token", "--energy-max-time=0.01"
    )
    result.assert_outcomes(passed=4)
    lines = result.stdout.lines
    # the header: what measures and where the rest went, no backend list nor repetition
    collected = next(i for i, line in enumerate(lines) if "collected" in line)
    header = [line.strip() for line in lines[:collected] if line.startswith(("llmenergy:", " "))]
    assert " ".join(header) == (
        f"llmenergy: backend trace -> trace: gpu:0 (counter) llmenergy: {DETAILS_HINT}"
    )
    # the tables and what follows them fit; one line says the cases were short
    start = next(i for i, line in enumerate(lines) if "llmenergy: energy per token" in line)
    assert_fits("\n".join(lines[start:-1]), width)
    under = joined("\n".join(lines[start:]))
    headers, rows = table_after(lines[start:], "all cases")
    trials = headers.index("trials")
    marks = [row[trials].split()[-1] for row in rows]  # the trials column: "10 ✓<"
    short = marks.count("\u2713<")
    assert short >= 2, under  # 5 windows of microsecond calls: far below 1 s
    which = "all 4" if short == 4 else f"{short} of 4"
    assert under.count("cases stopped at the trial limit with") == 1
    assert f"{which} cases stopped at the trial limit with" in under
    assert not re.search(r"^\d: stopped", under, re.MULTILINE)  # no line per case
    # the legend explains the marks the table shows, and no other
    assert ("\u2713<: the CI targets held" in under) == (short > 0)
    assert ("\u2713 the CI targets held" in under) == ("\u2713" in marks)
    assert ("\u2717 stopped at the trial limit or" in under) == ("\u2717" in marks)


def test_the_session_header_keeps_its_details_for_v(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(QUICK)
    result = pytester.runpytest(*QUICK_ARGS, "-v", "-k", "quick and 1")
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    assert "llmenergy: repetition: 3-5 trials" in text and DETAILS_HINT not in text


# -- pytest --help ---------------------------------------------------------------------------
def our_help_lines(help_text: str) -> list[str]:
    """The lines of this plugin's options (its group) and of its ini names, with their
    continuation lines."""
    ours, mine, in_group = [], False, False
    for line in help_text.splitlines():
        if line and not line.startswith(" "):  # a heading
            in_group = line.startswith("LLM energy measurement (pytest-llmenergy)")
            mine = in_group
            if mine:
                ours.append(line)
            continue
        if line.startswith("  ") and not line.startswith("   "):  # an entry
            name = line.split()[0] if line.split() else ""
            mine = in_group or name.startswith("llmenergy_")
        if mine:
            ours.append(line)
    return ours


@pytest.mark.parametrize("width", WIDTHS)
def test_the_help_of_our_options_fits(
    width: int, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    text = pytester.runpytest("--help").stdout.str()
    ours = our_help_lines(text)
    assert len(ours) > 300 and any("llmenergy_backend (" in line for line in ours)
    assert_fits("\n".join(ours), width)
