"""Which features a user can combine: every pair is checked by a test or refused at start.

Each feature passes its own tests; the defects are where two meet.  This is the one list
of those meetings: ``docs/combinations.md`` is made from it (``markdown()``), and
``tests/test_combinations.py`` runs every refused pair to its one-line refusal and
checks that every allowed pair names a test that exists.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    key: str
    title: str
    options: str  # how a user turns it on


FEATURES: tuple[Feature, ...] = (
    Feature("xdist", "pytest-xdist", "-n 2"),
    Feature("torchrun", "torchrun", "torchrun --nproc-per-node=2 -m pytest"),
    Feature("serving", "serving", "--llm-endpoint=URL, --llm-serve=vllm"),
    Feature("batch", "batches", "--llm-batch-sizes=1,4"),
    Feature("gpu", "GPU axes", "--energy-gpu-power-limits, --energy-gpu-clocks"),
    Feature("pytest-benchmark", "pytest-benchmark", "the benchmark fixture, --benchmark-only"),
    Feature("exports", "exports", "--energy-export=FORMAT:PATH"),
    Feature("gates", "gates", "--energy-compare-fail=j_per_token:5%"),
    Feature("profiles", "operator profiles", "--energy-profile-ops"),
)
_KEYS = tuple(f.key for f in FEATURES)


@dataclass(frozen=True)
class Pair:
    """Two features together: ``checked`` names the test that runs them and checks a
    figure; ``refused`` is the start of the line a session stops with; neither: allowed
    but not yet checked by a test of its own."""

    features: tuple[str, str]
    checked: str = ""
    refused: str = ""
    why: str = ""


_COMBINED = "tests/test_combinations.py::test_allowed_features_together"
_REFUSED = "tests/test_combinations.py::test_refused_pairs_stop_in_one_line"

PAIRS: tuple[Pair, ...] = (
    Pair(
        ("xdist", "serving"),
        refused="--llm-endpoint/--llm-serve: a server is measured one burst at a time",
        why="one server, one burst at a time",
    ),
    Pair(
        ("xdist", "gpu"),
        refused="--energy-gpu-power-limits/--energy-gpu-clocks change the whole GPU",
        why="a setting applies to the whole GPU",
    ),
    Pair(
        ("torchrun", "gpu"),
        refused="--energy-gpu-power-limits/--energy-gpu-clocks do not run under torchrun yet",
        why="every rank would change the GPUs",
    ),
    Pair(
        ("serving", "batch"),
        refused="--llm-batch-sizes: a server batches requests itself",
        why="use --llm-concurrency",
    ),
    Pair(
        ("serving", "profiles"),
        refused="--energy-profile-ops: the model runs in the server",
        why="torch.profiler would trace the client",
    ),
    *(
        Pair(features, checked=f"{_COMBINED}[xdist-batch-profiles-exports-gates]")
        for features in itertools.combinations(
            ("xdist", "batch", "profiles", "exports", "gates"), 2
        )
    ),
    Pair(("pytest-benchmark", "exports"), checked=f"{_COMBINED}[pytest-benchmark-exports-gates]"),
    Pair(("pytest-benchmark", "gates"), checked=f"{_COMBINED}[pytest-benchmark-exports-gates]"),
)


def pair(a: str, b: str) -> Pair:
    """The pair of two features, in either order; an unlisted pair is allowed, unchecked."""
    for p in PAIRS:
        if set(p.features) == {a, b}:
            return p
    return Pair((a, b))


def markdown() -> str:
    """``docs/combinations.md``: the matrix, then each refusal."""
    titles = {f.key: f.title for f in FEATURES}
    lines = [
        "# Combining features",
        "",
        "Every pair of features is either checked by a test that runs them together and "
        "checks a figure (✓), refused at the session's start with one line (✗), or allowed "
        "but not yet checked by a test of its own (·).  Made from "
        "`pytest_llmenergy/plugin/combinations.py`; `tests/test_combinations.py` checks "
        "both.",
        "",
        "| | " + " | ".join(titles[k] for k in _KEYS) + " |",
        "|---|" + "---|" * len(_KEYS),
    ]
    for a in _KEYS:
        marks = []
        for b in _KEYS:
            p = pair(a, b)
            marks.append("" if a == b else "✗" if p.refused else "✓" if p.checked else "·")
        lines.append(f"| **{titles[a]}** | " + " | ".join(marks) + " |")
    lines += ["", "## How each feature is turned on", ""]
    lines += [f"- {f.title}: `{f.options}`" for f in FEATURES]
    lines += ["", "## Refused", ""]
    for p in PAIRS:
        if p.refused:
            a, b = (titles[k] for k in p.features)
            lines.append(f"- {a} with {b} ({p.why}): `{p.refused}…`")
    lines += ["", "## Checked", ""]
    for a, b in itertools.combinations(_KEYS, 2):
        p = pair(a, b)
        if p.checked:
            lines.append(f"- {titles[a]} with {titles[b]}: `{p.checked}`")
    return "\n".join(lines) + "\n"
