"""A served workload on the page: its requests drawn over the meter's power, each coloured
by the joules attributed to it (``serving/attribution.py``), and the terminal's table of
J per request by input length.

The power is the workload window's own: the replay marks the window every slice
(``serving/replay.py``) and the trial keeps the slices (``Trial.power``), so each
slice's joules over its seconds are the mean power then, whatever the meter.  A request
is a bar from when it was sent to its last byte, its first token a tick: where the
batch was full, the bars stack over the high power.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..export import request_tables
from ..results import CaseResult, RequestRecord, Trial, distinct_names
from ..storage.runfile import Run
from ..tables import clean
from .casedata import Record
from .charts import DrawnChart
from .sections import Section

SERVED_WIDTH_PX, POWER_HEIGHT_PX = 640, 120
REQUEST_STEP_PX, MAX_REQUESTS_HEIGHT_PX = 3, 420


def served_trial(case: CaseResult) -> Trial | None:
    """The case's last trial that replayed a workload (requests sent at known times,
    attributed), or None."""
    for trial in reversed(case.trials):
        if any(q.sent_s is not None and q.energy_j is not None for q in trial.requests):
            return trial
    return None


def power_points(trial: Trial) -> list[Record]:
    """The window's mean power per slice, in time order: start, end, watts."""
    return [
        {"start_s": p.start_s, "end_s": p.end_s, "power_w": clean(p.joules / p.seconds)}
        for p in sorted(trial.power, key=lambda p: p.start_s)
        if p.end_s > p.start_s
    ]


def request_points(trial: Trial) -> list[Record]:
    """One bar per request with a send time: sent, first token, end, its joules."""
    points: list[Record] = []
    for i, q in enumerate(trial.requests, 1):
        if q.sent_s is None or not math.isfinite(q.sent_s):
            continue
        points.append(_request_point(i, q))
    return points


def _request_point(i: int, q: RequestRecord) -> Record:
    sent_s = q.sent_s or 0.0
    first = sent_s + q.ttft_s if q.ttft_s is not None else None
    energy = q.energy_j
    return {
        "request": i,
        "sent_s": sent_s,
        "first_s": first,
        "end_s": sent_s + q.latency_s,
        "energy_j": clean(energy) if energy is not None else None,
        "input_tokens": q.input_tokens,
        "output_tokens": q.output_tokens,
        "status": q.status or "done",
        "coarse": q.coarse,
    }


def served_spec(title: str, power: list[Record], requests: list[Record]) -> dict[str, Any]:
    """Power over time above the requests' bars, on one time axis."""
    x = {"field": "start_s", "type": "quantitative", "title": "seconds into the workload"}
    power_chart = {
        "height": POWER_HEIGHT_PX,
        "width": SERVED_WIDTH_PX,
        "data": {"values": power},
        "mark": {"type": "rect", "color": "#7f8c8d"},
        "encoding": {
            "x": x,
            "x2": {"field": "end_s"},
            "y": {"field": "power_w", "type": "quantitative", "title": "power [W]"},
            "y2": {"datum": 0},
            "tooltip": [
                {"field": "start_s", "title": "from [s]", "format": ".3~f"},
                {"field": "power_w", "title": "power [W]", "format": ".4~g"},
            ],
        },
    }
    height = min(MAX_REQUESTS_HEIGHT_PX, max(60, REQUEST_STEP_PX * len(requests)))
    bars = {
        "mark": {"type": "bar", "height": max(1, REQUEST_STEP_PX - 1)},
        "encoding": {
            "x": {**x, "field": "sent_s"},
            "x2": {"field": "end_s"},
            "y": {
                "field": "request",
                "type": "quantitative",
                "title": "request",
                "sort": "descending",
            },
            "color": {
                "field": "energy_j",
                "type": "quantitative",
                "title": "J attributed",
                "scale": {"scheme": "viridis"},
            },
            "tooltip": [
                {"field": "request", "title": "request"},
                {"field": "input_tokens", "title": "input tokens"},
                {"field": "output_tokens", "title": "output tokens"},
                {"field": "energy_j", "title": "J attributed", "format": ".4~g"},
                {"field": "status", "title": "status"},
                {"field": "coarse", "title": "marked"},
            ],
        },
    }
    ticks = {
        "mark": {"type": "tick", "color": "black", "thickness": 1},
        "encoding": {
            "x": {"field": "first_s", "type": "quantitative"},
            "y": {"field": "request", "type": "quantitative", "sort": "descending"},
        },
    }
    requests_chart = {
        "height": height,
        "width": SERVED_WIDTH_PX,
        "data": {"values": requests},
        "layer": [bars, ticks],
    }
    return {
        "title": {
            "text": title,
            "subtitle": "power per slice of the window (top); each request from sent to "
            "its last byte, its first token a tick, coloured by its attributed joules",
            "anchor": "start",
        },
        "vconcat": [power_chart, requests_chart],
        "resolve": {"scale": {"x": "shared"}},
        "config": {"title": {"subtitleFontSize": 10, "subtitleColor": "#555"}},
    }


def served_section(runs: Sequence[Run], labels: Sequence[str]) -> Section:
    """One chart per case that replayed a workload, and its table; nothing where no run
    served one."""
    charts: list[DrawnChart] = []
    cases = [(label, case) for run, label in zip(runs, labels) for case in run.cases]
    names = distinct_names([case.nodeid for _, case in cases])
    for i, (label, case) in enumerate(cases):
        trial = served_trial(case)
        if trial is None:
            continue
        requests = request_points(trial)
        title = f"{label}: {names[case.nodeid]}: {len(requests)} requests"
        spec = served_spec(title, power_points(trial), requests)
        charts.append(DrawnChart(f"served-{i}", title, spec, len(requests), fitted=True))
    tables = [t for run in runs for t in request_tables(run.cases)]
    return Section(tuple(charts), tuple(tables))
