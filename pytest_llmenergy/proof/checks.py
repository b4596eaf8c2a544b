"""What the proof found, check by check, and how it is written: ``proof.md`` for people,
``proof.json`` for machines, both rewritten whole after every stage so that a proof cut
short (a time limit, a lost machine) keeps every check it finished."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..storage.store import AtomicFile

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
MARKS = {PASS: "PASS", FAIL: "FAIL", NOT_RUN: "n/a "}


@dataclass(frozen=True)
class Check:
    """One line of the proof: what was checked, its verdict, the figure it rests on, and
    (for ``not run``) why not."""

    stage: str  # meter, suite, settings, gate, work
    name: str
    status: str  # PASS, FAIL or NOT_RUN
    figure: str
    detail: str = ""

    def line(self) -> str:
        text = f"{MARKS[self.status]}  {self.stage}: {self.name}: {self.figure}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass
class Proof:
    """Every check so far, the machine it ran on, and tables of figures per stage."""

    machine: dict[str, str]
    checks: list[Check] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=dict)
    # each stage's cap and the estimate it was sized from (plans.py), beside stage_s: a
    # first run on a new GPU says which estimate was off
    stage_plan: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def summary(self) -> str:
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, FAIL, NOT_RUN)}
        return (
            f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[NOT_RUN]} not run "
            f"of {len(self.checks)} checks"
        )

    def record(self) -> dict[str, Any]:
        return {
            "schema": "llmenergy-proof/1",
            "machine": self.machine,
            "summary": self.summary(),
            "checks": [asdict(c) for c in self.checks],
            "tables": self.tables,
            "notes": self.notes,
            "stage_s": self.stage_s,
            "stage_plan": self.stage_plan,
        }

    def write(self, folder: Path) -> None:
        """Both files, each replaced whole (a reader never sees half of one)."""
        text = json.dumps(_finite(self.record()), indent=1, allow_nan=False)
        AtomicFile(folder / "proof.json", derived=True).write(text + "\n")
        AtomicFile(folder / "proof.md", derived=True).write(markdown(self))


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no word for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def markdown(proof: Proof) -> str:
    lines = ["# llmenergy proof", ""]
    lines += [f"- {key}: {value}" for key, value in proof.machine.items()]
    lines += ["", f"**{proof.summary()}**", "", "```text"]
    lines += [c.line() for c in proof.checks]
    lines += ["```", ""]
    for stage, rows in proof.tables.items():
        lines += [f"## {stage}", "", *table_lines(rows), ""]
        lines += [f"- {note}" for note in proof.notes.get(stage, ())]
        lines.append("")
    for stage, notes in proof.notes.items():
        if stage not in proof.tables:
            lines += [f"## {stage}", "", *(f"- {n}" for n in notes), ""]
    if proof.stage_s:
        spent = ", ".join(_spent(proof, k, v) for k, v in proof.stage_s.items())
        lines += [f"Wall time by stage: {spent}.", ""]
    return "\n".join(lines)


def _spent(proof: Proof, stage: str, seconds: float) -> str:
    planned = proof.stage_plan.get(stage)
    if not planned:
        return f"{stage} {seconds:.0f} s"
    return (
        f"{stage} {seconds:.0f} s (estimate {planned['estimate_s']:.0f} s, "
        f"cap {planned['cap_s']:.0f} s)"
    )


def table_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A Markdown table of ``rows`` (their keys, in the first row's order)."""
    if not rows:
        return ["(no rows)"]
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        out.append("| " + " | ".join(_cell(row.get(k)) for k in keys) + " |")
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return "—" if not math.isfinite(value) else f"{value:.4g}"
    return str(value).replace("|", "/")
