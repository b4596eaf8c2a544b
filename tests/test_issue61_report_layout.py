"""The comparison table of the HTML report fits a 1,400-pixel window: every verdict is
within the table's box and the window, none cut off past its edge (issue 61, item 9).
In Debian's Chromium, as ``test_html_report_browser.py`` drives it."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.html import render_report
from pytest_llmenergy.storage.runfile import Run, dumps
from tests.casefactory import synthetic_run
from tests.test_html_report_browser import Opened, browser, shots  # noqa: F401 (fixtures)

VIEWPORT = {"width": 1400, "height": 900}
NARROW = {"width": 1000, "height": 900}

# Each verdict cell's box against its scroll box and the window, and whether the scroll
# box hides anything sideways.
VERDICTS = """(id) => {
  const table = document.getElementById(id), box = table.parentElement;
  const edge = Math.min(box.getBoundingClientRect().right, window.innerWidth);
  const heads = Array.from(table.tHead.rows[0].cells);
  const index = heads.findIndex((th) => th.dataset.key === 'verdict');
  const cells = Array.from(table.tBodies[0].rows).map((row) => row.cells[index]);
  return {
    hidden: box.scrollWidth - box.clientWidth,
    scrolls: getComputedStyle(box).overflowX === 'auto',
    page: document.documentElement.scrollWidth - window.innerWidth,
    past: cells.filter((td) => td.getBoundingClientRect().right > edge + 0.5).length,
    cut: cells.filter((td) => td.scrollWidth > td.clientWidth).length,
    texts: cells.map((td) => td.textContent),
  };
}"""


def cpu_run(seed: int, machine: float, name: str) -> Run:
    """54 cases measured on the CPU with the machine-speed reference read, so the
    comparison normalizes them and shows its machine speed column."""
    run = synthetic_run(54, seed=seed, slower=machine, name=name)
    cases = tuple(
        replace(
            c,
            counted={"cpu:process": True},
            methods={"cpu:process": "estimated"},
            reference_s=0.005 * machine,
        )
        for c in run.cases
    )
    return replace(run, cases=cases)


def with_long_verdicts(run: Run) -> Run:
    """Two cases whose verdicts are the longest a table shows: another execution, and a
    server's configuration ML.ENERGY's rules reject."""
    first, second, *rest = run.cases
    first = replace(first, labels={**first.labels, "execution": "compiled"})
    unsteady = tuple(replace(t, unstable="no steady window") for t in second.trials)
    return replace(run, cases=(first, replace(second, trials=unsteady), *rest))


def test_every_verdict_is_readable_in_a_1400_pixel_window(
    browser: Any,  # noqa: F811
    tmp_path: Path,
    shots: Path,  # noqa: F811
) -> None:
    paths = []
    for name, run in (
        ("base", cpu_run(1, 1.0, "base")),
        ("head", with_long_verdicts(cpu_run(2, 1.3, "head"))),
    ):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(dumps(run))
    out = tmp_path / "report.html"
    main(["report", *map(str, paths), "--out", str(out), "--gate", "j_per_token:5%"])
    opened = Opened(browser, out)
    page = opened.page
    page.set_viewport_size(VIEWPORT)
    heads = page.evaluate(
        "Array.from(document.querySelectorAll('#comparison-0 th')).map((th) => th.dataset.key)"
    )
    found = page.evaluate(VERDICTS, "comparison-0")
    assert "another execution" in found["texts"]
    assert any(t.startswith("rejected: no steady window") for t in found["texts"])
    assert found["hidden"] <= 0, found  # nothing of the table past its box's edge
    assert found["page"] <= 0, found  # nor of the page past the window's
    assert found["past"] == 0 and found["cut"] == 0, found
    assert "speed" in heads and heads[-1] == "verdict"  # the widest the table gets
    page.locator("#comparison-0").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "report-comparison-1400.png"))
    # a narrower window: the table scrolls sideways inside its box, the page does not
    page.set_viewport_size(NARROW)
    narrow = page.evaluate(VERDICTS, "comparison-0")
    assert narrow["hidden"] > 0 and narrow["scrolls"] and narrow["page"] <= 0, narrow
    assert narrow["cut"] == 0, narrow  # each verdict whole in its cell, wrapped
    page.screenshot(path=str(shots / "report-comparison-1000.png"))
    assert opened.errors == []


def _comparison_keys(page: str) -> list[str]:
    table = page.split('<table id="comparison-0"', 1)[1].split("</thead>", 1)[0]
    return re.findall(r'data-key="([^"]+)"', table)


def test_what_every_row_shares_is_said_once_above_the_table() -> None:
    """One gated figure: its name and gate in every row took 200 pixels the verdicts
    needed; they are said once.  Two figures: each row says its own."""
    base, head = cpu_run(1, 1.0, "base"), cpu_run(2, 1.1, "head")
    one = compare_cases(base.cases, head.cases, CompareOptions(gates=parse_gates("j_per_token:5%")))
    page = render_report([base, head], ["base", "head"], [one])
    assert "every row: figure j_per_token, gate j_per_token:5%" in page
    assert "figure" not in _comparison_keys(page) and "gate" not in _comparison_keys(page)
    two = compare_cases(
        base.cases, head.cases, CompareOptions(gates=parse_gates("j_per_token:5% time_s:5%"))
    )
    page = render_report([base, head], ["base", "head"], [two])
    assert "every row:" not in page
    assert {"figure", "gate", "verdict"} <= set(_comparison_keys(page))
