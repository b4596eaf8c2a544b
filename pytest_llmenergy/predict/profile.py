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
MAX_OPS = 60

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


def _inside_attention(event: Any) -> bool:
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if str(parent.name).startswith(_ATTENTION_PREFIX):
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


def _seq_by_seq(shapes: list[list[int]]) -> bool:
    """Both operands are activations (4-d, heads x tokens x dims): scores or values."""
    return len(shapes) >= 2 and len(shapes[0]) == 4 and len(shapes[1]) == 4


def _elements(shapes: list[list[int]]) -> int:
    return sum(math.prod(s) for s in shapes if s)


def profile_call(
    fn: Callable[[], Any], elem_bytes: int = 4, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Run ``fn`` once under torch.profiler (CPU operators, shapes, FLOPs) and summarize.

    Bytes are estimated from the inputs' shapes (``elem_bytes`` each): the profiler does
    not count memory traffic on a CPU.
    """
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        fn()
    wall_s = time.perf_counter() - start
    t0 = time.perf_counter()
    summary = summarize_events(prof.events(), elem_bytes)
    summary["wall_s"] = wall_s
    summary["summarize_s"] = time.perf_counter() - t0
    if extra:
        summary.update(extra)
    return summary


def summarize_events(events: Any, elem_bytes: int = 4) -> dict[str, Any]:
    """Per operator (name, input shapes) and per class: calls, self CPU time, FLOPs, bytes."""
    by_op: dict[tuple[str, str], dict[str, Any]] = {}
    classes = {c: {"calls": 0, "self_cpu_s": 0.0, "flops": 0.0, "bytes": 0.0} for c in CLASSES}
    top_level = 0
    count = 0
    for e in events:
        count += 1
        name = str(e.name)
        shapes = [list(s) for s in (getattr(e, "input_shapes", None) or []) if isinstance(s, list)]
        cls = op_class(name, shapes)
        if cls != ATTENTION and _inside_attention(e):
            cls = ATTENTION  # the math path's bmm and softmax are attention's work
        self_s = float(getattr(e, "self_cpu_time_total", 0.0)) / 1e6
        flops = float(getattr(e, "flops", 0) or 0)
        moved = float(_elements(shapes) * elem_bytes)
        nested = getattr(e, "cpu_parent", None) is not None
        if not nested:
            top_level += 1
        key = (name, repr(shapes))
        row = by_op.setdefault(
            key,
            {
                "name": name,
                "shapes": shapes,
                "class": cls,
                "calls": 0,
                "self_cpu_s": 0.0,
                "flops": 0.0,
                "bytes": 0.0,
            },
        )
        row["calls"] += 1
        row["self_cpu_s"] += self_s
        row["flops"] += flops
        c = classes[cls]
        c["self_cpu_s"] += self_s
        c["flops"] += flops
        if not nested:  # a nested operator's work is its parent's (linear -> addmm)
            c["calls"] += 1
            c["bytes"] += moved
            row["bytes"] += moved
    ops = sorted(by_op.values(), key=lambda r: -r["self_cpu_s"])[:MAX_OPS]
    return {
        "version": PROFILE_VERSION,
        "events": count,
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
