"""Impossible cases stop the session at start, before any weights load (pytester).

Cases beyond their model's context, a model folder without a tokenizer and an unknown
hub id with no network are each one line and exit code 4; ``--llm-allow-beyond-context``
lets a model with rotary positions run past its context.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch  # noqa: F401  # imported before any run, as in test_plugin_suite

from pytest_llmenergy.llm.tiny import ensure_tiny_model
from tests import test_plugin_suite
from tests.test_plugin import assert_one_line_usage_error

# The suite's fixtures: its files in a pytester dir, and the shared tiny-model cache.
suite = test_plugin_suite.suite
model_cache = test_plugin_suite.model_cache

# A run that loads weights fails loudly: the start check must come first.
NO_WEIGHTS = """
import transformers

def _refuse(*args, **kwargs):
    raise AssertionError("model weights loaded before the start check")

transformers.AutoModelForCausalLM.from_pretrained = _refuse
"""


def add_to_conftest(pytester: pytest.Pytester, code: str) -> None:
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text() + "\n" + code)


def tiny_llama_copy(cache: Path, dest: Path, **config: object) -> Path:
    """tiny-llama's checkpoint in ``dest``, its config.json updated with ``config``."""
    shutil.copytree(ensure_tiny_model("tiny-llama", cache), dest)
    path = dest / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return dest


def test_output_tokens_beyond_the_context_stop_the_session_at_start(
    suite: pytest.Pytester,
) -> None:
    add_to_conftest(suite, NO_WEIGHTS)
    start = time.monotonic()
    result = suite.runpytest_subprocess("--llm-output-tokens=100000")
    elapsed = time.monotonic() - start
    assert_one_line_usage_error(
        result,
        "--llm-model=tiny-falcon: 1 of 10 cases needs more than the model's context of "
        "8192 positions",
        "tiny-falcon-in32-out100000 (100032)",
        "lower --llm-input-tokens/--llm-output-tokens, or add --llm-allow-beyond-context",
        "rotary (RoPE)",
        "Llama-2-7B, context 4096, at 4128 positions",
        "(and the same for tiny-llama, tiny-mistral)",
    )
    result.stdout.fnmatch_lines(["*no tests ran*"])
    assert "PASSED" not in result.stdout.str() and "FAILED" not in result.stdout.str()
    assert elapsed < 60  # imports and three configs, not a 100000-token generation


def test_a_rope_model_runs_past_its_context_only_when_allowed(
    suite: pytest.Pytester, model_cache: Path
) -> None:
    model = tiny_llama_copy(model_cache, suite.path / "short-llama", max_position_embeddings=64)
    counts = ["--llm-input-tokens=8", "--llm-output-tokens=16,64"]
    result = suite.runpytest_subprocess(f"--llm-model={model}", *counts)
    assert_one_line_usage_error(
        result,
        f"--llm-model={model}: 1 of 3 cases needs more than the model's context of 64 positions",
        "short-llama-in32-out64 (96);",
        "or add --llm-allow-beyond-context",
    )
    result.stdout.fnmatch_lines(["*no tests ran*"])
    suite.makeini("[pytest]\nllmenergy_allow_beyond_context = on\n")  # the ini twin
    result = suite.runpytest_subprocess(
        f"--llm-model={model}",
        *counts,
        "--energy-backend=trace",
        "--energy-max-trials=3",
        "--energy-warmup=0",
    )
    # test_output_tokens checks that every trial generated exactly 64 tokens.
    result.assert_outcomes(passed=3)


def test_a_learned_position_model_cannot_be_allowed_past_its_context(
    suite: pytest.Pytester, model_cache: Path
) -> None:
    """GPT-2's position table has no row beyond n_positions: only the counts can change."""
    from transformers import GPT2Config

    folder = suite.path / "short-gpt2"
    GPT2Config(n_positions=64, n_embd=16, n_layer=1, n_head=2).save_pretrained(folder)
    shutil.copy(ensure_tiny_model("tiny-llama", model_cache) / "tokenizer.json", folder)
    add_to_conftest(suite, NO_WEIGHTS)
    result = suite.runpytest_subprocess(
        f"--llm-model={folder}",
        "--llm-input-tokens=8",
        "--llm-output-tokens=64",
        "--llm-allow-beyond-context",
    )
    assert_one_line_usage_error(
        result,
        "1 of 2 cases needs more than the model's context of 64 positions",
        "short-gpt2-in32-out64 (96); lower --llm-input-tokens/--llm-output-tokens: its "
        "positions are a learned table",
        "(--llm-allow-beyond-context cannot help)",
    )
    assert "or add --llm-allow-beyond-context" not in result.stderr.str()


def test_a_model_folder_without_tokenizer_stops_the_session_at_start(
    suite: pytest.Pytester, model_cache: Path
) -> None:
    folder = tiny_llama_copy(model_cache, suite.path / "weights-only")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    add_to_conftest(suite, NO_WEIGHTS)
    result = suite.runpytest_subprocess(f"--llm-model={folder}")
    assert_one_line_usage_error(
        result,
        f"--llm-model={folder}: model folder {folder} has no tokenizer files (tokenizer.json",
        "copy the tokenizer next to the weights",
    )
    result.stdout.fnmatch_lines(["*no tests ran*"])


def test_an_unknown_model_without_network_fails_fast_with_a_suggestion(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens on port 9: the hub is unreachable here whatever the network.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    result = suite.runpytest_subprocess("--llm-model=tiny-lama")
    assert_one_line_usage_error(
        result,
        "--llm-model=tiny-lama: cannot load model 'tiny-lama': it is not in the Hugging Face "
        "cache and http://127.0.0.1:9 cannot be reached",
        "did you mean tiny-llama?",
    )
    result.stdout.fnmatch_lines(["*no tests ran*"])
