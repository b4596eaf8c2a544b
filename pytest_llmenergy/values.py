"""One parser per kind of value, shared by the pytest options and the ``llmenergy`` CLI.

Each takes the text a user typed and returns the value, or raises ``ConfigError`` whose
message says what was expected, with an example; each front end prefixes where the text
came from (``--energy-cpu-tdp=abc: ...`` in pytest, ``argument --p-ref: ...`` in the CLI)
and prints that one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from .errors import ConfigError

Parser = Callable[[str], object]

_NUMBER = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?"
_WITH_UNIT = re.compile(rf"^\s*({_NUMBER})\s*([a-z/%]*)\s*$", re.IGNORECASE)


def _number(text: str) -> float | None:
    """A finite decimal number, or None; 'inf', 'nan' and '1_000' are not numbers here."""
    if not re.fullmatch(rf"\s*{_NUMBER}\s*", text, re.IGNORECASE):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def split_number(text: str) -> tuple[float, str] | None:
    """``'400 W'`` -> ``(400.0, 'w')``: a finite number and its unit, lower case."""
    match = _WITH_UNIT.match(text)
    if not match:
        return None
    value = float(match[1])
    return (value, match[2].lower()) if math.isfinite(value) else None


def seconds(text: str, *, allow_zero: bool = False) -> float:
    """``0.1``, ``100ms``, ``2s``, ``2 s``."""
    parsed = split_number(text)
    scale = {"": 1.0, "s": 1.0, "ms": 1e-3}.get(parsed[1]) if parsed else None
    value = parsed[0] * scale if parsed and scale is not None else math.nan
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        low = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"expected seconds {low} such as 0.1, 100ms or 5s, got {text!r}")
    return value


def non_negative_seconds(text: str) -> float:
    return seconds(text, allow_zero=True)


def watts(text: str) -> float:
    """``65``, ``65W``, ``65 w``."""
    parsed = split_number(text)
    if not parsed or parsed[1] not in ("", "w") or not parsed[0] > 0:
        raise ConfigError(f"expected watts > 0 such as 65 or 65W, got {text!r}")
    return parsed[0]


def celsius_difference(text: str) -> float:
    """A temperature difference > 0: ``2``, ``2C``, ``2 °C``."""
    parsed = split_number(text.replace("°", ""))
    if not parsed or parsed[1] not in ("", "c") or not parsed[0] > 0:
        raise ConfigError(f"expected degrees Celsius > 0 such as 2 or 2C, got {text!r}")
    return parsed[0]


def fraction(text: str, what: str = "a weight") -> float:
    """A number in [0, 1] or a percentage: ``0.3``, ``30%``."""
    parsed = split_number(text)
    value = math.nan
    if parsed and parsed[1] in ("", "%"):
        value = parsed[0] / 100 if parsed[1] == "%" else parsed[0]
    if not 0 <= value <= 1:
        raise ConfigError(f"expected {what} between 0 and 1 such as 0.5 or 50%, got {text!r}")
    return value


def background_share(text: str) -> float | None:
    """The share of the CPUs other work may use before a trial is disturbed: ``25%``,
    ``0.25``; ``off`` (None): never."""
    if text.strip().lower() in ("off", "none", "no"):
        return None
    value = fraction(text, "a share of the CPUs")
    if value == 0:
        raise ConfigError(f"expected a share above 0 such as 25%, or off, got {text!r}")
    return value


def confidence(text: str) -> float:
    """A level strictly between 0 and 1: ``0.95``, ``95%``."""
    parsed = split_number(text)
    value = math.nan
    if parsed and parsed[1] in ("", "%"):
        value = parsed[0] / 100 if parsed[1] == "%" else parsed[0]
    if not 0 < value < 1:
        raise ConfigError(
            f"expected a confidence level between 0 and 1 such as 0.95 or 95%, got {text!r}"
        )
    return value


def integer(low: int = 0, high: int | None = None) -> Callable[[str], int]:
    """A whole number in ``[low, high]``."""
    bounds = f">= {low}" if high is None else f"from {low} to {high}"

    def parse(text: str) -> int:
        stripped = text.strip()
        # 20 digits at most: int() refuses 4300 with advice that does not apply here
        if not re.fullmatch(r"[+-]?[0-9]{1,20}", stripped):
            raise ConfigError(f"expected a whole number {bounds}, got {text[:40]!r}")
        value = int(stripped)
        if value < low or (high is not None and value > high):
            raise ConfigError(f"expected a whole number {bounds}, got {text!r}")
        return value

    parse.__name__ = f"integer_{low}"
    return parse


def indices(text: str) -> tuple[int, ...]:
    """Comma-separated indices ``0,1`` (GPUs among the visible ones)."""
    found = items(text)
    if not found or not all(p.isdecimal() for p in found):
        raise ConfigError(f"expected comma-separated GPU indices such as 0,1, got {text!r}")
    return tuple(int(p) for p in found)


ON = ("on", "true", "yes", "1")
OFF = ("off", "false", "no", "0")


def switch(text: str) -> bool:
    value = text.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ConfigError(f"expected on or off, got {text!r}")


def names(text: str) -> tuple[str, ...]:
    """Comma- or space-separated names; a repeat adds nothing."""
    found = tuple(dict.fromkeys(n for n in re.split(r"[,\s]+", text) if n))
    if not found:
        raise ConfigError(f"expected one or more names, got {text!r}")
    return found


def words(texts: str | Iterable[str], what: str, examples: str) -> list[str]:
    """Comma- or space-separated words of one text or of several (a repeated option);
    none at all is a ConfigError naming ``what`` was expected."""
    if isinstance(texts, str):
        texts = [texts]
    found = [p for text in texts for p in re.split(r"[,\s]+", text) if p]
    if not found:
        raise ConfigError(f"no {what} given: expected one or more of {examples}")
    return found


def items(text: str) -> list[str]:
    """Comma-separated items, blanks ignored, first occurrence wins."""
    return list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


def choice(
    choices: Sequence[str], aliases: Mapping[str, str] | None = None
) -> Callable[[str], str]:
    """One of ``choices`` (``aliases`` map other spellings onto them)."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        value = (aliases or {}).get(value, value)
        if value not in choices:
            raise ConfigError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    parse.__name__ = "choice"
    return parse


def shown(value: str, limit: int = 200) -> str:
    """A value as an error line quotes it: a very long one (a 300-character path) cut in
    the middle, so the line still says what was wrong and how to fix it."""
    return value if len(value) <= limit else f"{value[: limit * 3 // 5]}…{value[-limit // 10 :]}"


def text(value: str) -> str:
    """Any non-empty text (a path, a name checked later)."""
    stripped = value.strip()
    if not stripped:
        raise ConfigError("expected a value, got nothing")
    return stripped


def threshold(
    text: str,
    scales: Mapping[str, float],
    *,
    percent_range: tuple[float, float] | None = None,
    zero: bool = False,
) -> tuple[float, bool]:
    """``5%`` -> (0.05, relative); ``0.5s`` -> (0.5, absolute) in the base unit of
    ``scales`` (its first suffix; a bare number is in that unit).  ``zero``: 0 is
    allowed too (a gate on a counted figure, which has no noise to allow for)."""
    parsed = split_number(text)
    units = [u for u in scales if u]
    if parsed is None:
        raise ConfigError(f"expected a number with {_units_text(units)} or %, got {text!r}")
    number, unit = parsed
    if unit == "%":
        low, high = percent_range or (0.0, math.inf)
        if not (low < number or (zero and number == 0)) or not number < high:
            raise ConfigError(f"a percentage must lie between {low:g} and {high:g}, got {text!r}")
        return number / 100.0, True
    scale = scales.get(unit) if unit else 1.0
    if scale is None:
        raise ConfigError(f"expected {_units_text(units)} or %, got {text!r}")
    if not (number > 0 or (zero and number == 0)):
        raise ConfigError(f"expected a positive amount, got {text!r}")
    return number * scale, False


def _units_text(units: Sequence[str]) -> str:
    return "a unit of " + ", ".join(units) if units else "no unit"
