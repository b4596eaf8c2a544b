"""A comparison's ratio and change are one number, the machine's speed taken out of both,
in the HTML report and in ``llmenergy compare``'s table, and the report's note says what
each column is (issue 61, item 9: ``0.757x`` beside ``-5.9 %``)."""

from __future__ import annotations

import math

import pytest

from pytest_llmenergy.compare import CompareOptions, Comparison, compare_cases
from pytest_llmenergy.comparison_text import comparison_table
from pytest_llmenergy.html import render_report
from pytest_llmenergy.html.casedata import comparison_rows
from pytest_llmenergy.tables import render
from tests.casefactory import synthetic_run
from tests.test_speed_normalization import GATES, session

pytest.importorskip("vl_convert")


def normalized(work: float, machine: float) -> Comparison:
    """Six CPU-measured cases, the current run's machine ``machine`` times slower and its
    code ``work`` times costlier: the figures are normalized by the machine's speed."""
    return compare_cases(
        session(1.0, 1.0),
        session(work, machine),
        CompareOptions(gates=GATES, session_noise=0.05),
    )


def test_the_reports_change_is_its_ratio_less_one() -> None:
    c = normalized(1.1, 1.3)  # +10 % work on a machine 30 % slower: the means +43 %
    rows = comparison_rows(c)
    assert rows
    for r, d in zip(rows, c.deltas):
        assert r["change_value"] == pytest.approx(r["ratio_value"] - 1)
        assert r["change"] == f"{(r['ratio_value'] - 1) * 100:+.1f} %"
        assert r["ratio_value"] == pytest.approx(1.1, rel=1e-6)  # the work, not the machine
        assert d.current.mean / d.baseline.mean == pytest.approx(1.43, rel=1e-6)
        assert r["speed"] == "1.3\u00d7"


def test_the_terminal_table_shows_the_same_change_and_says_so() -> None:
    c = normalized(1.1, 1.3)
    table = comparison_table(c)
    change = table.keys.index("change")
    assert [row[change] for row in table.cells] == ["+10.0 %"] * len(c.deltas)
    assert [row[change] for row in table.rows] == pytest.approx([0.1] * len(c.deltas))
    text = render([table], "table", width=200)
    assert "the machine's speed taken out" in text


def test_the_reports_note_says_what_each_column_is() -> None:
    c = normalized(1.1, 1.3)
    page = render_report([synthetic_run(6), synthetic_run(6, seed=2)], ["a", "b"], [c])
    assert "change: the same ratio as a percentage (ratio - 1)" in page
    assert "the machine&#x27;s speed taken out" in page
    assert "machine speed" in page  # the column


def test_without_normalization_nothing_mentions_the_speed() -> None:
    base, head = synthetic_run(6, seed=1), synthetic_run(6, seed=2, slower=1.2)
    c = compare_cases(base.cases, head.cases, CompareOptions(gates=GATES))
    rows = comparison_rows(c)
    assert all(r["speed"] == "" for r in rows)
    for r in rows:
        if r["ratio_value"] is not None:
            assert math.isclose(r["change_value"], r["ratio_value"] - 1)
    page = render_report([base, head], ["base", "head"], [c])
    assert "speed taken out" not in page
    text = render([comparison_table(c)], "table", width=200)
    assert "speed taken out" not in text
