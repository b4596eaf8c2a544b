"""Energy and time against the number of output tokens, at a fixed input length."""

from pytest_llmenergy.llm.grid import LLMCase


def test_output_tokens(llm_output_case: LLMCase, run_case) -> None:
    result = run_case(llm_output_case)
    assert all(t.output_tokens == llm_output_case.output_tokens for t in result.trials)
