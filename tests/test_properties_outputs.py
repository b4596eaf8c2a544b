"""Property tests (Hypothesis): generated hostile names and labels flow into every output
(issue 33) — node ids, parametrize ids, model labels, run labels, hardware keys and the
machine and commit fields, into the terminal tables, the exports (csv, json, markdown,
github-action-benchmark) and the HTML report.  Each output must parse back to the very
strings it was given, and lose nothing: no row, no case, no field."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import re
from collections.abc import Sequence
from html.parser import HTMLParser
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_llmenergy.case_tables import case_tables
from pytest_llmenergy.cli import runs_cli
from pytest_llmenergy.compare import CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.comparison_text import Lineup, comparison_table, side_by_side
from pytest_llmenergy.export import CSV, GITHUB_ACTION_BENCHMARK, export_text
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.storage.runfile import Run
from pytest_llmenergy.tables import printable, render
from tests.casefactory import make_case, synthetic_run
from tests.hostile import HOSTILE, script_texts

# Bounded: the whole file runs in well under 20 s (the report's examples dominate).
QUICK = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text as hostile as a run file can carry: markup, comments, quotes, separators of csv
# and markdown, line breaks and control characters, line separators, astral characters,
# whole hostile strings glued in anywhere.  No lone surrogates: no output is UTF-8 then.
_pieces = st.sampled_from(
    [*HOSTILE, "|", ",", '"', "\n", "\r\n", "\t", "\x00", "\x1b[31m", "\\", "`", "*", "[", "]"]
)
_chars = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
text = st.lists(st.one_of(_pieces, _chars), min_size=1, max_size=5).map("".join)


def _cases(named: Sequence[tuple[str, str]]) -> list[CaseResult]:
    """One case per (parametrize id, model label), named as pytest names a parametrized
    test: ``FILE::TEST[ID]``."""
    cases = []
    for i, (ident, model) in enumerate(named):
        name = f"test_x[{ident}]"
        base = make_case([0.1, 0.11, 0.09], input_tokens=8 + i, model=model)
        cases.append(dataclasses.replace(base, name=name, nodeid=f"t.py::{name}"))
    return cases


named = st.lists(st.tuples(text, text), min_size=1, max_size=6, unique_by=lambda t: t[0])


# -- exports and data formats ------------------------------------------------------------
@QUICK
@given(named)
@example([("\r", "m")])  # found: csv quoted "\n" but not "\r", and readers split the row
def test_csv_export_gives_back_every_node_id_and_name(named: list[tuple[str, str]]) -> None:
    cases = _cases(named)
    rows = list(csv.DictReader(io.StringIO(export_text(cases, CSV), newline="")))
    assert sorted(r["nodeid"] for r in rows) == sorted(c.nodeid for c in cases)
    assert sorted(r["name"] for r in rows) == sorted(c.name for c in cases)


@QUICK
@given(named)
def test_dashboard_export_is_json_naming_every_case(named: list[tuple[str, str]]) -> None:
    cases = _cases(named)
    entries = json.loads(export_text(cases, GITHUB_ACTION_BENCHMARK))
    names = {e["name"].rsplit(" ", 1)[0] for e in entries}
    assert names == {c.nodeid for c in cases}


@QUICK
@given(named)
def test_json_tables_grouped_by_model_keep_every_case_and_title(
    named: list[tuple[str, str]],
) -> None:
    cases = _cases(named)
    tables = json.loads(render(case_tables(cases, group_by=("model",)), "json"))["tables"]
    assert sorted(r["nodeid"] for t in tables for r in t["rows"]) == sorted(c.nodeid for c in cases)
    for table in tables:
        models = {
            c.labels["model"] for c in cases if c.nodeid in {r["nodeid"] for r in table["rows"]}
        }
        assert len(models) == 1
        (model,) = models
        assert table["title"] == (f"model {model}" if model else "all cases")


NAMED = ["name", "tokens_in", "j_per_token"]  # a table whose rows show their names


def _markdown_rows(text: str) -> list[list[str]]:
    """The cells of every table row: split at unescaped pipes, ``\\|`` read back."""
    rows = []
    for line in text.split("\n"):  # markdown's line ends, not every Unicode separator
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        rows.append([c.strip().replace("\\|", "|") for c in cells])
    return rows


@QUICK
@given(named)
@example([("\n", "m"), ("\u2028 and \u2029", "m")])  # found: a line break split the row
def test_markdown_table_has_one_row_per_case_with_its_name(named: list[tuple[str, str]]) -> None:
    cases = _cases(named)
    tables = case_tables(cases, columns=NAMED, group_by=())
    (table,) = tables
    rows = _markdown_rows(render(tables, "markdown"))
    header, body = rows[0], rows[1:]
    assert len(body) == len(cases)
    assert all(len(r) == len(header) for r in body)
    shown = [r[header.index("name")] for r in body]
    # a markdown cell's outer spaces are not its content (GFM trims them)
    names = [printable(cells[table.keys.index("name")]).strip() for cells in table.cells]
    assert shown == names


@QUICK
@given(named)
@example([("a\nb", "m"), ("\x1b[2J", "m"), ("\u202etxt", "m")])  # a break, a clear, a reorder
def test_terminal_table_has_one_line_per_case(named: list[tuple[str, str]]) -> None:
    cases = _cases(named)
    (table,) = case_tables(cases, columns=NAMED, group_by=())
    lines = render([table], "table", width=120).splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) <= set("- ") and line)
    body = lines[rule + 1 : rule + 1 + len(cases)]
    # the cell as shown, its outer spaces trimmed (as tabulate does)
    names = [printable(cells[table.keys.index("name")]).strip() for cells in table.cells]
    assert [line.startswith(name) for line, name in zip(body, names)] == [True] * len(cases)


_run_labels = st.lists(
    text.filter(lambda t: t not in ("group", "case", "nodeid", "tokens_in", "tokens_out")),
    min_size=2,
    max_size=3,
    unique=True,
)


@QUICK
@given(named=named, labels=_run_labels)
def test_runs_side_by_side_keep_every_label_as_a_column(
    named: list[tuple[str, str]], labels: list[str]
) -> None:
    """Run labels are csv and json column keys (``llmenergy compare``): each reads back,
    with its run's figure, and no two columns fall into one."""
    cases = tuple(_cases(named))
    table = side_by_side(Lineup(tuple(labels), (cases,) * len(labels)), "j_per_token")
    assert len(set(table.keys)) == len(table.keys)
    reader = csv.DictReader(io.StringIO(render([table], "csv"), newline=""))
    rows = list(reader)
    assert reader.fieldnames == ["group", *table.keys]
    assert sorted(r["nodeid"] for r in rows) == sorted(c.nodeid for c in cases)
    for row in rows:
        assert {float(row[label]) for label in labels} == {float(row[labels[0]])}
    (data,) = json.loads(render([table], "json"))["tables"]
    legend = [f"#{i} = {label}" for i, label in enumerate(labels, 1)]
    legend[0] += ", the baseline"
    assert data["legend"] == legend
    # the terminal: a legend line per run, each on its own line, as the label shows
    text = render([table], "table").split("\n")  # unwrapped: a long label has a line
    for i, label in enumerate(labels, 1):
        line = f"#{i} = {printable(label)}" + (", the baseline" if i == 1 else "")
        assert line.strip() in [x.strip() for x in text]


@QUICK
@given(named=named, labels=_run_labels)
def test_a_comparison_names_every_case_in_csv_and_json(
    named: list[tuple[str, str]], labels: list[str]
) -> None:
    cases = _cases(named)
    c = compare_cases(
        cases[: len(cases) // 2 + 1],
        cases,
        CompareOptions(
            gates=parse_gates("j_per_token:5%"), baseline_label=labels[0], current_label=labels[1]
        ),
    )
    table = comparison_table(c)
    rows = list(csv.DictReader(io.StringIO(render([table], "csv"), newline="")))
    assert [r["case"] for r in rows] == [d.nodeid for d in c.deltas]
    assert {r["group"] for r in rows} <= {table.title}
    (data,) = json.loads(render([table], "json"))["tables"]
    assert data["title"] == f"{labels[1]} (current) against {labels[0]} (baseline)"
    assert f"only in {labels[1]}: {', '.join(c.only_in_current)}" in data["notes"] or (
        not c.only_in_current
    )


@QUICK
@given(named=named, header=st.lists(text, min_size=5, max_size=5))
def test_show_prints_one_line_per_header_field(
    named: list[tuple[str, str]], header: list[str]
) -> None:
    """``llmenergy show``: the run's header (hardware, machine, commit, meter) is one line
    per field in the terminal and in markdown, whatever the run file holds."""
    hardware, cpu, gpu, branch, meter = header
    run = dataclasses.replace(
        _hostile_run(_cases(named), (hardware, cpu, branch)),
        machine={"cpu": {"model": cpu}, "gpus": [{"name": gpu}]},
        meter={"backend": "estimate", "description": meter},
    )
    for fmt, width in (("table", 10_000), ("markdown", None)):
        args = argparse.Namespace(columns=None, group_by=(), sort="name", format=fmt)
        with patch("pytest_llmenergy.cli.runs_cli.table_width", return_value=width):
            lines = runs_cli._show(run, args).split("\n")
        first = lines[: lines.index("")]
        words = ("run ", "hardware ", "commit ", "meter ")
        assert [line.removeprefix("- ").startswith(w) for line, w in zip(first, words)] == [
            True
        ] * 4
        assert len(first) == 4
        assert printable(cpu or "unknown") in first[1]
        assert printable(meter or "estimate") in first[3]


# -- the HTML report ---------------------------------------------------------------------
class _Page(HTMLParser):
    """Start tags and the text of each element, as Python's parser reads the page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.texts: dict[str, list[str]] = {}
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._open.append(tag)
        self.texts.setdefault(tag, []).append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._open:
            while self._open.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if self._open:
            self.texts[self._open[-1]][-1] += data


def _hostile_run(cases: list[CaseResult], header: Sequence[str]) -> Run:
    hardware, cpu, branch = header
    run = synthetic_run(1)
    return dataclasses.replace(
        run,
        cases=tuple(cases),
        hardware=hardware,
        machine={"cpu": {"model": cpu, "logical_cores": 2}, "gpus": []},
        commit={"id": "0123456789abcdef", "dirty": False, "branch": branch},
    )


@pytest.fixture(scope="module")
def report_page():
    """The renderer, once the inlined library is available (or the test skips)."""
    pytest.importorskip("vl_convert")
    from pytest_llmenergy.html import render_report

    return render_report


@SLOW
@given(
    named=named,
    labels=st.lists(text, min_size=2, max_size=2, unique=True),
    header=st.lists(text.filter(bool), min_size=3, max_size=3),
)
def test_the_report_reads_back_to_the_names_it_was_given(
    report_page, named: list[tuple[str, str]], labels: list[str], header: list[str]
) -> None:
    cases = _cases(named)
    base = _hostile_run(cases, header)
    head = dataclasses.replace(base, cases=tuple(cases[::-1]))
    comparison = compare_cases(
        base.cases,
        head.cases,
        CompareOptions(
            gates=parse_gates("j_per_token:5%"), baseline_label=labels[0], current_label=labels[1]
        ),
    )
    page = report_page([base, head], labels, [comparison])
    # each data element ends at its own </script> (as a browser's tokenizer finds it),
    # holds no markup character, and decodes to the very strings it was given
    scripts = script_texts(page)
    assert set(scripts) == {"cases-data", "comparison-0-data", "llmenergy-specs"}
    for data in scripts.values():
        assert not set(data) & set("<>&\u2028\u2029")
    rows = json.loads(scripts["cases-data"])["rows"]
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        (label, c.name) for label in labels for c in cases
    )
    compared = json.loads(scripts["comparison-0-data"])["rows"]
    assert len(compared) == len(cases)
    json.loads(scripts["llmenergy-specs"])
    # the markup: only the page's own elements, and the header's text as given
    parsed = _Page()
    parsed.feed(page)
    parsed.close()
    assert parsed.tags.count("script") == 5 and "img" not in parsed.tags
    shown = parsed.texts["dd"]
    hardware, cpu, branch = header
    assert hardware in shown and f"{cpu} (2 logical cores); no GPU" in shown
    assert f"0123456789ab on {branch}" in shown
    assert parsed.texts["h3"][:2] == labels
