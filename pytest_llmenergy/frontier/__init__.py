"""The time-energy frontier of a case over GPU settings (Perseus, Zeus).

Cases that differ only in their GPU setting (the ``gpu_setting`` label) are one case
measured at several settings.  For each: the Pareto frontier (no other setting is both
faster and cheaper), the minimum-energy setting, the energy bloat at the GPU's default
setting (the energy the best setting at most X % slower saves), and the setting that
minimises the cost the routing uses, ``lam * E + (1 - lam) * P_ref * T`` with P_ref the
GPU's highest allowed power limit, as Zeus's power-limit optimizer prices time.  From
these, a per-system policy: the best setting for each token range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..conditions.settings import (
    CLOCK_LABEL,
    DEFAULT_LABEL,
    GPU_LABELS,
    MAX_POWER_LABEL,
    POWER_LABEL,
    SETTING_LABEL,
)
from ..figures import FIGURES
from ..results import CaseResult
from ..tables import DASH, Table, fmt_number

DEFAULT_MAX_SLOWDOWNS = (0.0, 0.05)
FORMAT, VERSION = "pytest-llmenergy-frontier", 1
POLICY_FORMAT = "pytest-llmenergy-gpu-policy"


@dataclass(frozen=True)
class Point:
    """One setting of one case: mean time and energy over its trials."""

    setting: str
    time_s: float
    energy_j: float
    default: bool = False
    power_limit_w: float | None = None
    sm_clock: str | None = None  # MHz or "auto"
    time_half_s: float | None = None  # CI half-widths
    energy_half_j: float | None = None

    def cost(self, lam: float, p_ref_w: float) -> float:
        return lam * self.energy_j + (1.0 - lam) * p_ref_w * self.time_s

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "time_s": self.time_s,
            "energy_j": self.energy_j,
            "default": self.default,
            "power_limit_w": self.power_limit_w,
            "sm_clock": self.sm_clock,
            "time_half_width_s": self.time_half_s,
            "energy_half_width_j": self.energy_half_j,
        }


@dataclass(frozen=True)
class Bloat:
    """At most ``max_slowdown`` slower than the default: the cheapest setting, and what
    it saves against the default."""

    max_slowdown: float
    best: Point
    saved_j: float
    saved_share: float
    slowdown: float  # of the best setting, against the default

    def to_json(self) -> dict[str, Any]:
        return {
            "max_slowdown": self.max_slowdown,
            "setting": self.best.setting,
            "saved_j": self.saved_j,
            "saved_share": self.saved_share,
            "slowdown": self.slowdown,
        }


@dataclass(frozen=True)
class CaseFrontier:
    test: str  # the test function's node id, without parameters
    labels: Mapping[str, str]  # the case's labels without the GPU setting's
    input_tokens: int
    output_tokens: int
    points: tuple[Point, ...]
    pareto: tuple[Point, ...]  # fastest first
    min_energy: Point
    default: Point | None
    bloat: tuple[Bloat, ...]
    lam: float
    p_ref_w: float
    lam_best: Point

    @property
    def model(self) -> str:
        return self.labels.get("model", self.test.rsplit("::", 1)[-1])

    @property
    def sweep(self) -> str:
        return self.labels.get("sweep", "")

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "labels": dict(self.labels),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "points": [p.to_json() for p in self.points],
            "pareto": [p.setting for p in self.pareto],
            "min_energy": self.min_energy.setting,
            "default": None if self.default is None else self.default.setting,
            "bloat": [b.to_json() for b in self.bloat],
            "lambda": self.lam,
            "p_ref_w": self.p_ref_w,
            "lambda_best": self.lam_best.setting,
        }


# -- the math ---------------------------------------------------------------------------
class Timed(Protocol):
    """What a front is drawn over: a time and an energy (a ``Point``, or a server's
    configuration in ``frontier.slo``)."""

    @property
    def time_s(self) -> float: ...

    @property
    def energy_j(self) -> float: ...


T = TypeVar("T", bound=Timed)


def pareto_front(points: Sequence[T]) -> list[T]:
    """Points no other point dominates (at least as fast and as cheap, and better in
    one), fastest first; points measured exactly alike are all on it."""
    front: list[T] = []
    for p in sorted(points, key=lambda p: (p.time_s, p.energy_j)):
        last = front[-1] if front else None
        if (
            last is None
            or p.energy_j < last.energy_j
            or (p.energy_j == last.energy_j and p.time_s == last.time_s)
        ):
            front.append(p)
    return front


def bloat(points: Sequence[Point], default: Point, max_slowdown: float) -> Bloat:
    """The cheapest setting at most ``max_slowdown`` slower than the default (the default
    itself qualifies, so the saving is never negative)."""
    allowed = [p for p in points if p.time_s <= default.time_s * (1.0 + max_slowdown)]
    best = min([default, *allowed], key=lambda p: p.energy_j)
    saved = default.energy_j - best.energy_j
    return Bloat(
        max_slowdown,
        best,
        saved,
        saved / default.energy_j if default.energy_j > 0 else 0.0,
        best.time_s / default.time_s - 1.0 if default.time_s > 0 else 0.0,
    )


def lam_best(points: Sequence[Point], lam: float, p_ref_w: float) -> Point:
    return min(points, key=lambda p: (p.cost(lam, p_ref_w), p.time_s))


def frontier(
    test: str,
    labels: Mapping[str, str],
    input_tokens: int,
    output_tokens: int,
    points: Sequence[Point],
    *,
    max_slowdowns: Sequence[float] = DEFAULT_MAX_SLOWDOWNS,
    lam: float = 1.0,
    p_ref_w: float | None = None,
) -> CaseFrontier:
    """``p_ref_w`` None: the largest mean power among the points (as the routing does
    when the GPU's highest limit is not known)."""
    if not points:
        raise ValueError("a frontier needs at least one point")
    if p_ref_w is None:
        p_ref_w = max(p.energy_j / p.time_s for p in points if p.time_s > 0)
    default = next((p for p in points if p.default), None)
    return CaseFrontier(
        test=test,
        labels=dict(labels),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        points=tuple(points),
        pareto=tuple(pareto_front(points)),
        min_energy=min(points, key=lambda p: (p.energy_j, p.time_s)),
        default=default,
        bloat=tuple(bloat(points, default, s) for s in max_slowdowns) if default else (),
        lam=lam,
        p_ref_w=p_ref_w,
        lam_best=lam_best(points, lam, p_ref_w),
    )


# -- from measured cases ------------------------------------------------------------------
def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def point_of(case: CaseResult) -> Point | None:
    """The case's setting and mean time and energy; None for a case without a GPU
    setting or without trials (OOM)."""
    labels = case.labels
    setting = labels.get(SETTING_LABEL)
    if setting is None or not case.trials:
        return None
    # means and intervals both the figures' (per query): a batch's trial has many queries
    t, e = FIGURES["time_s"].summary(case), FIGURES["energy_j"].summary(case)
    if t is None or e is None:
        return None
    return Point(
        setting=setting,
        time_s=t.mean,
        energy_j=e.mean,
        default=labels.get(DEFAULT_LABEL) == "yes",
        power_limit_w=_number(labels.get(POWER_LABEL)),
        sm_clock=labels.get(CLOCK_LABEL),
        time_half_s=t.half_width,
        energy_half_j=e.half_width,
    )


def frontiers(
    cases: Sequence[CaseResult],
    *,
    max_slowdowns: Sequence[float] = DEFAULT_MAX_SLOWDOWNS,
    lam: float = 1.0,
    p_ref_w: float | None = None,
) -> list[CaseFrontier]:
    """One frontier per case measured at two or more settings, in the cases' order."""
    groups: dict[tuple[Any, ...], list[tuple[CaseResult, Point]]] = {}
    for case in cases:
        point = point_of(case)
        if point is None:
            continue
        rest = {k: v for k, v in case.labels.items() if k not in GPU_LABELS}
        key = (
            case.nodeid.split("[", 1)[0],
            tuple(sorted(rest.items())),
            case.input_tokens,
            case.output_tokens,
        )
        groups.setdefault(key, []).append((case, point))
    out = []
    for (test, rest, n_in, n_out), members in sorted(groups.items(), key=_group_order):
        if len({p.setting for _, p in members}) < 2:
            continue
        ref = p_ref_w
        if ref is None:
            ref = max((_number(c.labels.get(MAX_POWER_LABEL)) or 0.0) for c, _ in members) or None
        out.append(
            frontier(
                test,
                dict(rest),
                n_in,
                n_out,
                [p for _, p in members],
                max_slowdowns=max_slowdowns,
                lam=lam,
                p_ref_w=ref,
            )
        )
    return out


def _group_order(item: tuple[tuple[Any, ...], Any]) -> tuple[Any, ...]:
    """Model, sweep, then tokens: the order of the energy tables."""
    test, rest, n_in, n_out = item[0]
    labels = dict(rest)
    return (labels.get("model", test), labels.get("sweep", ""), n_in, n_out)


# -- showing --------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def frontier_table(items: Sequence[CaseFrontier]) -> Table:
    """One row per case: the default, the minimum-energy setting, the bloat per allowed
    slowdown, the lam-optimal setting and the frontier."""
    slowdowns = items[0].bloat if items else ()
    keys = ["model", "sweep", "tokens", "settings", "default", "min_energy"]
    headers = ["model", "sweep", "in/out", "settings", "default T s / E J", "min energy"]
    for b in slowdowns:
        keys.append(f"bloat_{b.max_slowdown:g}")
        headers.append(f"bloat (<= {b.max_slowdown * 100:g}% slower)")
    lam = items[0].lam if items else 1.0
    keys += ["lambda_best", "pareto"]
    headers += [f"best at lambda={lam:g}", "Pareto frontier (fastest first)"]
    rows, cells = [], []
    for f in items:
        d = f.default
        row: list[Any] = [
            f.model,
            f.sweep,
            f"{f.input_tokens}/{f.output_tokens}",
            len(f.points),
            None if d is None else f"{d.setting}",
            f.min_energy.setting,
        ]
        cell = [
            f.model,
            f.sweep,
            f"{f.input_tokens}/{f.output_tokens}",
            str(len(f.points)),
            DASH if d is None else f"{d.setting} {fmt_number(d.time_s)} / {fmt_number(d.energy_j)}",
            _vs(f.min_energy, d),
        ]
        for b in f.bloat:
            row.append(b.saved_share)
            cell.append(f"{b.saved_share * 100:.1f}% ({b.best.setting}, {_pct(b.slowdown)} T)")
        row += [f.lam_best.setting, " ".join(p.setting for p in f.pareto)]
        cell += [_vs(f.lam_best, d), " ".join(p.setting for p in f.pareto)]
        rows.append(tuple(row))
        cells.append(tuple(cell))
    return Table(
        title="time-energy frontier over GPU settings",
        keys=tuple(keys),
        headers=tuple(headers),
        rows=tuple(rows),
        cells=tuple(cells),
        legend=(
            "bloat: energy the cheapest setting at most that much slower saves against the "
            "GPU's default; T: its time against the default's",
            "lambda cost: lambda x E + (1 - lambda) x P_ref x T, P_ref the GPU's highest "
            "power limit (Zeus); lambda: the routing's (--energy-route-lambda, or --lambda "
            "in the CLI)",
        ),
    )


def _vs(p: Point, d: Point | None) -> str:
    if d is None or d.time_s <= 0 or d.energy_j <= 0:
        return f"{p.setting} {fmt_number(p.time_s)} s {fmt_number(p.energy_j)} J"
    return f"{p.setting} ({_pct(p.time_s / d.time_s - 1)} T, {_pct(p.energy_j / d.energy_j - 1)} E)"


# -- the policy ------------------------------------------------------------------------------
def setting_policy(
    items: Sequence[CaseFrontier], system: str, by_model: str | None = None
) -> list[dict[str, Any]]:
    """Per model and sweep: the lam-best setting for each token range (the sizes measured,
    each up to the next; the last rule takes the rest), for a router that chooses the
    system and then the setting."""
    out = []
    groups: dict[tuple[str, str], list[CaseFrontier]] = {}
    for f in items:
        if by_model is None or f.model == by_model:
            groups.setdefault((f.model, f.sweep), []).append(f)
    for (model, sweep), members in groups.items():
        by = "output" if sweep == "output" else "input"
        members.sort(key=lambda f: f.output_tokens if by == "output" else f.input_tokens)
        rules: list[dict[str, Any]] = []
        for f in members:
            tokens = f.output_tokens if by == "output" else f.input_tokens
            best = f.lam_best
            rule = {
                f"max_{by}_tokens": tokens,
                "setting": best.setting,
                "power_limit_w": best.power_limit_w,
                "sm_clock": best.sm_clock,
            }
            if rules and rules[-1]["setting"] == best.setting:
                rules[-1][f"max_{by}_tokens"] = tokens  # one range, widened
            else:
                rules.append(rule)
        rules[-1].pop(f"max_{by}_tokens")
        out.append(
            {
                "format": POLICY_FORMAT,
                "version": VERSION,
                "system": system,
                "model": model,
                "sweep": sweep,
                "by": by,
                "lambda": members[0].lam,
                "p_ref_w": members[0].p_ref_w,
                "rules": rules,
            }
        )
    return out


def setting_for(policy: Mapping[str, Any], tokens: int) -> str:
    """The setting a policy gives a query of ``tokens`` (input or output, as ``by`` says)."""
    key = f"max_{policy['by']}_tokens"
    for rule in policy["rules"]:
        if key not in rule or tokens <= rule[key]:
            return str(rule["setting"])
    raise ValueError("a setting policy's last rule takes every query")


def swept(cases: Sequence[CaseResult]) -> bool:
    """Whether any case was measured at a GPU setting."""
    return any(SETTING_LABEL in c.labels for c in cases)


def _case_key(test: str, n_in: int, n_out: int, labels: Mapping[str, str]) -> tuple[Any, ...]:
    rest = tuple(sorted((k, v) for k, v in labels.items() if k not in GPU_LABELS))
    return (test, n_in, n_out, rest)


def best_setting_cases(
    cases: Sequence[CaseResult], lam: float, p_ref_w: float | None = None
) -> list[CaseResult]:
    """Each case at its lam-best setting only (its setting kept in its labels): what the
    router compares between systems, so it chooses system and setting together.  A
    case measured at one setting only is kept as it is."""
    chosen = {
        _case_key(f.test, f.input_tokens, f.output_tokens, f.labels): f.lam_best.setting
        for f in frontiers(cases, lam=lam, p_ref_w=p_ref_w)
    }
    out = []
    for case in cases:
        setting = case.labels.get(SETTING_LABEL)
        key = _case_key(
            case.nodeid.split("[", 1)[0], case.input_tokens, case.output_tokens, case.labels
        )
        if setting is None or key not in chosen or chosen[key] == setting:
            out.append(case)
    return out


def at_best_settings(lam: float) -> Callable[[Sequence[CaseResult]], list[CaseResult]]:
    """The cases routing should compare (``routing.profile``'s ``pick``): each case at its
    lam-best GPU setting when measured at several, else every case as it is."""

    def pick(cases: Sequence[CaseResult]) -> list[CaseResult]:
        return best_setting_cases(cases, lam) if swept(cases) else list(cases)

    return pick


def with_settings(
    policy: Any, setting_policies: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The router's rules (a ``routing.policy.Policy`` on input or output tokens), each
    split where its system's best setting changes: one rule per range, with the system
    and the GPU setting to run it at; the first rule that holds wins, the last has no
    bound.  A system without a setting policy keeps its GPU as it is (setting None)."""
    by = policy.by
    if by not in ("input", "output"):
        raise ValueError("GPU settings go with routing by input or by output tokens")
    key = f"max_{by}_tokens"
    ours = {
        p["system"]: p["rules"]
        for p in setting_policies
        if p["model"] == policy.model and p["by"] == by
    }
    out: list[dict[str, Any]] = []
    low = 0.0  # queries up to this many tokens went to earlier rules
    for rule in policy.rules:
        high = getattr(rule, key)
        cap = math.inf if high is None else float(high)
        for s in ours.get(rule.system) or [{"setting": None}]:
            upper = min(float(s.get(key, math.inf)), cap)
            if upper <= low:
                continue
            entry: dict[str, Any] = {"system": rule.system, "setting": s["setting"]}
            if math.isfinite(upper):
                entry[key] = int(upper)
            out.append(entry)
            low = upper
            if upper >= cap:
                break
    return out


def frontier_json(items: Sequence[CaseFrontier], system: str) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "system": system,
        "cases": [f.to_json() for f in items],
        "policies": setting_policy(items, system),
    }


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
