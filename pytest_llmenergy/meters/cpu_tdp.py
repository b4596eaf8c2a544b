"""The CPU's nominal power (TDP), which the ``estimate`` backend scales by utilization.

The figure comes from, in this order: the user's ``--energy-cpu-tdp``, the table in
``data/cpu_tdp.csv`` (see ``data/cpu_tdp.md`` for where its values come from), or a
default of 10 W per logical CPU.  Every result says which one it was, because an
estimate is only as good as its TDP and the report must show that.
"""

from __future__ import annotations

import csv
import functools
import io
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

DEFAULT_W_PER_CPU = 10.0  # fallback for CPUs missing from the table

# Words in brand strings that say nothing about the model.
_NOISE = frozenset({"intel", "amd", "apple", "r", "tm", "cpu", "processor"})
# Tokens that, right after a match, name a different chip than the row does
# ("E5-2680" vs "E5-2680 v4", "M1" vs "M1 Max").
_VARIANT = re.compile(r"v\d+|pro|max|ultra")
_TOKEN = re.compile(r"[a-z0-9]+\+?")
_CLOCK = re.compile(r"@.*$")

# (CPU implementer, CPU part) from /proc/cpuinfo on arm64, which has no "model name".
_ARM_PARTS = {
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd4f"): "Neoverse-V2",
}
_GRAVITON = {
    "Neoverse-N1": "AWS Graviton2",
    "Neoverse-V1": "AWS Graviton3",
    "Neoverse-V2": "AWS Graviton4",
}

TdpKind = Literal["override", "table", "default"]


@dataclass(frozen=True)
class TdpLookup:
    """A TDP and where it came from, for the report header."""

    watts: float
    source: str  # e.g. "table: Xeon Platinum 8380 = 270 W"
    kind: TdpKind = "table"
    model: str | None = None  # the table row that matched


def tokens(text: str) -> tuple[str, ...]:
    """Lowercase model tokens of a brand string or table row, noise and clock dropped."""
    text = _CLOCK.sub("", text.lower())
    return tuple(t for t in _TOKEN.findall(text) if t not in _NOISE)


def parse_table(text: str) -> list[tuple[str, float]]:
    """Rows of a ``model,tdp_w`` CSV; ``#`` lines are comments."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    rows: list[tuple[str, float]] = []
    for n, row in enumerate(csv.DictReader(io.StringIO("\n".join(lines))), start=1):
        model = (row.get("model") or "").strip()
        watts = float(row.get("tdp_w") or "nan")
        if not model or not watts > 0:
            raise ValueError(f"CPU TDP table row {n}: bad entry {row!r}")
        rows.append((model, watts))
    return rows


@functools.lru_cache(maxsize=1)
def _table() -> tuple[tuple[tuple[str, ...], str, float], ...]:
    text = resources.files("pytest_llmenergy").joinpath("data/cpu_tdp.csv").read_text("utf-8")
    return tuple((tokens(model), model, watts) for model, watts in parse_table(text))


def _matches(row: tuple[str, ...], brand: tuple[str, ...]) -> bool:
    n = len(row)
    for i in range(len(brand) - n + 1):
        if brand[i : i + n] == row:
            after = brand[i + n] if i + n < len(brand) else ""
            if not _VARIANT.fullmatch(after):
                return True
    return False


def lookup_tdp(brand: str) -> TdpLookup | None:
    """The table's TDP for ``brand``; the longest matching row wins, None if no row does."""
    brand_tokens = tokens(brand)
    if not brand_tokens:
        return None
    best: tuple[str, float] | None = None
    best_key = (0, 0)
    for row, model, watts in _table():
        key = (len(row), len(model))  # most tokens, then longest name
        if key > best_key and _matches(row, brand_tokens):
            best, best_key = (model, watts), key
    if best is None:
        return None
    model, watts = best
    return TdpLookup(watts, f"table: {model} = {watts:g} W", "table", model)


def resolve_tdp(brand: str, logical_cpus: int, override_w: float | None = None) -> TdpLookup:
    """The TDP to use: the user's override, else the table, else 10 W per logical CPU."""
    if override_w is not None:
        if not override_w > 0:
            raise ValueError(f"CPU TDP must be > 0 watts, got {override_w}")
        return TdpLookup(float(override_w), f"--energy-cpu-tdp={override_w:g}", "override")
    found = lookup_tdp(brand)
    if found is not None:
        return found
    n = max(1, logical_cpus)
    return TdpLookup(
        DEFAULT_W_PER_CPU * n,
        f"default: unknown CPU model {brand!r}, {DEFAULT_W_PER_CPU:g} W per logical CPU"
        f" x {n}; pass --energy-cpu-tdp=WATTS",
        "default",
    )


def brand_from_cpuinfo(cpuinfo: str, sys_vendor: str = "") -> str | None:
    """The brand in a /proc/cpuinfo text; arm64 has none, so its core is named from the part.

    On EC2 (DMI vendor "Amazon EC2") a Neoverse core identifies the Graviton generation.
    """
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    if fields.get("model name"):
        return fields["model name"]
    core = _ARM_PARTS.get(
        (fields.get("cpu implementer", "").lower(), fields.get("cpu part", "").lower())
    )
    if core is None:
        return None
    if sys_vendor.strip().startswith("Amazon") and core in _GRAVITON:
        return f"{_GRAVITON[core]} ({core})"
    return core


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _windows_brand() -> str | None:
    try:
        import winreg  # type: ignore[import-not-found,unused-ignore]

        key = winreg.OpenKey(  # type: ignore[attr-defined,unused-ignore]
            winreg.HKEY_LOCAL_MACHINE,  # type: ignore[attr-defined,unused-ignore]
            r"HARDWARE\DESCRIPTION\System\CentralProcessor\0",
        )
        value, _ = winreg.QueryValueEx(key, "ProcessorNameString")  # type: ignore[attr-defined,unused-ignore]
        return str(value).strip() or None
    except (ImportError, OSError):
        return None


def cpu_brand() -> str:
    """This machine's CPU brand string, e.g. "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz"."""
    brand: str | None = None
    if sys.platform.startswith("linux"):
        brand = brand_from_cpuinfo(
            _read_text("/proc/cpuinfo"), _read_text("/sys/devices/virtual/dmi/id/sys_vendor")
        )
    elif sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            brand = out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            brand = None
    elif sys.platform == "win32":
        brand = _windows_brand()
    return brand or platform.processor() or platform.machine() or "unknown"
