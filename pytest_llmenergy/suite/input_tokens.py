"""Energy and time against the number of input tokens, at a fixed output length."""

from pytest_llmenergy.llm.grid import LLMCase


def test_input_tokens(llm_input_case: LLMCase, run_case) -> None:
    result = run_case(llm_input_case)
    assert all(t.input_tokens == llm_input_case.input_tokens for t in result.trials)
