"""The energy benchmark suite: every model x token-size case is a parametrized test.

The cases come from the plugin (``llm_input_case`` / ``llm_output_case`` are
parametrized over ``--llm-grid``, ``--llm-model``, ``--llm-input-tokens`` and
``--llm-output-tokens``); models are loaded once each by ``llm_pool``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_llmenergy.controller.benchmark import EnergyBenchmark
from pytest_llmenergy.llm.grid import LLMCase
from pytest_llmenergy.llm.loader import ModelPool
from pytest_llmenergy.results import CaseResult


@pytest.fixture
def run_case(
    llm_pool: ModelPool, energy_benchmark: EnergyBenchmark
) -> Callable[[LLMCase], CaseResult]:
    """Generate exactly the case's output tokens from a prompt of exactly its input tokens,
    repeated under the stopping rule (the model loads outside the measurement)."""

    def run(case: LLMCase) -> CaseResult:
        model = llm_pool.get(case.model)
        prompt = model.prompt_ids(case.input_tokens)
        return energy_benchmark(
            model.generate,
            prompt,
            case.output_tokens,
            input_tokens=case.input_tokens,
            output_tokens=case.output_tokens,
            # repeated back to back where one prefill is too short for the meter
            prefill_pass=lambda: model.prefill(prompt),
        )

    return run
