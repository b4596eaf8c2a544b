"""The suite's fixture, ``run_case``: one case measured, by a model in this process or by
a server.

The cases come from the plugin (``llm_input_case`` / ``llm_output_case`` are
parametrized over ``--llm-grid``, ``--llm-model``, ``--llm-input-tokens`` and
``--llm-output-tokens``); models are loaded once each by ``llm_pool``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_llmenergy.controller.benchmark import EnergyBenchmark, is_out_of_memory
from pytest_llmenergy.llm.grid import LLMCase
from pytest_llmenergy.llm.loader import ModelPool
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.serving.target import ServerTarget


@pytest.fixture
def run_case(
    llm_pool: ModelPool, energy_benchmark: EnergyBenchmark, llm_server: ServerTarget | None
) -> Callable[[LLMCase], CaseResult]:
    """Generate exactly the case's output tokens from a prompt of exactly its input tokens,
    repeated under the stopping rule (the model loads outside the measurement); with a
    server (--llm-endpoint, --llm-serve), each trial is a burst of concurrent requests."""

    def run(case: LLMCase) -> CaseResult:
        if llm_server is not None:
            return energy_benchmark(
                llm_server.run,
                case.input_tokens,
                case.output_tokens,
                case.concurrency,
                input_tokens=case.input_tokens,
                output_tokens=case.output_tokens,
                queries=llm_server.requests_for(case.concurrency),
            )
        model = llm_pool.get(case.model)
        # a batch of distinct prompts of exactly the case's tokens (--llm-batch-sizes)
        prompt = model.prompt_ids(case.input_tokens, case.batch_size)
        # compiled execution (--llm-execution): this shape compiled and captured now,
        # before any window; out of memory, the benchmark's warm-up meets it again and
        # keeps the case as out of memory
        try:
            model.prepare(prompt, case.output_tokens)
        except BaseException as exc:
            if not is_out_of_memory(exc):
                raise
        return energy_benchmark(
            model.generate,
            prompt,
            case.output_tokens,
            input_tokens=case.input_tokens,
            output_tokens=case.output_tokens,
            queries=case.batch_size,
            # repeated back to back where one prefill is too short for the meter
            prefill_pass=lambda: model.prefill(prompt),
        )

    return run
