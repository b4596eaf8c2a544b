"""Showing results: a plain line per case at the end of the session."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .controller.results import OOM, CaseResult


def _num(value: float, digits: int = 4) -> str:
    return "n/a" if math.isnan(value) or math.isinf(value) else f"{value:.{digits}g}"


def _ci(value: float) -> str:
    return "" if math.isinf(value) or math.isnan(value) else f" ±{value:.2g}"


def case_line(r: CaseResult) -> str:
    if r.status == OOM:
        return f"{r.name}: {r.reason} (skipped)"
    mark = " [estimated]" if r.estimated else ""
    t, e = r.time, r.energy
    parts = [
        f"{r.name}: {len(r.trials)} trials ({r.status})",
        f"{_num(t.mean)} s{_ci(t.half_width)}",
        f"{_num(e.mean)} J{_ci(e.half_width)}{mark}",
        f"{_num(r.joules_per_token)} J/token (in {_num(r.joules_per_input_token)}, "
        f"out {_num(r.joules_per_output_token)})",
        f"{_num(r.tokens_per_s)} tokens/s",
        f"{_num(r.power_w)} W",
    ]
    if r.has_phases:
        parts.append(
            f"prefill {_num(r.prefill_seconds)} s {_num(r.prefill_joules)} J, decode "
            f"{_num(r.decode_seconds)} s {_num(r.decode_joules)} J "
            f"({_num(r.joules_per_decode_token)} J/token, {_num(r.decode_tokens_per_s)} tokens/s)"
        )
    if r.resources is not None:
        u = r.resources
        res = f"peak RSS {u.peak_rss_bytes / 2**20:.0f} MiB, CPU {u.cpu_seconds:.2f} s"
        if u.peak_gpu_bytes is not None:
            res += f", peak GPU {u.peak_gpu_bytes / 2**20:.0f} MiB"
        if u.iowait_share is not None:
            res += f", iowait {u.iowait_share:.1%}"
        parts.append(res)
    return " | ".join(parts)


def case_summary_lines(results: Iterable[CaseResult]) -> list[str]:
    def order(r: CaseResult) -> tuple[str, str, int, int, str]:
        test = r.nodeid.split("[", 1)[0]
        return (test, r.labels.get("model", ""), r.input_tokens, r.output_tokens, r.nodeid)

    return [case_line(r) for r in sorted(results, key=order)]
