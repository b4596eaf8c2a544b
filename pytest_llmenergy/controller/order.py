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
    seed: int | None,
    selected: Callable[[T], bool],
    group: Callable[[T], Hashable] = lambda _: None,
    file_order: Callable[[T], int] | None = None,
) -> None:
    """Order the selected items among the positions they occupy; others stay put.

    ``file_order`` first puts them back in the order they were collected (another plugin,
    such as pytest-randomly, may have moved them); ``seed`` None keeps that order, so the
    result depends on the seed alone, never on what reordered them before.
    """
    positions = [i for i, item in enumerate(items) if selected(item)]
    chosen = [items[i] for i in positions]
    if file_order is not None:
        chosen.sort(key=file_order)
    new_order = chosen if seed is None else shuffled_in_groups(chosen, seed, group)
    for position, item in zip(positions, new_order):
        items[position] = item
