"""pytest-xdist: one session spread over worker processes, one run, one table, one gate.

* The controller chooses the case order's seed and hands it to every worker, so every
  worker collects the same cases in the same order (xdist requires it).
* Workers measure; the controller keeps: each finished case travels to the controller
  inside its test report (``user_properties``) as run-file JSON, and the controller's
  results, tables, run file and gates take it from there.  Workers save nothing.
* Workers take turns on a shared meter: a CPU meter sees the whole machine (or the whole
  package), so a case holds a lock file from its warm-up to its last trial; the wait is
  outside every measurement window.
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

from ..results import CaseResult
from ..storage.runfile import case_dict, decode_case

SEED_KEY = "llmenergy_seed"
LOCK_KEY = "llmenergy_lock"
CASE_PROPERTY = "llmenergy_case"


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

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[SEED_KEY] = self.seed
        node.workerinput[LOCK_KEY] = self.lock_path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == CASE_PROPERTY and isinstance(value, str):
                self.received += 1
                self._on_case(decode_case(value))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        with contextlib.suppress(OSError):
            Path(self.lock_path).unlink(missing_ok=True)
            os.rmdir(self._dir)


class WorkerSide:
    """Worker side: sends each finished case to the controller with its test's report."""

    def __init__(self, config: pytest.Config) -> None:
        self.lock_path: str | None = config.workerinput.get(LOCK_KEY)  # type: ignore[attr-defined]
        self._pending: dict[str, CaseResult] = {}

    def on_case(self, result: CaseResult) -> None:
        self._pending[result.nodeid] = result

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return exclusive(self.lock_path) if self.lock_path else contextlib.nullcontext()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        result = self._pending.pop(item.nodeid, None)
        if result is not None:
            text = json.dumps(case_dict(result), allow_nan=False)
            report.user_properties.append((CASE_PROPERTY, text))


WORKER_SIDE = pytest.StashKey[WorkerSide]()
