"""Do we need all that scale?  The same cases at different scales, from saved runs.

Each run is one configuration: one process, or a torchrun job of N ranks on M nodes (as
its run file's ``machine.distributed`` section says).  For every case measured at two
scales or more, against the smallest configuration that ran it:

* energy per token (J/token);
* speed-up: the smallest configuration's time / this one's;
* parallel efficiency: speed-up / (ranks / the smallest's ranks), 1 when N ranks are N
  times as fast;
* the energy cost of scale: extra J/token over the smallest configuration (and in %).

A row ``all cases`` pools the cases every configuration ran (joules over tokens, time
summed), so one line answers the question for the whole suite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError
from .figures import value
from .results import CaseResult
from .tables import Table, fmt_number

if TYPE_CHECKING:
    from .storage.runfile import Run

ALL_CASES = "all cases"


@dataclass(frozen=True)
class Scale:
    """How many processes a run used, and how they were laid out."""

    label: str
    world_size: int = 1
    nodes: int = 1
    ranks_per_node: int = 1
    parallel: str = "none"

    @property
    def text(self) -> str:
        if self.world_size == 1:
            return "1 process"
        nodes = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.world_size} ranks{nodes} ({self.parallel})"


def scale_of(run: Run, label: str) -> Scale:
    """A run's scale from its run file: ``machine.distributed``, else one process."""
    layout = run.machine.get("distributed")
    if not isinstance(layout, dict):
        return Scale(label)

    def number(key: str) -> int:
        found = layout.get(key)
        return found if isinstance(found, int) and found >= 1 else 1

    parallel = layout.get("parallel")
    return Scale(
        label,
        world_size=number("world_size"),
        nodes=number("nodes"),
        ranks_per_node=number("ranks_per_node"),
        parallel=parallel if isinstance(parallel, str) else "none",
    )


@dataclass(frozen=True)
class ScaleRow:
    """One case (or all of them) at one scale, against the smallest that ran it."""

    case: str
    scale: Scale
    tokens: int
    energy_j: float
    time_s: float
    base: Scale
    base_energy_j: float
    base_time_s: float

    @property
    def j_per_token(self) -> float:
        return self.energy_j / self.tokens if self.tokens else math.nan

    @property
    def speedup(self) -> float:
        return self.base_time_s / self.time_s if self.time_s > 0 else math.nan

    @property
    def efficiency(self) -> float:
        return self.speedup / (self.scale.world_size / self.base.world_size)

    @property
    def extra_j_per_token(self) -> float:
        return (self.energy_j - self.base_energy_j) / self.tokens if self.tokens else math.nan

    @property
    def extra_percent(self) -> float:
        return 100.0 * (self.energy_j / self.base_energy_j - 1) if self.base_energy_j else math.nan


def _means(case: CaseResult) -> tuple[float, float] | None:
    energy, seconds = value(case, "energy_j"), value(case, "time_s")
    if isinstance(energy, int | float) and isinstance(seconds, int | float):
        return float(energy), float(seconds)
    return None


def scale_rows(runs: Sequence[Run], labels: Sequence[str]) -> list[ScaleRow]:
    """Per case, every scale that measured it, against the smallest; then the pooled row."""
    if len(runs) < 2:
        raise ConfigError("llmenergy scale needs two runs or more (one per scale)")
    scales = [scale_of(run, label) for run, label in zip(runs, labels)]
    order = sorted(range(len(runs)), key=lambda i: (scales[i].world_size, scales[i].nodes))
    per_case: dict[str, list[tuple[Scale, int, float, float]]] = {}
    names: dict[str, str] = {}
    keys: dict[str, tuple[str, str, int, int]] = {}  # the report's order: model, then tokens
    for i in order:
        for case in runs[i].cases:
            means = _means(case)
            if means is None:
                continue
            names.setdefault(case.nodeid, case.name)
            keys.setdefault(
                case.nodeid,
                (
                    case.nodeid.split("[", 1)[0],
                    case.labels.get("model", ""),
                    case.input_tokens,
                    case.output_tokens,
                ),
            )
            tokens = case.input_tokens + case.output_tokens
            per_case.setdefault(case.nodeid, []).append((scales[i], tokens, *means))
    rows: list[ScaleRow] = []
    shared = [k for k, found in per_case.items() if len(found) == len(runs)]
    for nodeid, found in sorted(per_case.items(), key=lambda item: keys[item[0]]):
        if len(found) < 2:
            continue
        base = found[0]
        for scale, tokens, energy_j, time_s in found:
            rows.append(ScaleRow(names[nodeid], scale, tokens, energy_j, time_s, *_base(base)))
    if not rows:
        raise ConfigError(
            "no case has figures in two of the runs: run the same cases at each scale "
            "(the same --llm-model and token options), with trials that were measured "
            "(not all left out as disturbed)"
        )
    if len(shared) > 1:
        pooled = []
        for n in range(len(runs)):
            tokens = sum(per_case[k][n][1] for k in shared)
            pooled.append((per_case[shared[0]][n][0], tokens, *_sums(per_case, shared, n)))
        for scale, tokens, energy_j, time_s in pooled:
            rows.append(ScaleRow(ALL_CASES, scale, tokens, energy_j, time_s, *_base(pooled[0])))
    return rows


def _base(found: tuple[Scale, int, float, float]) -> tuple[Scale, float, float]:
    return found[0], found[2], found[3]


def _sums(
    per_case: dict[str, list[tuple[Scale, int, float, float]]], keys: list[str], n: int
) -> tuple[float, float]:
    return (
        math.fsum(per_case[k][n][2] for k in keys),
        math.fsum(per_case[k][n][3] for k in keys),
    )


def _signed(x: float, digits: int = 4) -> str:
    return ("+" if x > 0 else "") + fmt_number(x, digits) if math.isfinite(x) else "-"


def scale_table(rows: Sequence[ScaleRow]) -> Table:
    keys = (
        "case",
        "scale",
        "run",
        "j_per_token",
        "time_s",
        "speedup",
        "efficiency",
        "extra_j_per_token",
        "extra_percent",
    )
    headers = (
        "case",
        "scale",
        "run",
        "J/token",
        "s",
        "speed-up",
        "efficiency",
        "extra J/token",
        "extra %",
    )
    raw = tuple(
        (
            r.case,
            r.scale.text,
            r.scale.label,
            r.j_per_token,
            r.time_s,
            r.speedup,
            r.efficiency,
            r.extra_j_per_token,
            r.extra_percent,
        )
        for r in rows
    )
    cells = tuple(
        (
            r.case,
            r.scale.text,
            r.scale.label,
            fmt_number(r.j_per_token),
            fmt_number(r.time_s),
            f"{r.speedup:.2f}x",
            f"{r.efficiency:.0%}",
            _signed(r.extra_j_per_token),
            _signed(r.extra_percent, 3) + "%",
        )
        for r in rows
    )
    return Table(
        title="energy at scale: each case against the smallest configuration that ran it",
        keys=keys,
        headers=headers,
        rows=raw,
        cells=cells,
        priorities=(0, 0, 3, 0, 1, 0, 0, 0, 2),
        legend=(
            "speed-up: the smallest configuration's time / this one's; efficiency: "
            "speed-up / (ranks / its ranks); extra J/token: the energy cost of scale",
        ),
    )


def write_scale_plot(rows: Sequence[ScaleRow], out_dir: Path, fmt: str = "png") -> Path:
    """J/token and speed-up against the number of ranks, one line per case (the pooled
    row bold), with ideal speed-up dashed; a new file, never over an existing one."""
    from .plotting import new_figure, write_new_figure

    fig, axes = new_figure(1, 2, width=10.0, height=4.2)
    energy_ax, speed_ax = axes[0][0], axes[0][1]
    cases = list(dict.fromkeys(r.case for r in rows))
    for case in cases:
        mine = sorted((r for r in rows if r.case == case), key=lambda r: r.scale.world_size)
        ranks = [r.scale.world_size for r in mine]
        width = 2.5 if case == ALL_CASES else 1.0
        energy_ax.plot(ranks, [r.j_per_token for r in mine], "o-", lw=width, label=case)
        speed_ax.plot(ranks, [r.speedup for r in mine], "o-", lw=width, label=case)
    all_ranks = sorted({r.scale.world_size for r in rows})
    low = all_ranks[0]
    speed_ax.plot(all_ranks, [n / low for n in all_ranks], "k--", lw=1, label="ideal")
    energy_ax.set(xlabel="ranks", ylabel="J/token", title="energy per token")
    speed_ax.set(xlabel="ranks", ylabel="speed-up", title="speed-up vs the smallest")
    for ax in (energy_ax, speed_ax):
        ax.set_xticks(all_ranks)
        ax.grid(alpha=0.3)
    speed_ax.legend(fontsize="small")
    out_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = out_dir / (f"scale.{fmt}" if n == 1 else f"scale-{n}.{fmt}")
        try:
            write_new_figure(fig, path, fmt)
        except FileExistsError:
            continue
        return path
    raise ConfigError(f"{out_dir} holds 999 scale figures already; choose another --out")
