"""A served workload: requests of real lengths arriving at random, as production sends them.

A burst sends identical requests, so every request of it costs the same; a server in
production takes requests of every length at random moments, and they share its batch.
A workload draws each request's input and output lengths from a table of real ones (the
Stanford Alpaca lengths shipped with the package, ``data/alpaca_token_lengths.md``, or a
CSV of ``input_tokens,output_tokens``) and its arrival from a Poisson process at a given
rate, seeded, so that a run can be repeated request for request.  ``serving/replay.py``
sends them; ``serving/attribution.py`` says what each one cost.

The spec is one value: ``alpaca:rate=4,requests=200`` (or ``seconds=60`` instead of a
count; ``seed``, ``scale`` to shrink every length, ``max_input`` / ``max_output`` to cap
them at a model's context).  Every mistake in it, or in a lengths file, is one line.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, one_line

if TYPE_CHECKING:  # imported where used: pytest's start reads this module's options
    import numpy as np

ALPACA = "alpaca"
COLUMNS = ("input_tokens", "output_tokens")
# Beyond these a spec or a file is a mistake, not a workload: a day of requests, a rate
# no single server takes, more rows or bytes than any lengths table needs.
MAX_REQUESTS = 100_000
MAX_SECONDS = 86_400.0
MAX_RATE = 10_000.0
MAX_TOKENS = 1_000_000
MAX_ROWS = 10_000_000
MAX_FILE_BYTES = 256 * 2**20
DEFAULT_RATE = 1.0
DEFAULT_REQUESTS = 100
EXAMPLE = "alpaca:rate=4,requests=200"


class WorkloadError(ConfigError):
    """A workload spec or lengths file that cannot be used; one line, naming the place."""


@dataclass(frozen=True)
class WorkloadSpec:
    """What ``--llm-workload`` says: where lengths come from, how requests arrive."""

    source: str = ALPACA  # "alpaca", or a CSV file of input_tokens,output_tokens
    rate: float = DEFAULT_RATE  # requests a second, on average (Poisson arrivals)
    requests: int | None = DEFAULT_REQUESTS  # a fixed number of requests ...
    seconds: float | None = None  # ... or every arrival within this many seconds
    seed: int = 0
    scale: float = 1.0  # every length times this (at least one token)
    max_input: int = MAX_TOKENS
    max_output: int = MAX_TOKENS

    def text(self) -> str:
        """The spec as one would give it (for headers and run files)."""
        parts = [f"rate={self.rate:g}"]
        parts.append(f"seconds={self.seconds:g}" if self.seconds else f"requests={self.requests}")
        parts.append(f"seed={self.seed}")
        if self.scale != 1.0:
            parts.append(f"scale={self.scale:g}")
        if self.max_input != MAX_TOKENS:
            parts.append(f"max_input={self.max_input}")
        if self.max_output != MAX_TOKENS:
            parts.append(f"max_output={self.max_output}")
        return f"{self.source}:{','.join(parts)}"


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: when (seconds after the workload starts) and its lengths."""

    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class WorkloadPlan:
    spec: WorkloadSpec
    requests: tuple[PlannedRequest, ...]

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def span_s(self) -> float:
        """From the first arrival to the last."""
        return self.requests[-1].arrival_s if self.requests else 0.0


# -- the spec --------------------------------------------------------------------------
def parse_workload(text: str) -> WorkloadSpec:
    """``SOURCE[:key=value,...]``, e.g. ``alpaca:rate=4,requests=200``."""
    source, _, rest = text.strip().partition(":")
    if rest and "=" not in rest:  # a path with a colon in it, no settings
        source, rest = text.strip(), ""
    if not source:
        raise WorkloadError(f"workload {one_line(text)!r}: no source; e.g. {EXAMPLE}")
    settings: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _SETTINGS:
            raise WorkloadError(
                f"workload setting {one_line(item)!r}: expected one of "
                f"{', '.join(k + '=' for k in _SETTINGS)}; e.g. {EXAMPLE}"
            )
        if key in settings:
            raise WorkloadError(f"workload setting {key}= given twice")
        settings[key] = value.strip()
    if "requests" in settings and "seconds" in settings:
        raise WorkloadError("a workload runs for requests= or for seconds=, not both")
    values = {key: _SETTINGS[key](key, value) for key, value in settings.items()}
    if "seconds" in values:
        values["requests"] = None
    return WorkloadSpec(source=source, **values)


def _number(key: str, value: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not low < number <= high:  # NaN too
        raise WorkloadError(
            f"workload setting {key}={one_line(value)!r}: expected a number above {low:g}, "
            f"at most {high:g}"
        )
    return number


def _whole(key: str, value: str, low: int, high: int) -> int:
    text = value.strip()
    if not (text.isdecimal() and len(text) <= 12 and low <= int(text) <= high):
        raise WorkloadError(
            f"workload setting {key}={one_line(value)!r}: expected a whole number from "
            f"{low} to {high:,}"
        )
    return int(text)


_SETTINGS = {
    "rate": lambda k, v: _number(k, v, 0.0, MAX_RATE),
    "requests": lambda k, v: _whole(k, v, 1, MAX_REQUESTS),
    "seconds": lambda k, v: _number(k, v, 0.0, MAX_SECONDS),
    "seed": lambda k, v: _whole(k, v, 0, 2**32 - 1),
    "scale": lambda k, v: _number(k, v, 0.0, 1.0),
    "max_input": lambda k, v: _whole(k, v, 1, MAX_TOKENS),
    "max_output": lambda k, v: _whole(k, v, 1, MAX_TOKENS),
}


# -- the lengths -----------------------------------------------------------------------
def read_lengths(text: str, where: str) -> np.ndarray:
    """Rows of (input_tokens, output_tokens) from a CSV's text whose header names both
    (more columns are left alone); ``where`` names it in errors."""
    import numpy as np

    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise WorkloadError(
                f"{where}:1: the header lacks {', '.join(missing)}; a lengths CSV has the "
                f"columns {','.join(COLUMNS)}"
            )
        at = [header.index(c) for c in COLUMNS]
        rows = list(_rows(reader, at, where))
    except csv.Error as exc:
        raise WorkloadError(f"{where}: not a CSV of token counts ({one_line(str(exc))})") from None
    if not rows:
        raise WorkloadError(f"{where}: no rows of token counts")
    return np.array(rows, dtype=np.int64)


def _rows(reader: Iterator[list[str]], at: list[int], where: str) -> Iterator[tuple[int, int]]:
    for number, values in enumerate(reader, 2):
        if not any(v.strip() for v in values):
            continue
        if number > MAX_ROWS:
            raise WorkloadError(f"{where}: more than {MAX_ROWS:,} rows")
        if len(values) <= max(at):
            raise WorkloadError(f"{where}:{number}: {len(values)} values, fewer than the header")
        yield (
            _count(values[at[0]], COLUMNS[0], where, number),
            _count(values[at[1]], COLUMNS[1], where, number),
        )


def _count(value: str, column: str, where: str, line: int) -> int:
    text = value.strip()
    if not (text.isdecimal() and len(text) <= 7 and int(text) <= MAX_TOKENS):
        raise WorkloadError(
            f"{where}:{line}: {column} should be a whole number from 0 to {MAX_TOKENS:,}, "
            f"got {one_line(value, 40)!r}"
        )
    return int(text)


def load_lengths(source: str) -> np.ndarray:
    """The built-in Alpaca lengths (the prompt with Alpaca's template, Llama 2's
    tokenizer), or a user's CSV file."""
    if source == ALPACA:
        data = resources.files("pytest_llmenergy").joinpath("data/alpaca_token_lengths.csv")
        return read_lengths(data.read_text(encoding="ascii"), "alpaca_token_lengths.csv")
    path = Path(source)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise WorkloadError(
            f"{one_line(source)}: cannot read the lengths ({one_line(exc.strerror or str(exc))}); "
            f"give {ALPACA} or a CSV file of {','.join(COLUMNS)}"
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise WorkloadError(f"{one_line(source)}: larger than {MAX_FILE_BYTES // 2**20} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise WorkloadError(f"{one_line(source)}: not a text file of token counts") from None
    return read_lengths(text, one_line(source))


# -- the draw --------------------------------------------------------------------------
def draw(spec: WorkloadSpec, lengths: np.ndarray | None = None) -> WorkloadPlan:
    """The requests to send: rows drawn at random (with replacement) from the lengths,
    arriving as a Poisson process at ``spec.rate`` from time 0, all from ``spec.seed``."""
    import numpy as np

    table = load_lengths(spec.source) if lengths is None else lengths
    rng = np.random.default_rng(spec.seed)
    arrivals = _arrivals(rng, spec)
    rows = rng.integers(0, len(table), size=len(arrivals))
    inputs = _scaled(table[rows, 0], spec.scale, spec.max_input)
    outputs = _scaled(table[rows, 1], spec.scale, spec.max_output)
    planned = tuple(
        PlannedRequest(i, float(t), int(n_in), int(n_out))
        for i, (t, n_in, n_out) in enumerate(zip(arrivals, inputs, outputs))
    )
    return WorkloadPlan(spec, planned)


def _arrivals(rng: np.random.Generator, spec: WorkloadSpec) -> np.ndarray:
    """Arrival times: the first at 0, then exponential gaps of mean 1 / rate."""
    import numpy as np

    if spec.requests is not None:
        gaps = rng.exponential(1 / spec.rate, size=spec.requests)
        gaps[0] = 0.0
        return np.cumsum(gaps)
    assert spec.seconds is not None
    times = [0.0]
    while len(times) < MAX_REQUESTS:
        t = times[-1] + float(rng.exponential(1 / spec.rate))
        if t > spec.seconds:
            break
        times.append(t)
    return np.array(times)


def _scaled(column: np.ndarray, scale: float, cap: int) -> np.ndarray:
    """Lengths times ``scale``, rounded, from 1 (a request asks for a token at least;
    Alpaca has empty outputs) to ``cap``."""
    import numpy as np

    return np.clip(np.rint(column * scale).astype(np.int64), 1, cap)
