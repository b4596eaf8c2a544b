"""One self-contained HTML report of runs: headers, charts, the case table, comparisons.

``llmenergy report RUN [RUN...] --out report.html`` and ``--energy-report=PATH`` write it;
``write_report(path, runs, labels, comparisons)`` is the API behind both.
"""

from __future__ import annotations

from .page import render_report, write_report
from .vega import check_available

__all__ = ["check_available", "render_report", "write_report"]
