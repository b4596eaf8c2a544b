"""Case results with known numbers, for tests of storage, comparison and reports."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.probes.resources import ResourceUsage
from pytest_llmenergy.results import CONVERGED, CaseResult, PhaseRecord, Trial
from pytest_llmenergy.storage.recorder import new_run
from pytest_llmenergy.storage.runfile import COMPLETE, Run


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
        options=ControllerSettings(),
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


def synthetic_run(
    n_cases: int, *, seed: int = 1, slower: float = 1.0, name: str = "synthetic"
) -> Run:
    """A complete run of ``n_cases`` cases over two sweeps and several models, with noisy
    trials (seeded): for reports of realistic shape at any size.  ``slower`` scales every
    trial's seconds (and so its joules), to make a second run that regressed."""
    rng = random.Random(seed)
    models = (
        [f"model-{i}" for i in range(max(1, n_cases // 100))]
        if n_cases > 300
        else [
            "tiny-llama",
            "tiny-mistral",
            "tiny-falcon",
        ]
    )
    per_sweep = max(1, n_cases // (2 * len(models)))
    cases: list[CaseResult] = []
    for sweep in ("input", "output"):
        for m, model in enumerate(models):
            for k in range(per_sweep):
                size = round(8 * (2048 / 8) ** (k / max(per_sweep - 1, 1)))
                tokens_in, tokens_out = (size, 32) if sweep == "input" else (32, size)
                base_s = (0.02 + 0.0002 * tokens_in + 0.004 * tokens_out) * (1 + 0.2 * m)
                seconds = [base_s * slower * rng.uniform(0.95, 1.05) for _ in range(5)]
                cases.append(
                    make_case(
                        seconds,
                        model=model,
                        sweep=sweep,
                        input_tokens=tokens_in,
                        output_tokens=tokens_out,
                        watts=20.0,
                        method="estimated",
                    )
                )
    header = new_run(
        name=name,
        hardware="cpu-x__no-gpu__estimate",
        machine={"cpu": {"model": "CPU X", "logical_cores": 2}, "gpus": []},
        commit={"id": "0123456789abcdef", "dirty": False, "branch": "main"},
        options={"rule": "default", "confidence": 0.95, "max_trials": 25},
        meter={"backend": "estimate", "description": "estimate: CPU time x TDP 20 W"},
        command=["benchmarks/"],
    )
    return dataclasses.replace(header, cases=tuple(cases[:n_cases]), status=COMPLETE)
