"""A regression of known size, injected into a model's own work.

To learn what a gate can see on a runner, the same code is measured with and without a
known slowdown (``llmenergy gatecheck``, ``--llm-inject-regression=25%``).  Every forward
pass of the model is followed by extra CPU work of ``share`` times the CPU time the pass
itself took, so the model's work (and, on CPU meters, its energy) grows by about
``share`` whatever the case's size; generation's bookkeeping outside the forward passes
is not scaled, so the whole case grows a little less.
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
    """Add ``share`` (0.25: +25 %) of each forward pass's CPU time as extra work."""
    if share <= 0:
        return
    started: list[float] = []

    def before(module: Any, args: Any) -> None:
        started.append(time.process_time())

    def after(module: Any, args: Any, output: Any) -> None:
        if started:
            _spin_cpu_s(share * (time.process_time() - started.pop()))

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)
