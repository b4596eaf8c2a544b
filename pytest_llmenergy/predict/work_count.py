"""Counted work: the FLOPs, bytes and operator calls of one run of a case.

Unlike joules and seconds these are counted, not measured: the same code, inputs and
library versions give the same numbers in every session and on every machine, so a
gate on them needs no statistics, and "more work" (the KV cache no longer used, a wider
dtype, a second forward pass) can be told from "the same work done slower".

How: the case runs once more after its trials, never inside a measured window, under a
``TorchDispatchMode``.  It counts the aten operators that run kernels: a composite one
(``aten::linear``, which ``torch.inference_mode`` lets through whole) is split into its
parts (``aten::t`` + ``aten::mm``), as ``FlopCounterMode`` does, and only they count, so
nothing is counted twice.  Per call:

- FLOPs: torch's own formula (``torch.utils.flop_counter``'s registry) where it has
  one; the fused CPU attention kernel has none, so its FLOPs are ``op_profile``'s
  estimate (causal: half the query-key pairs), and its rows are marked ``estimated``;
- bytes: the element bytes of the call's tensor inputs and outputs (in place: read and
  written).  An upper bound of memory traffic, blind to caches, to broadcasts read once
  and to kernels that read an operand twice; views move nothing and count none;
- calls: every operator that runs a kernel, views included (each costs a dispatch).

Classes are ``op_profile``'s, but at this level ``aten::matmul`` is gone: a linear layer
arrives as ``aten::mm``/``aten::addmm`` (its weight is 2-d), so a batched product
(``aten::bmm``) multiplies two activations: attention (eager scores and values), or,
over a contraction of one, an outer product (rotary positions x frequencies), which is
elementwise work.

Phases: ``llm.loader``'s streamer calls ``meters.base.mark_phase("decode")`` at the
first output token, which splits a measured window; the count hears the same mark
through ``meters.base.phase_listener`` (no window is open), so what ran before it is
prefill and what ran after is decode.  A run that never marks is all prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..meters.base import phase_listener
from ..results import DECODE, PREFILL, CountedWork, OpWork
from .features import ATTENTION, ELEMENTWISE
from .op_profile import _FLASH, _flash_flops, op_class

_BATCHED = {"aten::bmm": 0, "aten::baddbmm": 1}  # the index of the first factor
# Operators whose class or FLOPs need their inputs' shapes (the others' are read once).
_SHAPED = {*_BATCHED, "aten::matmul", _FLASH}


def count_work(fn: Callable[[], Any]) -> CountedWork:
    """Run ``fn`` once and count the work of every aten operator it dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    tally = _Tally()

    class _Counting(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if tally.composite(func):  # split here, its parts dispatched to this mode
                with self:
                    return func.decompose(*args, **kwargs)
            out = func(*args, **kwargs)
            tally.add(func, args, kwargs, out)
            return out

    start = time.perf_counter()
    with phase_listener(tally.mark), _Counting():
        fn()
    seconds = time.perf_counter() - start
    return tally.result(seconds)


def dispatch_class(name: str, shapes: list[list[int]]) -> str:
    """The class of an operator as a dispatch mode sees it (see the module's docstring)."""
    first = _BATCHED.get(name)
    if first is not None and len(shapes) > first:
        return ELEMENTWISE if shapes[first][-1:] == [1] else ATTENTION
    return op_class(name, shapes)


class _Tally:
    """Per phase, per (operator, class): [calls, flops, bytes, estimated]."""

    def __init__(self) -> None:
        import torch
        from torch.utils._pytree import tree_leaves
        from torch.utils.flop_counter import flop_registry

        self._tensor = torch.Tensor
        self._leaves = tree_leaves
        self._formulas = flop_registry
        # per operator overload: (name, FLOP formula, is a view, class without shapes)
        self._known: dict[Any, tuple[str, Any, bool, str | None]] = {}
        self._composite: dict[Any, bool] = {}
        self._composite_key = torch._C.DispatchKey.CompositeImplicitAutograd
        self._has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
        self.phase = PREFILL
        self.marked = False
        self.rows: dict[str, dict[tuple[str, str], list[Any]]] = {PREFILL: {}, DECODE: {}}

    def composite(self, func: Any) -> bool:
        """Made of other operators (``aten::linear``, ``aten::scaled_dot_product_attention``):
        under ``torch.inference_mode`` the mode sees them whole, so they are split."""
        found = self._composite.get(func)
        if found is None:
            key = self._composite_key
            found = key in func.py_kernels or self._has_kernel(func.name(), key)
            self._composite[func] = found
        return found

    def mark(self, phase: str) -> None:
        """The first output token: the rest is decode (later generations' marks too)."""
        if phase == DECODE:
            self.phase, self.marked = DECODE, True

    def add(self, func: Any, args: tuple[Any, ...], kwargs: Any, out: Any) -> None:
        known = self._known.get(func)
        if known is None:
            name = str(func._schema.name)
            fixed = None if name in _SHAPED else dispatch_class(name, [])
            known = (name, self._formulas.get(func._overloadpacket), func.is_view, fixed)
            self._known[func] = known
        name, formula, is_view, cls = known
        tensor = self._tensor
        inputs = [x for x in self._leaves((args, kwargs)) if isinstance(x, tensor)]
        shapes = [list(t.shape) for t in inputs] if cls is None else []
        if cls is None:
            cls = dispatch_class(name, shapes)
        flops, estimated = 0.0, False
        if formula is not None:
            try:
                flops = float(formula(*args, **kwargs, out_val=out))
            except (AssertionError, TypeError, ValueError):  # shapes its formula refuses
                estimated = True  # none counted: the row says its FLOPs are not torch's
        elif name == _FLASH:
            flops, estimated = _flash_flops(shapes), True
        moved = 0
        if not is_view:
            outputs = [x for x in self._leaves(out) if isinstance(x, tensor)]
            moved = sum(t.numel() * t.element_size() for t in (*inputs, *outputs))
        row = self.rows[self.phase].setdefault((name, cls), [0, 0.0, 0, False])
        row[0] += 1
        row[1] += flops
        row[2] += moved
        row[3] = row[3] or estimated

    def result(self, seconds: float) -> CountedWork:
        def ops(phase: str) -> tuple[OpWork, ...]:
            return tuple(
                OpWork(name, cls, calls, flops, moved, estimated)
                for (name, cls), (calls, flops, moved, estimated) in sorted(
                    self.rows[phase].items()
                )
            )

        return CountedWork(ops(PREFILL), ops(DECODE), self.marked, seconds)
