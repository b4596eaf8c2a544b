"""GPU settings as benchmark axes: power limits and locked SM clocks.

A setting is what one case runs at (``pl250W``, ``sm1410MHz``, ``pl250W-sm1200MHz``).
The axes are parsed from the options without a GPU (``AxisSpec``) and resolved at
session start against what the GPUs allow (``resolve``): ``all`` and percentages need
the GPU's range, and a value outside it is one line naming the allowed range.  The
GPU's default setting (its default power limit, clocks unlocked) is always part of the
sweep: it is the reference of the energy bloat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .. import values
from ..axes import ENERGY_TESTS, Axis
from ..errors import ConfigError

AUTO_CLOCK = 0  # sm_clock_mhz of "clocks unlocked": the GPU chooses
ALL_POINTS = 6  # ``all`` without a step: about this many values across the range

# Labels a case gets from its setting; the frontier groups cases on every other label.
SETTING_LABEL = "gpu_setting"
POWER_LABEL = "power_limit_w"
CLOCK_LABEL = "sm_clock_mhz"
DEFAULT_LABEL = "gpu_default"
MAX_POWER_LABEL = "gpu_max_power_w"
GPU_LABELS = (SETTING_LABEL, POWER_LABEL, CLOCK_LABEL, DEFAULT_LABEL, MAX_POWER_LABEL)

POWER_EXAMPLES = "200W,250W,300W, 80%, all or all:25W"
CLOCK_EXAMPLES = "1410MHz,1200MHz, all or all:150MHz"


@dataclass(frozen=True)
class GpuSetting:
    """One point of the sweep; None: that axis is not swept (left as the GPU has it)."""

    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None  # AUTO_CLOCK: unlocked
    default: bool = False  # the GPU's own setting: default limit, clocks unlocked
    max_power_w: float | None = None  # the GPU's highest allowed limit (Zeus's P_ref)

    @property
    def id(self) -> str:
        parts = []
        if self.power_limit_w is not None:
            parts.append(f"pl{self.power_limit_w:g}W")
        if self.sm_clock_mhz is not None:
            parts.append(
                "smauto" if self.sm_clock_mhz == AUTO_CLOCK else f"sm{self.sm_clock_mhz}MHz"
            )
        return "-".join(parts) or "gpu-as-is"

    def labels(self) -> dict[str, str]:
        """What a case records of its setting (so saved runs keep it)."""
        out = {SETTING_LABEL: self.id, DEFAULT_LABEL: "yes" if self.default else "no"}
        if self.power_limit_w is not None:
            out[POWER_LABEL] = f"{self.power_limit_w:g}"
        if self.sm_clock_mhz is not None:
            out[CLOCK_LABEL] = "auto" if self.sm_clock_mhz == AUTO_CLOCK else str(self.sm_clock_mhz)
        if self.max_power_w is not None:
            out[MAX_POWER_LABEL] = f"{self.max_power_w:g}"
        return out

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True)
class AxisSpec:
    """An axis as typed: fixed values (W or MHz), percentages of the default power
    limit, and ``all`` (``all_step`` 0: choose the step)."""

    values: tuple[float, ...] = ()
    percents: tuple[float, ...] = ()
    all_step: float | None = None

    def __bool__(self) -> bool:
        return bool(self.values or self.percents or self.all_step is not None)


def _parse_axis(text: str, unit: str, examples: str, allow_percent: bool) -> AxisSpec:
    fixed: list[float] = []
    percents: list[float] = []
    all_step: float | None = None
    bad = f"expected {examples}, got {text!r}"
    for part in values.items(text):
        word = part.strip().lower()
        if word in ("default", "auto"):
            continue  # the default is always measured
        if word == "all" or word.startswith("all:"):
            step = word[4:]
            if not step:
                all_step = 0.0
                continue
            parsed = values.split_number(step)
            if not parsed or parsed[1] not in ("", unit) or parsed[0] <= 0:
                raise ConfigError(f"{bad}: the step of all: is a positive {unit.upper()}")
            all_step = parsed[0]
            continue
        parsed = values.split_number(word)
        if parsed is None or parsed[0] <= 0:
            raise ConfigError(bad)
        number, given_unit = parsed
        if given_unit == "%" and allow_percent:
            percents.append(number)
        elif given_unit in ("", unit):
            fixed.append(number)
        else:
            raise ConfigError(bad)
    spec = AxisSpec(tuple(fixed), tuple(percents), all_step)
    if not spec and not any(p.strip().lower() in ("default", "auto") for p in text.split(",")):
        raise ConfigError(bad)
    return spec


def parse_power_limits(text: str) -> AxisSpec:
    """``200W,250W``, ``250``, ``80%`` (of the default limit), ``all``, ``all:25W``."""
    return _parse_axis(text, "w", POWER_EXAMPLES, allow_percent=True)


def parse_clocks(text: str) -> AxisSpec:
    """``1410MHz,1200``, ``all``, ``all:150MHz``."""
    return _parse_axis(text, "mhz", CLOCK_EXAMPLES, allow_percent=False)


@dataclass(frozen=True)
class GpuLimits:
    """What one GPU allows, read through NVML at session start."""

    domain: str  # gpu:0
    name: str
    min_power_w: float
    max_power_w: float
    default_power_w: float
    clocks_mhz: tuple[int, ...]  # supported SM clocks, highest first

    def power_range(self) -> str:
        return (
            f"{self.domain} {self.name} allows {self.min_power_w:g} W to {self.max_power_w:g} W "
            f"(default {self.default_power_w:g} W)"
        )

    def clock_range(self) -> str:
        return (
            f"{self.domain} {self.name} supports SM clocks of {min(self.clocks_mhz)} MHz to "
            f"{max(self.clocks_mhz)} MHz"
        )


def _spread(low: float, high: float, step: float) -> list[float]:
    if step <= 0:
        step = max((high - low) / (ALL_POINTS - 1), 1.0)
    out, x = [], high
    while x >= low - 1e-9:
        out.append(x)
        x -= step
    if out[-1] - low > 1e-9 and step > 0:
        out.append(low)
    return out


def resolve_power(spec: AxisSpec, gpus: Sequence[GpuLimits], flag: str) -> list[float]:
    """Watts to sweep, highest first, the default among them; checked on every GPU."""
    first = gpus[0]
    low = max(g.min_power_w for g in gpus)
    high = min(g.max_power_w for g in gpus)
    wanted = [float(v) for v in spec.values]
    wanted += [round(first.default_power_w * p / 100) for p in spec.percents]
    if spec.all_step is not None:
        wanted += [round(w) for w in _spread(low, high, spec.all_step)]
    for w in wanted:
        for g in gpus:
            if not g.min_power_w <= w <= g.max_power_w:
                raise ConfigError(f"{flag}: {w:g} W is outside the range: {g.power_range()}")
    wanted.append(first.default_power_w)
    return sorted(set(wanted), reverse=True)


def resolve_clocks(
    spec: AxisSpec, gpus: Sequence[GpuLimits], flag: str
) -> tuple[list[int], list[str]]:
    """MHz to lock (AUTO_CLOCK last: unlocked, the default), snapped to a supported
    clock; and notes on values that were snapped."""
    first = gpus[0]
    supported = first.clocks_mhz
    wanted = [float(v) for v in spec.values]
    if spec.all_step is not None:
        if spec.all_step == 0:
            k = max(1, math.ceil(len(supported) / ALL_POINTS))
            wanted += [float(c) for c in supported[::k]]
        else:
            wanted += _spread(min(supported), max(supported), spec.all_step)
    out: list[int] = []
    notes: list[str] = []
    for mhz in wanted:
        for g in gpus:
            if not min(g.clocks_mhz) <= mhz <= max(g.clocks_mhz):
                raise ConfigError(f"{flag}: {mhz:g} MHz is outside the range: {g.clock_range()}")
        near = min(supported, key=lambda c: abs(c - mhz))
        if near != mhz and mhz in spec.values:
            notes.append(f"{mhz:g} MHz is not a supported SM clock: {near} MHz is used")
        out.append(near)
    return [*sorted(set(out), reverse=True), AUTO_CLOCK], notes


def cross(
    power_w: Sequence[float] | None,
    clocks_mhz: Sequence[int] | None,
    default_power_w: float | None,
    max_power_w: float | None,
) -> list[GpuSetting]:
    """Every combination of the axes; the one with the default limit and clocks
    unlocked is marked as the GPU's default."""
    out = []
    for w in power_w if power_w is not None else [None]:
        for mhz in clocks_mhz if clocks_mhz is not None else [None]:
            default = (w is None or w == default_power_w) and mhz in (None, AUTO_CLOCK)
            out.append(GpuSetting(w, mhz, default, max_power_w))
    return out


def parse_slowdowns(text: str) -> tuple[float, ...]:
    """``0%,5%`` or ``0,0.05``: slowdowns the energy bloat is reported at."""
    out = []
    for part in values.items(text):
        parsed = values.split_number(part)
        if parsed is None or parsed[1] not in ("", "%") or parsed[0] < 0:
            raise ConfigError(f"expected slowdowns such as 0%,5% or 10%, got {text!r}")
        out.append(parsed[0] / 100 if parsed[1] == "%" else parsed[0])
    if not out:
        raise ConfigError(f"expected slowdowns such as 0%,5% or 10%, got {text!r}")
    return tuple(sorted(set(out)))


def axis_record(spec: AxisSpec) -> dict[str, object] | None:
    """An axis as the run file keeps it."""
    if not spec:
        return None
    return {"values": list(spec.values), "percents": list(spec.percents), "all_step": spec.all_step}


def _setting_id(setting: GpuSetting) -> str:
    return setting.id


def _setting_labels(name: str, setting: GpuSetting) -> dict[str, str]:
    """Its id under ``gpu_setting``, and the limit and clock the frontier reads."""
    return setting.labels()


# Resolved at session start against what the GPUs allow, so no parser of its own here.
GPU_SETTING_AXIS = Axis(
    SETTING_LABEL,
    "GPU settings",
    None,
    (),
    id_part=_setting_id,
    applies=ENERGY_TESTS,
    flag="--energy-gpu-power-limits, --energy-gpu-clocks",
    labels=_setting_labels,
)
