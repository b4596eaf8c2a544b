"""Help and docs that say what is true (issue 61, item 12): what counting work costs, how
long the first run takes, and the README's table as a 100-column terminal shows it."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_llmenergy.figures import DEFAULT_COLUMNS, FIGURES
from pytest_llmenergy.plugin.options import plugin_option

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def test_the_count_work_help_says_what_counting_was_measured_to_cost() -> None:
    """It said "a few per cent"; measured, it was 11-23 % of a session."""
    text = " ".join(plugin_option("--energy-count-work").full_help().split())
    assert "few per cent" not in text
    assert "10-20 % of a session's time" in text and "docs/evidence.md" in text
    why = " ".join((DOCS / "guides" / "why.md").read_text().split())
    assert "a few per cent of a session" not in why
    evidence = (DOCS / "evidence.md").read_text()
    assert "`--energy-count-work=off`): 62.8 s against 53.3 s" in evidence


def test_the_first_run_guide_says_how_long_the_grid_took_and_on_what() -> None:
    guide = " ".join((DOCS / "guides" / "first-run.md").read_text().split())
    assert "about 2 minutes" not in guide
    assert "depends on the machine" in guide
    assert "(../evidence.md#how-long-the-commands-take-here)" in guide
    table = (DOCS / "evidence.md").read_text()
    assert "| `python -m pytest benchmarks/ -p no:randomly` (the default grid) | 41 min" in table


# What a case of the default suite on a CPU has no value for: one query a trial, no steady
# window, no server, no GPU or DRAM domain.  Every other default column is on its table.
NOT_ON_A_CPU_SUITE_TABLE = {
    "queries",
    "steady_j_per_token",
    "gpu_j",
    "dram_j",
    "req_ttft_s",
    "tpot_s",
    "latency_p50_s",
    "latency_p99_s",
}


def _sample_table() -> tuple[list[str], list[str], list[str], int]:
    """The README's sample: its lines, the header's columns, the columns it says it left
    out, and the width it says it fit."""
    block = re.search(r"## What it prints.*?```text\n(.*?)```", README.read_text(), re.S)
    assert block, "the README shows a sample table"
    lines = block.group(1).splitlines()
    header = next(line for line in lines if line.lstrip().startswith("in "))
    shown = re.split(r"\s{2,}", header.strip())
    note = " ".join(lines[lines.index(header) :])
    found = re.search(r"columns left out to fit (\d+) characters: (.*?); choose with", note)
    assert found, "the README's table names the columns it left out"
    return lines, shown, found.group(2).split(", "), int(found.group(1))


def test_the_readme_table_is_what_a_100_column_terminal_shows_of_the_suite() -> None:
    """Every default column a CPU suite case has is on the table or named as left out,
    and those left out are the ones a narrower terminal leaves out first."""
    lines, shown, left_out, width = _sample_table()
    assert width == 100 and all(len(line) <= width for line in lines)
    keys = [k for k in DEFAULT_COLUMNS if k not in NOT_ON_A_CPU_SUITE_TABLE]
    labels = [FIGURES[k].label for k in keys]
    assert shown == [label for label in labels if label in shown]  # in the columns' order
    assert sorted(shown + left_out, key=labels.index) == labels  # each once, none missing
    # the table fits by leaving out the lowest priority first, the last of a tie first
    rank = {label: (FIGURES[k].priority, i) for i, (k, label) in enumerate(zip(keys, labels))}
    assert min(rank[label] for label in left_out) > max(rank[label] for label in shown)
