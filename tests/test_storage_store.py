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


# -- output targets (store.check_output): what may be written where ------------------------
def test_check_output_kinds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_llmenergy.storage.store import DERIVED_FILE, FOLDER, NEW_FILE, check_output

    storage = tmp_path / ".llmenergy"
    mine = tmp_path / "mine.csv"
    mine.write_text("an earlier export")
    assert check_output(tmp_path / "new.json", NEW_FILE, storage=storage) == tmp_path / "new.json"
    with pytest.raises(ConfigError, match=r"mine\.csv already exists and is never replaced"):
        check_output(mine, NEW_FILE, storage=storage)
    assert check_output(mine, DERIVED_FILE, storage=storage) == mine  # made again at will
    with pytest.raises(ConfigError, match=r"--out x/y\.json: folder x does not exist"):
        monkeypatch.chdir(tmp_path)
        check_output("x/y.json", storage=storage, label="--out x/y.json")
    with pytest.raises(ConfigError, match="is a folder; give a file name"):
        check_output(tmp_path, DERIVED_FILE, storage=storage)
    assert check_output(tmp_path / "plots" / "deeper", FOLDER, storage=storage)  # made later
    with pytest.raises(ConfigError, match="is a file; give a folder"):
        check_output(mine, FOLDER, storage=storage)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.csv"]  # the probe is gone


def test_nothing_but_the_store_writes_in_a_hardware_folder(tmp_path: Path) -> None:
    from pytest_llmenergy.storage.store import DERIVED_FILE, FOLDER, check_output

    storage = Storage(tmp_path / ".llmenergy")
    run = save(storage, "base")
    before = run.read_bytes()
    for target, kind in [
        (run, DERIVED_FILE),  # the run itself
        (run.parent / "report.html", DERIVED_FILE),  # any file beside it
        (run.parent / ".0002.claimed", DERIVED_FILE),  # a claim marker's name
        (run.parent / "figures", FOLDER),  # a folder in it
        (run.parent, FOLDER),  # the hardware folder itself
        (storage.root / "other-hw" / "0001_x.json", DERIVED_FILE),  # a run's name, anywhere
    ]:
        (storage.root / "other-hw").mkdir(exist_ok=True)
        with pytest.raises(ConfigError, match="belongs to the store"):
            check_output(target, kind, storage=storage.root)
    # a run reached another way (a relative path, a symbolic link) is still the store's
    (tmp_path / "link").symlink_to(run.parent)
    with pytest.raises(ConfigError, match="belongs to the store"):
        check_output(tmp_path / "link" / "x.csv", DERIVED_FILE, storage=storage.root)
    # the root itself, and a folder of it without runs, are anyone's
    assert check_output(storage.root / "report.html", DERIVED_FILE, storage=storage.root)
    assert check_output(storage.root / "other-hw" / "notes.txt", storage=storage.root)
    assert run.read_bytes() == before


def test_a_saved_run_anywhere_is_never_replaced_by_a_derived_file(tmp_path: Path) -> None:
    from pytest_llmenergy.storage.store import DERIVED_FILE, check_output

    run = save(Storage(tmp_path / "store"), "base")
    copy = tmp_path / "kept.json"
    copy.write_bytes(run.read_bytes())
    with pytest.raises(ConfigError, match=r"kept\.json is a saved run \(pytest-llmenergy-run\)"):
        check_output(copy, DERIVED_FILE, storage=None)
    other = tmp_path / "other.json"
    other.write_text('{"format": "something-else"}')
    assert check_output(other, DERIVED_FILE, storage=None) == other


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("a" * 300 + ".json", "a name of 305 characters is too long for a file (at most 255)"),
        ("/".join(["d" * 200] * 25), "characters are too long (at most 4095)"),
        ("/proc/run.json", "cannot create files in /proc"),
        ("/dev/null", "/dev/null is not a regular file (a device or a pipe)"),
        ("", "an empty path"),
    ],
)
def test_unwritable_outputs_are_one_line(tmp_path: Path, path: str, needle: str) -> None:
    from pytest_llmenergy.storage.store import DERIVED_FILE, check_output

    if path.startswith("/proc") and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    with pytest.raises(ConfigError) as error:
        check_output(path, DERIVED_FILE, storage=tmp_path, label=f"--energy-json={path}")
    message = str(error.value)
    assert needle in message and "\n" not in message
    assert message.startswith("--energy-json=") and len(message) < 400  # a long path is cut


def test_long_names_are_refused_before_a_number_is_claimed(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    with pytest.raises(ConfigError, match="at most 200"):
        check_run_name("a" * 201)
    assert check_run_name("a" * 200) == "a" * 200
    long_run = storage.claim(HW, "a" * 200)  # the longest name still fits, temp file too
    long_run.write("{}")
    assert long_run.path.name == "0001_" + "a" * 200 + ".json"
    with pytest.raises(ConfigError, match="names no file"):
        storage.resolve("b" * 300)
