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
