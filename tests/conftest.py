"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
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


@pytest.hookimpl(optionalhook=True, trylast=True)
def pytest_configure_node(node: Any) -> None:
    """This suite's own workers do not take turns.  The plugin makes xdist workers run one
    test at a time where its meter sees the CPU (a worker's work would disturb another's
    trials); this suite measures nothing in its own session (its tests start sessions of
    their own, each with its own meter and lock), so the lock would only serialize it."""
    node.workerinput.pop(LOCK_KEY, None)


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


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions run by pytester print every column; tests of narrowing set COLUMNS."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Sessions run by pytester do not judge trials by the machine's load (these tests run
    beside each other, e.g. under xdist); tests of the busy-machine check turn it on with
    ``--energy-max-background``, which comes later on the command line and wins.  (Set
    here, after pytester cleared PYTEST_ADDOPTS.)"""
    monkeypatch.setenv("PYTEST_ADDOPTS", "--energy-max-background=off")
    return pytester
