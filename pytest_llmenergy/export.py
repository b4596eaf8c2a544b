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

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .case_tables import case_tables
from .errors import ConfigError
from .figures import FIGURES, percentile
from .leaderboards import ai_energy_score, mlenergy_records
from .results import CaseResult, RequestRecord
from .tables import Raw, Table, fmt_number, printable, render

GITHUB_ACTION_BENCHMARK = "github-action-benchmark"
BENCHER = "bencher"
CSV = "csv"
AI_ENERGY_SCORE = "ai-energy-score"
MLENERGY = "mlenergy"
REQUESTS_CSV = "requests-csv"
REQUESTS_JSON = "requests-json"
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


# -- a served workload's requests, one by one (serving/replay.py) ----------------------
REQUEST_COLUMNS = (
    "case",
    "trial",
    "request",
    "input_tokens",
    "output_tokens",
    "sent_s",
    "ttft_s",
    "latency_s",
    "energy_j",
    "prefill_j",
    "decode_j",
    "j_per_token",
    "plain_j",
    "status",
    "coarse",
)


def _request_row(case: CaseResult, trial: int, index: int, q: RequestRecord) -> dict[str, Raw]:
    energy_j = q.energy_j
    tokens = (q.input_tokens or 0) + q.output_tokens
    values: tuple[Raw, ...] = (
        case.nodeid,
        trial,
        index,
        q.input_tokens,
        q.output_tokens,
        q.sent_s,
        q.ttft_s,
        q.latency_s,
        energy_j,
        q.prefill_j,
        q.decode_j,
        energy_j / tokens if energy_j is not None and tokens else None,
        q.plain_j,
        q.status,
        q.coarse,
    )
    return dict(zip(REQUEST_COLUMNS, values))


def request_rows(results: Sequence[CaseResult]) -> list[dict[str, Raw]]:
    """Every attributed request of every kept trial: its lengths, timings and joules."""
    return [
        _request_row(case, trial.index, i + 1, q)
        for case in results
        for trial in case.trials
        for i, q in enumerate(trial.requests)
        if q.energy_j is not None
    ]


def _requests_csv(results: Sequence[CaseResult]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, REQUEST_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(request_rows(results))
    return out.getvalue()


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
        ExportFormat(
            REQUESTS_CSV,
            "a served workload's requests, one a row: lengths, timings, joules (prefill, "
            "decode, ML.ENERGY's plain figure) and why a figure is marked",
            _requests_csv,
        ),
        ExportFormat(
            REQUESTS_JSON,
            "a served workload's requests as a JSON list",
            lambda r: _json(request_rows(r)),
        ),
    )
}
EXPORT_FORMATS = tuple(EXPORTS)


# Input-length buckets of the per-request table: powers of two, as the routing guide's.
PERCENTILES = (50, 90, 99)


def _bucket(tokens: int) -> int:
    """The power of two at or above ``tokens``: the bucket's upper bound."""
    top = 1
    while top < tokens:
        top *= 2
    return top


def request_tables(results: Sequence[CaseResult]) -> list[Table]:
    """Per case with a served workload: J per request and J/token (input + output) by
    input-length bucket, p50/p90/p99 over the requests that completed as asked."""
    return [t for case in results if (t := _request_table(case)) is not None]


def _request_table(case: CaseResult) -> Table | None:
    requests = [q for trial in case.trials for q in trial.requests if q.energy_j is not None]
    if not requests:
        return None
    done = [q for q in requests if not q.status and q.input_tokens is not None]
    buckets: dict[int, list[RequestRecord]] = {}
    for q in done:
        buckets.setdefault(_bucket(q.input_tokens or 0), []).append(q)
    keys = (
        "input_tokens",
        "requests",
        *(f"j_p{p}" for p in PERCENTILES),
        *(f"j_per_token_p{p}" for p in PERCENTILES),
        "plain_j_p50",
        "coarse",
    )
    headers = (
        "input tokens",
        "requests",
        *(f"J p{p}" for p in PERCENTILES),
        *(f"J/token p{p}" for p in PERCENTILES),
        "plain J p50",
        "marked",
    )
    rows = [_bucket_row(top, buckets[top]) for top in sorted(buckets)]
    cells = tuple(
        (str(r[0]), str(r[1]), *(fmt_number(v) for v in r[2:-1]), str(r[-1])) for r in rows
    )
    return Table(
        title=f"J per request, by input length: {printable(case.name)}",
        keys=keys,
        headers=headers,
        rows=tuple(rows),
        cells=cells,
        notes=_request_notes(requests, done),
    )


def _bucket_row(top: int, requests: list[RequestRecord]) -> tuple[Raw, ...]:
    joules = [q.energy_j or 0.0 for q in requests]
    per_token = [
        (q.energy_j or 0.0) / ((q.input_tokens or 0) + q.output_tokens)
        for q in requests
        if (q.input_tokens or 0) + q.output_tokens
    ]
    plain = [q.plain_j for q in requests if q.plain_j is not None]
    bound = f"{top // 2 + 1}-{top}" if top > 1 else "1"
    return (
        bound,
        len(requests),
        *(percentile(joules, p) for p in PERCENTILES),
        *(percentile(per_token, p) if per_token else None for p in PERCENTILES),
        percentile(plain, 50) if plain else None,
        sum(1 for q in requests if q.coarse),
    )


def _request_notes(requests: list[RequestRecord], done: list[RequestRecord]) -> tuple[str, ...]:
    notes = [
        "J: each request's share of the window's energy above idle, by its work (prefill "
        "and decode tokens, and its 1/b of each decode step of a batch of b); plain J: "
        "ML.ENERGY's steady J/output token x its output tokens; --energy-export="
        "requests-csv:FILE writes every request"
    ]
    failed = len(requests) - len(done)
    if failed:
        notes.append(f"{failed} requests failed, were cut or miscounted: left out above")
    marked = sum(1 for q in done if q.coarse)
    if marked:
        notes.append(
            f"marked: {marked} requests shorter than two of the meter's steps, whose "
            "joules are a share of whole steps, not their own"
        )
    return tuple(notes)


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
