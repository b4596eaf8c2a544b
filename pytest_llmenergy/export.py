"""A run's figures for other tools: CI dashboards (github-action-benchmark, Bencher), CSV,
and the leaderboards' shapes (AI Energy Score, ML.ENERGY: ``leaderboards.py``).

``github-action-benchmark`` is the JSON that the GitHub Action of the same name reads with
``tool: customSmallerIsBetter``: one entry per case (named by its node id) and figure,
with the mean as the value and the confidence interval as the range, so a repository gets
a chart per case over its commits and an alert when energy per token rises.  Every figure
exported there is one of the registry's lower-is-better figures; CSV carries every figure
of every case, and the node id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .case_tables import case_tables
from .errors import ConfigError
from .figures import FIGURES
from .leaderboards import ai_energy_score, mlenergy_records
from .results import CaseResult
from .tables import fmt_number, render

GITHUB_ACTION_BENCHMARK = "github-action-benchmark"
BENCHER = "bencher"
CSV = "csv"
AI_ENERGY_SCORE = "ai-energy-score"
MLENERGY = "mlenergy"
# Bencher's limits: a benchmark's name at most 1024 characters, a measure's 64.
BENCHER_NAME_MAX = 1024
# What a dashboard charts per case: the research's energy per token, then per query.
DASHBOARD_FIGURES = ("j_per_token", "energy_j", "time_s")
EXPORT_EXAMPLES = "github-action-benchmark:energy.json, bencher:bmf.json, csv:energy.csv"


def dashboard_entries(results: Sequence[CaseResult]) -> list[dict[str, object]]:
    """``customSmallerIsBetter`` entries: name, unit, value, range, extra."""
    entries: list[dict[str, object]] = []
    for case in results:
        for key in DASHBOARD_FIGURES:
            f = FIGURES[key]
            summary = f.summary(case)
            if summary is None:
                continue
            estimated = " (estimated: no energy sensor)" if case.estimated and f.energy else ""
            trials = f"{summary.n} trial{'s' if summary.n != 1 else ''}"
            entry: dict[str, object] = {
                # The node id: unique across files and classes, the same in every run.
                "name": f"{case.nodeid} {key}",
                "unit": f.label if "/" in f.label else f.unit,
                "value": summary.mean,
            }
            if math.isfinite(summary.half_width):  # no interval from one trial: no range
                entry["range"] = f"± {fmt_number(summary.half_width, 2)}"
                trials += f", {summary.confidence:.0%} CI half-width"
            entry["extra"] = f"{trials}; meter {case.backend or 'unknown'}{estimated}"
            entries.append(entry)
    return entries


def bencher_metrics(results: Sequence[CaseResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher Metric Format: per case (its node id) and figure (its key, as a measure
    slug: ``j-per-token``), the mean as ``value`` and the interval's ends as
    ``lower_value`` and ``upper_value`` (left out after a single trial)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case in results:
        measures: dict[str, dict[str, float]] = {}
        for key in DASHBOARD_FIGURES:
            summary = FIGURES[key].summary(case)
            if summary is None or not math.isfinite(summary.mean):
                continue
            metric = {"value": summary.mean}
            if math.isfinite(summary.half_width):
                metric["lower_value"] = summary.mean - summary.half_width
                metric["upper_value"] = summary.mean + summary.half_width
            measures[key.replace("_", "-")] = metric
        if measures:
            out[_bencher_name(case.nodeid)] = measures
    return out


def _bencher_name(nodeid: str) -> str:
    """The node id, or (past Bencher's 1024 characters) its head and a hash of the whole:
    still unique and the same in every run."""
    if len(nodeid) <= BENCHER_NAME_MAX:
        return nodeid
    import hashlib

    digest = hashlib.sha256(nodeid.encode()).hexdigest()[:16]
    return f"{nodeid[: BENCHER_NAME_MAX - 18]}~{digest}"


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


@dataclass(frozen=True)
class ExportFormat:
    """One export: its name (``FORMAT`` of ``FORMAT:PATH``), what it is for, and the text
    it makes of a run's cases."""

    name: str
    help: str
    text: Callable[[Sequence[CaseResult]], str]


EXPORTS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat(
            GITHUB_ACTION_BENCHMARK,
            "customSmallerIsBetter entries for the github-action-benchmark Action",
            lambda r: _json(dashboard_entries(r)),
        ),
        ExportFormat(BENCHER, "Bencher Metric Format", lambda r: _json(bencher_metrics(r))),
        ExportFormat(
            CSV,
            "every figure of every case",
            lambda r: render(case_tables(r, columns=list(FIGURES), group_by=()), "csv"),
        ),
        ExportFormat(
            AI_ENERGY_SCORE,
            "AI Energy Score's figure per model: GPU Wh per 1,000 queries at batch 1, CPU "
            "and DRAM beside it",
            lambda r: _json(ai_energy_score(r)),
        ),
        ExportFormat(
            MLENERGY,
            "ML.ENERGY-style records per configuration: J per output token and per "
            "response, throughput, power, throughput per watt, validity",
            lambda r: _json(mlenergy_records(r)),
        ),
    )
}
EXPORT_FORMATS = tuple(EXPORTS)


def export_text(results: Sequence[CaseResult], fmt: str) -> str:
    try:
        return EXPORTS[fmt].text(results)
    except KeyError:
        raise ConfigError(
            f"unknown export format {fmt!r}; choose from: {', '.join(EXPORT_FORMATS)}"
        ) from None


def parse_exports(text: str) -> tuple[tuple[str, Path], ...]:
    """Comma-separated ``FORMAT:PATH`` exports (a repeated option arrives joined)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"no export given: expected FORMAT:PATH such as {EXPORT_EXAMPLES}")
    return tuple(parse_export(p) for p in parts)


def parse_export(text: str) -> tuple[str, Path]:
    """``FORMAT:PATH``, e.g. ``github-action-benchmark:energy.json``."""
    fmt, sep, path = text.strip().partition(":")
    if not sep or not path.strip():
        raise ConfigError(f"bad export {text!r}: expected FORMAT:PATH such as {EXPORT_EXAMPLES}")
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(
            f"bad export {text!r}: unknown format {fmt!r}; choose from: {', '.join(EXPORT_FORMATS)}"
        )
    return fmt, Path(path.strip())
