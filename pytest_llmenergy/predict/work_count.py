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
  one; elementwise operators have none and count no FLOPs;
- bytes: the element bytes of the call's tensor inputs and outputs (in place: read and
  written).  An upper bound of memory traffic, blind to caches, to broadcasts read once
  and to kernels that read an operand twice; views move nothing and count none; a copy
  between devices (``.to("cuda")``, ``.cpu()``) moves its bytes over the bus, not through
  either memory, and counts none (on the CPU the same ``.cpu()`` is no operator at all);
- calls: every operator that runs a kernel, views included (each costs a dispatch).

The same work on every device.  Some calls run other kernels on each device or
backend: attention (PyTorch's scaled-dot-product attention picks a fused kernel by
device, dtype and shapes, or decomposes into products and a softmax; transformers'
``eager`` attention is matmul, softmax, matmul) and ``F.rms_norm`` (one fused kernel on
CUDA, five elementwise operators on the CPU).  Such a call is counted whole, by what it
computes, never by how: its kernels still count as calls (under their own names, so
calls may differ between devices) but no FLOPs or bytes; a row of its own
(``attention``, ``aten::rms_norm``; no calls) holds its work.  Attention: FLOPs
``2 * (d_k + d_v)`` per attended query-key pair and query head (the products Q·Kᵀ and
P·V; softmax and scaling count none, like every elementwise operator); a pair is
attended when the mask allows it, else, without a mask, every pair of a causal call up
to its diagonal (queries aligned at the top left, as PyTorch's ``is_causal``) or of any
other call; bytes: Q, K and V as given (grouped-query K and V at their own heads,
before any repetition) and the output; the mask is read by some kernels and not
others, and counts none.  Whole are: every ``F.scaled_dot_product_attention`` call
(seen at the torch function level, above the dispatcher, whatever the grad mode), and
every attention function transformers' models pick (``AttentionInterface``: eager,
sdpa, flash, ...; wrapped while counting, so eager and sdpa count alike, GQA repetition
inside them included), whose mask builders (eager materializes a mask where sdpa
passes ``is_causal``) count calls only.  Attention written out in a model's own code
(Falcon's eager path) is counted operator by operator.

Classes are ``op_profile``'s, but at this level ``aten::matmul`` is gone: a linear layer
arrives as ``aten::mm``/``aten::addmm`` (its weight is 2-d), so a batched product
(``aten::bmm``) multiplies two activations: attention (eager scores and values), or,
over a contraction of one, an outer product (rotary positions x frequencies), which is
elementwise work.

Phases: ``llm.loader``'s streamer calls ``meters.marks.mark_phase("decode")`` at the
first output token, which splits a measured window; the count hears the same mark
through ``meters.marks.phase_listener`` (no window is open), so what ran before it is
prefill and what ran after is decode.  A run that never marks is all prefill.

Sampled decode steps.  Counting every operator of every decode step costs three times
the run (each call passes through Python), so a generation's decode steps are counted
on a sample and the rest derived.  The streamer marks every token
(``meters.marks.mark_token``); the ops between token k and token k+1 are decode step k.
A step's shapes differ from the next one's only by the one position the KV cache
grows, so each operator's calls are the same in every step and its FLOPs and bytes
affine in k.  Counted in full: everything up to the first output token, everything
after the last, and the steps ``sampled_steps`` names (the first three, every power of
two, the last two); between them the counting mode is off and costs nothing.  The
derivation is checked on every generation: the sampled steps must hold the same
operators and lie on the line through steps 1 and 2 exactly, or the run is counted
again in full and says why (``CountedWork.full_because``).  tests/test_work_sampled.py
compares derived and full counts on the grids' shapes, other architectures and batches.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

from ..meters.marks import phase_listener, token_listener
from ..results import DECODE, PREFILL, CountedWork, OpWork
from .features import ATTENTION, ELEMENTWISE, OTHER
from .op_profile import _FLASH, _flash_flops, op_class

_BATCHED = {"aten::bmm": 0, "aten::baddbmm": 1}  # the index of the first factor
# Operators whose class or FLOPs need their inputs' shapes (the others' are read once).
_SHAPED = {*_BATCHED, "aten::matmul", _FLASH}
# The row of every attention call counted whole, whatever ran it (eager, sdpa, flash).
ATTENTION_CALL = "attention"
# Copies that may cross devices: their bytes count only when they do not.
_COPIES = frozenset(
    {"aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize"}
)


def count_work(fn: Callable[[], Any], *, sample: bool = True) -> CountedWork:
    """Run ``fn`` once and count the work of every aten operator it dispatches; with
    ``sample``, a generation's decode steps are sampled and the rest derived (see the
    module's docstring), and a run whose steps do not follow is run again in full."""
    first = _count(fn, sample)
    if not first.full_because:
        return first
    again = _count(fn, sample=False)
    return CountedWork(
        again.prefill,
        again.decode,
        again.marked,
        first.seconds + again.seconds,
        full_because=first.full_because,
    )


def _count(fn: Callable[[], Any], sample: bool) -> CountedWork:
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    tally = _Tally()
    whole = _whole_functions()

    class _Counting(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if tally.quiet:
                return func(*args, **kwargs)
            if tally.composite(func):  # split here, its parts dispatched to this mode
                with self:
                    return func.decompose(*args, **kwargs)
            out = func(*args, **kwargs)
            tally.add(func, args, kwargs, out)
            return out

    class _Whole(TorchFunctionMode):
        """Sees torch's functions before the dispatcher splits them by device."""

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            how = whole.get(func)
            if how is None or tally.quiet:
                return func(*args, **kwargs)
            with tally.whole(how[0]) as outer:
                out = func(*args, **kwargs)
            if outer:
                how[1](tally, args, kwargs)
            return out

    modes = _Modes(tally, _Counting(), _Whole())
    steps = _Steps(tally, modes) if sample else None
    start = time.perf_counter()
    with phase_listener(tally.mark), _attention_functions(tally):
        if steps is None:
            with modes:
                fn()
        else:
            with token_listener(steps.token), steps.counting():
                fn()
    seconds = time.perf_counter() - start
    if steps is not None:
        steps.settle()
    return tally.result(seconds, steps.derived if steps else 0, steps.why if steps else "")


class _Modes:
    """The dispatch mode and the function mode, switched on and off together."""

    def __init__(self, tally: _Tally, dispatch: Any, function: Any) -> None:
        self.tally, self.dispatch, self.function = tally, dispatch, function

    def __enter__(self) -> None:
        self.function.__enter__()
        self.dispatch.__enter__()
        self.tally.on = True

    def __exit__(self, *exc: object) -> None:
        self.tally.on = False
        self.dispatch.__exit__(None, None, None)
        self.function.__exit__(None, None, None)


def _arg(args: tuple[Any, ...], kwargs: Any, index: int, name: str, default: Any = None) -> Any:
    """An argument given by position or by name."""
    return args[index] if len(args) > index else kwargs.get(name, default)


def _whole_functions() -> dict[Any, tuple[str, Callable[[_Tally, tuple[Any, ...], Any], None]]]:
    """Torch functions counted whole (see the module's docstring): the class of their
    kernels, and what adds their work."""
    import torch
    import torch.nn.functional as F

    def sdpa(tally: _Tally, args: tuple[Any, ...], kwargs: Any) -> None:
        q, k, v = (_arg(args, kwargs, i, n) for i, n in enumerate(("query", "key", "value")))
        mask = _arg(args, kwargs, 3, "attn_mask")
        tally.attention(q, k, v, mask, bool(_arg(args, kwargs, 5, "is_causal", False)))

    def rms_norm(tally: _Tally, args: tuple[Any, ...], kwargs: Any) -> None:
        x, weight = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 2, "weight")
        parts = [t for t in (x, weight, x) if isinstance(t, torch.Tensor)]  # the output: x's
        tally.add_whole("aten::rms_norm", ELEMENTWISE, 0.0, _bytes(parts), False)

    found: dict[Any, tuple[str, Callable[[_Tally, tuple[Any, ...], Any], None]]] = {
        F.scaled_dot_product_attention: (ATTENTION, sdpa)
    }
    for f in (getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None)):
        if f is not None:
            found[f] = (ELEMENTWISE, rms_norm)
    return found


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@contextlib.contextmanager
def _attention_functions(tally: _Tally) -> Iterator[None]:
    """While counting, every attention function transformers' models pick is counted
    whole (eager, sdpa, flash alike: ``AttentionInterface.get_interface`` returns it
    wrapped), and the attention mask each builds (``AttentionMaskInterface``: eager
    materializes one where sdpa passes ``is_causal``) counts as calls, with no work: the
    mask's work is the pairs it leaves.  Without transformers loaded, nothing is."""
    utils = sys.modules.get("transformers.modeling_utils")
    masks = sys.modules.get("transformers.masking_utils")
    with contextlib.ExitStack() as stack:
        functions = getattr(utils, "AttentionInterface", None)
        if functions is not None and hasattr(functions, "get_interface"):
            pick = functions.get_interface

            def get_interface(self: Any, implementation: Any, default: Any) -> Any:
                return _counted_attention(tally, pick(self, implementation, default))

            stack.enter_context(_replaced(functions, "get_interface", get_interface))
        builders = getattr(masks, "AttentionMaskInterface", None)
        if builders is not None:
            look_up = builders.__getitem__

            def get_mask(self: Any, key: Any) -> Any:
                return _uncounted(tally, look_up(self, key))

            stack.enter_context(_replaced(builders, "__getitem__", get_mask))
        yield


@contextlib.contextmanager
def _replaced(owner: type, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside, as it was after (inherited or its own)."""
    own = name in vars(owner)
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, before)
        else:
            delattr(owner, name)


def _uncounted(tally: _Tally, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``'s kernels count as calls of attention, its work not at all."""

    def uncounted(*args: Any, **kwargs: Any) -> Any:
        if not tally.on or threading.get_ident() != tally.thread:
            return fn(*args, **kwargs)
        with tally.whole(ATTENTION):
            return fn(*args, **kwargs)

    return uncounted


def _counted_attention(tally: _Tally, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A transformers attention function, ``fn(module, query, key, value,
    attention_mask, ...)``, counted whole when it runs while counting."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    def attention(*args: Any, **kwargs: Any) -> Any:
        if not tally.on or tally.depth or threading.get_ident() != tally.thread:
            return fn(*args, **kwargs)
        if _get_current_dispatch_mode() is None:  # the count set aside (a warm-up's call)
            return fn(*args, **kwargs)
        q, k, v = (_arg(args, kwargs, i, n) for i, n in ((1, "query"), (2, "key"), (3, "value")))
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            return fn(*args, **kwargs)  # not the layout of the interface: op by op
        with tally.whole(ATTENTION):
            out = fn(*args, **kwargs)
        causal = kwargs.get("is_causal")
        if causal is None:
            causal = getattr(_arg(args, kwargs, 0, "module"), "is_causal", True)
        # transformers' causal calls take one query without a mask as attending every key
        causal = bool(causal) and q.shape[-2] > 1
        tally.attention(q, k, v, _arg(args, kwargs, 4, "attention_mask"), causal)
        return out

    return attention


def attended_pairs(query: Any, keys: int, mask: Any, causal: bool) -> tuple[int, bool]:
    """The query-key pairs an attention call attends, over all its batches and query
    heads, and whether that is a guess (a mask of a kind not read).  A mask decides
    where there is one (boolean: True attends; additive: everything above half the
    dtype's lowest value); without one a causal call attends up to its diagonal, its
    queries aligned at the top left (PyTorch's ``is_causal``), any other every pair."""
    import torch

    slices, n = math.prod(query.shape[:-2]), int(query.shape[-2])
    if mask is None:
        if not causal:
            return slices * n * keys, False
        if n <= keys:
            return slices * n * (n + 1) // 2, False
        return slices * (keys * (keys + 1) // 2 + (n - keys) * keys), False
    target = (*query.shape[:-2], n, keys)
    tensor = isinstance(mask, torch.Tensor)
    if tensor and mask.numel() and (mask.is_floating_point() or mask.dtype == torch.bool):
        try:
            fits = tuple(torch.broadcast_shapes(mask.shape, target)) == target
        except RuntimeError:
            fits = False
        if fits:
            allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
            return int(torch.count_nonzero(allowed)) * (math.prod(target) // mask.numel()), False
    return attended_pairs(query, keys, None, causal)[0], True


def sampled_steps(total: int) -> frozenset[int]:
    """The decode steps of a generation of ``total`` tokens counted in full: steps run
    from 1 (between the first output token and the second) to ``total - 1``."""
    last = total - 1
    chosen = {1, 2, 3, last - 1, last}
    chosen.update(2**i for i in range(2, last.bit_length() + 1))
    return frozenset(k for k in chosen if 1 <= k <= last)


class _Steps:
    """Switches the counting mode on for the sampled steps of each generation and off
    between them, and derives the skipped steps' work from the sampled ones."""

    def __init__(self, tally: _Tally, mode: Any) -> None:
        self.tally = tally
        self.mode = mode
        self.on = False
        self.total = 0
        self.sampled: frozenset[int] = frozenset()
        self.step: int | None = None  # the sampled step being counted
        self.steps: dict[int, dict[tuple[str, str], list[Any]]] = {}
        self.derived = 0  # decode steps whose work was derived, not counted
        self.why = ""  # why the derivation does not hold (the run is counted in full)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """On from the start; off again (if on) at the end."""
        self._switch(True)
        try:
            yield
        finally:
            if not self.on:
                self.why = self.why or "a generation ended between its sampled steps"
            self._switch(False)

    def _switch(self, on: bool) -> None:
        if on and not self.on:
            self.mode.__enter__()
        elif self.on and not on:
            self.mode.__exit__(None, None, None)
        self.on = on

    def token(self, index: int, total: int) -> None:
        """Token ``index`` of ``total`` was just emitted: step ``index`` begins."""
        if self.step is not None:
            self.steps[self.step] = self.tally.take()
            self.step = None
        if index == 0:  # a new generation: the one before it is complete
            self.settle()
            self.total, self.sampled = total, sampled_steps(total)
            self._switch(True)
        elif index >= self.total:  # after the last token: counted in full
            self._switch(True)
        elif index in self.sampled:
            self.step = index
            self.tally.to_step()
            self._switch(True)
        else:
            self._switch(False)

    def settle(self) -> None:
        """Add the last generation's decode steps, counted and derived, to the tally."""
        steps, total = self.steps, self.total
        self.steps, self.total = {}, 0
        if not steps:
            return
        last = total - 1
        if len(steps) == last:  # every step counted
            for rows in steps.values():
                self.tally.merge(rows)
            return
        why = _not_affine(steps)
        if why:
            self.why = self.why or why
            return
        self.tally.merge(_affine_sum(steps[1], steps[2], last))
        self.derived += last - len(steps)


def _not_affine(steps: dict[int, dict[tuple[str, str], list[Any]]]) -> str:
    """Why the sampled steps do not lie on the line through steps 1 and 2 ("" if they
    do): the same operators, the same calls, FLOPs and bytes affine in the step."""
    one, two = steps[1], steps[2]
    for k, rows in sorted(steps.items()):
        if rows.keys() != one.keys():
            extra = sorted({*rows.keys()} ^ {*one.keys()})
            return f"decode step {k} ran other operators than step 1 ({extra[0][0]})"
        for key, row in rows.items():
            for i, what in ((0, "calls"), (1, "FLOPs"), (2, "bytes")):
                a, b = Fraction(one[key][i]), Fraction(two[key][i])
                if Fraction(row[i]) != a + (k - 1) * (b - a):
                    return f"decode step {k}'s {key[0]} {what} are not affine in the step"
            if row[3] != one[key][3]:
                return f"decode step {k}'s {key[0]} changed its FLOP estimate"
    return ""


def _affine_sum(
    one: dict[tuple[str, str], list[Any]], two: dict[tuple[str, str], list[Any]], last: int
) -> dict[tuple[str, str], list[Any]]:
    """Steps 1..``last`` summed, each row affine through steps 1 and 2 (exact)."""
    out: dict[tuple[str, str], list[Any]] = {}
    pairs = Fraction(last * (last - 1), 2)  # sum of (k - 1) over k = 1..last
    for key, row in one.items():
        summed = [
            last * Fraction(row[i]) + pairs * (Fraction(two[key][i]) - row[i]) for i in range(3)
        ]
        out[key] = [int(summed[0]), float(summed[1]), int(summed[2]), row[3]]
    return out


def dispatch_class(name: str, shapes: list[list[int]]) -> str:
    """The class of an operator as a dispatch mode sees it (see the module's docstring)."""
    first = _BATCHED.get(name)
    if first is not None and len(shapes) > first:
        return ELEMENTWISE if shapes[first][-1:] == [1] else ATTENTION
    return op_class(name, shapes)


def _tensors(values: Any, tensor: type) -> list[Any]:
    """The tensors among an aten call's arguments or results: themselves, or in a list
    or tuple (``aten::cat``'s inputs, ``aten::split``'s outputs).  Aten's schemas nest
    no deeper, so this is what ``torch.utils._pytree.tree_leaves`` finds, without its
    generic walk (which took a quarter of a full count's time when profiled)."""
    found = []
    for value in values:
        if isinstance(value, tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, tensor))
    return found


class _Tally:
    """Per phase, per (operator, class): [calls, flops, bytes, estimated]."""

    def __init__(self) -> None:
        import torch
        from torch.utils.flop_counter import flop_registry

        self._tensor = torch.Tensor
        self._formulas = flop_registry
        # per operator overload: (name, FLOP formula, is a view, class without shapes)
        self._known: dict[Any, tuple[str, Any, bool, str | None]] = {}
        self._composite: dict[Any, bool] = {}
        self._composite_key = torch._C.DispatchKey.CompositeImplicitAutograd
        self._has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
        self.on = False  # the counting modes are on
        self.depth = 0  # inside a call counted whole (how deep)
        self.inner = OTHER  # the class of the kernels of the call counted whole
        self.quiet = False  # the count's own operators (reading a mask): not counted
        self.thread = threading.get_ident()  # the counting modes are this thread's
        self.phase = PREFILL
        self.marked = False
        self.rows: dict[str, dict[tuple[str, str], list[Any]]] = {PREFILL: {}, DECODE: {}}
        self.sink = self.rows[PREFILL]  # where the next operator is added

    def to_step(self) -> None:
        """Count the next operators apart, as one sampled decode step."""
        self.sink = {}

    def take(self) -> dict[tuple[str, str], list[Any]]:
        """The sampled step's rows; the next operators go to the phase again."""
        rows, self.sink = self.sink, self.rows[self.phase]
        return rows

    def merge(self, rows: dict[tuple[str, str], list[Any]]) -> None:
        """Add a step's rows (counted or derived) to the current phase."""
        for key, (calls, flops, moved, estimated) in rows.items():
            row = self.rows[self.phase].setdefault(key, [0, 0.0, 0, False])
            row[0] += calls
            row[1] += flops
            row[2] += moved
            row[3] = row[3] or estimated

    @contextlib.contextmanager
    def whole(self, cls: str) -> Iterator[bool]:
        """Inside: one call counted whole, its kernels as calls of class ``cls`` and no
        work.  Yields whether it is the outermost (only that one adds its work)."""
        outer = not self.depth
        if outer:
            self.inner = cls
        self.depth += 1
        try:
            yield outer
        finally:
            self.depth -= 1

    def add_whole(self, name: str, cls: str, flops: float, moved: int, estimated: bool) -> None:
        """The work of one call counted whole: a row with no calls of its own (its
        kernels are counted as calls)."""
        row = self.sink.setdefault((name, cls), [0, 0.0, 0, False])
        row[1] += flops
        row[2] += moved
        row[3] = row[3] or estimated

    def attention(self, q: Any, k: Any, v: Any, mask: Any, causal: bool) -> None:
        """One attention call by what it computes (see the module's docstring)."""
        import torch

        if not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in (q, k, v)):
            self.add_whole(ATTENTION_CALL, ATTENTION, 0.0, 0, True)
            return
        self.quiet = True  # reading the mask runs operators of its own
        try:
            pairs, guess = attended_pairs(q, int(k.shape[-2]), mask, causal)
        finally:
            self.quiet = False
        flops = 2.0 * pairs * (int(q.shape[-1]) + int(v.shape[-1]))
        out = math.prod(q.shape[:-1]) * int(v.shape[-1]) * q.element_size()
        self.add_whole(ATTENTION_CALL, ATTENTION, flops, _bytes((q, k, v)) + out, guess)

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
            at_phase = self.sink is self.rows[self.phase]
            self.phase, self.marked = DECODE, True
            if at_phase:
                self.sink = self.rows[DECODE]

    def add(self, func: Any, args: tuple[Any, ...], kwargs: Any, out: Any) -> None:
        known = self._known.get(func)
        if known is None:
            name = str(func._schema.name)
            fixed = None if name in _SHAPED else dispatch_class(name, [])
            known = (name, self._formulas.get(func._overloadpacket), func.is_view, fixed)
            self._known[func] = known
        name, formula, is_view, cls = known
        if self.depth:  # a kernel of a call counted whole: a call, its work counted whole
            row = self.sink.setdefault((name, self.inner), [0, 0.0, 0, False])
            row[0] += 1
            return
        tensor = self._tensor
        inputs = _tensors(args, tensor)
        if kwargs:
            inputs += _tensors(kwargs.values(), tensor)
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
            outputs = _tensors((out,), tensor)
            moved = _bytes((*inputs, *outputs))
            if name in _COPIES and len({t.device for t in (*inputs, *outputs)}) > 1:
                moved = 0  # between devices: over the bus (see the module's docstring)
        row = self.sink.setdefault((name, cls), [0, 0.0, 0, False])
        row[0] += 1
        row[1] += flops
        row[2] += moved
        row[3] = row[3] or estimated

    def result(self, seconds: float, derived: int = 0, full_because: str = "") -> CountedWork:
        def ops(phase: str) -> tuple[OpWork, ...]:
            return tuple(
                OpWork(name, cls, calls, flops, moved, estimated)
                for (name, cls), (calls, flops, moved, estimated) in sorted(
                    self.rows[phase].items()
                )
            )

        return CountedWork(
            ops(PREFILL),
            ops(DECODE),
            self.marked,
            seconds,
            derived_steps=derived,
            full_because=full_because,
        )
