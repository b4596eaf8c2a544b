"""pytest-xdist: one session spread over worker processes, one run, one table, one gate.

* The controller chooses the case order's seed and hands it to every worker, so every
  worker collects the same cases in the same order (xdist requires it).
* Workers measure; the controller keeps: each finished case travels to the controller
  inside its test report (``user_properties``) as run-file JSON, and the controller's
  results, tables, run file and gates take it from there.  Workers save nothing.
* Workers take turns on a shared meter: a case holds a lock file from its warm-up to its
  last trial; the wait is outside every measurement window.  A meter that sees the CPU
  (RAPL, the estimate, ...) sees every worker's work, and another worker loading a model
  or building prompts would disturb the trials (and be counted as busy), so with such a
  meter a worker holds the lock for its collection and for each whole test: the workers
  run one test at a time, and ``-n`` gains nothing (the header says so).  GPU-only meters
  keep the lock around the measured part alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..meters.base import Meter
from ..results import CaseResult
from ..storage.runfile import RunFileError, case_dict, decode_case
from .session import header_lines

SEED_KEY = "llmenergy_seed"
LOCK_KEY = "llmenergy_lock"
CASE_PROPERTY = "llmenergy_case"
SHARD_KEY = "llmenergy_shard"  # a worker's word on its --llm-shard part (workeroutput)


def sees_cpu(meter: Meter) -> bool:
    """Does the meter count any domain besides GPUs (a CPU package, the process)?"""
    return any(d.counted and not name.startswith("gpu") for name, d in meter.domains.items())


def xdist_header(config: pytest.Config, meter: Meter | None) -> list[str]:
    """The header's word on ``-n`` with a meter that sees the CPU."""
    n = getattr(config.option, "numprocesses", None)
    if not n or meter is None or not sees_cpu(meter):
        return []
    return [
        f"pytest-xdist: {n} workers take turns, one test at a time: the meter sees the CPU, "
        "where another worker's work would disturb the trials; -n gains nothing here"
    ]


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_seed(config: pytest.Config) -> int | None:
    """The controller's seed, on a worker."""
    if not is_worker(config):
        return None
    value = config.workerinput.get(SEED_KEY)  # type: ignore[attr-defined]
    return int(value) if value is not None else None


@contextlib.contextmanager
def exclusive(path: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) while the block runs."""
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class Workers:
    """Controller side: hands out the seed and the lock; gathers the workers' cases."""

    def __init__(self, seed: int, on_case: Callable[[CaseResult], None]) -> None:
        self.seed = seed
        self._on_case = on_case
        self._dir = tempfile.mkdtemp(prefix="llmenergy-xdist-")
        self.lock_path = os.path.join(self._dir, "meter.lock")
        self.received = 0
        # by test, for the summary (each phase's report carries the test's properties)
        self.unreadable: dict[str, str] = {}
        # --llm-shard's note: the workers split the cases, the controller never sees them
        self.shard_notes: dict[str, None] = {}

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[SEED_KEY] = self.seed
        node.workerinput[LOCK_KEY] = self.lock_path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == CASE_PROPERTY and isinstance(value, str):
                self.received += 1
                try:
                    case = decode_case(value, f"{report.nodeid}: its worker's report")
                except RunFileError as exc:  # a test can write its own user_properties
                    self.unreadable[report.nodeid] = str(exc)
                    continue
                self._on_case(case)

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        note = getattr(node, "workeroutput", {}).get(SHARD_KEY)
        if isinstance(note, str) and note:
            self.shard_notes[note] = None

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        config = terminalreporter.config
        for part in header_lines(config, list(self.shard_notes)):  # every worker alike: once
            terminalreporter.write_line(part)
        unreadable = [
            f"{line}; that case is left out of this run" for line in self.unreadable.values()
        ]
        for part in header_lines(config, unreadable):
            terminalreporter.write_line(part, red=True)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        with contextlib.suppress(OSError):
            Path(self.lock_path).unlink(missing_ok=True)
            os.rmdir(self._dir)


class WorkerSide:
    """Worker side: sends each finished case to the controller with its test's report."""

    def __init__(self, config: pytest.Config, meter: Callable[[], Meter | None]) -> None:
        self.lock_path: str | None = config.workerinput.get(LOCK_KEY)  # type: ignore[attr-defined]
        self._pending: dict[str, CaseResult] = {}
        self._meter = meter
        self._held = False  # the whole test holds the lock: a case must not take it again

    def on_case(self, result: CaseResult) -> None:
        self._pending[result.nodeid] = result

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        if self._held or not self.lock_path:
            return contextlib.nullcontext()
        return exclusive(self.lock_path)

    @contextlib.contextmanager
    def _whole(self) -> Iterator[None]:
        """The lock around everything this worker does, when the meter sees the CPU."""
        meter = self._meter()
        if self.lock_path is None or self._held or meter is None or not sees_cpu(meter):
            yield
            return
        with exclusive(self.lock_path):
            self._held = True
            try:
                yield
            finally:
                self._held = False

    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionstart(self, session: pytest.Session) -> Any:
        """Opening the meter measures idle power: not while another worker starts up."""
        if self.lock_path is None:
            yield
            return
        with exclusive(self.lock_path):
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collection(self, session: pytest.Session) -> Any:
        with self._whole():  # importing torch and the tests is CPU work too
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        with self._whole():  # setup (loading a model), call, teardown
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        result = self._pending.pop(item.nodeid, None)
        if result is not None:
            text = json.dumps(case_dict(result), allow_nan=False)
            report.user_properties.append((CASE_PROPERTY, text))


WORKER_SIDE = pytest.StashKey[WorkerSide]()
