"""A regression of known size, injected into a model's own work.

To learn what a gate can see on a runner, the same code is measured with and without a
known slowdown (``llmenergy gatecheck``, ``--llm-inject-regression=25%``).  Every forward
pass of the model is followed by extra CPU work of ``share`` times the CPU time the pass
itself took, so the model's work (and, on CPU meters, its energy) grows by about
``share`` whatever the case's size; generation's bookkeeping outside the forward passes
is not scaled, so the whole case grows a little less.

Two more, to check that a failed gate says why (``--llm-inject-work``, issue 35): more
work of a known kind (every linear layer computes its product twice) and the same work
done slower (every linear layer busy-waits, in Python, as long as its product took).
"""

from __future__ import annotations

import time
from typing import Any


def _spin_cpu_s(seconds: float) -> None:
    """Busy work until the process has used ``seconds`` more CPU time (its other threads
    count too: a math library's workers spin-waiting meanwhile are part of the cost)."""
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        for i in range(200):
            x += i * i % 7


def inject_regression(model: Any, share: float) -> None:
    """Add ``share`` (0.25: +25 %) of each forward pass's CPU time as extra work; on a
    GPU, where the CPU only launches the work, the GPU busy ``share`` longer per pass."""
    if share <= 0:
        return
    if _on_gpu(model):
        _repeat_products(model, share)
        return
    started: list[float] = []

    def before(module: Any, args: Any) -> None:
        started.append(time.process_time())

    def after(module: Any, args: Any, output: Any) -> None:
        if started:
            _spin_cpu_s(share * (time.process_time() - started.pop()))

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)


def _on_gpu(model: Any) -> bool:
    first = next(model.parameters(), None)
    return first is not None and first.device.type == "cuda"


def _repeat_products(model: Any, share: float) -> None:
    """After each forward pass, keep the GPU busy multiplying for ``share`` of the time
    the pass took on it: a GPU kernel ``share`` slower.  (More of the pass's own products
    would not do: transformers' eager decoding leaves the GPU waiting for the CPU's
    launches most of each step, and extra kernels fill those gaps unseen; the proof on an
    H100 found +10 % of every linear product at -1.5 %.)"""
    import torch

    device = next(model.parameters()).device
    block = torch.ones(2048, 2048, device=device, dtype=torch.bfloat16)
    started: list[float] = []

    def before(module: Any, args: Any) -> None:
        torch.cuda.synchronize(device)
        started.append(time.perf_counter())

    def after(module: Any, args: Any, output: Any) -> None:
        if not started:
            return
        torch.cuda.synchronize(device)
        now = time.perf_counter()
        end = now + share * (now - started.pop())
        while time.perf_counter() < end:
            block @ block
            torch.cuda.synchronize(device)

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)


def _linear_twice(linear: Any) -> None:
    """Compute the layer's product once more after each call: twice the matmul FLOPs,
    the same output."""
    import torch.nn.functional as F

    def again(module: Any, args: Any, output: Any) -> Any:
        return F.linear(args[0], module.weight, module.bias)

    linear.register_forward_hook(again)


def _linear_slow(linear: Any) -> None:
    """Busy-wait after each call as long as the call took: the same work, slower, the
    extra time in no operator (Python)."""
    started: list[float] = []

    def before(module: Any, args: Any) -> None:
        started.append(time.perf_counter())

    def after(module: Any, args: Any, output: Any) -> None:
        if started:
            took = time.perf_counter() - started.pop()
            end = time.perf_counter() + took
            while time.perf_counter() < end:
                pass

    linear.register_forward_pre_hook(before)
    linear.register_forward_hook(after)


# Changes of a known kind to every linear layer: name -> (what it does, how).
WORK_INJECTIONS: dict[str, tuple[str, Any]] = {
    "linear-twice": ("every linear layer computes its product twice (more work)", _linear_twice),
    "linear-slow": (
        "every linear layer busy-waits as long as its product took (the same work, slower)",
        _linear_slow,
    ),
}


def inject_work(model: Any, kinds: tuple[str, ...]) -> None:
    """Apply ``WORK_INJECTIONS`` ``kinds`` to every ``torch.nn.Linear`` of ``model``."""
    if not kinds:
        return
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for kind in kinds:
        apply = WORK_INJECTIONS[kind][1]
        for linear in linears:
            apply(linear)
