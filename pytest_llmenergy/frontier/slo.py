"""The best configuration under a latency limit, as ML.ENERGY's leaderboard chooses it.

Cases that differ only in their configuration (batch size, concurrent requests, GPU
setting) are one sweep.  Each configuration is a point: its inter-token latency (a
server request's time per output token after the first, ``tpot_s``; a local model's
decode seconds per token it produces) and its energy per output token (the steady
window's, ``steady_j_per_token``, where every configuration of the sweep has one, as
ML.ENERGY measures servers; else the whole query's joules per output token).  Over
them: the time-energy Pareto front (``frontier.pareto_front``), and, under limits such
as ``itl:100ms,ttft:2s`` (``--llm-slo``), the minimum-energy configuration that meets
every one, or none, with the closest named.  A configuration ML.ENERGY's rules reject
(``serving_rules``), with invalid telemetry, or without trials is left out, with why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import values
from ..case_tables import busy_reason
from ..conditions.settings import GPU_LABELS, SETTING_LABEL
from ..errors import ConfigError
from ..figures import FIGURES
from ..llm.grid import BATCH_AXIS, CONCURRENCY_AXIS
from ..results import CaseResult
from ..serving_rules import Rejection, group_key, label_count, rejections
from ..tables import DASH, Table, fmt_number
from . import pareto_front

ITL, TTFT = "itl", "ttft"
METRICS = {ITL: "inter-token latency", TTFT: "time to first token"}
SLO_EXAMPLE = "itl:100ms or itl:100ms,ttft:2s"
# the labels a sweep's configurations differ in; every other label names the sweep
CONFIG_LABELS = (BATCH_AXIS.name, CONCURRENCY_AXIS.name, *GPU_LABELS)
STEADY = "steady_j_per_token"  # ML.ENERGY's: the steady window's joules per output token
WHOLE = "j_per_out_token"  # the whole query's joules per output token
ENERGY_NAMES = {STEADY: "steady window", WHOLE: "whole query"}


# -- the limits -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limit:
    """One service-level limit: a latency ``metric`` (``itl`` or ``ttft``) at most ``max_s``."""

    metric: str
    max_s: float

    @property
    def text(self) -> str:
        """As it is written: ``itl:100ms``, ``ttft:2s``."""
        if self.max_s < 1.0:
            return f"{self.metric}:{self.max_s * 1e3:g}ms"
        return f"{self.metric}:{self.max_s:g}s"


def parse_slo(text: str) -> tuple[Limit, ...]:
    """``itl:100ms,ttft:2s``: each limit once, a positive finite time in ms or s."""
    limits: dict[str, Limit] = {}
    for part in (p.strip() for p in text.split(",")):
        name, colon, amount = part.partition(":")
        metric = name.strip().lower()
        if not colon or metric not in METRICS:
            raise ConfigError(
                f"expected limits such as {SLO_EXAMPLE} ({', '.join(METRICS)}), got {text!r}"
            )
        if metric in limits:
            raise ConfigError(f"{metric} is limited twice in {text!r}; give each limit once")
        try:
            limits[metric] = Limit(metric, values.seconds(amount))
        except ConfigError as exc:
            raise ConfigError(f"{metric}: {exc}") from None
    return tuple(limits.values())


def slo_text(limits: Sequence[Limit]) -> str:
    return ",".join(limit.text for limit in limits)


def saved_limits(options: Mapping[str, Any]) -> tuple[tuple[Limit, ...], str]:
    """The limits a run file's options carry (``slo``), and a note when they cannot be
    read (a hand-edited or foreign file): then no limits."""
    given = options.get("slo")
    if given in (None, ""):
        return (), ""
    if not isinstance(given, str):
        return (), "the run's slo option is not text; no configuration is chosen"
    try:
        return parse_slo(given), ""
    except ConfigError as exc:
        return (), f"the run's slo option cannot be read ({exc}); no configuration is chosen"


# -- the points ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Configuration:
    """One measured configuration of a sweep: its latencies and energy per output token."""

    nodeid: str
    setting: str  # e.g. "c4", "bs8", "c4 pl250W"
    itl_s: float
    ttft_s: float | None
    j_per_out_token: float
    rank: tuple[int, int, str]  # batch size, concurrency, GPU setting: the sweep's order

    @property
    def time_s(self) -> float:  # what the front is drawn over (``frontier.Timed``)
        return self.itl_s

    @property
    def energy_j(self) -> float:
        return self.j_per_out_token

    def latency_s(self, metric: str) -> float | None:
        return self.itl_s if metric == ITL else self.ttft_s


@dataclass(frozen=True)
class LeftOut:
    """A configuration of the sweep left out of the front and the choice, and why."""

    nodeid: str
    name: str
    setting: str
    reason: str


def is_served(cases: Sequence[CaseResult]) -> bool:
    """Whether the cases were sent to a server (then a configuration is a concurrency)."""
    return any(
        CONCURRENCY_AXIS.name in c.labels or any(t.requests for t in c.trials) for c in cases
    )


def setting_of(case: CaseResult, served: bool) -> str:
    """The configuration as the case ids write it: ``c4``, ``bs8``, with the GPU
    setting after it; ``served``: of a sweep sent to a server (``c1``, not ``bs1``)."""
    labels = case.labels
    parts = []
    if BATCH_AXIS.name in labels or not served:
        parts.append(f"bs{label_count(case, BATCH_AXIS.name)}")
    if CONCURRENCY_AXIS.name in labels or served:
        parts.append(f"c{label_count(case, CONCURRENCY_AXIS.name)}")
    if SETTING_LABEL in labels:
        parts.append(labels[SETTING_LABEL])
    return " ".join(parts)


def rank_of(case: CaseResult) -> tuple[int, int, str]:
    return (
        label_count(case, BATCH_AXIS.name),
        label_count(case, CONCURRENCY_AXIS.name),
        case.labels.get(SETTING_LABEL, ""),
    )


def sweep_key(case: CaseResult) -> tuple[Any, ...]:
    """What the configurations of one sweep share: the test, every label but the
    configuration's, and the token counts."""
    return group_key(case, CONFIG_LABELS)


def itl_of(case: CaseResult) -> float | None:
    """Seconds between output tokens: a server request's (``tpot_s``), else the decode
    passes' seconds per token they produce."""
    served = FIGURES["tpot_s"].value(case)
    if isinstance(served, float):
        return served
    decode = FIGURES["decode_s"].value(case)
    if isinstance(decode, float) and case.output_tokens > 1:
        return decode / (case.output_tokens - 1)
    return None


def ttft_of(case: CaseResult) -> float | None:
    for key in ("req_ttft_s", "ttft_s"):
        found = FIGURES[key].value(case)
        if isinstance(found, float):
            return found
    return None


def energy_of(case: CaseResult, figure: str) -> float | None:
    """Joules per output token: the steady window's, or the whole query's."""
    if figure == STEADY:
        found = FIGURES[STEADY].value(case)
        return found if isinstance(found, float) else None
    per_query = FIGURES["energy_j"].value(case)
    if isinstance(per_query, float) and case.output_tokens > 0:
        return per_query / case.output_tokens
    return None


def why_left_out(case: CaseResult, rejection: Rejection | None) -> str:
    """Why a configuration cannot stand on the front ("": it can)."""
    if not case.trials:
        why = case.reason or (busy_reason(case) if case.busy_trials else case.status)
        return f"not measured: {why}"
    if rejection is not None:
        return f"rejected: {rejection.reason}"
    invalid = case.invalid_telemetry
    if invalid:
        return f"{len(invalid)} of {len(case.trials)} trials with invalid power telemetry"
    if itl_of(case) is None:
        return "no inter-token latency (requests not streamed, or no prefill | decode split)"
    if energy_of(case, WHOLE) is None:
        return "no energy per output token"
    return ""


def configuration(case: CaseResult, figure: str, served: bool) -> Configuration:
    """The point of an accepted case (``why_left_out`` said nothing)."""
    itl, energy = itl_of(case), energy_of(case, figure)
    if itl is None or energy is None:
        raise ValueError(f"{case.nodeid} has no point; ask why_left_out first")
    setting = setting_of(case, served)
    return Configuration(case.nodeid, setting, itl, ttft_of(case), energy, rank_of(case))


# -- the choice ------------------------------------------------------------------------------
def meets(c: Configuration, limits: Sequence[Limit]) -> bool:
    """Every limit met; a latency not measured meets none."""
    return all(
        (v := c.latency_s(limit.metric)) is not None and v <= limit.max_s for limit in limits
    )


def excess(c: Configuration, limits: Sequence[Limit]) -> float:
    """How far over its limits the configuration is: its largest latency / limit."""
    ratios = [
        math.inf if (v := c.latency_s(limit.metric)) is None else v / limit.max_s
        for limit in limits
    ]
    return max(ratios, default=0.0)


@dataclass(frozen=True)
class Choice:
    """Under ``limits``: the minimum-energy configuration that meets them (ties: the
    faster, then the smaller), or None and the one closest to meeting them."""

    limits: tuple[Limit, ...]
    chosen: Configuration | None
    closest: Configuration | None = None


def choose(points: Sequence[Configuration], limits: Sequence[Limit]) -> Choice:
    feasible = [c for c in points if meets(c, limits)]
    if feasible:
        best = min(feasible, key=lambda c: (c.j_per_out_token, c.itl_s, c.rank))
        return Choice(tuple(limits), best)
    closest = min(
        points, key=lambda c: (excess(c, limits), c.j_per_out_token, c.rank), default=None
    )
    return Choice(tuple(limits), None, closest)


# -- the sweeps ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    """One case measured in several configurations: its points, front and choice."""

    test: str
    labels: Mapping[str, str]  # the case's labels without the configuration's
    input_tokens: int
    output_tokens: int
    energy: str  # STEADY or WHOLE: the energy figure of every point
    points: tuple[Configuration, ...]  # in the sweep's order
    front: tuple[Configuration, ...]  # fastest first
    left_out: tuple[LeftOut, ...]
    choice: Choice | None  # None: no limits given

    @property
    def model(self) -> str:
        return self.labels.get("model", self.test.rsplit("::", 1)[-1])

    @property
    def name(self) -> str:
        sweep = self.labels.get("sweep", "")
        return f"{self.model} {sweep} in{self.input_tokens}-out{self.output_tokens}".replace(
            "  ", " "
        )


def energy_figure(accepted: Sequence[CaseResult]) -> str:
    """The steady window's figure where every accepted configuration has one."""
    if accepted and all(energy_of(c, STEADY) is not None for c in accepted):
        return STEADY
    return WHOLE


def sweep_of(
    members: Sequence[CaseResult], rejected: Mapping[str, Rejection], limits: Sequence[Limit]
) -> Sweep:
    first = members[0]
    test, rest, n_in, n_out = sweep_key(first)
    reasons = {c.nodeid: why_left_out(c, rejected.get(c.nodeid)) for c in members}
    accepted = [c for c in members if not reasons[c.nodeid]]
    figure, served = energy_figure(accepted), is_served(members)
    points = tuple(configuration(c, figure, served) for c in accepted)
    left = tuple(
        LeftOut(c.nodeid, c.name, setting_of(c, served), reasons[c.nodeid])
        for c in members
        if reasons[c.nodeid]
    )
    return Sweep(
        test=test,
        labels=dict(rest),
        input_tokens=n_in,
        output_tokens=n_out,
        energy=figure,
        points=points,
        front=tuple(pareto_front(points)),
        left_out=left,
        choice=choose(points, limits) if limits else None,
    )


def sweeps(
    cases: Sequence[CaseResult], limits: Sequence[Limit] = (), least: int = 2
) -> list[Sweep]:
    """Every sweep of ``least`` configurations or more (left-out ones counted), in the
    cases' order, each in its configurations' order."""
    groups: dict[tuple[Any, ...], list[CaseResult]] = {}
    for case in cases:
        groups.setdefault(sweep_key(case), []).append(case)
    rejected = rejections(cases)
    return [
        sweep_of(sorted(members, key=rank_of), rejected, limits)
        for members in groups.values()
        if len(members) >= least
    ]


# -- showing ---------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    return DASH if seconds is None else fmt_number(seconds * 1e3)


def _point_text(c: Configuration) -> str:
    return f"{c.setting} (ITL {_ms(c.itl_s)} ms, {fmt_number(c.j_per_out_token)} J/out)"


def choice_text(choice: Choice) -> str:
    """The choice in words: the configuration, or none and the closest."""
    if choice.chosen is not None:
        return _point_text(choice.chosen)
    if choice.closest is None:
        return "none measured"
    over = excess(choice.closest, choice.limits)
    how = "" if math.isinf(over) else f", {(over - 1) * 100:+.0f}% over"
    return f"none meets it; closest: {_point_text(choice.closest)}{how}"


def front_table(items: Sequence[Sweep], limits: Sequence[Limit] = ()) -> Table:
    """One row per configuration of every sweep: latencies, energy, on the front, and
    whether it meets the limits; the left-out configurations as notes."""
    keys = ["sweep", "configuration", "itl_ms", "ttft_ms", "j_per_out_token", "energy", "front"]
    headers = ["sweep", "config", "ITL ms", "TTFT ms", "J/out token", "energy", "on front"]
    if limits:
        keys.append("meets")
        headers.append(f"meets {slo_text(limits)}")
    rows: list[tuple[Any, ...]] = []
    cells: list[tuple[str, ...]] = []
    for s in items:
        on_front = {c.nodeid for c in s.front}
        for c in s.points:
            row: list[Any] = [
                s.name,
                c.setting,
                c.itl_s * 1e3,
                None if c.ttft_s is None else c.ttft_s * 1e3,
                c.j_per_out_token,
                ENERGY_NAMES[s.energy],
                c.nodeid in on_front,
            ]
            cell = [
                s.name,
                c.setting,
                _ms(c.itl_s),
                _ms(c.ttft_s),
                fmt_number(c.j_per_out_token),
                ENERGY_NAMES[s.energy],
                "yes" if c.nodeid in on_front else "",
            ]
            if limits:
                row.append(meets(c, limits))
                cell.append("yes" if meets(c, limits) else "no")
            rows.append(tuple(row))
            cells.append(tuple(cell))
    notes = tuple(f"{s.name} {o.setting}: left out: {o.reason}" for s in items for o in s.left_out)
    return Table(
        title="time-energy front over configurations (batch size, concurrency, GPU setting)",
        keys=tuple(keys),
        headers=tuple(headers),
        rows=tuple(rows),
        cells=tuple(cells),
        notes=notes,
        legend=(
            "ITL: inter-token latency (a server request's time per output token after the "
            "first; a local model's decode seconds per token); on front: no other "
            "configuration is both at least as fast and as cheap, and better in one",
            "energy: steady window = J per output token in a burst's steady window "
            "(ML.ENERGY's), where every configuration of the sweep has one; whole query = "
            "the query's J / its output tokens",
        ),
    )


def choice_table(items: Sequence[Sweep]) -> Table:
    """One row per sweep: the minimum-energy configuration that meets the limits."""
    limits = next((s.choice.limits for s in items if s.choice is not None), ())
    rows: list[tuple[Any, ...]] = []
    cells: list[tuple[str, ...]] = []
    for s in items:
        if s.choice is None:
            continue
        chosen = s.choice.chosen
        rows.append(
            (
                s.name,
                len(s.points),
                None if chosen is None else chosen.setting,
                None if chosen is None else chosen.itl_s * 1e3,
                None if chosen is None else chosen.j_per_out_token,
                choice_text(s.choice),
            )
        )
        cells.append(
            (
                s.name,
                str(len(s.points)),
                DASH if chosen is None else chosen.setting,
                DASH if chosen is None else _ms(chosen.itl_s),
                DASH if chosen is None else fmt_number(chosen.j_per_out_token),
                choice_text(s.choice),
            )
        )
    return Table(
        title=f"minimum-energy configuration under {slo_text(limits)}",
        keys=("sweep", "configurations", "chosen", "itl_ms", "j_per_out_token", "choice"),
        headers=("sweep", "configs", "chosen", "ITL ms", "J/out token", "choice"),
        rows=tuple(rows),
        cells=tuple(cells),
        hidden=("choice",) if all(s.choice and s.choice.chosen for s in items) else (),
        legend=(
            "chosen: the configuration with the least energy per output token among those "
            "meeting every limit (--llm-slo; a latency not measured meets none); none: the "
            "closest is the one least over its limits",
        ),
    )


def slo_tables(items: Sequence[Sweep]) -> list[Table]:
    """The front, and the choice where limits were given."""
    if not items:
        return []
    tables = [front_table(items, next((s.choice.limits for s in items if s.choice), ()))]
    if any(s.choice is not None for s in items):
        tables.append(choice_table(items))
    return tables
