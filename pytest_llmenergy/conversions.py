"""From joules to what a budget is kept in: grams of CO2e and money.

``--energy-carbon-intensity`` takes gCO2e/kWh as a number or a country / cloud-region
code from ``data/carbon_intensity.csv`` (see ``data/carbon_intensity.md``);
``--energy-price`` takes money per kWh.  A session's conversions are kept with every case
(``CaseResult.conversions``), so saved runs and their figures keep the factors they were
shown with, and the figures (``co2_g``, ``cost``, per 1,000 tokens) are ordinary
per-trial figures: columns, gates, exports.
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources

from .errors import ConfigError
from .values import split_number

J_PER_KWH = 3.6e6
# Keys of CaseResult.conversions
G_PER_KWH = "g_co2e_per_kwh"
PRICE_PER_KWH = "price_per_kwh"
# The option that gives each of them, for a message that asks for it.
CONVERSION_OPTIONS = {G_PER_KWH: "--energy-carbon-intensity", PRICE_PER_KWH: "--energy-price"}


@dataclass(frozen=True)
class Intensity:
    """Grams of CO2e per kWh, and where the figure comes from (for the header)."""

    g_per_kwh: float
    source: str


@dataclass(frozen=True)
class Price:
    per_kwh: float
    currency: str = ""


@functools.lru_cache(maxsize=1)
def intensity_table() -> dict[str, tuple[str, float, str]]:
    """code (upper case) -> (name, g/kWh, year)."""
    text = resources.files("pytest_llmenergy").joinpath("data/carbon_intensity.csv")
    lines = [x for x in text.read_text("utf-8").splitlines() if not x.startswith("#")]
    table: dict[str, tuple[str, float, str]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        table[row["code"].upper()] = (row["name"], float(row["g_per_kwh"]), row["year"])
    return table


def parse_intensity(text: str) -> Intensity:
    """``120`` or ``120g`` (gCO2e/kWh), or a code: ``FRA``, ``gcp:europe-west1``."""
    value = text.strip()
    parsed = split_number(value)
    if parsed is not None and parsed[1].lower() in ("", "g", "g/kwh", "gco2e/kwh"):
        if not parsed[0] >= 0:
            raise ConfigError(f"a carbon intensity must be >= 0 g/kWh, got {text!r}")
        return Intensity(parsed[0], "given")
    found = intensity_table().get(value.upper())
    if found is None:
        codes = sorted(intensity_table())
        close = [c for c in codes if c.startswith(value.upper()[:3])][:5]
        hint = f" (close: {', '.join(close)})" if close else ""
        raise ConfigError(
            f"unknown carbon-intensity code {text!r}{hint}: give gCO2e/kWh as a number, an "
            "ISO 3166 alpha-3 country code such as FRA, or a cloud region such as "
            "gcp:europe-west1 (the table: pytest_llmenergy/data/carbon_intensity.csv)"
        )
    name, g, year = found
    when = f" {year}" if year else ""
    return Intensity(g, f"{value.upper()} ({name}{when}, CodeCarbon's data)")


def parse_price(text: str) -> Price:
    """``0.30``, ``0.30EUR``, ``0.30 USD``: money per kWh."""
    parsed = split_number(text.strip())
    if parsed is None or not parsed[0] >= 0:
        raise ConfigError(f"expected a price per kWh such as 0.30 or 0.30EUR, got {text!r}")
    return Price(parsed[0], parsed[1].strip().upper())
