"""Which of a server's configurations measured nothing worth comparing (ML.ENERGY's rules).

ML.ENERGY's benchmark serves a model at one batch size per run and rejects the run when
its steady state lasted under 20 s or its mean batch stayed under 85 % of the batch it
was asked to hold; a rejected batch size rejects the larger ones of its group, since a
server that cannot fill a batch cannot fill a larger one.  Here a configuration is a case
sent to a server at one concurrency: ``serving.steady`` judges each burst by the first
two rules (``--llm-min-steady``, ``--llm-min-batch-fill``), and this module applies them
to whole cases and adds the group rule.  A rejected case is kept in the run and shown,
with its reason in one line, and no gate and no choice (``--llm-slo``) rests on it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from .results import CaseResult

GROUP_AXIS = "concurrency"  # the label a group's configurations differ in


@dataclass(frozen=True)
class Rejection:
    """Why one configuration was rejected; ``by`` names the smaller configuration of its
    group whose rejection carried over ("": rejected by its own bursts)."""

    nodeid: str
    reason: str
    by: str = ""


def label_count(case: CaseResult, label: str) -> int:
    """A count the case's label holds (batch size, concurrency); 1 when it has none."""
    try:
        return int(case.labels.get(label, "1"))
    except ValueError:
        return 1


def concurrency_of(case: CaseResult) -> int:
    """The case's concurrency (1 when it has none: a local model, a single request)."""
    return label_count(case, GROUP_AXIS)


def group_key(case: CaseResult, varying: Collection[str] = (GROUP_AXIS,)) -> tuple[Any, ...]:
    """What the configurations of one group share: the test, every label but the
    ``varying`` ones (the concurrency), and the token counts."""
    rest = tuple(sorted((k, v) for k, v in case.labels.items() if k not in varying))
    return (case.nodeid.split("[", 1)[0], rest, case.input_tokens, case.output_tokens)


def own_rejection(case: CaseResult) -> Rejection | None:
    """The case's own bursts: rejected when any kept burst was (its first one's reason)."""
    unstable = case.unstable
    if not unstable:
        return None
    return Rejection(
        case.nodeid, f"{len(unstable)} of {len(case.trials)} bursts: {unstable[0].unstable}"
    )


def rejections(cases: Sequence[CaseResult]) -> dict[str, Rejection]:
    """Every rejected case of a run, by node id: its own bursts', then the group rule's
    (each case larger than its group's smallest rejected one)."""
    out = {r.nodeid: r for r in map(own_rejection, cases) if r is not None}
    groups: dict[tuple[Any, ...], list[CaseResult]] = {}
    for case in cases:
        groups.setdefault(group_key(case), []).append(case)
    for members in groups.values():
        rejected = [c for c in members if c.nodeid in out]
        if not rejected:
            continue
        first = min(rejected, key=concurrency_of)
        limit = concurrency_of(first)
        for case in members:
            n = concurrency_of(case)
            if n > limit and case.nodeid not in out:
                out[case.nodeid] = Rejection(
                    case.nodeid,
                    f"its group's concurrency {limit} was rejected ({first.name}), and a server "
                    f"that cannot hold {limit} requests steadily cannot hold {n} "
                    "(ML.ENERGY's group rule)",
                    by=first.nodeid,
                )
    return out
