"""The batch-size axis: case ids, per-query and per-token figures of a batch, OOM, the
run file, and the suite run with ``--llm-batch-sizes`` as users run it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from pytest_llmenergy.errors import ConfigError, LLMEnergyError
from pytest_llmenergy.figures import value
from pytest_llmenergy.llm.grid import INPUT_SWEEP, make_grid, parse_count_list
from pytest_llmenergy.results import OOM, RequestRecord
from pytest_llmenergy.storage.runfile import decode_case, encode_case
from tests.test_controller_benchmark import constant_meter, make_bench
from tests.test_plugin_suite import model_cache, suite  # noqa: F401 - fixtures


def test_every_case_runs_at_every_batch_size_and_batch_1_keeps_its_id() -> None:
    grid = make_grid("quick", ["tiny-llama"], [8, 64], None, batch_sizes=(1, 8))
    ids = [c.id for c in grid.cases(INPUT_SWEEP)]
    assert ids == [
        "tiny-llama-in8-out32",
        "tiny-llama-in8-out32-bs8",
        "tiny-llama-in64-out32",
        "tiny-llama-in64-out32-bs8",
    ]
    case = grid.cases(INPUT_SWEEP)[1]
    assert case.queries == 8 and case.labels()["batch_size"] == "8"
    assert "batch_size" not in grid.cases(INPUT_SWEEP)[0].labels()
    assert "batch sizes 1,8" in grid.describe()
    assert "10 cases" in grid.models_text()
    assert parse_count_list("1..16") == (1, 2, 4, 8, 16)
    with pytest.raises(ConfigError, match="counts >= 1 such as 1,8,32"):
        parse_count_list("0,8")


@dataclass(frozen=True)
class Batch:
    input_tokens: int
    output_tokens: int
    queries: int


def test_queries_are_checked_and_shape_every_per_query_figure() -> None:
    bench, _, _ = make_bench(constant_meter(100.0), warmup=0, min_trials=3, max_trials=3)

    def target() -> Batch:
        time.sleep(0.05)
        return Batch(10, 5, 4)

    result = bench(target, input_tokens=10, output_tokens=5, queries=4)
    trial = result.trials[0]
    assert trial.queries == 4 and result.queries == 4
    assert value(result, "energy_j") == pytest.approx(sum(t.joules for t in result.trials) / 3 / 4)
    j_per_token = sum(t.joules / (4 * 15) for t in result.trials) / 3
    assert value(result, "j_per_token") == pytest.approx(j_per_token)
    tokens_per_s = sum(60 / t.seconds for t in result.trials) / 3
    assert value(result, "tokens_per_s") == pytest.approx(tokens_per_s)
    assert value(result, "gpu_j") == pytest.approx(value(result, "energy_j"))
    assert value(result, "queries") == 4

    wrong, _, _ = make_bench(constant_meter(), warmup=0)
    with pytest.raises(LLMEnergyError, match="ran 4 queries at once, but the case declares"):
        wrong(target, input_tokens=10, output_tokens=5, queries=8)


def test_an_oom_at_a_batch_size_is_recorded_with_it() -> None:
    bench, results, _ = make_bench(constant_meter(), warmup=1)

    def target() -> None:
        raise MemoryError

    with pytest.raises(pytest.skip.Exception, match=r"OOM at 512 input tokens .* x 32 queries"):
        bench(target, input_tokens=512, output_tokens=32, queries=32)
    assert results[0].status == OOM and results[0].queries == 32


def test_the_run_file_keeps_queries_and_requests() -> None:
    bench, _, _ = make_bench(constant_meter(), warmup=0, min_trials=3, max_trials=3)

    @dataclass(frozen=True)
    class Burst(Batch):
        requests: tuple[RequestRecord, ...] = ()

    def target() -> Burst:
        time.sleep(0.02)
        return Burst(10, 5, 2, (RequestRecord(0.01, 0.02, 5), RequestRecord(0.011, 0.03, 5)))

    result = bench(target, input_tokens=10, output_tokens=5, queries=2)
    again = decode_case(encode_case(result))
    assert again.queries == 2 and again.trials == result.trials
    assert again.trials[0].requests[1] == RequestRecord(0.011, 0.03, 5)
    assert value(again, "latency_p50_s") == pytest.approx(0.025)


def test_the_suite_runs_a_batch_sweep(suite: pytest.Pytester) -> None:  # noqa: F811
    result = suite.runpytest_subprocess(
        "--energy-backend=trace",
        "--llm-model=tiny-llama",
        "--llm-input-tokens=16",
        "--llm-output-tokens=4",
        "--llm-batch-sizes=1,3",
        "--energy-rule=research",
        "--energy-max-trials=2",
        "--energy-min-trials=2",
        "--energy-json=run.json",
        "-k",
        "test_input",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*batch sizes 1,3*", "*in*out*queries*", "*16*32*3 *"])
    run = json.loads((suite.path / "run.json").read_text())
    cases = {c["name"]: c for c in run["cases"]}
    batch = cases["test_input_tokens[tiny-llama-in16-out32-bs3]"]
    assert batch["queries"] == 3 and batch["labels"]["batch_size"] == "3"
    assert all(t["queries"] == 3 and t["input_tokens"] == 16 for t in batch["trials"])
    assert cases["test_input_tokens[tiny-llama-in16-out32]"]["queries"] == 1
    assert run["options"]["batch_sizes"] == [1, 3]
