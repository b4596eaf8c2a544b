"""Sampled decode steps (predict/work_count.py): the derived count equals the full one.

Counting every operator of every decode step costs three times the run, so a
generation's steps are counted on a sample and the rest derived (affine in the step).
Exactness is not negotiable: here the derived count is compared with a full count
(every step observed) on real models and shapes, with zero difference allowed, and a
generation whose steps do not follow the line is counted in full and says why.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_llmenergy.llm import LoadedModel, load_model
from pytest_llmenergy.llm.grid import GRIDS
from pytest_llmenergy.llm.tiny import ensure_tiny_model
from pytest_llmenergy.predict.work_count import count_work, sampled_steps
from pytest_llmenergy.results import CountedWork
from tests.test_work_count import generate_without_cache

MODELS = GRIDS["default"].models


def _shapes(grid: str) -> list[tuple[int, int]]:
    """A grid's (input, output) tokens: its input sweep and its output sweep."""
    g = GRIDS[grid]
    ins = [(n, g.fixed_output_tokens) for n in g.input_tokens]
    return ins + [(g.fixed_input_tokens, n) for n in g.output_tokens]


def assert_same(derived: CountedWork, full: CountedWork) -> None:
    """Every operator row of both phases equal: calls, FLOPs, bytes, estimated."""
    assert derived.marked == full.marked
    assert derived.prefill == full.prefill
    for mine, theirs in zip(derived.decode, full.decode, strict=True):
        assert mine == theirs
    assert not full.derived_steps


def both(run: Callable[[], Any]) -> tuple[CountedWork, CountedWork]:
    return count_work(run), count_work(run, sample=False)


@pytest.fixture(scope="module")
def models(tiny_cache: Path) -> dict[str, LoadedModel]:
    return {name: load_model(name, cache_dir=tiny_cache) for name in MODELS}


def test_the_sampled_steps_are_the_first_three_the_powers_of_two_and_the_last_two() -> None:
    assert sampled_steps(100) == {1, 2, 3, 4, 8, 16, 32, 64, 98, 99}
    assert sampled_steps(4) == {1, 2, 3}  # every step: nothing to derive
    assert sampled_steps(1) == set()  # one token: no decode step
    assert max(sampled_steps(4096)) == 4095 and len(sampled_steps(4096)) == 15


def _quick_cases() -> list[Any]:
    """The quick grid's shapes on every tiny model, but its longest generation on one:
    512 decode steps counted in full took 34-38 s a model, and the architectures differ
    in their layers, which every shorter shape already counts (every model's every shape:
    ``-m exhaustive``)."""
    longest = max(n for _, n in _shapes("quick"))
    return [
        pytest.param(name, shape, id=f"{name}-in{shape[0]}-out{shape[1]}")
        for name in MODELS
        for shape in _shapes("quick")
        if shape[1] < longest or name == MODELS[0]
    ]


@pytest.mark.parametrize(("name", "shape"), _quick_cases())
def test_the_derived_count_equals_the_full_count(
    models: dict[str, LoadedModel], name: str, shape: tuple[int, int]
) -> None:
    model = models[name]
    n_in, n_out = shape
    ids = model.prompt_ids(n_in)
    derived, full = both(lambda: model.generate(ids, n_out))
    assert_same(derived, full)
    assert derived.derived_steps == max(0, n_out - 1 - len(sampled_steps(n_out)))
    assert not derived.full_because


def test_a_batch_of_prompts_derives_exactly(models: dict[str, LoadedModel]) -> None:
    model = models["tiny-llama"]
    ids = model.prompt_ids(24, batch_size=3)
    derived, full = both(lambda: model.generate(ids, 40))
    assert_same(derived, full)
    assert derived.derived_steps == 39 - len(sampled_steps(40))


def test_two_generations_in_one_run_each_derive(models: dict[str, LoadedModel]) -> None:
    model = models["tiny-mistral"]
    short, long = model.prompt_ids(8), model.prompt_ids(20)

    def run() -> None:
        model.generate(short, 30)
        model.generate(long, 50)

    derived, full = both(run)
    assert_same(derived, full)
    assert derived.derived_steps == (29 - len(sampled_steps(30))) + (49 - len(sampled_steps(50)))


def custom(tmp_path: Path, tiny_cache: Path, config: Any) -> LoadedModel:
    """A checkpoint of another architecture, random weights, tiny-llama's tokenizer,
    through the package's loader."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path / config.model_type
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    shutil.copy(ensure_tiny_model("tiny-llama", tiny_cache) / "tokenizer.json", folder)
    return load_model(str(folder))


def tiny_llama_vocab(tiny_cache: Path) -> int:
    config = json.loads((ensure_tiny_model("tiny-llama", tiny_cache) / "config.json").read_text())
    return int(config["vocab_size"])


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_other_architectures_derive_exactly(tmp_path: Path, tiny_cache: Path, arch: str) -> None:
    from transformers import GPT2Config, Qwen2Config

    vocab = tiny_llama_vocab(tiny_cache)
    config = (
        GPT2Config(n_positions=256, n_embd=32, n_layer=2, n_head=2, vocab_size=vocab)
        if arch == "gpt2"
        else Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            vocab_size=vocab,
        )
    )
    model = custom(tmp_path, tiny_cache, config)
    ids = model.prompt_ids(16)
    derived, full = both(lambda: model.generate(ids, 70))
    assert_same(derived, full)
    assert derived.derived_steps > 0


def test_steps_off_the_line_are_counted_in_full_and_say_why(
    models: dict[str, LoadedModel],
) -> None:
    """Without the KV cache each step attends over the whole sequence: its attention
    grows with the square of the step, which the line cannot hold."""
    model = models["tiny-llama"]
    ids = model.prompt_ids(8)
    derived, full = both(lambda: generate_without_cache(model, ids, 24))
    assert "not affine" in derived.full_because
    assert derived.derived_steps == 0
    assert_same(derived, full)


def test_a_run_without_token_marks_is_counted_in_full() -> None:
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.no_grad():
        derived, full = both(lambda: layer(x))
    assert derived == CountedWork(derived.prefill, (), False, derived.seconds)
    assert derived.prefill == full.prefill


@pytest.mark.exhaustive
@pytest.mark.parametrize("shape", _shapes("default"), ids=lambda s: f"in{s[0]}-out{s[1]}")
@pytest.mark.parametrize("name", MODELS)
def test_every_case_of_the_default_grid_derives_exactly(
    request: pytest.FixtureRequest,
    models: dict[str, LoadedModel],
    name: str,
    shape: tuple[int, int],
) -> None:
    """The default grid (the paper grid's shapes on the tiny models): 57 cases, whose
    full counts take about 3 times a session's generation time (every operator of 25,000
    decode steps through Python), so they run when selected: ``-m exhaustive``."""
    if "exhaustive" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the default grid's full counts: select them with -m exhaustive")
    test_the_derived_count_equals_the_full_count(models, name, shape)
