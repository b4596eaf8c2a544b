"""Keeping a session's run on disk as it grows, so that a crash keeps what was measured.

The run file is rewritten (atomically) after every finished case with status
``running``, and once more at the end with ``complete`` or ``interrupted``.  A session
killed outright leaves its last write: every case it finished, marked ``running``; the
file names its writer (host, pid, start time), so a reader on that host shows it as
``abandoned`` once that process is gone.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..results import CaseResult
from .runfile import COMPLETE, INTERRUPTED, RUNNING, Run, dumps, encode_case, this_writer
from .store import AtomicFile, Storage


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def jsonable(value: Any) -> Any:
    """Options and similar records as plain JSON values (dataclasses become objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    return str(value)


def autosave_name(commit: dict[str, Any], now: datetime | None = None) -> str:
    """``<commit>_<UTC time>[_uncommitted-changes]``, as pytest-benchmark names its saves."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S")
    if not commit.get("id"):
        return stamp
    name = f"{str(commit['id'])[:12]}_{stamp}"
    return name + "_uncommitted-changes" if commit.get("dirty") else name


@dataclass(frozen=True)
class Kept:
    """What one of a run's files holds after its latest write: the truth the session's
    summary tells (a write that failed leaves the file as its last good write left it)."""

    path: Path  # where it is: a numbered name beside ``asked`` if that was taken
    asked: Path
    cases: int = 0  # cases in the file on disk; 0 with status "": no file
    status: str = ""
    error: str = ""  # why the latest write failed; "" when it did not

    def line(self, measured: int) -> str:
        """One line: what was saved where, or what was not and why."""
        where = str(self.path)
        if self.path != self.asked:
            where += f" ({self.asked} was taken meanwhile, by another session?)"
        if not self.error:
            return f"saved {self.cases} case(s) to {where}"
        if not self.status:
            return f"not saved: {measured} case(s) measured, none written to {where}: {self.error}"
        if self.cases < measured:
            return (
                f"saved only {self.cases} of {measured} case(s) to {where}, marked "
                f"{self.status}: {self.error}"
            )
        return (
            f"saved {self.cases} case(s) to {where}, but it stays marked {self.status}: "
            f"{self.error}"
        )


class RunRecorder:
    """Writes one run to the storage folder and/or a JSON path, after every case."""

    def __init__(
        self,
        header: Run,
        *,
        storage: Storage | None = None,
        json_path: Path | None = None,
    ) -> None:
        self.run = header
        self.files: list[AtomicFile] = []
        if storage is not None:
            claimed = storage.claim(header.hardware, header.name)
            self.files.append(claimed)
            self.run = dataclasses.replace(self.run, run_id=claimed.path.name.split("_", 1)[0])
        if json_path is not None:  # another session may take the name first: go beside it
            self.files.append(AtomicFile(json_path, beside=True))
        self.kept = [Kept(f.path, f.path) for f in self.files]
        self._encoded: list[str] = []  # cases only ever get appended: encode each once

    @property
    def paths(self) -> list[Path]:
        return [f.path for f in self.files]

    @property
    def written_paths(self) -> list[Path]:
        return [f.path for f in self.files if f.written]

    @property
    def errors(self) -> list[str]:
        """One line per file whose latest write failed."""
        return [self._line(k) for k in self.kept if k.error]

    def summary(self) -> list[tuple[str, bool]]:
        """Each file's line, and whether it tells of a failure; nothing before a case."""
        if not self.run.cases:
            return []
        return [(self._line(k), bool(k.error)) for k in self.kept]

    def _line(self, kept: Kept) -> str:
        return kept.line(len(self.run.cases))

    def add(self, cases: Sequence[CaseResult]) -> None:
        self.run = dataclasses.replace(self.run, cases=tuple(cases))
        self._write()

    def finish(self, cases: Sequence[CaseResult], *, interrupted: bool, exit_status: int) -> None:
        self.run = dataclasses.replace(
            self.run,
            cases=tuple(cases),
            status=INTERRUPTED if interrupted else COMPLETE,
            finished=utc_now(),
            exit_status=exit_status,
        )
        if self.run.cases:
            self._write()

    def amend(self, **changes: Any) -> None:
        """Change header fields (a distributed job's layout, its final status) and rewrite
        the file if it holds cases."""
        self.run = dataclasses.replace(self.run, **changes)
        if self.run.cases:
            self._write()

    def _write(self) -> None:
        cases = self.run.cases
        if len(self._encoded) > len(cases):
            self._encoded = []
        self._encoded += [encode_case(c) for c in cases[len(self._encoded) :]]
        text = dumps(self.run, self._encoded)
        for i, f in enumerate(self.files):
            try:
                f.write(text)
            except OSError as exc:  # kept as it was: said once, at the end
                self.kept[i] = dataclasses.replace(
                    self.kept[i], path=f.path, error=exc.strerror or str(exc)
                )
            else:
                self.kept[i] = Kept(f.path, f.asked, len(cases), self.run.status)


def new_run(
    *,
    name: str,
    hardware: str,
    machine: dict[str, Any],
    commit: dict[str, Any],
    options: Any,
    meter: dict[str, Any],
    command: Sequence[str],
) -> Run:
    return Run(
        run_id="",
        name=name,
        created=utc_now(),
        status=RUNNING,
        hardware=hardware,
        machine=machine,
        commit=commit,
        options=jsonable(options),
        meter=meter,
        command=tuple(command),
        path=None,
        writer=this_writer(),
    )


__all__ = ["Kept", "RunRecorder", "autosave_name", "jsonable", "new_run"]
