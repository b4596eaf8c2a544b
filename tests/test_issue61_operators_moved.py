"""The table of the operators whose counted work moved most lists only operators that
moved, and says so when none did (issue 61, item 9: it listed ``0.9 -> 0.9``)."""

from __future__ import annotations

from dataclasses import replace

from pytest_llmenergy.explain import explain_tables
from pytest_llmenergy.results import CaseResult, CountedWork, OpWork
from pytest_llmenergy.tables import Table
from tests.casefactory import make_case

SECONDS = [0.100, 0.101, 0.099, 0.100]


def work(mm_flops: float = 1000.0, extra: float = 0.0) -> CountedWork:
    """Nine operators, eight of which never change; ``extra`` moves one by a little."""
    still = tuple(OpWork(f"aten::op{i}", "elementwise", 9, 90.0, 900) for i in range(8))
    return CountedWork(
        prefill=(OpWork("aten::mm", "matmul", 4, mm_flops + extra, 800), *still), marked=False
    )


def case(w: CountedWork) -> CaseResult:
    return replace(make_case(SECONDS, input_tokens=8, output_tokens=2), work=w)


def ops_table(base: CaseResult, head: CaseResult) -> Table:
    (table,) = [t for t in explain_tables("t", base, head) if "operators whose" in t.title]
    return table


def test_only_the_operator_that_moved_is_listed() -> None:
    table = ops_table(case(work()), case(work(mm_flops=2000.0)))
    assert [row[0] for row in table.rows] == ["aten::mm"]
    assert all(" -> " in c for row in table.cells for c in row[2:])
    for row in table.cells:  # no listed operator reads the same on both sides
        assert any(a != b for a, b in (c.split(" -> ") for c in row[2:]))
    assert any("8 operator(s)" in n and "left out" in n for n in table.notes)


def test_a_change_that_rounds_away_is_no_move_and_the_table_says_none_moved() -> None:
    table = ops_table(case(work()), case(work(extra=1e-6)))
    assert table.keys == ("note",)
    (row,) = table.cells
    assert row[0].startswith("no operator moved")
