"""Faults injected into the store's one write path (``store.AtomicFile``).

The invariant, whatever fails: a file is complete (its last good write) or absent, no
temporary file is left beside it, and what the session printed is what was kept.  The
faults: ENOSPC while writing and at fsync, EACCES, a failing link or rename, and a crash
between the write and the rename (``os._exit`` in a subprocess).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.storage.recorder import RunRecorder
from pytest_llmenergy.storage.runfile import RUNNING, dumps, load
from pytest_llmenergy.storage.store import AtomicFile, Storage
from tests.casefactory import make_case
from tests.test_storage_runfile import sample_run

REPO = Path(__file__).resolve().parent.parent
HW = "cpu-x__no-gpu__trace"


@pytest.fixture(params=["unnamed", "named"])
def temp_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a temporary file is made: unnamed (Linux's O_TMPFILE) and named."""
    if request.param == "unnamed" and not AtomicFile.unnamed:
        pytest.skip("this system has no unnamed temporary files")
    monkeypatch.setattr(AtomicFile, "unnamed", request.param == "unnamed")
    return str(request.param)


def oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class Fault:
    """``os.<name>`` raising ``code`` (when ``applies`` says so); remembers if it fired."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        name: str,
        code: int,
        applies: Callable[..., bool] = lambda *a, **k: True,
    ) -> None:
        self.fired = False
        real = getattr(os, name)

        def faulty(*args: Any, **kwargs: Any) -> Any:
            if applies(*args, **kwargs):
                self.fired = True
                raise oserror(code)
            return real(*args, **kwargs)

        monkeypatch.setattr(os, name, faulty)


def _creates(path: Any, flags: int, *rest: Any, **kw: Any) -> bool:
    return bool(flags & (os.O_CREAT | getattr(os, "O_TMPFILE", 0)))


def _second_chunk() -> Callable[..., bool]:
    """os.write that fails on its second call: half a file written, then the disk is full."""
    calls = iter(range(1_000_000))
    return lambda *a, **k: next(calls) >= 1


FAULTS: dict[str, tuple[str, int, Callable[[], Callable[..., bool]]]] = {
    "ENOSPC at write": ("write", errno.ENOSPC, _second_chunk),
    "ENOSPC at fsync": ("fsync", errno.ENOSPC, lambda: lambda *a, **k: True),
    "EIO at fsync": ("fsync", errno.EIO, lambda: lambda *a, **k: True),
    "EACCES at create": ("open", errno.EACCES, lambda: _creates),
    "failing link": ("link", errno.ENOSPC, lambda: lambda *a, **k: True),
    "failing rename": ("replace", errno.EIO, lambda: lambda *a, **k: True),
}


def small_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write takes at most 64 bytes a call, so a file takes several writes."""
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:64])))


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("phase", ["first write", "later write", "derived"])
def test_a_failed_write_leaves_the_last_good_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temp_kind: str, fault: str, phase: str
) -> None:
    target = tmp_path / "run.json"
    old = json.dumps({"cases": list(range(50))})
    new = json.dumps({"cases": list(range(100))})
    writer = AtomicFile(target, derived=phase == "derived")
    if phase == "later write":
        writer.write(old)
    elif phase == "derived":
        target.write_text(old)  # an earlier export, replaced by this one
    small_writes(monkeypatch)
    name, code, applies = FAULTS[fault]
    injected = Fault(monkeypatch, name, code, applies())
    try:
        writer.write(new)
    except OSError as exc:
        assert injected.fired and exc.errno == code
        assert not target.exists() if phase == "first write" else target.read_text() == old
    else:  # this way of writing never calls what failed (a named file is renamed, not linked)
        assert not injected.fired
        assert target.read_text() == new
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ([] if not target.exists() else ["run.json"])


def test_every_fault_fires_in_some_way_of_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table above is no blank: each fault makes some write fail."""
    for name, code, applies in FAULTS.values():
        failed = False
        for unnamed in {AtomicFile.unnamed, False}:
            for derived in (False, True):
                with monkeypatch.context() as m:
                    m.setattr(AtomicFile, "unnamed", unnamed)
                    writer = AtomicFile(tmp_path / f"{name}-{unnamed}-{derived}", derived=derived)
                    small_writes(m)
                    Fault(m, name, code, applies())
                    try:
                        writer.write("x" * 200)
                    except OSError:
                        failed = True
        assert failed, name


def test_a_file_system_without_hard_links_leaves_no_empty_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hard links (EPERM): the name is claimed, then replaced; when the replace fails
    too, the empty claim is taken back."""
    monkeypatch.setattr(AtomicFile, "unnamed", False)
    Fault(monkeypatch, "link", errno.EPERM)
    AtomicFile(tmp_path / "ok.json").write("{}")
    assert (tmp_path / "ok.json").read_text() == "{}"
    Fault(monkeypatch, "replace", errno.ENOSPC)
    with pytest.raises(OSError, match="No space left"):
        AtomicFile(tmp_path / "full.json").write("{}")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.json"]


# -- the recorder: what a session prints is what was kept ----------------------------------
def recorder(tmp_path: Path, **kwargs: Any) -> RunRecorder:
    header = dataclasses.replace(sample_run(()), status=RUNNING)
    return RunRecorder(header, storage=Storage(tmp_path), **kwargs)


def temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*.tmp")]


@pytest.mark.parametrize("good_writes", [0, 2, 4])
def test_the_summary_says_what_the_file_holds_when_the_disk_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temp_kind: str, good_writes: int
) -> None:
    rec = recorder(tmp_path, json_path=tmp_path / "also.json")
    cases = [make_case([0.1, 0.1], input_tokens=8 * (i + 1)) for i in range(4)]
    fsyncs = iter(range(1_000_000))
    # two files per write: the disk fills after ``good_writes`` writes of both
    Fault(monkeypatch, "fsync", errno.ENOSPC, lambda fd: next(fsyncs) >= 2 * good_writes)
    for i in range(len(cases)):
        rec.add(cases[: i + 1])
    rec.finish(cases, interrupted=False, exit_status=0)
    monkeypatch.undo()
    lines = rec.summary()
    assert len(lines) == 2  # one line per file, however many writes failed
    for (line, failed), path in zip(lines, rec.paths):
        kept = load(path).cases if path.exists() else ()
        assert len(kept) == min(good_writes, 4)
        if good_writes == 0:
            assert failed and line.startswith("not saved: 4 case(s) measured, none written")
        elif good_writes < 4:
            assert failed and f"saved only {good_writes} of 4 case(s) to {path}" in line
            assert "marked running: No space left on device" in line
            assert load(path).status == RUNNING
        else:  # every case kept; only the final status could not be written
            assert failed and line.endswith("stays marked running: No space left on device")
        assert str(path) in line
    assert rec.errors == [line for line, _ in lines]
    assert temp_files(tmp_path) == []


def test_a_write_that_succeeds_again_clears_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = recorder(tmp_path)
    cases = [make_case([0.1, 0.1], input_tokens=8 * (i + 1)) for i in range(3)]
    rec.add(cases[:1])
    with monkeypatch.context() as m:
        Fault(m, "fsync", errno.ENOSPC)
        rec.add(cases[:2])
    assert rec.errors  # the second write failed ...
    rec.finish(cases, interrupted=False, exit_status=0)
    assert rec.errors == []  # ... and the last one put everything there
    [(line, failed)] = rec.summary()
    assert not failed and line == f"saved 3 case(s) to {rec.paths[0]}"
    assert len(load(rec.paths[0]).cases) == 3


def test_a_json_path_taken_meanwhile_keeps_this_run_beside_it(tmp_path: Path) -> None:
    """Two sessions given one --energy-json: both pass the check at start; the one
    that writes second goes beside the first, and says where, once."""
    target = tmp_path / "run.json"
    rec = RunRecorder(sample_run(()), json_path=target)
    target.write_text("the other session's run")
    cases = [make_case([0.1, 0.1], input_tokens=8 * (i + 1)) for i in range(2)]
    rec.add(cases[:1])
    rec.add(cases)
    rec.finish(cases, interrupted=False, exit_status=0)
    assert target.read_text() == "the other session's run"
    beside = tmp_path / "run-2.json"
    assert rec.paths == [beside] and len(load(beside).cases) == 2
    assert rec.summary() == [
        (f"saved 2 case(s) to {beside} ({target} was taken meanwhile, by another session?)", False)
    ]


# -- crashes: a process that dies between writing and renaming ------------------------------
CRASH = """
import os, sys
from pathlib import Path
from pytest_llmenergy.storage.store import AtomicFile

AtomicFile.unnamed = sys.argv[3] == "unnamed"
writer = AtomicFile(Path(sys.argv[1]))
writer.write('{"version": 1}')
setattr(os, sys.argv[2], lambda *a, **k: os._exit(3))  # the process dies right there
writer.write('{"version": 2, "padding": "%s"}' % ("x" * 100000))
"""


def crash(tmp_path: Path, where: str, kind: str) -> Path:
    target = tmp_path / "run.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", CRASH, str(target), where, kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    return target


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_a_crash_mid_write_keeps_the_last_complete_file(
    tmp_path: Path, temp_kind: str, where: str
) -> None:
    target = crash(tmp_path, where, temp_kind)
    assert json.loads(target.read_text()) == {"version": 1}  # complete, never half of 2
    left = temp_files(tmp_path)
    if temp_kind == "unnamed" and where == "fsync":
        assert left == []  # an unnamed file dies with its process
    else:  # a named one stays until the next writer in the folder sees its writer gone
        assert len(left) == 1
        stale = tmp_path / left[0]
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
        AtomicFile(target, derived=True).write('{"version": 3}')
        assert temp_files(tmp_path) == []
        assert json.loads(target.read_text()) == {"version": 3}


def test_the_store_sweeps_what_a_killed_session_left(tmp_path: Path) -> None:
    """A session killed between write and rename left a temporary file in its hardware
    folder; the next session that saves there removes it (its writer is gone), and
    leaves alone a live writer's and a fresh one."""
    storage = Storage(tmp_path)
    first = storage.claim(HW, "a")
    first.write(dumps(sample_run((make_case([0.1, 0.2]),))))
    folder = first.path.parent
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    gone = folder / f".0001_a.json.{dead.stdout.strip()}.tmp"
    live = folder / f".0001_a.json.{os.getppid()}.tmp"
    for path in (gone, live):
        path.write_text("half a run")
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    fresh = folder / f".0001_a.json.{dead.stdout.strip()}9.tmp"
    fresh.write_text("being written")
    no_pid = folder / f".0001_a.json.{'9' * 40}.tmp"  # a name no process can have
    no_pid.write_text("someone's")
    os.utime(no_pid, (time.time() - 3600, time.time() - 3600))
    storage.claim(HW, "b")
    assert not gone.exists() and live.exists() and fresh.exists() and no_pid.exists()
    assert [r.path.name for r in storage.runs()] == ["0001_a.json"]


# -- the user's view: a session whose disk fills ---------------------------------------
CASES = """
import time, pytest

@pytest.mark.parametrize("n_in", [8, 64, 128, 256])
def test_case(energy_benchmark, n_in):
    energy_benchmark.pedantic(
        lambda: time.sleep(0.005), rounds=2, warmup_rounds=0, input_tokens=n_in, output_tokens=4
    )
"""
FULL_DISK = """
import errno, os
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace

def pytest_llmenergy_meters(config):
    return {"trace": lambda options: TraceMeter({"gpu:0": PowerTrace([(3600, 200.0)])})}

_real_fsync, _calls = os.fsync, [0]

def _fsync(fd):  # the disk fills after FSYNC_OK synced files
    _calls[0] += 1
    if _calls[0] > int(os.environ.get("FSYNC_OK", "1000")):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _real_fsync(fd)

os.fsync = _fsync
"""
ARGS = (
    "-p",
    "no:randomly",
    "-p",
    "no:cacheprovider",
    "--energy-backend=trace",
    "--energy-shuffle=off",
    "--energy-max-background=off",
)
SAVED = re.compile(r"saved (?:only )?(\d+)(?: of \d+)? case\(s\) to (\S+)")


@pytest.fixture
def full_disk(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    monkeypatch.setenv("COLUMNS", "400")  # the summary's lines unwrapped
    pytester.makeconftest(FULL_DISK)
    pytester.makepyfile(test_cases=CASES)
    return pytester


def summary_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if line.startswith("llmenergy: ")]


def assert_printed_is_kept(result: pytest.RunResult, root: Path) -> dict[str, int]:
    """Every "saved N case(s) to PATH" line matches the file at PATH; returns them."""
    said = {}
    for line in summary_lines(result):
        match = SAVED.search(line)
        if match:
            said[match[2].rstrip(",")] = int(match[1])
    for path, n in said.items():
        assert len(load(root / path).cases) == n, (path, result.stdout.str())
    assert temp_files(root) == []
    return said


def test_a_session_whose_disk_fills_says_once_what_was_not_saved(
    full_disk: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FSYNC_OK", "4")  # the run file and the JSON, twice each
    result = full_disk.runpytest_subprocess(*ARGS, "--energy-save=x", "--energy-json=run.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # measured fine, not all kept
    result.assert_outcomes(passed=4)
    said = assert_printed_is_kept(result, full_disk.path)
    assert sorted(said.values()) == [2, 2] and "run.json" in said
    full = [line for line in summary_lines(result) if "No space left on device" in line]
    assert len(full) == 2  # once per file, each naming it
    assert all("saved only 2 of 4 case(s)" in line and "marked running" in line for line in full)
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_session_with_room_saves_everything(full_disk: pytest.Pytester) -> None:
    result = full_disk.runpytest_subprocess(*ARGS, "--energy-save=x")
    assert result.ret == 0
    assert list(assert_printed_is_kept(result, full_disk.path).values()) == [4]


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KB file system, where this machine lets us mount one (root, Linux)."""
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        pytest.skip("no mount command here")
    if done.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False, timeout=30)


def test_a_real_full_disk(full_disk: pytest.Pytester, tiny_tmpfs: Path) -> None:
    (tiny_tmpfs / "filler").write_bytes(b"\0" * 48_000)  # 16 KB left: less than a run needs
    storage = tiny_tmpfs / "runs"
    result = full_disk.runpytest_subprocess(
        *ARGS,
        f"--energy-storage={storage}",
        "--energy-save=x",
        f"--energy-export=csv:{tiny_tmpfs / 'cases.csv'}",
    )
    said = assert_printed_is_kept(result, full_disk.path)
    assert len(said) == 1
    full = [line for line in summary_lines(result) if "No space left on device" in line]
    assert full, result.stdout.str()  # the disk did fill: said once, with the file
    assert len([line for line in full if str(storage) in line]) == 1
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert temp_files(tiny_tmpfs) == []
