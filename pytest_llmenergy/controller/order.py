"""Random case order, reproducible from a seed.

Cases that share a model are kept together (models in random order, cases of each model
in random order), so that each model is loaded once even when several would not fit in
memory together; the order within and across models is still random.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")


def shuffled_in_groups(
    items: Sequence[T], seed: int, group: Callable[[T], Hashable] = lambda _: None
) -> list[T]:
    rng = random.Random(seed)
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(group(item), []).append(item)
    keys = list(groups)
    rng.shuffle(keys)
    out: list[T] = []
    for key in keys:
        members = groups[key]
        rng.shuffle(members)
        out.extend(members)
    return out


def shuffle_in_place(
    items: list[T],
    seed: int,
    selected: Callable[[T], bool],
    group: Callable[[T], Hashable] = lambda _: None,
) -> None:
    """Shuffle the selected items among the positions they occupy; others stay put."""
    positions = [i for i, item in enumerate(items) if selected(item)]
    new_order = shuffled_in_groups([items[i] for i in positions], seed, group)
    for position, item in zip(positions, new_order):
        items[position] = item
