"""Why a case got worse: more work, or the same work done slower, and what moved most.

A failed gate says "+47.9 %"; this module says why, from what the two runs recorded
besides their trials:

- the **counted work** (``--energy-count-work``, ``predict.work_count``): FLOPs, bytes
  and operator calls per token, per phase and operator class.  Counted, so any change is
  real: the same code and inputs count the same in every session.  More work is named by
  the phase, class and quantity that grew most (its share of its phase's total);
- the **operator profile** (``--energy-profile-ops``, ``predict.op_profile``): the time
  of each operator class per token, and the time outside any operator (Python, the
  generate loop).  Where the work is the same, the biggest grower of time is named.

``explain`` gives one line per case (printed under a failed gate), ``explain_tables``
the full picture (``llmenergy compare --explain``, the HTML report).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .results import DECODE, PREFILL, CaseResult, work_tokens
from .tables import Raw, Table, fmt_number, printable

QUANTITIES = (("flops", "FLOPs"), ("bytes", "bytes"), ("calls", "operator calls"))
OUTSIDE = "outside operators"
# Below this relative change a counted total is the same (floating sums of FLOPs).
SAME = 1e-9
# How many operators the tables list, by the size of their change.
TOP_OPS = 8

NOT_COUNTED = "work not counted (--energy-count-work on both runs tells more work from slower)"
SERVER = "a server's work is not counted (its model runs in another process)"
SAME_WORK = "same work (counted)"
NO_OP_MOVED = (
    "no operator moved: every operator's calls, FLOPs and bytes per token read the same "
    "on both sides"
)


@dataclass(frozen=True)
class Why:
    """Why one case got worse: the line printed under a failed gate, and the tables
    (``llmenergy compare --explain``, the HTML report)."""

    name: str
    line: str
    tables: tuple[Table, ...]


def why(name: str, base: CaseResult, head: CaseResult) -> Why:
    return Why(name, explain(base, head), tuple(explain_tables(name, base, head)))


@dataclass(frozen=True)
class Mover:
    """One quantity of one phase and class, per token, on both sides."""

    phase: str  # PREFILL, DECODE, or "" (the whole run)
    op_class: str
    quantity: str  # flops, bytes, calls, or seconds
    base: float
    head: float
    share: float  # (head - base) / the base's phase total of this quantity

    @property
    def ratio(self) -> float:
        return self.head / self.base if self.base else math.inf

    def text(self) -> str:
        label = dict(QUANTITIES).get(self.quantity, self.quantity)
        where = f"{self.phase}: " if self.phase else ""
        if not self.base:
            return f"{where}{self.op_class} {label}/token new ({fmt_number(self.head)})"
        return f"{where}{self.op_class} {label}/token x{_ratio(self.ratio)}"


def _ratio(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _percent(fraction: float) -> str:
    return f"{fraction:+.0%}" if abs(fraction) >= 0.01 else f"{fraction:+.1%}"


def phase_tokens(case: CaseResult, phase: str) -> int:
    """``results.work_tokens``, with "" for the whole run."""
    return work_tokens(case, phase or None)


def _phases(base: CaseResult, head: CaseResult) -> tuple[str, ...]:
    assert base.work is not None and head.work is not None
    if base.work.marked and head.work.marked:
        return (PREFILL, DECODE)
    return ("",)


def work_rows(base: CaseResult, head: CaseResult) -> list[Mover]:
    """Every (phase, class, quantity) of the counted work, per token, both sides."""
    assert base.work is not None and head.work is not None
    rows = []
    for phase in _phases(base, head):
        key = phase or None
        nb, nh = phase_tokens(base, phase), phase_tokens(head, phase)
        if not nb or not nh:
            continue
        classes = sorted({o.op_class for w in (base.work, head.work) for o in w.ops(key)})
        for quantity, _ in QUANTITIES:
            total = base.work.total(quantity, key) / nb
            for cls in classes:
                b = base.work.total(quantity, key, cls) / nb
                h = head.work.total(quantity, key, cls) / nh
                share = (h - b) / total if total else (math.inf if h > b else 0.0)
                rows.append(Mover(phase, cls, quantity, b, h, share))
    return rows


def _changed(b: float, h: float) -> bool:
    return abs(h - b) > SAME * max(abs(b), abs(h), 1e-300)


def work_changed(base: CaseResult, head: CaseResult) -> bool:
    """Both runs counted the case's work, and some of it differs."""
    if base.work is None or head.work is None:
        return False
    return any(_changed(r.base, r.head) for r in work_rows(base, head))


def _hint(rows: Sequence[Mover]) -> str:
    """A likely cause, where the pattern of the change points to one."""

    def ratio(phase: str, quantity: str, cls: str | None = None) -> float:
        picked = [
            r
            for r in rows
            if r.phase == phase and r.quantity == quantity and (cls is None or r.op_class == cls)
        ]
        b, h = sum(r.base for r in picked), sum(r.head for r in picked)
        return h / b if b else (math.inf if h else 1.0)

    phases = {r.phase for r in rows}
    if DECODE in phases and ratio(DECODE, "flops") >= 2 and ratio(PREFILL, "flops") < 1.5:
        return "is the KV cache still used? each decoded token now computes over the whole sequence"
    matmul = [ratio(p, "flops", "matmul") for p in phases]
    if matmul and all(1.9 <= m <= 2.1 for m in matmul):
        return "is every product computed twice?"
    flops = [ratio(p, "flops") for p in phases]
    moved = [ratio(p, "bytes") for p in phases]
    if all(abs(f - 1) < 0.01 for f in flops) and moved and min(moved) >= 1.5:
        return "the same FLOPs moving more bytes: a wider dtype, or copies?"
    return ""


def profile_rows(base: CaseResult, head: CaseResult) -> list[Mover]:
    """Seconds per token of each operator class and outside any operator, from the
    two runs' operator profiles (both must have one)."""
    pb, ph = base.op_profile, head.op_profile
    assert pb is not None and ph is not None
    nb, nh = phase_tokens(base, ""), phase_tokens(head, "")
    if not nb or not nh:
        return []
    wall_b = _seconds(pb.get("wall_s")) / nb
    rows = []
    classes = sorted(set(pb.get("classes", {})) | set(ph.get("classes", {})))
    for cls in classes:
        b = _seconds(pb.get("classes", {}).get(cls, {}).get("self_cpu_s")) / nb
        h = _seconds(ph.get("classes", {}).get(cls, {}).get("self_cpu_s")) / nh
        rows.append(Mover("", cls, "seconds", b, h, (h - b) / wall_b if wall_b else 0.0))
    b = _outside(pb) / nb
    h = _outside(ph) / nh
    rows.append(Mover("", OUTSIDE, "seconds", b, h, (h - b) / wall_b if wall_b else 0.0))
    return rows


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


def _outside(profile: Mapping[str, Any]) -> float:
    """The profiled run's time in no operator: its wall time less the operators' own."""
    return max(0.0, _seconds(profile.get("wall_s")) - _seconds(profile.get("self_cpu_s")))


def _op_times(profile: Mapping[str, Any], op_class: str) -> dict[str, float]:
    """Self time of the profile's kept operators of one class, by name."""
    out: dict[str, float] = {}
    for op in profile.get("ops", ()):
        if isinstance(op, Mapping) and op.get("class") == op_class:
            name = str(op.get("name", "?"))
            out[name] = out.get(name, 0.0) + _seconds(op.get("self_cpu_s"))
    return out


def _slower_line(base: CaseResult, head: CaseResult, same: str) -> str:
    """Where the time went, for the same (or uncounted) work."""
    if base.op_profile is None or head.op_profile is None:
        change = _time_change(base, head)
        slower = f"{_percent(change)} time per trial" if change is not None else "slower"
        return (
            f"{same}; {slower}: the same work done slower "
            "(--energy-profile-ops on both runs shows where the time went)"
        )
    rows = profile_rows(base, head)
    if not rows:
        return same
    top = max(rows, key=lambda r: r.head - r.base)
    if top.head <= top.base:
        change = _time_change(base, head)
        slower = f"{_percent(change)} time per trial" if change is not None else "slower"
        return (
            f"{same}; {slower}, not located by the profiles (one profiled run each: the "
            "profiler's own cost per operator can hide a small change)"
        )
    grew = (top.head - top.base) / top.base if top.base else math.inf
    grown = _percent(grew) if math.isfinite(grew) else "new"
    if top.op_class == OUTSIDE:
        operators = " and operators" if same == SAME_WORK else ""  # calls are counted work
        return f"{same}{operators}; {grown} time outside operators (Python, the generate loop)"
    nb, nh = phase_tokens(base, ""), phase_tokens(head, "")
    ob, oh = _op_times(base.op_profile, top.op_class), _op_times(head.op_profile, top.op_class)
    names = set(ob) | set(oh)
    if names:
        name = max(names, key=lambda n: oh.get(n, 0.0) / nh - ob.get(n, 0.0) / nb)
        b, h = ob.get(name, 0.0) / nb, oh.get(name, 0.0) / nh
        if b and h > b:
            return f"{same}; {_percent((h - b) / b)} time in {name} ({top.op_class})"
    return f"{same}; {grown} time in {top.op_class} operators"


def _time_change(base: CaseResult, head: CaseResult) -> float | None:
    tb = [t.seconds for t in base.trials]
    th = [t.seconds for t in head.trials]
    if not tb or not th or not sum(tb):
        return None
    return (sum(th) / len(th)) / (sum(tb) / len(tb)) - 1


def _is_server(case: CaseResult) -> bool:
    return any(t.requests for t in case.trials)


def explain(base: CaseResult, head: CaseResult) -> str:
    """One line: why ``head`` differs from ``base`` (the biggest mover and, where the
    pattern points to one, a likely cause)."""
    if _is_server(base) or _is_server(head):
        return SERVER
    if base.work is None or head.work is None:
        if base.op_profile is not None and head.op_profile is not None:
            return _slower_line(base, head, NOT_COUNTED)
        return NOT_COUNTED + "; --energy-profile-ops shows where the time went"
    rows = work_rows(base, head)
    moved = [r for r in rows if _changed(r.base, r.head)]
    if not moved:
        return _slower_line(base, head, SAME_WORK)
    top = max(moved, key=lambda r: (abs(r.share), r.quantity == "flops"))
    hint = _hint(rows)
    phase_rows = [r for r in rows if r.phase == top.phase and r.quantity == top.quantity]
    b, h = sum(r.base for r in phase_rows), sum(r.head for r in phase_rows)
    whole = dict(QUANTITIES)[top.quantity]
    where = f"{top.phase} " if top.phase else ""
    total = f"{where}{whole}/token x{_ratio(h / b)}" if b else ""
    more = "more work" if h >= b else "less work"
    detail = "; ".join(x for x in (total, hint) if x)
    return f"{more}: {top.text()}" + (f" ({detail})" if detail else "")


# -- the full picture (compare --explain, the HTML report) --------------------------------
def _table(
    title: str,
    keys: Sequence[str],
    headers: Sequence[str],
    rows: list[list[Raw]],
    cells: list[list[str]],
    notes: Sequence[str] = (),
) -> Table:
    return Table(
        title=title,
        keys=tuple(keys),
        headers=tuple(headers),
        rows=tuple(tuple(r) for r in rows),
        cells=tuple(tuple(c) for c in cells),
        notes=tuple(notes),
    )


def explain_tables(name: str, base: CaseResult, head: CaseResult) -> list[Table]:
    """Work per token base -> head by phase and class, the operators that moved most,
    and, where both runs were profiled, time (and energy, by time share) per class."""
    out: list[Table] = []
    shown = printable(name)
    if base.work is not None and head.work is not None:
        keys = ("phase", "class", "quantity", "baseline", "current", "ratio")
        rows: list[list[Raw]] = []
        cells: list[list[str]] = []
        for r in work_rows(base, head):
            if not (r.base or r.head):
                continue
            ratio = r.ratio if r.base else None
            rows.append([r.phase or "all", r.op_class, r.quantity, r.base, r.head, ratio])
            cells.append(
                [
                    r.phase or "all",
                    r.op_class,
                    dict(QUANTITIES)[r.quantity] + "/token",
                    fmt_number(r.base),
                    fmt_number(r.head),
                    "new" if ratio is None else f"x{_ratio(ratio)}",
                ]
            )
        out.append(
            _table(
                f"{shown}: counted work per token (prefill per input token, decode per "
                "output token after the first)",
                keys,
                keys,
                rows,
                cells,
                ["counted: exact, the same in every session with the same code and libraries"],
            )
        )
        out.append(_ops_table(shown, base, head))
        if base.work.ranks or head.work.ranks:
            out.append(_ranks_table(shown, base, head))
    else:
        out.append(
            _table(
                f"{shown}: counted work",
                ("note",),
                ("note",),
                [[_work_note(base, head)]],
                [[_work_note(base, head)]],
            )
        )
    if base.op_profile is not None and head.op_profile is not None:
        out.append(_profile_table(shown, base, head))
    return out


def _work_note(base: CaseResult, head: CaseResult) -> str:
    if _is_server(base) or _is_server(head):
        return SERVER
    missing = [label for label, c in (("baseline", base), ("current", head)) if c.work is None]
    return f"not counted in the {' and '.join(missing)} run (--energy-count-work)"


def _ops_table(shown: str, base: CaseResult, head: CaseResult) -> Table:
    """The operators whose counted work changed most (both phases together)."""
    assert base.work is not None and head.work is not None
    nb, nh = phase_tokens(base, ""), phase_tokens(head, "")

    def by_op(case: CaseResult, tokens: int) -> dict[tuple[str, str], list[float]]:
        assert case.work is not None
        found: dict[tuple[str, str], list[float]] = {}
        for o in case.work.ops():
            row = found.setdefault((o.name, o.op_class), [0.0, 0.0, 0.0])
            row[0] += o.calls / tokens
            row[1] += o.flops / tokens
            row[2] += o.bytes / tokens
        return found

    ob, oh = by_op(base, max(nb, 1)), by_op(head, max(nh, 1))
    zero = [0.0, 0.0, 0.0]
    total_flops = sum(v[1] for v in ob.values()) or 1.0
    total_bytes = sum(v[2] for v in ob.values()) or 1.0
    total_calls = sum(v[0] for v in ob.values()) or 1.0

    def weight(key: tuple[str, str]) -> float:
        b, h = ob.get(key, zero), oh.get(key, zero)
        return max(
            abs(h[1] - b[1]) / total_flops,
            abs(h[2] - b[2]) / total_bytes,
            abs(h[0] - b[0]) / total_calls,
        )

    title = f"{shown}: the operators whose counted work moved most, per token (baseline -> current)"
    moved = [k for k in set(ob) | set(oh) if _op_moved(ob.get(k, zero), oh.get(k, zero))]
    if not moved:
        return _table(title, ("note",), ("note",), [[NO_OP_MOVED]], [[NO_OP_MOVED]])
    keys = sorted(moved, key=lambda k: (-weight(k), k))[:TOP_OPS]
    rows: list[list[Raw]] = []
    cells: list[list[str]] = []
    for key in keys:
        b, h = ob.get(key, zero), oh.get(key, zero)
        # raw: the change per token (csv, json); shown: baseline -> current
        rows.append([key[0], key[1], *(y - x for x, y in zip(b, h))])
        cells.append(
            [
                printable(key[0]),
                key[1],
                *(f"{fmt_number(x)} -> {fmt_number(y)}" for x, y in zip(b, h)),
            ]
        )
    still = len(set(ob) | set(oh)) - len(moved)
    return _table(
        title,
        ("operator", "class", "calls_change", "flops_change", "bytes_change"),
        ("operator", "class", "calls", "FLOPs", "bytes"),
        rows,
        cells,
        [f"{still} operator(s) whose work per token reads the same on both sides left out"]
        if still
        else [],
    )


def _op_moved(base: Sequence[float], head: Sequence[float]) -> bool:
    """An operator moved when one of its quantities per token reads otherwise on the two
    sides: a change that rounds away in the table (``0.9 -> 0.9``) is no move."""
    return any(fmt_number(b) != fmt_number(h) for b, h in zip(base, head))


def _ranks_table(shown: str, base: CaseResult, head: CaseResult) -> Table:
    """Under torchrun: each rank's share of the job's counted work, per token."""
    assert base.work is not None and head.work is not None
    nb, nh = max(phase_tokens(base, ""), 1), max(phase_tokens(head, ""), 1)
    rows: list[list[Raw]] = []
    cells: list[list[str]] = []
    for rank in range(max(len(base.work.ranks), len(head.work.ranks))):
        sides = [w.ranks[rank] if rank < len(w.ranks) else None for w in (base.work, head.work)]
        raw: list[Raw] = [rank]
        shown_cells = [str(rank)]
        for quantity, _ in QUANTITIES:
            b, h = (None if w is None else w.total(quantity) / n for w, n in zip(sides, (nb, nh)))
            raw.append(None if b is None or h is None else h - b)
            shown_cells.append(f"{fmt_number(b)} -> {fmt_number(h)}")
        rows.append(raw)
        cells.append(shown_cells)
    return _table(
        f"{shown}: each rank's share of the counted work, per token of the job",
        ("rank", "flops_change", "bytes_change", "calls_change"),
        ("rank", "FLOPs", "bytes", "operator calls"),
        rows,
        cells,
    )


def _profile_table(shown: str, base: CaseResult, head: CaseResult) -> Table:
    """Time per token of each class and outside operators, and the energy each would
    carry by its share of the profiled run's time (an attribution, not a measurement)."""
    jb, jh = _joules_per_token(base), _joules_per_token(head)
    pb, ph = base.op_profile, head.op_profile
    assert pb is not None and ph is not None
    wall_b = _seconds(pb.get("wall_s")) / max(phase_tokens(base, ""), 1)
    wall_h = _seconds(ph.get("wall_s")) / max(phase_tokens(head, ""), 1)
    rows: list[list[Raw]] = []
    cells: list[list[str]] = []
    for r in profile_rows(base, head):
        eb = jb * r.base / wall_b if jb is not None and wall_b else None
        eh = jh * r.head / wall_h if jh is not None and wall_h else None
        change = (r.head - r.base) / r.base if r.base else None
        rows.append([r.op_class, r.head * 1e6, change, eh])
        cells.append(
            [
                r.op_class,
                f"{fmt_number(r.base * 1e6)} -> {fmt_number(r.head * 1e6)}",
                "new" if change is None else _percent(change),
                "—" if eb is None or eh is None else f"{fmt_number(eb)} -> {fmt_number(eh)}",
            ]
        )
    return Table(
        title=f"{shown}: time per token by operator class (one profiled run each)",
        keys=("class", "us_per_token", "change", "j_per_token_by_time_share"),
        headers=("class", "µs/token", "change", "J/token by time share"),
        rows=tuple(tuple(r) for r in rows),
        cells=tuple(tuple(c) for c in cells),
        notes=(
            "profiled runs are slower than measured ones (the profiler's own cost); their "
            "shares compare, their seconds do not; energy is the case's J/token split by "
            "each class's share of its profiled run's time: an attribution",
        ),
    )


def _joules_per_token(case: CaseResult) -> float | None:
    trials = [t for t in case.trials if t.joules is not None]
    tokens = phase_tokens(case, "")
    if not trials or not tokens:
        return None
    return sum(float(t.joules) for t in trials) / len(trials) / tokens


__all__ = [
    "Why",
    "explain",
    "explain_tables",
    "phase_tokens",
    "profile_rows",
    "why",
    "work_changed",
    "work_rows",
]
