"""The operator trace of one run of a case: torch.profiler's CPU operators, per class.

Recorded in a separate, unmeasured run after a case's trials (``--energy-profile-ops``):
the profiler costs several microseconds per operator, which on a small model is more
than the operator itself, so it must never run inside a measured window.  The result is
plain JSON kept with the case in the run file (``op_profile``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from .features import ATTENTION, CLASSES, ELEMENTWISE, EMBEDDING, MATMUL, OTHER

PROFILE_VERSION = 1
# Operators kept by name and shapes (the costliest); the per-class totals count them all.
MAX_OPS = 200

_MATMUL = {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm", "aten::baddbmm"}
_ATTENTION_PREFIX = ("aten::scaled_dot_product", "aten::_scaled_dot_product", "aten::_flash")
_EMBEDDING = {"aten::embedding", "aten::index_select", "aten::index", "aten::gather"}
# Arithmetic over tensors' elements; views, copies of metadata and allocation are "other".
_ELEMENTWISE = {
    "aten::add",
    "aten::add_",
    "aten::mul",
    "aten::mul_",
    "aten::sub",
    "aten::rsub",
    "aten::div",
    "aten::neg",
    "aten::pow",
    "aten::mean",
    "aten::rsqrt",
    "aten::silu",
    "aten::gelu",
    "aten::tanh",
    "aten::softmax",
    "aten::_softmax",
    "aten::layer_norm",
    "aten::native_layer_norm",
    "aten::cat",
    "aten::copy_",
    "aten::cos",
    "aten::sin",
    "aten::where",
    "aten::masked_fill",
    "aten::argmax",
}


def op_class(name: str, shapes: list[list[int]] | None = None) -> str:
    """The class of an aten operator: a batched matmul over a sequence is attention."""
    if name in _MATMUL:
        if (
            name in ("aten::bmm", "aten::baddbmm", "aten::matmul")
            and shapes
            and _seq_by_seq(shapes)
        ):
            return ATTENTION
        return MATMUL
    if name.startswith(_ATTENTION_PREFIX):
        return ATTENTION
    if name in _EMBEDDING:
        return EMBEDDING
    if name in _ELEMENTWISE:
        return ELEMENTWISE
    return OTHER


def _seq_by_seq(shapes: list[list[int]]) -> bool:
    """Both operands are activations (4-d, heads x tokens x dims): scores or values."""
    return len(shapes) >= 2 and len(shapes[0]) == 4 and len(shapes[1]) == 4


def profile_call(
    fn: Callable[[], Any], elem_bytes: int = 4, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Run ``fn`` once under torch.profiler (CPU operators, shapes, FLOPs) and summarize.

    The profiler's raw events are read (not its Python event tree, which takes seconds
    per ten thousand operators); nesting is rebuilt from their times.
    """
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        fn()
    wall_s = time.perf_counter() - start
    t0 = time.perf_counter()
    summary = summarize_events(prof.profiler.kineto_results.events(), elem_bytes)
    summary["wall_s"] = wall_s
    summary["summarize_s"] = time.perf_counter() - t0
    if extra:
        summary.update(extra)
    return summary


# Bytes per element of the dtypes the profiler names; anything else counts as elem_bytes.
_DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "bool": 1,
    "unsigned char": 1,
}
_FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


def _flash_flops(shapes: list[list[int]]) -> float:
    """The fused CPU attention kernel reports no FLOPs: scores and values from q and k,
    causal (half the pairs) when queries and keys are the same tokens."""
    if len(shapes) < 2 or len(shapes[0]) != 4 or len(shapes[1]) != 4:
        return 0.0
    b, h, n, d = shapes[0]
    keys = shapes[1][2]
    pairs = n * (n + 1) / 2 if n == keys and n > 1 else n * keys
    return 4.0 * b * h * pairs * d


def _timed_rows(events: Any) -> list[tuple[int, int, int, Any]]:
    """The operators' events as (thread, start, end, event), each thread's in order of
    start, an enclosing event before those inside it; user annotations left out."""
    rows = []
    for e in events:
        if getattr(e, "is_user_annotation", lambda: False)():
            continue
        start = int(e.start_ns())
        rows.append((int(e.start_thread_id()), start, start + int(e.duration_ns()), e))
    rows.sort(key=lambda r: (r[0], r[1], -r[2]))
    return rows


def _op_row(name: str, shapes: list[list[int]], cls: str) -> dict[str, Any]:
    return {
        "name": name,
        "shapes": shapes,
        "class": cls,
        "calls": 0,
        "self_cpu_s": 0.0,
        "flops": 0.0,
        "bytes": 0.0,
    }


def _moved_bytes(event: Any, shapes: list[list[int]], elem_bytes: int) -> float:
    """The bytes of an outermost operator's inputs, at its dtypes' sizes."""
    dtypes = list(event.dtypes()) if hasattr(event, "dtypes") else []
    moved = 0.0
    for i, shape in enumerate(shapes):
        size = _DTYPE_BYTES.get(dtypes[i] if i < len(dtypes) else "", elem_bytes)
        moved += math.prod(shape) * size if shape else 0
    return moved


def summarize_events(events: Any, elem_bytes: int = 4) -> dict[str, Any]:
    """Per operator (name, input shapes) and per class: calls, self CPU time, FLOPs, bytes.

    ``events`` are the profiler's raw CPU events (``name()``, ``start_ns()``,
    ``duration_ns()``, ``shapes()``, ``dtypes()``, ``flops()``, ``start_thread_id()``).
    An event inside another on the same thread is its child: its time is not the
    parent's self time, and its bytes are the parent's (linear -> addmm) so they count
    once, at the outermost operator.  Anything inside an attention operator is attention.
    """
    rows = _timed_rows(events)
    by_op: dict[tuple[str, str], dict[str, Any]] = {}
    classes = {c: {"calls": 0, "self_cpu_s": 0.0, "flops": 0.0, "bytes": 0.0} for c in CLASSES}
    top_level = 0
    # the open operators of one thread: [end, children's time, in attention, row, class,
    # duration] (ns)
    stack: list[list[Any]] = []
    thread = None

    def close(entry: list[Any]) -> None:
        _, child_ns, _, row, cls, dur_ns = entry
        self_s = max(0, dur_ns - child_ns) / 1e9
        row["self_cpu_s"] += self_s
        classes[cls]["self_cpu_s"] += self_s

    for tid, start, end, e in rows:
        if tid != thread:
            while stack:
                close(stack.pop())
            thread = tid
        while stack and stack[-1][0] <= start:
            close(stack.pop())
        name = str(e.name())
        shapes = [list(s) for s in e.shapes() if isinstance(s, list)]
        parent = stack[-1] if stack else None
        in_attention = parent is not None and (parent[2] or parent[4] == ATTENTION)
        cls = ATTENTION if in_attention else op_class(name, shapes)
        flops = float(e.flops() or 0)
        if name == _FLASH and not flops:
            flops = _flash_flops(shapes)
        key = (name, repr(shapes))
        row = by_op.get(key)
        if row is None:
            row = by_op[key] = _op_row(name, shapes, cls)
        row["calls"] += 1
        row["flops"] += flops
        classes[cls]["flops"] += flops
        if parent is None:
            top_level += 1
            moved = _moved_bytes(e, shapes, elem_bytes)
            row["bytes"] += moved
            classes[cls]["calls"] += 1
            classes[cls]["bytes"] += moved
        else:
            parent[1] += end - start
        stack.append([end, 0, in_attention, row, cls, end - start])
    while stack:
        close(stack.pop())
    ops = sorted(by_op.values(), key=lambda r: -r["self_cpu_s"])[:MAX_OPS]
    return {
        "version": PROFILE_VERSION,
        "events": len(rows),
        "top_level_ops": top_level,
        "self_cpu_s": sum(c["self_cpu_s"] for c in classes.values()),
        "classes": classes,
        "ops": ops,
    }


def check_profile(data: Any, where: str) -> dict[str, Any]:
    """A run file's ``op_profile``, checked before use: one error naming what is wrong."""
    from ..errors import ConfigError

    if not isinstance(data, dict) or not isinstance(data.get("classes"), dict):
        raise ConfigError(f"{where}: op_profile is not an operator profile (no classes)")
    for cls, row in data["classes"].items():
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), int | float) and not isinstance(row.get(k), bool)
            for k in ("calls", "self_cpu_s", "flops", "bytes")
        ):
            raise ConfigError(f"{where}: op_profile class {cls!r} lacks numeric calls/time/work")
    return data
