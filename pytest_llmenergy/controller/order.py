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


# What a decoded token costs against a prompt token, for splitting a grid into shards by
# tokens: a prompt's tokens run in one pass, each output token in a pass of its own.  On
# the built-in models here a decoded token took about 80 prompt tokens' time (in512-out32
# against in8-out32, 2026-11); GPUs run prompts wider still.  Only the balance depends on
# it, never which shard a case is in on another machine.
DECODE_WEIGHT = 64.0


def token_cost(input_tokens: int, output_tokens: int, queries: int = 1) -> float:
    """A case's expected time in prompt-token equivalents (``DECODE_WEIGHT``)."""
    return float(input_tokens + DECODE_WEIGHT * output_tokens) * max(queries, 1)


def split_shards(
    items: Sequence[T], shards: int, cost: Callable[[T], float], key: Callable[[T], str]
) -> list[int]:
    """Each item's shard (0-based), balanced by ``cost``: the costliest first, each to the
    shard with the least so far (ties: the lower shard; equal costs: by ``key``).  It
    depends only on the items' keys and costs, never on their order or the machine, so
    every machine of a job array computes the same split; every item is in exactly one."""
    if shards < 1:
        raise ValueError(f"a split needs at least one shard, got {shards}")
    loads = [0.0] * shards
    out = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-cost(items[i]), key(items[i]))):
        shard = min(range(shards), key=lambda k: (loads[k], k))
        out[i] = shard
        loads[shard] += cost(items[i])
    return out
