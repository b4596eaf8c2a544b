"""Issue 54: a cancelled job keeps its run, and hostile inputs each end in one clear line
(no traceback, nothing lost, nothing left ``running``), tried the way users meet them: a
session ended by ``timeout`` or killed, a name with a newline, a run file with subnormal
joules, a TOML ini with typed values, a garbage RAPL counter, a damaged gatecheck index
or GPU state file, two runs with one number, a storage that is a file, a full disk."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from pytest_llmenergy.plugin.stopping import SigtermStop
from pytest_llmenergy.sessions import side_sessions
from pytest_llmenergy.storage import store
from pytest_llmenergy.storage.runfile import (
    ABANDONED,
    COMPLETE,
    INTERRUPTED,
    RUNNING,
    RunFileError,
    dumps,
    load,
    loads,
    this_writer,
    writer_gone,
)
from pytest_llmenergy.storage.store import check_run_name
from tests.casefactory import make_case
from tests.test_cli import cli, save
from tests.test_plugin import assert_one_line_usage_error
from tests.test_storage_runfile import sample_run

# The first case is quick; the second waits in its target until the test signals.
SLOW_SESSION = """
import time, pytest

@pytest.mark.parametrize("seconds", [0.001, 600])
def test_case(energy_benchmark, seconds):
    energy_benchmark(time.sleep, seconds, input_tokens=8, output_tokens=8)
"""
SESSION_ARGS = (
    "-p",
    "no:randomly",
    "-p",
    "no:cacheprovider",
    "--energy-backend=estimate",
    "--energy-shuffle=off",
    "--energy-max-background=off",
    "--energy-min-trials=2",
    "--energy-max-trials=2",
    "--energy-warmup=0",
)


def _default_signals() -> None:
    """``preexec_fn``: SIGTERM and SIGINT as a terminal or CI delivers them (a shell's
    background job may start with them ignored, and then no handler is installed)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_and_wait_for_first_case(folder: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    (folder / "test_slow.py").write_text(SLOW_SESSION)
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_slow.py", *SESSION_ARGS, *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_default_signals,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = list((folder / "S").glob("*/*.json"))
        if found:
            return child, found[0]
        if child.poll() is not None:
            break
        time.sleep(0.1)
    child.kill()
    raise AssertionError(f"no run file appeared: {child.communicate()[0]}")


# -- item 1: a cancelled job ------------------------------------------------------------------
def test_sigterm_ends_the_session_with_2_and_keeps_the_run_interrupted(tmp_path: Path) -> None:
    child, path = _start_and_wait_for_first_case(
        tmp_path, "--energy-storage=S", "--energy-save=term", "--energy-export=csv:out.csv"
    )
    try:
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 2, out
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert "SIGTERM: session stopped; the cases measured so far are kept" in out
    run = load(path)
    assert run.status == INTERRUPTED and run.exit_status == 2 and len(run.cases) == 1
    assert len((tmp_path / "out.csv").read_text().splitlines()) == 2  # header and the case


def test_a_run_whose_writer_was_killed_reads_as_abandoned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    child, path = _start_and_wait_for_first_case(tmp_path, "--energy-storage=S", "--energy-save=k")
    assert load(path).status == RUNNING  # its writer still runs
    child.kill()
    child.communicate(timeout=60)
    assert json.loads(path.read_text())["run"]["status"] == RUNNING  # its last write
    assert load(path).status == ABANDONED
    code, out, _ = cli(capsys, "--storage", tmp_path / "S", "list", "--format", "json")
    assert code == 0
    assert [r["status"] for r in json.loads(out)["tables"][0]["rows"]] == [ABANDONED]


def test_a_writer_is_gone_only_where_this_host_can_tell() -> None:
    me = this_writer()
    assert me["pid"] == os.getpid() and me["host"] == socket.gethostname()
    assert not writer_gone(me)
    assert not writer_gone({})  # a run written before the writer was recorded
    assert not writer_gone({**me, "host": me["host"] + "-elsewhere"})
    assert writer_gone({**me, "started": me["started"] - 3600})  # a recycled pid
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    if not psutil.pid_exists(ended.pid):
        assert writer_gone({**me, "pid": ended.pid})


def test_a_second_sigterm_never_cuts_the_saving_short() -> None:
    stop = SigtermStop()
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        stop._on_sigterm(signal.SIGTERM, None)
    stop._on_sigterm(signal.SIGTERM, None)  # the session's end is under way: no raise


def test_ctrl_c_while_the_report_is_made_is_one_line_and_keeps_the_run(
    pytester: pytest.Pytester,
) -> None:
    if importlib.util.find_spec("vl_convert") is None:  # not imported: see below
        pytest.skip("the HTML report needs vl-convert-python")
    pytester.makeconftest(  # Ctrl-C lands while the report is made
        """
        import pytest_llmenergy.html as html

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        html.write_report = interrupted
        """
    )
    pytester.makepyfile(test_slow=SLOW_SESSION.replace(", 600", ""))
    # a subprocess: the report's converter loads once per process
    result = pytester.runpytest_subprocess(
        *SESSION_ARGS, "--energy-save=r", "--energy-report=r.html"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text
    result.stdout.fnmatch_lines(["*the HTML report r.html was not written: interrupted*"])
    [path] = (pytester.path / ".llmenergy").glob("*/*.json")
    assert load(path).status == COMPLETE and not (pytester.path / "r.html").exists()


# -- item 7: hostile inputs -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "\n", "a/b", "a b"])
def test_a_run_name_with_a_newline_is_refused(name: str) -> None:
    with pytest.raises(Exception, match="bad run name") as caught:
        check_run_name(name)
    assert "\n" not in str(caught.value)


def test_a_name_with_a_newline_stops_the_session_and_merge(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--energy-backend=estimate", "--energy-save=abc\n")
    assert_one_line_usage_error(result, "bad run name 'abc\\n'")
    assert not (pytester.path / ".llmenergy").exists()
    base = save(tmp_path, [make_case([0.1, 0.1])])
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        cli(capsys, "merge", base, base, "--name", "abc\n", "--out", tmp_path / "m.json")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --name: bad run name 'abc\\n'" in err and "Traceback" not in err
    assert not (tmp_path / "m.json").exists()


def _with_trials(path: Path, **figures: float) -> None:
    data = json.loads(path.read_text())
    for case in data["cases"]:
        for trial in case["trials"]:
            for key, value in figures.items():
                trial[key] = value
                if key == "joules":
                    trial["joules_by_domain"] = dict.fromkeys(trial["joules_by_domain"], value)
            trial["phases"] = {}
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("tiny", [5e-324, 1e-320, 2.2e-308, 1e-160, -1e-31])
def test_subnormal_figures_are_refused_by_the_reader(tmp_path: Path, tiny: float) -> None:
    path = save(tmp_path, [make_case([0.1, 0.12, 0.11])])
    _with_trials(path, net_joules=tiny)  # signed: only the magnitude refuses it
    with pytest.raises(RunFileError, match="no measurement is that near zero") as caught:
        load(path)
    assert "\n" not in str(caught.value) and "cases[0].trials[0]" in str(caught.value)


def test_figures_at_the_smallest_magnitude_are_read_and_used_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1e-30 is accepted: report, every export and comparisons take it without a
    division by an underflowed square (the session statistics' ``var / mean²``)."""
    good = save(tmp_path, [make_case([0.1, 0.12, 0.11])], name="good")
    tiny = save(tmp_path, [make_case([0.1, 0.12, 0.11])], name="tiny")
    _with_trials(tiny, joules=1e-30, net_joules=1e-30, seconds=1e-30)
    assert load(tiny).cases[0].trials[0].joules == 1e-30
    for fmt in ("mlenergy", "csv", "bencher", "github-action-benchmark", "ai-energy-score"):
        code, _, err = cli(capsys, "--storage", tmp_path, "export", "tiny", "--format", fmt)
        assert code == 0, err
    for first, second in (("good", "tiny"), ("tiny", "good")):
        code, _, err = cli(
            capsys, "--storage", tmp_path, "compare", first, second, "--fail-on", "energy_j:5%"
        )
        assert code in (0, 1) and "Traceback" not in err, err
    assert good.exists()


def test_session_statistics_take_tiny_means() -> None:
    sides = side_sessions({1: [1e-30, 1.1e-30, 0.9e-30], 2: [1e-30, 1e-30]})
    assert sides is not None and all(w >= 0 for w in sides.within)


def test_a_session_compared_with_a_hostile_run_stops_at_start(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    storage = pytester.path / "S"
    base = save(storage, [make_case([0.1, 0.1])], name="tiny")
    _with_trials(base, joules=5e-324, net_joules=5e-324)
    pytester.makepyfile(test_slow=SLOW_SESSION.replace(", 600", ""))
    result = pytester.runpytest(
        *SESSION_ARGS, "--energy-storage=S", "--energy-compare=tiny", "--energy-export=csv:o.csv"
    )
    assert_one_line_usage_error(result, "no measurement is that near zero")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("llmenergy_gpus = [0, 1]", "llmenergy_gpus = [0, 1] (ini): a list of strings"),
        ("llmenergy_export = [1]", "llmenergy_export = [1] (ini)"),
        ("llmenergy_save = true", "llmenergy_save = true (ini): true or false is not a NAME"),
    ],
)
def test_typed_toml_ini_values_are_refused_in_one_line(
    pytester: pytest.Pytester, line: str, needle: str
) -> None:
    pytester.makepyprojecttoml(f"[tool.pytest.ini_options]\n{line}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--energy-backend=estimate")
    assert_one_line_usage_error(result, needle)
    assert not (pytester.path / ".llmenergy").exists()


def test_toml_booleans_are_on_and_off_for_switches(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nllmenergy_autosave = false\nllmenergy_gpus = ["0"]\n'
    )
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--energy-backend=estimate")
    assert result.ret == 0, result.stdout.str()
    assert not (pytester.path / ".llmenergy").exists()


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"12 34"])
def test_a_garbage_rapl_counter_is_one_line_or_another_meter(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    zone = pytester.path / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    (zone / "energy_uj").write_bytes(content)
    monkeypatch.setenv("LLMENERGY_POWERCAP_ROOT", str(zone.parent))
    pytester.makepyfile(test_slow=SLOW_SESSION.replace(", 600", ""))
    result = pytester.runpytest("--energy-backend=rapl")
    assert_one_line_usage_error(result, "energy_uj holds", "not a counter in microjoules")
    result = pytester.runpytest(*SESSION_ARGS[:2], "--energy-backend=auto")
    assert result.ret == 0, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(
    ("index", "needle"),
    [
        ('{"a": 1}', "not a list of sessions"),
        ("[1]", "not a list of sessions"),
        ("[]", "not a list of sessions"),
        ('[{"label": "A"}]', "[0].injected is missing"),
        (
            '[{"label": "A", "injected": "x", "round": 1, "file": "f.json", "seconds": 1}]',
            '[0].injected should be a number, not below 0, not "x"',
        ),
        (
            '[{"label": "A", "injected": 0, "round": 1, "file": "../f.json", "seconds": 1}]',
            "[0].file should be a file's path inside the folder",
        ),
        ("[[[[", "not a gatecheck folder"),
    ],
)
def test_a_damaged_gatecheck_index_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], index: str, needle: str
) -> None:
    (tmp_path / "sessions.json").write_text(index)
    code, out, err = cli(capsys, "gatecheck", "--out", tmp_path, "--judge-only")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_a_gatecheck_round_without_unchanged_code_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = save(tmp_path, [make_case([0.1, 0.1])])
    row = {"label": "+10%", "injected": 0.1, "round": 1, "file": str(run.relative_to(tmp_path))}
    (tmp_path / "sessions.json").write_text(json.dumps([{**row, "seconds": 1}]))
    code, _, err = cli(capsys, "gatecheck", "--out", tmp_path, "--judge-only")
    assert code == 2 and "round 1 has no session of unchanged code" in err


@pytest.mark.parametrize(
    "gpus",
    ['"x"', "null", "[1]", '[{"bogus": 1}]', '[{"uuid": "u", "domain": "gpu:0", "name": "A"}]'],
)
def test_a_damaged_gpu_state_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: str
) -> None:
    state = tmp_path / "state.json"
    state.write_text(f'{{"format": "pytest-llmenergy-gpu-state", "pid": 1, "gpus": {gpus}}}')
    code, _, err = cli(capsys, "gpu", "restore", "--state", state, "--force")
    assert code == 2 and err.count("\n") == 1
    assert f"the GPU state file {state} is damaged" in err and "by hand" in err
    assert state.exists()  # kept: it is what says what to restore


def test_runs_sharing_a_number_are_ambiguous_by_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = save(tmp_path, [make_case([0.1, 0.1])], name="good")
    folder = first.parent
    for name in ("0001_other.json", "00001_third.json"):
        (folder / name).write_bytes(first.read_bytes())
    code, _, err = cli(capsys, "--storage", tmp_path, "show", "0001")
    assert code == 2 and "run '0001' is ambiguous: 3 files" in err
    assert "0001_good.json, 0001_other.json" in err
    code, out, _ = cli(capsys, "--storage", tmp_path, "show", "0001_other")
    assert code == 0 and "run 0001_other" in out
    code, out, _ = cli(capsys, "--storage", tmp_path, "list", "--format", "json")
    refs = [r["run"] for r in json.loads(out)["tables"][0]["rows"]]
    assert len(set(refs)) == 3 and all(ref.startswith(f"{folder.name}/000") for ref in refs)


def test_a_storage_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pytester: pytest.Pytester
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for command in (["list"], ["show", "1"], ["compare", "1", "2"]):
        code, out, err = cli(capsys, "--storage", afile, *command)
        assert (code, out) == (2, "") and f"storage {afile} is a file" in err
    pytester.makepyfile("def test_x(): pass")
    (pytester.path / "afile").write_text("")
    result = pytester.runpytest(
        "--energy-backend=estimate", "--energy-storage=afile", "--energy-compare"
    )
    assert_one_line_usage_error(result, "storage afile is a file")


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Every write of file content fails as a full disk fails: ENOSPC, no file name."""

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return lambda: monkeypatch.setattr(store, "_write_all", full)


def test_a_full_disk_names_the_file_in_report_and_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], full_disk: Callable[[], None]
) -> None:
    save(tmp_path / "S", [make_case([0.1, 0.1])])
    full_disk()
    for command in (
        ["export", "1", "--format", "csv", "--out", tmp_path / "e.csv"],
        ["report", "1", "--out", tmp_path / "r.html"],
    ):
        code, _, err = cli(capsys, "--storage", tmp_path / "S", *command)
        target = command[-1]
        assert code == 2 and err == f"llmenergy: error: {target}: No space left on device\n"
        assert not Path(target).exists()


def test_a_session_whose_three_writes_failed_counts_three(
    pytester: pytest.Pytester, full_disk: Callable[[], None]
) -> None:
    pytester.makepyfile(test_slow=SLOW_SESSION.replace(", 600", ", 0.001"))
    full_disk()
    result = pytester.runpytest(
        *SESSION_ARGS, "--energy-save=x", "--energy-json=j.json", "--energy-export=csv:e.csv"
    )
    assert result.ret == 1
    last = [line for line in result.stdout.lines if line.strip()][-1]
    assert "2 passed, 3 files not written" in last, last


def test_atomic_file_errors_keep_their_class_with_the_name(tmp_path: Path) -> None:
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    with pytest.raises(FileExistsError):
        store.AtomicFile(taken).write("{}")


def test_an_old_run_without_a_writer_stays_running(tmp_path: Path) -> None:
    run = replace(sample_run((make_case([0.1, 0.1]),)), status=RUNNING, writer={})
    assert loads(dumps(run), tmp_path / "r.json").status == RUNNING


def test_a_routing_profile_of_subnormal_seconds_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5e-324 seconds made routing's grid of thresholds fill the memory."""
    profile = tmp_path / "p.csv"
    rows = ["A,m,8,32,5e-324,1", "A,m,16,32,1,1", "B,m,8,32,1,2", "B,m,16,32,1,2"]
    profile.write_text("system,model,input_tokens,output_tokens,seconds,joules\n" + "\n".join(rows))
    code, out, err = cli(capsys, "route", "--profile", profile)
    assert (code, out) == (2, "")
    assert err == (
        f"llmenergy: error: {profile}:2: seconds is 4.94066e-324; no measurement is that "
        "near zero (between 1e-30 and 1e+15)\n"
    )


CTRL_C_IN_IMPORTS = """
import sys

class CtrlC:  # Ctrl-C lands while the command's modules are imported
    def find_spec(self, name, path=None, target=None):
        if name == "pytest_llmenergy.cli":
            raise KeyboardInterrupt

sys.meta_path.insert(0, CtrlC())
import runpy
runpy.run_module("pytest_llmenergy", run_name="__main__")
"""


def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_IMPORTS, "list"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130
    assert done.stderr == "llmenergy: interrupted while starting; nothing was done\n"


def test_the_package_imports_nothing_heavy_before_the_command_runs() -> None:
    """What makes the window above short: ``import pytest_llmenergy`` and the entry point
    leave pytest, numpy and the command's modules for later."""
    code = (
        "import sys, pytest_llmenergy.launch\n"
        "heavy = {'pytest', 'numpy', 'pytest_llmenergy.cli', 'pytest_llmenergy.meters'}\n"
        "print(sorted(heavy & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "[]\n", done.stderr
