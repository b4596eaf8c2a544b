"""The queries to route: token counts of a real workload.

``alpaca`` is every Stanford Alpaca example as a Llama 2 model sees it (the prompt with
Alpaca's template); ``alpaca-paper`` counts the input as Wilkins et al. did (instruction
and input with a BOS each, no template). See ``data/alpaca_token_lengths.md``.
Any other workload is a CSV or JSON-lines file of ``input_tokens,output_tokens``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .profile import ProfileError, csv_rows

ALPACA, ALPACA_PAPER = "alpaca", "alpaca-paper"
BUILTIN = (ALPACA, ALPACA_PAPER)
_COLUMNS = ("input_tokens", "output_tokens")


class WorkloadError(ProfileError):
    """A workload file with a bad row; the message gives the line."""


@dataclass(frozen=True, eq=False)
class Workload:
    name: str
    input_tokens: np.ndarray  # int64, one per query
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.input_tokens)


def alpaca(counting: str = ALPACA) -> Workload:
    """The 52,002 Alpaca examples shipped with the package."""
    text = resources.files("pytest_llmenergy").joinpath("data/alpaca_token_lengths.csv")
    with text.open("r", encoding="ascii") as f:
        table = np.loadtxt(f, delimiter=",", skiprows=1, dtype=np.int64)
    if counting == ALPACA_PAPER:
        # instruction and input encoded apart, each with a BOS: raw + 1
        return Workload(ALPACA_PAPER, table[:, 2] + 1, table[:, 1])
    return Workload(ALPACA, table[:, 0], table[:, 1])


# Beyond any context window; and the counts go into int64 arrays.
_MAX_TOKENS = 10**9


def _count(value: object, column: str, where: str) -> int:
    if isinstance(value, str):
        value = value.strip()
        # isdigit() also takes "²", which int() rejects; 10 digits: no 5000-digit int()
        ok = value.isdecimal() and len(value) <= 10
        number = int(value) if ok else -1
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        number = value if ok else -1
    if not 0 <= number <= _MAX_TOKENS:
        shown = repr(value)[:40]
        raise WorkloadError(
            f"{where}: {column} should be a whole number from 0 to {_MAX_TOKENS:,}, got {shown}"
        )
    return number


def _read_csv(path: Path) -> list[tuple[int, int]]:
    return [
        (_count(row[_COLUMNS[0]], _COLUMNS[0], where), _count(row[_COLUMNS[1]], _COLUMNS[1], where))
        for where, row in csv_rows(path, _COLUMNS, "workload", WorkloadError)
    ]


def _read_jsonl(path: Path) -> list[tuple[int, int]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            where = f"{path}:{number}"
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: not a JSON object ({exc.msg})") from None
            except (ValueError, RecursionError):  # a 5000-digit number, 100,000 '['
                raise WorkloadError(f"{where}: not an object of two token counts") from None
            if not isinstance(item, dict) or any(c not in item for c in _COLUMNS):
                raise WorkloadError(
                    f"{where}: each line should be an object with input_tokens and output_tokens"
                )
            rows.append(tuple(_count(item[c], c, where) for c in _COLUMNS))
    return rows


def load_workload(spec: str) -> Workload:
    """``alpaca``, ``alpaca-paper``, or a ``.csv`` / ``.jsonl`` file of token counts."""
    if spec in BUILTIN:
        return alpaca(spec)
    path = Path(spec)
    jsonl = path.suffix.lower() in (".jsonl", ".ndjson", ".json")
    try:
        rows = _read_jsonl(path) if jsonl else _read_csv(path)
    except FileNotFoundError:
        raise WorkloadError(
            f"{spec}: no such workload; give {' or '.join(BUILTIN)}, or a CSV / JSONL file "
            "of input_tokens,output_tokens"
        ) from None
    except OSError as exc:
        raise WorkloadError(f"{spec}: cannot read the workload: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise WorkloadError(f"{spec}: not a text file of token counts ({exc})") from None
    if not rows:
        raise WorkloadError(f"{spec}: the workload has no queries")
    counts = np.array(rows, dtype=np.int64)
    return Workload(path.name, counts[:, 0], counts[:, 1])
