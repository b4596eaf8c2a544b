"""Case results with known numbers, for tests of storage, comparison and reports."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_llmenergy.controller.rule import ControllerOptions
from pytest_llmenergy.meters.resources import ResourceUsage
from pytest_llmenergy.results import CONVERGED, CaseResult, PhaseRecord, Trial


def make_trials(
    seconds: Sequence[float],
    *,
    watts: float = 100.0,
    input_tokens: int = 8,
    output_tokens: int = 4,
    prefill_share: float | None = 0.25,
    idle_w: float = 0.0,
) -> tuple[Trial, ...]:
    """Trials at a constant power: joules = watts x seconds, split 80/20 into gpu/cpu."""
    trials = []
    for i, s in enumerate(seconds, start=1):
        joules = watts * s
        by_domain = {"gpu:0": 0.8 * joules, "cpu:package-0": 0.2 * joules, "cpu:core-0": 0.1}
        phases = {}
        if prefill_share is not None:
            p = prefill_share
            phases = {
                "prefill": PhaseRecord(s * p, joules * p, {"gpu:0": 0.8 * joules * p}),
                "decode": PhaseRecord(s * (1 - p), joules * (1 - p), {"gpu:0": 0.8 * joules}),
            }
        trials.append(
            Trial(
                index=i,
                seconds=s,
                joules=joules,
                net_joules=joules - idle_w * s,
                joules_by_domain=by_domain,
                net_joules_by_domain={k: v - idle_w * s / 2 for k, v in by_domain.items()},
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                phases=phases,
            )
        )
    return tuple(trials)


def make_case(
    seconds: Sequence[float],
    *,
    model: str = "tiny-llama",
    sweep: str = "input",
    input_tokens: int = 8,
    output_tokens: int = 4,
    watts: float = 100.0,
    status: str = CONVERGED,
    method: str = "counter",
    resources: bool = True,
    **kwargs: object,
) -> CaseResult:
    case_id = f"{model}-in{input_tokens}-out{output_tokens}"
    test = f"test_{sweep}_tokens"
    return CaseResult(
        nodeid=f"benchmarks/{test}.py::{test}[{case_id}]",
        name=f"{test}[{case_id}]",
        labels={"sweep": sweep, "model": model},
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        status=status,
        options=ControllerOptions(),
        trials=make_trials(
            seconds, watts=watts, input_tokens=input_tokens, output_tokens=output_tokens, **kwargs
        ),
        methods={"gpu:0": method, "cpu:package-0": method, "cpu:core-0": method},
        counted={"gpu:0": True, "cpu:package-0": True, "cpu:core-0": False},
        backend="trace",
        resources=ResourceUsage(
            peak_rss_bytes=300 * 2**20,
            peak_gpu_bytes=None,
            cpu_seconds=0.5,
            iowait_share=0.01,
            wall_seconds=sum(seconds),
        )
        if resources
        else None,
    )
