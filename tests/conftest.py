"""Fixtures shared by the test modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of built-in tiny models for the whole test run (never the user's home)."""
    return tmp_path_factory.mktemp("llm-cache")


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
