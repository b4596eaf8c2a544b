"""The storage folder: numbering, no overwrites, concurrent savers, finding runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.storage.runfile import RunFileError, dumps, load
from pytest_llmenergy.storage.store import AtomicFile, Storage, check_run_name
from tests.casefactory import make_case
from tests.test_storage_runfile import sample_run

HW = "cpu-x__no-gpu__trace"


def save(storage: Storage, name: str, hardware: str = HW) -> Path:
    f = storage.claim(hardware, name)
    f.write(dumps(sample_run((make_case([0.1, 0.2]),))))
    return f.path


def test_runs_are_numbered_per_hardware_folder(tmp_path: Path) -> None:
    storage = Storage(tmp_path / ".llmenergy")
    assert storage.runs() == []
    first = save(storage, "baseline")
    second = save(storage, "baseline")
    other = save(storage, "baseline", hardware="cpu-y__1x-a100__nvml")
    assert first.name == "0001_baseline.json" and second.name == "0002_baseline.json"
    assert other.name == "0001_baseline.json" and other.parent.name == "cpu-y__1x-a100__nvml"
    assert [r.ref for r in storage.runs()] == [
        f"{HW}/0001",
        f"{HW}/0002",
        "cpu-y__1x-a100__nvml/0001",
    ]
    assert load(first).cases[0].trials[1].seconds == 0.2


def test_an_existing_file_is_never_replaced(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_text("someone else's results")
    writer = AtomicFile(target)
    with pytest.raises(FileExistsError):
        writer.write("mine")
    assert target.read_text() == "someone else's results"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temp file left


def test_later_writes_replace_only_the_writers_own_file(tmp_path: Path) -> None:
    writer = AtomicFile(tmp_path / "run.json")
    writer.write("one")
    writer.write("two")
    assert (tmp_path / "run.json").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_claimed_number_is_skipped_even_before_its_file_exists(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    a = storage.claim(HW, "a")  # claimed, nothing written yet
    b = storage.claim(HW, "b")
    assert (a.path.name, b.path.name) == ("0001_a.json", "0002_b.json")
    assert storage.runs() == []  # claims are not runs
    (tmp_path / HW / "0003_copied.json").write_text("{}")  # placed by hand
    assert storage.claim(HW, "c").path.name == "0004_c.json"


def test_concurrent_savers_in_two_processes_lose_nothing(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from pytest_llmenergy.storage.runfile import dumps
        from pytest_llmenergy.storage.store import Storage
        from tests.casefactory import make_case
        from tests.test_storage_runfile import sample_run
        storage = Storage({str(tmp_path)!r})
        for i in range(25):
            f = storage.claim({HW!r}, sys.argv[1])
            f.write(dumps(sample_run((make_case([0.1 + i / 1000]),))))
            f.write(dumps(sample_run((make_case([0.1 + i / 1000]), make_case([0.2])))))
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, name]) for name in ("left", "right")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    runs = Storage(tmp_path).runs()
    assert len(runs) == 50
    assert sorted(r.number for r in runs) == list(range(1, 51))  # unique numbers, no gaps
    assert {r.name for r in runs} == {"left", "right"}
    assert all(len(r.load().cases) == 2 for r in runs)
    leftovers = [p.name for p in (tmp_path / HW).iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_resolve_by_number_name_stem_hardware_and_path(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    one = save(storage, "baseline")
    two = save(storage, "baseline")
    three = save(storage, "feature-x")
    elsewhere = save(storage, "m1", hardware="apple-m1-pro__no-gpu__powermetrics")
    assert storage.resolve("1", hardware=HW) == one
    assert storage.resolve("0003") == three
    assert storage.resolve("baseline") == two  # a name saved twice: its latest run
    assert storage.resolve("0001_baseline") == one
    assert storage.resolve("m1") == elsewhere  # found in another hardware folder
    assert storage.resolve(f"{HW}/2") == two
    assert storage.resolve(str(one)) == one
    assert storage.latest(HW) is not None and storage.latest(HW).path == three
    assert storage.latest(HW, exclude=three).path == two


def test_resolve_errors_say_what_exists(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    with pytest.raises(ConfigError, match="none saved yet"):
        storage.resolve("baseline")
    save(storage, "baseline")
    save(storage, "baseline", hardware="other__no-gpu__rapl")
    with pytest.raises(ConfigError, match=f"no saved run 'nope'.*{HW}/0001"):
        storage.resolve("nope")
    with pytest.raises(ConfigError, match=f"several machines; say which: {HW}/1, other"):
        storage.resolve("1")
    assert storage.resolve("1", hardware="other__no-gpu__rapl").parent.name.startswith("other")


@pytest.mark.parametrize("name", ["", "a/b", "..", "x y", "ünï"])
def test_bad_run_names(name: str) -> None:
    with pytest.raises(ConfigError, match="bad run name"):
        check_run_name(name)


def test_storage_lists_only_run_files(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    save(storage, "a")
    folder = tmp_path / HW
    (folder / ".0001_a.json.123.tmp").write_text("partial")
    (folder / "notes.txt").write_text("mine")
    os.mkdir(folder / "0009_dir.json")
    assert [r.path.name for r in storage.runs()] == ["0001_a.json"]


def test_hardware_keys_cannot_leave_the_storage_folder(tmp_path: Path) -> None:
    storage = Storage(tmp_path / "store")
    for key in ("..", "../x", "/etc", "a/b"):
        with pytest.raises(ConfigError, match="bad hardware key"):
            storage.runs(key)
        with pytest.raises(ConfigError, match="bad hardware key"):
            storage.claim(key, "x")
    with pytest.raises(ConfigError, match="no saved run"):
        storage.resolve("../x/1")


def test_a_missing_json_path_is_named_as_a_file(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    path = save(storage, "base")
    assert storage.resolve("0001_base.json") == path  # the name `llmenergy list` shows
    assert storage.resolve(f"{HW}/0001_base.json") == path
    with pytest.raises(RunFileError, match=r"results/run\.json: no such run file"):
        storage.resolve("results/run.json")
