"""``value(result, FIGURE)`` of a figure per token, on a case that declared no tokens,
says why it has none instead of returning None (issue 61, item 10)."""

from __future__ import annotations

import pytest

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import value
from pytest_llmenergy.leaderboards import mlenergy_records
from tests.casefactory import make_case

SECONDS = [0.1, 0.11, 0.1]


def test_j_per_token_without_tokens_says_which_argument_is_missing() -> None:
    case = make_case(SECONDS, input_tokens=0, output_tokens=0)
    with pytest.raises(ConfigError) as raised:
        value(case, "j_per_token")
    message = str(raised.value)
    assert "\n" not in message
    assert "declared no tokens, so j_per_token has no value" in message
    assert "pass input_tokens= and output_tokens= to energy_benchmark" in message
    assert message.startswith(case.name)


def test_a_figure_per_output_token_names_output_tokens() -> None:
    case = make_case(SECONDS, input_tokens=16, output_tokens=0)
    with pytest.raises(ConfigError, match=r"declared no output tokens, so decode_j_per_out"):
        value(case, "decode_j_per_out_token")
    # J/token divides by the input tokens too: it has its value
    assert value(case, "j_per_token") == pytest.approx(value(case, "energy_j") / 16)


def test_other_figures_and_cases_with_tokens_are_as_before() -> None:
    plain = make_case(SECONDS, input_tokens=0, output_tokens=0)
    assert value(plain, "time_s") == pytest.approx(sum(SECONDS) / 3)
    assert value(plain, "req_ttft_s") is None  # not a server's: None, as documented
    llm = make_case(SECONDS, input_tokens=8, output_tokens=4)
    assert value(llm, "j_per_token") == pytest.approx(value(llm, "energy_j") / 12)
    # the package's own readers keep their blank
    from pytest_llmenergy.figures import value_or_none

    assert value_or_none(plain, "j_per_token") is None


def test_an_export_of_a_run_with_a_plain_function_still_works() -> None:
    """ML.ENERGY's records read every measured case: one without tokens gets a blank."""
    plain = make_case(SECONDS, input_tokens=0, output_tokens=0)
    (record,) = mlenergy_records([plain])["records"]
    assert record["energy_per_output_token_j"] is None
