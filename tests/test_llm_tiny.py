"""The built-in tiny models: real architectures, exact vocab, built once and atomically."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from pytest_llmenergy.llm import tiny
from pytest_llmenergy.llm.tiny import (
    TINY_MODELS,
    default_cache_dir,
    ensure_tiny_model,
    is_tiny,
    tiny_model_dir,
)

NAMES = ("tiny-llama", "tiny-mistral", "tiny-falcon")


@pytest.fixture(scope="module")
def cache(tiny_cache: Path) -> Path:
    return tiny_cache


def test_builtin_names() -> None:
    assert tuple(TINY_MODELS) == (*NAMES, "tiny-llama-h32")  # h32: for serving engines
    assert all(is_tiny(n) for n in NAMES)
    assert not is_tiny("meta-llama/Llama-2-7b-hf")
    assert not is_tiny("tiny-gpt2")
    with pytest.raises(ValueError, match="tiny-llama, tiny-mistral, tiny-falcon"):
        ensure_tiny_model("tiny-gpt2", Path("/nonexistent"))


@pytest.mark.parametrize("name", NAMES)
def test_config_matches_tokenizer(name: str, cache: Path) -> None:
    path = ensure_tiny_model(name, cache)
    config = AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert config.vocab_size == len(tok) == 1024
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    assert tok.convert_ids_to_tokens([tok.bos_token_id, tok.eos_token_id]) == ["<s>", "</s>"]
    assert tok.pad_token == "<pad>" and tok.unk_token == "<unk>"
    assert tok("The harbour")["input_ids"][0] == tok.bos_token_id  # adds BOS like Llama
    assert config.max_position_embeddings == 8192
    assert config.hidden_size == 64 and config.num_hidden_layers == 2
    assert str(getattr(config, "dtype", None) or config.torch_dtype).endswith("float32")
    assert (path / "model.safetensors").is_file()


def test_architectures_are_the_real_ones(cache: Path) -> None:
    llama = AutoConfig.from_pretrained(ensure_tiny_model("tiny-llama", cache))
    mistral = AutoConfig.from_pretrained(ensure_tiny_model("tiny-mistral", cache))
    falcon = AutoConfig.from_pretrained(ensure_tiny_model("tiny-falcon", cache))
    assert (llama.model_type, mistral.model_type, falcon.model_type) == (
        "llama",
        "mistral",
        "falcon",
    )
    assert mistral.num_key_value_heads == 2  # grouped-query attention
    assert mistral.sliding_window is None or mistral.sliding_window >= 8192
    assert falcon.multi_query and not falcon.new_decoder_architecture


def test_tokenizer_round_trips_text() -> None:
    tok = tiny.build_tokenizer()
    text = "The lighthouse keeper walked out every evening."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) < len(text) / 2  # trained merges, not bytes
    assert tok.decode(ids) == text


def test_second_call_reuses_the_directory(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_tiny_model("tiny-llama", cache)
    mtime_ns = (first / "model.safetensors").stat().st_mtime_ns

    def no_rebuild(name: str, out_dir: Path) -> None:
        raise AssertionError("the model was rebuilt")

    monkeypatch.setattr(tiny, "build_tiny_model", no_rebuild)
    assert ensure_tiny_model("tiny-llama", cache) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime_ns


def test_layout_under_cache(cache: Path) -> None:
    path = ensure_tiny_model("tiny-mistral", cache)
    assert path.parent == cache / "models"
    assert path.name == f"tiny-mistral-{tiny.recipe_hash('tiny-mistral')}"
    hashes = {tiny.recipe_hash(n) for n in NAMES}
    assert len(hashes) == 3


def test_env_var_chooses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMENERGY_CACHE", str(tmp_path / "envcache"))
    path = ensure_tiny_model("tiny-falcon")
    assert path.parent == tmp_path / "envcache" / "models"
    assert (path / "config.json").is_file()


def test_default_cache_is_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMENERGY_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "pytest-llmenergy"


def test_leftover_temp_dir_is_ignored(tmp_path: Path) -> None:
    target = tiny_model_dir("tiny-llama", tmp_path)
    target.parent.mkdir(parents=True)
    leftover = target.parent / f".{target.name}.tmp-crashed"
    leftover.mkdir()
    (leftover / "config.json").write_text("{ half written")
    path = ensure_tiny_model("tiny-llama", tmp_path)
    assert path == target
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 1024


def test_stale_leftovers_are_cleaned_but_fresh_ones_kept(tmp_path: Path) -> None:
    target = tiny_model_dir("tiny-llama", tmp_path)
    target.parent.mkdir(parents=True)
    stale = target.parent / f".{target.name}.tmp-crashed"
    fresh = target.parent / f".{target.name}.tmp-building"  # another process, still at it
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    ensure_tiny_model("tiny-llama", tmp_path)
    assert not stale.exists()
    assert fresh.is_dir()
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)


def test_incomplete_target_is_rebuilt(tmp_path: Path) -> None:
    target = tiny_model_dir("tiny-llama", tmp_path)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{ half written")  # no completion marker
    path = ensure_tiny_model("tiny-llama", tmp_path)
    assert path == target
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 1024
    assert (path / "model.safetensors").is_file()
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # nothing left over


def test_losing_a_race_keeps_the_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_build = tiny.build_tiny_model
    target = tiny_model_dir("tiny-llama", tmp_path)

    def build_while_another_process_wins(name: str, out_dir: Path) -> None:
        real_build(name, out_dir)
        target.mkdir()
        (target / "winner").write_text("other process")
        (target / ".complete").write_text(name)

    monkeypatch.setattr(tiny, "build_tiny_model", build_while_another_process_wins)
    path = ensure_tiny_model("tiny-llama", tmp_path)
    assert path == target
    assert (path / "winner").is_file()  # the winner's copy, not ours
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # ours is gone


def test_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny, "build_tiny_model", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        ensure_tiny_model("tiny-llama", tmp_path)
    assert os.listdir(tmp_path / "models") == []


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-falcon"])
def test_builds_are_deterministic(name: str, cache: Path, tmp_path: Path) -> None:
    a = ensure_tiny_model(name, cache)
    b = ensure_tiny_model(name, tmp_path)
    assert a != b
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert wa[key].equal(wb[key]), key
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    # Random, not constant: a layer with all-equal weights would hide bugs downstream.
    assert any(w.dim() == 2 and w.std() > 0.01 for w in wa.values())


def test_the_serving_variant_has_heads_of_32_dimensions() -> None:
    """vLLM's CPU kernels take head sizes of 32 and up; tiny-llama's (16) stays as it was."""
    h32 = TINY_MODELS["tiny-llama-h32"].config_kwargs
    assert h32["hidden_size"] // h32["num_attention_heads"] == 32
    llama = TINY_MODELS["tiny-llama"].config_kwargs
    assert llama["hidden_size"] // llama["num_attention_heads"] == 16
