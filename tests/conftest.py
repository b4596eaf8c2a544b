"""Fixtures shared by the test modules."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.plugin.workers import LOCK_KEY


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``python -m pytest`` (the whole suite: no file named) runs on pytest-xdist's workers,
    one a CPU, tests handed out one by one; ``-n`` chooses otherwise (``-n 0``: one
    process).  Named files and folders run in one process as given: the energy suite
    (``benchmarks/``), the engine and Slurm tiers and ``tests/perf`` measure, and one
    file's tests are not worth the workers' start.  (Runs before xdist's own hook, which
    turns the number into workers.)"""
    if (
        config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and config.pluginmanager.hasplugin("xdist")
        and not hasattr(config, "workerinput")  # a worker: its controller chose
        and config.option.numprocesses is None  # no -n given
        and not config.option.usepdb
        and not config.option.collectonly
    ):
        config.option.numprocesses = "auto"
        if config.option.dist == "no":
            config.option.dist = "loadgroup"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``python -m pytest`` (the whole suite, no file named) leaves out the ``slow`` tier:
    minutes-long runs of whole commands, which ``python -m pytest -m slow`` runs after it
    (``.ci/run`` does both).  A file named on the command line runs all of its tests."""
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return
    if "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


# The folder of the lock that ``serial`` tests hold alone (made on xdist's controller).
SERIAL_DIR = pytest.StashKey[str]()
SERIAL_KEY = "llmenergy_tests_serial_lock"


@pytest.hookimpl(optionalhook=True, trylast=True)
def pytest_configure_node(node: Any) -> None:
    """This suite's own workers do not take the plugin's turns, only ``serial`` tests'.

    The plugin makes xdist workers run one test at a time where its meter sees the CPU (a
    worker's work would disturb another's trials); this suite measures nothing in its own
    session (its tests start sessions of their own, each with its own meter and lock), so
    that lock would only serialize it."""
    node.workerinput.pop(LOCK_KEY, None)
    stash = node.config.stash
    if SERIAL_DIR not in stash:
        stash[SERIAL_DIR] = tempfile.mkdtemp(prefix="llmenergy-tests-")
    node.workerinput[SERIAL_KEY] = os.path.join(stash[SERIAL_DIR], "serial.lock")


def pytest_unconfigure(config: pytest.Config) -> None:
    if SERIAL_DIR in config.stash:
        shutil.rmtree(config.stash[SERIAL_DIR], ignore_errors=True)


@contextlib.contextmanager
def _turn(path: str, alone: bool) -> Iterator[None]:
    """Run beside other workers' tests (a shared lock), or alone (an exclusive one).  A test
    waiting to run alone holds the gate, so no new test starts meanwhile and it is not
    starved by the others' shared locks."""
    with open(path + ".gate", "a+b") as gate, open(path, "a+b") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Under xdist a test marked ``serial`` runs with no other test beside it (setup,
    call and teardown): it loads the machine itself, or reads its figures off the
    machine's load; every other test runs beside the other workers' tests."""
    path = getattr(item.config, "workerinput", {}).get(SERIAL_KEY)
    if path is None:
        return (yield)
    with _turn(path, alone=item.get_closest_marker("serial") is not None):
        return (yield)


@pytest.fixture(scope="session")
def tiny_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of built-in tiny models for the whole test run (never the user's home).

    Under pytest-xdist the workers share it: each model is then built once a run, not once
    a worker (``ensure_tiny_model`` renames a finished build into place, so a worker never
    reads another's half-written model)."""
    if hasattr(request.config, "workerinput"):
        shared = tmp_path_factory.getbasetemp().parent / "llm-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("llm-cache")


@pytest.fixture(autouse=True)
def not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions a test starts (pytester's, subprocesses) are a user's, not xdist workers,
    when this suite itself runs under xdist: a worker's PYTEST_XDIST_* variables would make
    pytest-benchmark take them for workers too."""
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        monkeypatch.delenv(name)


# Sessions a test starts need no property-based testing of their own: hypothesis's pytest
# plugin, which every session loads, took 1.0-1.8 s of each session's start (an empty
# session: 2.4-3.6 s with it, 1.4-2.1 s without; test_cli.py and test_exit_codes.py on two
# workers: 92-100 s with it, 66-69 s without).
NESTED_ADDOPTS = "-p no:hypothesispytest"


@pytest.fixture(autouse=True)
def lean_nested_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions a test starts (subprocesses, the commands' own sides) load no
    hypothesis plugin; a test's own PYTEST_ADDOPTS replaces this one."""
    monkeypatch.setenv("PYTEST_ADDOPTS", NESTED_ADDOPTS)


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions run by pytester print every column, and a message stays on one line
    (every line is fitted to the terminal, errors too: a temporary path makes them
    long); tests of narrowing set COLUMNS."""
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Sessions run by pytester do not judge trials by the machine's load (these tests run
    beside each other, e.g. under xdist); tests of the busy-machine check turn it on with
    ``--energy-max-background``, which comes later on the command line and wins.  (Set
    here, after pytester cleared PYTEST_ADDOPTS.)"""
    monkeypatch.setenv("PYTEST_ADDOPTS", f"{NESTED_ADDOPTS} --energy-max-background=off")
    return pytester
