"""The storage folder: ``.llmenergy/<hardware>/0001_<name>.json``, one folder per hardware.

Runs are numbered per folder.  A number is claimed with an exclusive create, so two
sessions saving at once get different numbers; a run file appears by an atomic link of
a complete temporary file, so it is never half-written and never replaces another run.
``AtomicFile`` is the one way anything is written; ``check_output`` says, before any
work, whether an output may go where it was asked (the hardware folders are the store's).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ConfigError
from ..values import shown
from .runfile import FORMAT, Run, RunFileError, load

DEFAULT_STORAGE = ".llmenergy"
STORAGE_HELP = f"storage folder of saved runs (default: {DEFAULT_STORAGE})"
_RUN_FILE = re.compile(r"^(\d{4,})_(.*)\.json$")
_CLAIM = re.compile(r"^\.(\d{4,})\.claimed$")
# fullmatch, never ``$``: ``$`` also matches before a final newline ("abc\n")
_NAME = re.compile(r"[A-Za-z0-9._-]+")


MAX_RUN_NAME = 200  # characters: NNNN_<name>.json must fit in one file name (255)


def check_run_name(name: str) -> str:
    """Run names become file names: letters, digits, '.', '_' and '-' only, and short
    enough for one (checked when the option is read, before a number is claimed)."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            f"bad run name {shown(name)!r}: use letters, digits, '.', '_' and '-' only, "
            "e.g. baseline"
        )
    if len(name) > MAX_RUN_NAME:
        raise ConfigError(
            f"bad run name {name[:20]}… ({len(name)} characters): at most {MAX_RUN_NAME}, "
            "as it becomes a file name"
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
    shared: bool = False  # another run file in its folder has the same number

    @property
    def run_id(self) -> str:
        return f"{self.number:04d}"

    @property
    def ref(self) -> str:
        """The shortest unambiguous way to name it anywhere: ``<hardware>/<number>``, or
        ``<hardware>/<file name>`` where its number is not its own (files copied in)."""
        return f"{self.hardware}/{self.path.stem if self.shared else self.run_id}"

    def load(self) -> Run:
        return load(self.path)


class AtomicFile:
    """A file written whole each time, so a reader never sees half of it.

    The text goes to a temporary file in the same folder (an unnamed one where Linux
    offers it, so a writer killed mid-write leaves nothing behind), is synced, and then
    appears at ``path`` in one step.  The first write fails with FileExistsError if
    anything is already at ``path``, so an existing run is never replaced; later writes
    replace this writer's own earlier ones.  A derived file (an export or a report, made
    again from a run at will) is ``derived``: its first write replaces what is there.
    With ``beside``, a first write that finds ``path`` taken (another session got there
    first) goes to ``<stem>-2<suffix>``, ``-3``, ... instead, and ``asked`` keeps the
    path that was asked for.  A failed write leaves no temporary file and leaves
    ``path`` as it was.
    """

    def __init__(self, path: Path, *, derived: bool = False, beside: bool = False) -> None:
        self.path = path
        self.asked = path
        self.written = derived
        self.beside = beside
        self._swept = False

    @property
    def temp_path(self) -> Path:
        """The named temporary file (where an unnamed one cannot be had, and for a
        replacement); the name is cut so that a long target name still fits."""
        return self.path.with_name(f".{self.path.name[:_TEMP_STEM]}.{os.getpid()}{_TEMP}")

    # Unnamed temporary files (Linux's O_TMPFILE, named through /proc/self/fd); off for
    # the process once the system refuses to name one.
    unnamed = bool(getattr(os, "O_TMPFILE", 0)) and os.path.isdir("/proc/self/fd")

    def write(self, text: str) -> None:
        if not self._swept:  # once: a crashed writer's leftovers at this name
            sweep_temps(self.path.parent, self.path.name[:_TEMP_STEM])
            self._swept = True
        data = text.encode("utf-8")
        try:
            if AtomicFile.unnamed:
                try:
                    self._write(data, unnamed=True)
                    return
                except _CannotName:
                    AtomicFile.unnamed = False
            self._write(data, unnamed=False)
        except OSError as exc:
            if exc.filename is not None:
                raise
            # a full disk says only "No space left on device": say where (the errno keeps
            # the error's class, FileExistsError included)
            raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(self.path)) from None

    def _write(self, data: bytes, *, unnamed: bool) -> None:
        fd, named = _open_temp(self, unnamed)
        try:
            _write_all(fd, data)
            os.fsync(fd)
            if named is None:  # unnamed: give it a name only to put it in place
                if self.written:
                    named = self.temp_path
                    with contextlib.suppress(FileNotFoundError):  # a recycled pid's leftover
                        named.unlink()
                    _link_fd(fd, named)
                    os.replace(named, self.path)
                else:
                    self._publish(lambda target: _link_fd(fd, target))
            elif self.written:
                os.replace(named, self.path)
            else:
                self._publish(lambda target: _publish_new(named, target))
            self.written = True
        finally:
            os.close(fd)
            if named is not None:
                with contextlib.suppress(OSError):  # gone after a replace; never mask why
                    named.unlink()

    def _publish(self, link: Callable[[Path], None]) -> None:
        """The first write: at ``path`` if it is free, else (``beside``) the first free
        numbered name beside it."""
        for n in itertools.count(1):
            target = self.asked if n == 1 else _numbered(self.asked, n)
            try:
                link(target)
            except FileExistsError:
                if not self.beside or n >= _MAX_BESIDE:
                    raise
                continue
            self.path = target
            return


_TEMP = ".tmp"
_MODE = 0o666  # as open() makes files: the umask decides (a team's storage may share)
_TEMP_STEM = 200  # characters of the target's name kept in a temporary file's name
_MAX_BESIDE = 999
_TEMP_FILE = re.compile(r"^\.(.+)\.(\d+)\.tmp$")
_STALE_S = 60.0  # a temporary file untouched this long, whose writer is gone, is litter


def _numbered(path: Path, n: int) -> Path:
    return path.with_name(f"{path.stem}-{n}{path.suffix}")


def _open_temp(owner: AtomicFile, unnamed: bool) -> tuple[int, Path | None]:
    """An unnamed temporary file in the target's folder (Linux: O_TMPFILE), else a named
    one, created exclusively and never through a symbolic link."""
    if unnamed:
        try:
            return os.open(owner.path.parent, os.O_TMPFILE | os.O_WRONLY, _MODE), None
        except OSError as exc:
            if exc.errno not in _NO_UNNAMED:
                raise  # the folder is missing or not writable: that is the answer
    named = owner.temp_path
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(named, flags, _MODE), named
    except FileExistsError:  # our own pid's leftover (a recycled pid): ours to remove
        named.unlink()
        return os.open(named, flags, _MODE), named


_PROC_FDS = "/proc/self/fd"
_NO_UNNAMED = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EISDIR, errno.EINVAL}


class _CannotName(Exception):
    """The system made an unnamed file but will not give it a name: use named ones."""


def _link_fd(fd: int, target: Path) -> None:
    """Give an unnamed file a name (fails if ``target`` exists)."""
    try:
        fds = os.open(_PROC_FDS, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        raise _CannotName from None
    try:
        os.link(str(fd), target, src_dir_fd=fds, follow_symlinks=True)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise _CannotName from None
        raise
    finally:
        os.close(fds)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _publish_new(tmp: Path, path: Path) -> None:
    """Make ``tmp`` appear at ``path`` in one step, failing if ``path`` exists."""
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        # a file system without hard links: claim the name, then replace the claim; a
        # claim that could not be filled is taken back, so nothing empty is left there
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            path.unlink()
            raise


_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV}


def sweep_temps(folder: Path, stem: str | None = None) -> None:
    """Remove temporary files that writers killed mid-write left in ``folder`` (only
    those named by ``AtomicFile``, of ``stem`` if given, whose process is gone and which
    nobody touched for a minute)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = _TEMP_FILE.match(name)
        if not match or (stem is not None and match[1] != stem) or _alive(int(match[2])):
            continue
        path = folder / name
        with contextlib.suppress(OSError):
            if time.time() - path.lstat().st_mtime > _STALE_S:
                path.unlink()


def _alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # Windows: signal 0 is not a probe there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # someone else's, or no pid at all
        return True
    return True


class Storage:
    """One storage root; folders are hardware keys (see ``machine.hardware_key``)."""

    def __init__(self, root: str | os.PathLike[str] = DEFAULT_STORAGE) -> None:
        self.root = Path(root)

    def runs(self, hardware: str | None = None) -> list[StoredRun]:
        """Every run file, by hardware then number; names only, nothing is read."""
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(
                f"storage {self.root} is a file, not a folder of saved runs; give the folder "
                f"(default {DEFAULT_STORAGE})"
            )
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
        counts = Counter((r.hardware, r.number) for r in found)
        found = [replace(r, shared=counts[r.hardware, r.number] > 1) for r in found]
        return sorted(found, key=lambda r: (r.hardware, r.number, r.path.name))

    def claim(self, hardware: str, name: str) -> AtomicFile:
        """Reserve the next number in ``hardware``'s folder for a run called ``name``."""
        check_run_name(name)
        check_hardware_key(hardware)
        folder = self.root / hardware
        folder.mkdir(parents=True, exist_ok=True)
        sweep_temps(folder)  # what sessions killed mid-write left
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
        too_long = len(os.fsencode(spec)) >= _PATH_MAX
        if too_long or any(len(os.fsencode(part)) > _NAME_MAX for part in Path(spec).parts):
            raise ConfigError(
                f"no saved run {shown(spec)!r}: a name that long ({len(spec)} characters) "
                "names no file; give a run's number, name or path"
            )
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
        if key.isdigit() and len(candidates) > 1:  # one number, several files: copied in
            names = ", ".join(r.path.name for r in candidates)
            raise ConfigError(
                f"run {spec!r} is ambiguous: {len(candidates)} files in "
                f"{self.root / folders[0]} have that number ({names}); name one by its file "
                f"name, e.g. {candidates[0].path.stem}"
            )
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


# -- output targets ------------------------------------------------------------------------
# Every file or folder the package writes besides the store's own run files (--energy-json,
# --energy-report, --energy-export, --energy-plots, llmenergy report/export/merge --out,
# ...) is checked here before anything is measured or computed.  The store's rule: the
# hardware folders of a storage root belong to the store alone.  Nothing else is written
# inside one (a folder that holds a run file or a claim marker, or any name shaped like
# one), and an existing run file anywhere is never replaced by a derived file.
#
# What an output option or argument names: a file that must not exist yet, a file made
# again from a run at will (an existing one is replaced, a saved run never), or a folder
# that new files are written into (made if need be).
NEW_FILE, DERIVED_FILE, FOLDER = "new file", "derived file", "folder"
_NAME_MAX = 255  # bytes in one name, where the file system does not say
_PATH_MAX = 4096
_RUN_SNIFF_BYTES = 65536  # where a run file's "format" field is looked for
_RUN_FORMAT = re.compile(rb'"format"\s*:\s*"' + re.escape(FORMAT.encode()) + rb'"')


def check_output(
    path: str | os.PathLike[str],
    kind: str = NEW_FILE,
    *,
    storage: str | os.PathLike[str] | None = DEFAULT_STORAGE,
    label: str | None = None,
) -> Path:
    """Whether an output may be written at ``path``: a ConfigError in one line if not.

    Refused: a name too long for the file system, a missing or unwritable folder, a
    place inside a hardware folder of ``storage`` (the store's), an existing file unless
    it is a DERIVED_FILE (a report, an export), and an existing run file even then.
    ``label`` (e.g. ``--energy-json=out.json``) begins the message; the path by default.
    """
    if kind not in (NEW_FILE, DERIVED_FILE, FOLDER):
        raise ValueError(f"unknown kind of output {kind!r}")  # a declaration mistake
    folder = kind == FOLDER
    text = os.fspath(path)
    said = shown(label or text)
    lead = f"{said}: " if label else ""
    if not text.strip():
        raise ConfigError(f"{said}: an empty path; give a file or folder name")
    _check_length(text, said)
    target = Path(text)
    place = target if folder else target.parent
    try:
        if folder:
            if target.exists() and not target.is_dir():
                raise ConfigError(f"{said}: is a file; give a folder")
        elif target.is_dir():
            raise ConfigError(f"{said}: is a folder; give a file name, e.g. report.html")
        elif not place.is_dir():
            raise ConfigError(f"{said}: folder {place} does not exist")
        owner = _hardware_folder(place, target.name, storage) if storage is not None else None
        if owner is not None:
            raise ConfigError(
                f"{said}: inside {owner}, which holds saved runs and belongs to the "
                "store; write it outside the storage folder's hardware folders"
            )
        if not folder and os.path.lexists(target):
            if os.path.exists(target) and not os.path.isfile(target):
                raise ConfigError(
                    f"{lead}{target} is not a regular file (a device or a pipe); give a file name"
                )
            if kind == NEW_FILE:
                raise ConfigError(
                    f"{lead}{target} already exists and is never replaced; choose a new path"
                )
            if _is_run_file(target):
                raise ConfigError(
                    f"{lead}{target} is a saved run ({FORMAT}); a derived file never replaces "
                    "one: choose another path"
                )
        writable = _existing(place)
        try:
            _probe(writable)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise ConfigError(f"{said}: cannot create files in {writable}: {why}") from None
    except OSError as exc:
        raise ConfigError(f"{said}: cannot write there: {exc.strerror or exc}") from None
    return target


def _check_length(text: str, said: str) -> None:
    """Too long for the file system: said now, not as an OSError after the session."""
    raw = os.fsencode(text)
    longest = max((os.fsencode(part) for part in Path(text).parts), key=len, default=b"")
    limit = _name_max(Path(text))
    if len(longest) > limit:
        raise ConfigError(
            f"{said}: a name of {len(longest)} characters is too long for a file "
            f"(at most {limit}); choose a shorter path"
        )
    if len(raw) >= _PATH_MAX:
        raise ConfigError(
            f"{said}: the path's {len(raw)} characters are too long (at most {_PATH_MAX - 1})"
        )


def _name_max(path: Path) -> int:
    try:
        return int(os.pathconf(_existing(path.parent), "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return _NAME_MAX


def _existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (where a new folder would be made)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _hardware_folder(place: Path, name: str, storage: str | os.PathLike[str]) -> Path | None:
    """The store's hardware folder ``place`` lies in (or is), if any."""
    root = Path(os.path.realpath(storage))
    real = Path(os.path.realpath(place))
    if real == root or root not in real.parents:
        return None
    folder = root / real.relative_to(root).parts[0]
    if real == folder and (_RUN_FILE.match(name) or _CLAIM.match(name)):
        return Path(storage) / folder.name  # a run's name, in a folder not holding one yet
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    if any(_RUN_FILE.match(n) or _CLAIM.match(n) for n in names):
        return Path(storage) / folder.name
    return None


def _is_run_file(path: Path) -> bool:
    """Does the file say it is a run file (its "format" field, near its start)?"""
    try:
        with open(path, "rb") as f:
            return bool(_RUN_FORMAT.search(f.read(_RUN_SNIFF_BYTES)))
    except OSError:
        return False


def _probe(folder: Path) -> None:
    """Create and remove a file in ``folder``: the one test of writability that also
    holds for root, read-only mounts and /proc."""
    probe = folder / f".llmenergy-probe.{os.getpid()}{_TEMP}"
    with contextlib.suppress(FileNotFoundError):  # our own pid's leftover
        probe.unlink()
    fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
    os.close(fd)
    probe.unlink()


__all__ = [
    "DERIVED_FILE",
    "FOLDER",
    "NEW_FILE",
    "AtomicFile",
    "RunFileError",
    "Storage",
    "StoredRun",
    "check_output",
    "check_run_name",
    "sweep_temps",
]
