"""Generic tables: fitting the terminal, legends, number formats, wrapping."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_llmenergy.stats import Summary
from pytest_llmenergy.tables import Table, fmt_mean_ci, fold, render, terminal_width, wrap


def wide_table(**kwargs: object) -> Table:
    """Eight columns of 12-character cells; priorities 0, 0, 1, 2, 3, 4, 5, 5."""
    keys = tuple(f"k{i}" for i in range(8))
    headers = tuple(f"col{i}" for i in range(8))
    rows = tuple(tuple(float(r * 10 + i) for i in range(8)) for r in range(3))
    cells = tuple(tuple(f"{v:012.3f}" for v in row) for row in rows)
    defaults: dict[str, object] = {
        "title": "a title that is fairly long " * 4,
        "keys": keys,
        "headers": headers,
        "rows": rows,
        "cells": cells,
        "priorities": (0, 0, 1, 2, 3, 4, 5, 5),
    }
    defaults.update(kwargs)
    return Table(**defaults)  # type: ignore[arg-type]


@pytest.mark.parametrize("width", [30, 60, 80, 100, 200])
def test_every_line_fits_the_width(width: int) -> None:
    text = render([wide_table()], "table", width=width, narrow_hint="choose with --columns")
    assert all(len(line) <= width for line in text.splitlines()), text


def test_the_highest_priorities_go_first_and_are_named_in_table_order() -> None:
    # every column is 12 wide plus 2 of separation: 8 columns need 110 characters
    text = render([wide_table()], "table", width=60)
    header = next(line for line in text.splitlines() if "col0" in line)
    assert header.split() == ["col0", "col1", "col2", "col3"]  # 4 x 12 + 3 x 2 = 54
    assert "columns left out to fit 60 characters: col4, col5, col6, col7" in text.replace(
        "\n  ", " "
    )
    # the two priority-5 columns tie: the rightmost went first
    text = render([wide_table()], "table", width=97)
    header = next(line for line in text.splitlines() if "col0" in line)
    assert header.split() == ["col0", "col1", "col2", "col3", "col4", "col5", "col6"]
    assert "left out to fit 97 characters: col7" in text


def test_priority_zero_columns_stay_even_when_nothing_fits() -> None:
    text = render([wide_table()], "table", width=20)
    header = next(line for line in text.splitlines() if "col0" in line)
    assert header.split() == ["col0", "col1"]  # 26 wide: over, but priority 0 stays
    assert "col2, col3, col4, col5, col6, col7" in text.replace("\n  ", " ")


def test_the_hint_says_how_to_choose() -> None:
    text = render([wide_table()], "table", width=70, narrow_hint="choose with --columns")
    assert "; choose with --columns" in text.replace("\n  ", " ")
    assert "choose with" not in render([wide_table()], "table", width=200)


def test_hidden_columns_stay_hidden_and_data_formats_keep_every_column() -> None:
    table = wide_table(hidden=("k1",))
    assert "col1" not in render([table], "table", width=200)
    for fmt in ("csv", "json", "markdown"):
        assert render([table], fmt, width=40) == render([table], fmt)
    data = json.loads(render([table], "json", width=40))
    assert data["tables"][0]["columns"] == [f"k{i}" for i in range(8)]


def test_without_a_width_the_text_is_the_plain_table() -> None:
    table = Table(
        title="t",
        keys=("a", "b"),
        headers=("name", "J"),
        rows=(("x", 1.5), ("yy", 12.0)),
        cells=(("x", "1.5"), ("yy", "12")),
        notes=("a note",),
    )
    # columns as wide as their widest cell or header, two spaces apart
    assert render([table]) == "t\nname    J\n----  ---\nx     1.5\nyy     12\na note"


def test_a_legend_is_printed_once_after_the_last_table() -> None:
    one = Table("one", ("a",), ("A",), ((1,),), (("1",),), notes=("n1",), legend=("L", "only1"))
    two = Table("two", ("a",), ("A",), ((2,),), (("2",),), legend=("L",))
    text = render([one, two])
    # issue 61: every line once, at the end, one table's own too; notes under their table
    assert text.endswith("two\nA\n-\n2\n\nL\nonly1")
    assert text.count("only1") == 1 and text.index("n1") < text.index("two")
    alone = render([one])  # one table: its legend under it, then its notes
    assert alone.index("only1") < alone.index("n1")
    markdown = render([one], "markdown")
    assert "> L" in markdown and "> only1" in markdown


def test_wrap() -> None:
    assert wrap("short", 80) == ["short"]
    assert wrap("x" * 200, None) == ["x" * 200]
    lines = wrap("llmenergy: " + "word " * 30, 40, indent="    ")
    assert all(len(line) <= 40 for line in lines) and len(lines) > 1
    assert all(line.startswith("    ") for line in lines[1:])
    long = "a-very-long-hyphenated-word-that-does-not-fit-in-twenty"
    assert wrap(f"see {long} here", 20) == ["see", f"  {long}", "  here"]


def test_terminal_width_honours_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "123")
    assert terminal_width() == 123
    monkeypatch.setenv("COLUMNS", "10")
    assert terminal_width() == 40


def test_the_width_is_a_bound_not_a_target() -> None:
    # 8 columns of 12 with 2 between: exactly 110 fits whole, 109 loses the rightmost 5
    whole = render([wide_table()], "table", width=110)
    assert "left out" not in whole
    assert max(len(line) for line in whole.splitlines()) == 110
    lines = render([wide_table(title="t")], "table", width=109).splitlines()
    assert lines[-1] == "columns left out to fit 109 characters: col7"


def test_marks_in_cells_count_as_one_character() -> None:
    headers = ("case", "J ± CI", "ok", "approx", "trend")
    cells = tuple(
        (f"case-{i}", f"{i}.25 ± 0.0{i}", "\u2713", f"~{i}00", "\u2014") for i in range(1, 4)
    )
    rows = tuple((c[0], float(i), True, float(i), None) for i, c in enumerate(cells))
    keys = ("c", "j", "ok", "ap", "tr")
    table = Table("marks", keys, headers, rows, cells, priorities=(0, 0, 1, 2, 3))
    full = max(len(line) for line in render([table]).splitlines())
    assert "left out" not in render([table], width=full)
    narrowed = render([table], width=full - 1)
    assert all(len(line) <= full - 1 for line in narrowed.splitlines()), narrowed
    assert "columns left out to fit" in narrowed and "trend" in narrowed.splitlines()[-1]


def test_legend_and_notes_are_wrapped_under_the_table() -> None:
    legend = ("\u2713 means the case passed; " + "a legend that goes on " * 5,)
    notes = ("a note that goes on and on " * 5,)
    table = wide_table(title="t", legend=legend, notes=notes)
    for width in (40, 60, 80):
        text = render([table], width=width, narrow_hint="choose with --energy-columns")
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines), text
        body_end = max(i for i, line in enumerate(lines) if line.startswith("0000"))
        legend_at = next(i for i, line in enumerate(lines) if line.startswith("\u2713"))
        left_out_at = next(i for i, line in enumerate(lines) if line.startswith("columns left"))
        notes_at = next(i for i, line in enumerate(lines) if line.startswith("a note"))
        assert body_end < legend_at < left_out_at < notes_at
        assert all(line.startswith("  ") for line in lines[legend_at + 1 : left_out_at])
        assert all(line.startswith("  ") for line in lines[notes_at + 1 :])


def test_a_hidden_column_is_neither_shown_nor_named_as_left_out() -> None:
    table = wide_table(title="t", hidden=("k7",))
    text = render([table], width=60)
    assert "col7" not in text
    assert text.splitlines()[-1] == "columns left out to fit 60 characters: col4, col5, col6"


def test_each_table_is_narrowed_on_its_own() -> None:
    small = Table("small", ("a", "b"), ("A", "B"), ((1, 2),), (("1", "2"),), priorities=(0, 9))
    text = render([wide_table(title="wide"), small], width=60)
    assert all(len(line) <= 60 for line in text.splitlines()), text
    assert text.count("columns left out") == 1
    assert text.endswith("small\nA  B\n-  -\n1  2")


@pytest.mark.parametrize(
    ("mean", "half_width", "text"),
    [
        (0.009282, 0.00096, "0.00928 ± 0.00096"),  # digits below the CI's are noise
        (10.17, 0.41, "10.17 ± 0.41"),
        (0.51, 0.022, "0.510 ± 0.022"),  # the CI's precision, trailing zero kept
        (2.024, 0.0042, "2.024 ± 0.0042"),  # never more than four significant digits
        (250.3, 12.0, "250 ± 12"),
        (1.0, 0.0, "1 ± 0"),
    ],
)
def test_a_mean_is_rounded_where_its_interval_is(mean: float, half_width: float, text: str):
    assert fmt_mean_ci(Summary(3, mean, 0.0, half_width, 0.95)) == text


def test_a_lone_trial_has_no_interval() -> None:
    assert fmt_mean_ci(Summary(1, 2.5, float("nan"), float("inf"), 0.95)) == "2.5"


# -- issue 54: folding, and a legend that follows its columns ---------------------------------
def test_fold_breaks_at_spaces_then_inside_a_test_id() -> None:
    prose = "no RAPL zones under /sys/class/powercap (not a Linux machine with Intel/AMD RAPL)"
    lines = fold(prose, 30)
    assert all(len(line) <= 30 for line in lines) and " ".join(lines) == prose
    name = "test_input_tokens[tiny-llama-in256-out32]"
    lines = fold(name, 24)
    assert lines == ["test_input_tokens[tiny-", "llama-in256-out32]"]
    assert fold("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]  # no break: cut
    assert fold(name, 60) == [name]


def reasons_table(wraps: tuple[tuple[str, int, int], ...]) -> Table:
    why = "the amdsmi Python package is not installed: install the one that comes with ROCm"
    return Table(
        "meters",
        ("backend", "why", "res", "idle"),
        ("backend", "why not", "resolution", "idle W"),
        (("amdsmi", why, None, None), ("estimate", "reads the CPU time", 1e-3, 0.5)),
        (("amdsmi", why, "—", "—"), ("estimate", "reads the CPU time", "1 ms", "0.5")),
        priorities=(0, 0, 1, 1),
        wraps=wraps,
    )


def test_prose_folds_before_the_figures_beside_it_are_left_out() -> None:
    plain = render([reasons_table(())], width=60).splitlines()
    assert "left out" in plain[-1]  # without folding, the figures went
    text = render([reasons_table((("why", 20, 1),))], width=60)
    lines = text.splitlines()
    assert all(len(line) <= 60 for line in lines), text
    assert "left out" not in text and "resolution  idle W" in lines[1]
    assert lines[3].startswith("amdsmi    the amdsmi Python") and lines[4].startswith(" " * 10)
    # too narrow for even the folded column's floor: the figures go after all
    narrow = render([reasons_table((("why", 30, 1),))], width=50)
    assert "left out to fit 50 characters: resolution, idle W" in narrow.replace("\n  ", " ")
    assert all(len(line) <= 50 for line in narrow.splitlines())  # the reasons fill the room


def test_a_name_folds_only_once_the_other_columns_are_gone() -> None:
    name = "test_output_tokens[tiny-llama-in32-out128]"
    table = Table(
        "t",
        ("case", "p", "verdict"),
        ("case", "p", "verdict"),
        ((name, 0.5, "ok"),),
        ((name, "0.5", "ok"),),
        priorities=(0, 1, 0),
        wraps=(("case", 16, 0),),
    )
    assert render([table], width=52).splitlines()[1].split() == ["case", "verdict"]
    lines = render([table], width=40).splitlines()
    assert all(len(line) <= 40 for line in lines)
    folded = [line[: lines[2].index(" ")].strip() for line in lines[3:5]]
    assert "".join(folded) == name


def test_a_legend_line_goes_with_the_columns_it_explains() -> None:
    legend = ("A: the mark of col1", "B: the mark of col5 or col6", "C: always")
    table = wide_table(title="t", legend=legend)
    keyed = dataclasses.replace(table, legend_keys=(("k1",), ("k5", "k6"), ()))
    full = render([keyed], width=200)
    assert all(line in full for line in legend)
    text = render([keyed], width=60)  # col4, col5, col6 and col7 left out
    assert "A: the mark of col1" in text and "C: always" in text
    assert "B: the mark" not in text
    # csv, json and markdown keep every column, and so every legend line
    assert "B: the mark" in render([keyed], "markdown") and "B: the mark" in render([keyed], "json")
