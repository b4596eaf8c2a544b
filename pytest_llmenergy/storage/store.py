"""The storage folder: ``.llmenergy/<hardware>/0001_<name>.json``, one folder per hardware.

Runs are numbered per folder.  A number is claimed with an exclusive create, so two
sessions saving at once get different numbers; a run file appears by an atomic link of
a complete temporary file, so it is never half-written and never replaces another run.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .runfile import Run, RunFileError, load

DEFAULT_STORAGE = ".llmenergy"
STORAGE_HELP = f"storage folder of saved runs (default: {DEFAULT_STORAGE})"
_RUN_FILE = re.compile(r"^(\d{4,})_(.*)\.json$")
_CLAIM = re.compile(r"^\.(\d{4,})\.claimed$")
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def check_run_name(name: str) -> str:
    """Run names become file names: letters, digits, '.', '_' and '-' only."""
    if not _NAME.match(name) or name in (".", ".."):
        raise ConfigError(
            f"bad run name {name!r}: use letters, digits, '.', '_' and '-' only, e.g. baseline"
        )
    return name


def check_hardware_key(key: str) -> str:
    """A hardware key names one folder inside the storage root, never a path out of it."""
    if not key or "/" in key or "\\" in key or key in (".", "..") or Path(key).is_absolute():
        raise ConfigError(
            f"bad hardware key {key!r}: a folder name inside the storage folder, "
            "as `llmenergy list` shows it"
        )
    return key


def _is_key(text: str) -> bool:
    try:
        check_hardware_key(text)
    except ConfigError:
        return False
    return True


@dataclass(frozen=True)
class StoredRun:
    """A run file in the storage folder, known by its name before it is read."""

    path: Path
    hardware: str
    number: int
    name: str

    @property
    def run_id(self) -> str:
        return f"{self.number:04d}"

    @property
    def ref(self) -> str:
        """The shortest unambiguous way to name it anywhere: ``<hardware>/<number>``."""
        return f"{self.hardware}/{self.run_id}"

    def load(self) -> Run:
        return load(self.path)


class AtomicFile:
    """A file written whole each time: a temp file beside it, then link (first) or rename.

    The first write fails with FileExistsError if anything is already at ``path``, so an
    existing run is never replaced; later writes replace this writer's own earlier ones.
    A derived file (an export, made again from a run at will) is ``derived``: its first
    write replaces what is there, still in one step.
    """

    def __init__(self, path: Path, *, derived: bool = False) -> None:
        self.path = path
        self.written = derived

    def write(self, text: str) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            if self.written:
                os.replace(tmp, self.path)
                self.written = True
            else:
                _publish_new(tmp, self.path)
                self.written = True
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def _publish_new(tmp: Path, path: Path) -> None:
    """Make ``tmp`` appear at ``path`` in one step, failing if ``path`` exists."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: claim the name, then replace
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        os.replace(tmp, path)


class Storage:
    """One storage root; folders are hardware keys (see ``machine.hardware_key``)."""

    def __init__(self, root: str | os.PathLike[str] = DEFAULT_STORAGE) -> None:
        self.root = Path(root)

    def runs(self, hardware: str | None = None) -> list[StoredRun]:
        """Every run file, by hardware then number; names only, nothing is read."""
        if hardware is not None:
            check_hardware_key(hardware)
            folders = [self.root / hardware]
        elif self.root.is_dir():
            folders = sorted(p for p in self.root.iterdir() if p.is_dir())
        else:
            folders = []
        found = []
        for folder in folders:
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                match = _RUN_FILE.match(path.name)
                if match and path.is_file():
                    found.append(StoredRun(path, folder.name, int(match[1]), match[2]))
        return sorted(found, key=lambda r: (r.hardware, r.number, r.name))

    def claim(self, hardware: str, name: str) -> AtomicFile:
        """Reserve the next number in ``hardware``'s folder for a run called ``name``."""
        check_run_name(name)
        check_hardware_key(hardware)
        folder = self.root / hardware
        folder.mkdir(parents=True, exist_ok=True)
        number = self._highest(folder) + 1
        while True:
            marker = folder / f".{number:04d}.claimed"
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                number += 1
                continue
            os.close(fd)
            path = folder / f"{number:04d}_{name}.json"
            if not path.exists():
                return AtomicFile(path)
            number += 1  # a run file without its marker (copied in by hand): skip it

    @staticmethod
    def _highest(folder: Path) -> int:
        highest = 0
        for path in folder.iterdir():
            match = _RUN_FILE.match(path.name) or _CLAIM.match(path.name)
            if match:
                highest = max(highest, int(match[1]))
        return highest

    def latest(self, hardware: str, *, exclude: Path | None = None) -> StoredRun | None:
        runs = [r for r in self.runs(hardware) if exclude is None or r.path != exclude]
        return runs[-1] if runs else None

    def resolve(self, spec: str, *, hardware: str | None = None) -> Path:
        """A path, ``0003``, ``0003_name``, a run name, or ``<hardware>/<any of those>``.

        ``hardware``'s folder is searched first; a name saved more than once means its
        latest run.  Not found or ambiguous: a ConfigError that says what exists.
        """
        spec = spec.strip()
        if spec.endswith(".json") and Path(spec).is_file():
            return Path(spec)
        key = spec.removesuffix(".json")  # a run file's name, as `llmenergy list` shows
        folder, _, key = key.rpartition("/")
        if folder:
            candidates = self._matching(self.runs(folder), key) if _is_key(folder) else []
        else:
            candidates = []
            if hardware is not None:
                candidates = self._matching(self.runs(hardware), key)
            if not candidates:
                candidates = self._matching(self.runs(), key)
        if not candidates:
            if spec.endswith(".json"):
                raise RunFileError(
                    spec, f"no such run file, nor a saved run of that name in {self.root}"
                )
            raise ConfigError(
                f"no saved run {spec!r} in {self.root} ({self._saved_text()}); save one with "
                "--energy-save=NAME or --energy-autosave, or pass a run file's path"
            )
        folders = sorted({r.hardware for r in candidates})
        if len(folders) > 1:
            refs = ", ".join(f"{h}/{key}" for h in folders)
            raise ConfigError(f"run {spec!r} exists for several machines; say which: {refs}")
        return candidates[-1].path

    def _saved_text(self, shown: int = 5) -> str:
        """``saved: 0001_base, 0002_head``: the runs, each as it can be named here (its
        file name; with the hardware folder when there are several); the last few of
        ``llmenergy list`` when there are many."""
        runs = self.runs()
        if not runs:
            return "none saved yet"
        several = len({r.hardware for r in runs}) > 1
        names = [f"{r.hardware}/{r.path.stem}" if several else r.path.stem for r in runs]
        if len(names) <= shown:
            return f"saved: {', '.join(names)}"
        return (
            f"{len(names)} saved, the last {shown} of llmenergy list: {', '.join(names[-shown:])}"
        )

    @staticmethod
    def _matching(runs: list[StoredRun], key: str) -> list[StoredRun]:
        if key.isdigit():
            return [r for r in runs if r.number == int(key)]
        return [r for r in runs if key in (r.name, r.path.stem)]

    def load(self, spec: str, *, hardware: str | None = None) -> Run:
        return load(self.resolve(spec, hardware=hardware))


__all__ = ["AtomicFile", "RunFileError", "Storage", "StoredRun", "check_run_name"]
