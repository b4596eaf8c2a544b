"""Showing a routing decision: terminal tables, or one JSON document for programs."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..tables import Raw, Table, clean, fmt_number, render
from . import BOTH, INPUT
from .decide import Routed
from .fit import TERMS
from .optimize import MEASURED, Baseline, Decision, Router, Totals
from .policy import Policy, Rule

ROUTE_FORMATS = ("table", "json", "markdown")


def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{x * 100:+.2f} %"


def _lam_text(lam: float) -> str:
    kind = {1.0: " (energy only)", 0.0: " (time only)"}.get(lam, "")
    return f"lambda {lam:g}{kind}"


def _ranges(policy: Policy) -> list[tuple[Rule, str]]:
    """Each rule with the token counts it takes, in words."""
    out = []
    low_in = low_out = 0
    for rule in policy.rules:
        if policy.by == BOTH:
            text = (
                f"input <= {rule.max_input_tokens} and output <= {rule.max_output_tokens}"
                if rule.max_input_tokens is not None
                else "the rest"
            )
        else:
            limit = rule.max_input_tokens if policy.by == INPUT else rule.max_output_tokens
            low = low_in if policy.by == INPUT else low_out
            text = f"{low}..{limit}" if limit is not None else f"{low} and more"
            if limit is not None:
                low_in = low_out = limit + 1
        out.append((rule, text))
    return out


ALONE, SERVED = "one at a time", "served workload"


def measured(router: Router) -> str:
    """How the systems' joules were measured: a query alone, or each request of a
    served workload in its batch."""
    return SERVED if any(m.profile.served for m in router.models) else ALONE


def _title(router: Router, what: str) -> str:
    """A table's title; a served workload's say so, since their figures differ."""
    kind = f" ({SERVED})" if measured(router) == SERVED else ""
    return f"routing {router.model}{kind}: {what}"


def _table(
    title: str,
    keys: Sequence[str],
    headers: Sequence[str],
    rows: Sequence[Sequence[Raw]],
    notes: Sequence[str] = (),
    priorities: Sequence[int] = (),
) -> Table:
    """``priorities``: which columns a narrow terminal loses first (highest first)."""
    raw = tuple(tuple(clean(v) for v in row) for row in rows)
    cells = tuple(tuple(v if isinstance(v, str) else fmt_number(v) for v in row) for row in rows)
    return Table(
        title, tuple(keys), tuple(headers), raw, cells, tuple(notes), priorities=tuple(priorities)
    )


def policy_table(routed: Routed) -> Table:
    d, router = routed.decision, routed.router
    p = d.policy
    tokens = f"{p.by} tokens" if p.by != BOTH else "tokens"
    rows = []
    for rule, text in _ranges(p):
        rows.append(
            (
                rule.system,
                text,
                d.totals.queries[rule.system],
                f"{d.totals.queries[rule.system] / d.queries * 100:.1f} %",
                d.totals.energy_by_system_j[rule.system],
                d.totals.busy_s[rule.system],
            )
        )
    notes = [
        f"cost per query = lambda x E + (1 - lambda) x {router.p_ref_w:.4g} W x T",
        "thresholds at the measured sizes only"
        if router.boundaries == MEASURED
        else "thresholds at token granularity (between measured sizes: power laws)",
    ]
    if p.by == BOTH:
        notes.append("by both: each pair priced by the fitted model (see its error below)")
    if measured(router) == SERVED:
        notes.append(
            "served: each request's joules as attributed in its batch, net of idle power "
            f"(idle is paid whichever requests come); priced at the served requests' mean "
            f"{'output' if p.by == INPUT else 'input'} length"
        )
    return _table(
        _title(
            router,
            f"by {p.by}, {_lam_text(p.lam)}, workload {p.workload} ({d.queries:,} queries)",
        ),
        ("system", "tokens", "queries", "share", "energy_j", "runtime_s"),
        ("system", tokens, "queries", "share", "energy J", "busy s"),
        rows,
        notes,
        priorities=(0, 0, 2, 1, 1, 2),
    )


def savings_table(d: Decision, title: str = "") -> Table:
    """``title``: the table's (default: the model's, as one-at-a-time routing names it)."""
    rows: list[tuple[Raw, ...]] = [
        ("this policy", d.totals.energy_j, d.totals.runtime_s, "", ""),
    ]
    for b in d.baselines:
        rows.append(
            (
                b.name,
                b.totals.energy_j,
                b.totals.runtime_s,
                _pct(d.saving(b, "energy_j")),
                _pct(d.saving(b, "runtime_s")),
            )
        )
    return _table(
        title or f"routing {d.policy.model}: workload totals and savings",
        ("baseline", "energy_j", "runtime_s", "energy_saved", "runtime_saved"),
        ("policy or baseline", "energy J", "runtime s", "energy saved", "runtime saved"),
        rows,
        ("saved: 1 - policy / baseline; runtime is busy seconds summed over systems",),
        priorities=(0, 2, 2, 0, 1),
    )


def fit_table(router: Router) -> Table:
    rows = []
    for m in router.models:
        sweeps = [s for s in (m.input_sweep, m.output_sweep) if s is not None]
        rows.append(
            (
                m.system,
                m.profile.average_power_w,
                "; ".join(f"{s.axis} {s.sizes[0]}..{s.sizes[-1]} ({len(s.sizes)})" for s in sweeps)
                or "—",
                f"{m.fitted.energy_error.mean_abs_pct:.1f} / "
                f"{m.fitted.energy_error.max_abs_pct:.1f} %",
                f"{m.fitted.time_error.mean_abs_pct:.1f} / {m.fitted.time_error.max_abs_pct:.1f} %",
            )
        )
    notes = [
        "fit error: mean / max |fitted - measured| over the measured sizes, of the model "
        "1, n_in, n_out, n_in*n_out, n_out^2"
    ]
    for m in router.models:
        if m.profile.note:
            notes.append(f"{m.system}: {m.profile.note}")
        if m.fitted.dropped and m.profile.served:
            notes.append(
                f"{m.system}: {', '.join(m.fitted.dropped)} left out: too few requests of "
                "different lengths to tell them apart"
            )
        elif m.fitted.dropped:
            notes.append(
                f"{m.system}: {', '.join(m.fitted.dropped)} left out: the measured sizes "
                "cannot tell it apart (crossing sweeps), so input and output costs add up"
            )
    if measured(router) == SERVED:
        notes.append(
            "served: every request a point; fit by least squares on its joules, "
            "error against each size's mean"
        )
    return _table(
        _title(router, "system models"),
        ("system", "power_w", "sweeps", "energy_fit_error", "time_fit_error"),
        ("system", "avg power W", "measured sweeps", "energy fit err", "time fit err"),
        rows,
        notes,
        priorities=(0, 2, 3, 1, 1),
    )


def pareto_table(routed: Routed) -> Table:
    rows = [
        (d.policy.lam, d.policy.describe(), d.totals.energy_j, d.totals.runtime_s)
        for d in routed.front
    ]
    return _table(
        _title(routed.router, f"energy-runtime Pareto front ({len(routed.sweep)} lambdas)"),
        ("lambda", "policy", "energy_j", "runtime_s"),
        ("lambda", "policy", "energy J", "runtime s"),
        rows,
        priorities=(0, 0, 1, 1),
    )


def routed_tables(routed: Routed) -> list[Table]:
    savings = savings_table(routed.decision, _title(routed.router, "workload totals and savings"))
    tables = [policy_table(routed), savings, fit_table(routed.router)]
    if routed.front:
        tables.append(pareto_table(routed))
    return tables


def _best_single(d: Decision) -> Baseline:
    """The cheapest system taking every query: what routing must beat."""
    singles = [b for b in d.baselines if b.name.startswith("all on ")]
    return min(singles, key=lambda b: b.totals.energy_j)


def beside_table(alone: Sequence[Routed], served: Sequence[Routed]) -> Table:
    """Each model's threshold and savings from one-at-a-time cases and from a served
    workload, one row each: the two can differ by far, and the reasons are in the notes."""
    rows = []
    for r in sorted([*alone, *served], key=lambda r: (r.router.model, measured(r.router))):
        d = r.decision
        best = _best_single(d)
        rows.append(
            (
                r.router.model,
                measured(r.router),
                d.policy.describe(),
                d.totals.energy_j,
                f"{_pct(d.saving(best))} ({best.name[len('all on ') :]})",
                _pct(d.saving(d.baselines[-1])),
            )
        )
    return _table(
        "routing: thresholds from one-at-a-time cases and from a served workload",
        ("model", "measured", "policy", "energy_j", "saved_vs_best_system", "saved_vs_unaware"),
        ("model", "measured", "policy", "energy J", "saved vs best system", "vs size-blind"),
        rows,
        (
            "one at a time: a query alone pays every decode step's fixed cost (the weights' "
            "reads); served: a batch of b shares it, so each request pays about 1/b of it and "
            "the systems' per-request joules fall by factors that depend on their batches",
            "served joules are net of idle power; one-at-a-time joules are as measured",
        ),
        priorities=(0, 1, 0, 2, 0, 1),
    )


def _totals_json(t: Totals) -> dict[str, Any]:
    return {
        "energy_j": t.energy_j,
        "runtime_s": t.runtime_s,
        "cost_j": t.cost_j,
        "makespan_s": t.makespan_s,
        "queries": dict(t.queries),
        "busy_s": dict(t.busy_s),
        "energy_by_system_j": dict(t.energy_by_system_j),
    }


def routed_json(routed: Routed) -> dict[str, Any]:
    d, router = routed.decision, routed.router
    return {
        "model": router.model,
        "measured": measured(router),
        "by": router.by,
        "workload": {"name": router.workload.name, "queries": d.queries},
        "boundaries": router.boundaries,
        "p_ref_w": router.p_ref_w,
        "policy": d.policy.to_json(),
        "totals": _totals_json(d.totals),
        "baselines": [
            {
                "name": b.name,
                **_totals_json(b.totals),
                "energy_saving": d.saving(b, "energy_j"),
                "runtime_saving": d.saving(b, "runtime_s"),
            }
            for b in d.baselines
        ],
        "systems": [
            {
                "system": m.system,
                "average_power_w": m.profile.average_power_w,
                "sweeps": {
                    s.axis: {"fixed_tokens": s.fixed, "sizes": list(s.sizes)}
                    for s in (m.input_sweep, m.output_sweep)
                    if s is not None
                },
                "fit": {
                    "terms": list(TERMS),
                    "dropped_terms": list(m.fitted.dropped),
                    "energy_coef": list(m.fitted.energy_coef),
                    "time_coef": list(m.fitted.time_coef),
                    "energy_error_pct": {
                        "mean": m.fitted.energy_error.mean_abs_pct,
                        "max": m.fitted.energy_error.max_abs_pct,
                    },
                    "time_error_pct": {
                        "mean": m.fitted.time_error.mean_abs_pct,
                        "max": m.fitted.time_error.max_abs_pct,
                    },
                },
            }
            for m in router.models
        ],
        "pareto": [
            {
                "lambda": x.policy.lam,
                "policy": x.policy.describe(),
                "energy_j": x.totals.energy_j,
                "runtime_s": x.totals.runtime_s,
            }
            for x in routed.front
        ],
    }


def _strict(value: Any) -> Any:
    """NaN and infinities become null: the output is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def render_routed(
    routed: Sequence[Routed],
    fmt: str = "table",
    width: int | None = None,
    served: Sequence[Routed] = (),
) -> str:
    """One-at-a-time decisions, then a served workload's, then the two side by side when
    both were measured; JSON: one list, each decision saying how it was measured."""
    both = [*routed, *served]
    if fmt == "json":
        return json.dumps([_strict(routed_json(r)) for r in both], indent=2, allow_nan=False)
    tables = [t for r in both for t in routed_tables(r)]
    if routed and served:
        tables.append(beside_table(routed, served))
    return render(tables, fmt, width=width)
