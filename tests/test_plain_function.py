"""A plain function, measured without token counts (issue 54): its figures per call."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]


def test_a_plain_function_needs_no_token_counts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="""
        def work(n):
            return sum(range(n))

        def test_plain(energy_benchmark):
            result = energy_benchmark(work, 20_000)
            assert result.input_tokens == 0 and result.output_tokens == 0
        """
    )
    done = pytester.runpytest(
        "-p", "no:randomly", "--energy-max-background=off", "--energy-json=out.json"
    )
    done.assert_outcomes(passed=1)
    assert "TypeError" not in done.stdout.str()
    case = json.loads((pytester.path / "out.json").read_text())["cases"][0]
    assert case["trials"] and all(t["joules"] > 0 for t in case["trials"])
    # no token: figures per call, and no throughput column rather than 0 tok/s
    table = done.stdout.str()
    assert "J ± CI" in table and "tok/s" not in table
