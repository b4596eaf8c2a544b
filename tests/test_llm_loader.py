"""Loading by name, exact token counts, the prefill | decode mark, a fresh KV cache."""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
import torch
import transformers
from transformers import DynamicCache

from pytest_llmenergy import ConfigError
from pytest_llmenergy.llm import (
    Generation,
    LoadedModel,
    ModelPool,
    ensure_tiny_model,
    load_model,
)
from pytest_llmenergy.llm.grid import GRIDS, INPUT_SWEEP, OUTPUT_SWEEP
from pytest_llmenergy.llm.loader import ALIBI, LEARNED, ROTARY, check_model, position_kind
from pytest_llmenergy.llm.tiny import SAMPLE_TEXT
from pytest_llmenergy.plugin.cases import beyond_context
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace

NAMES = ("tiny-llama", "tiny-mistral", "tiny-falcon")


@pytest.fixture(scope="module")
def cache(tiny_cache: Path) -> Path:
    return tiny_cache


@pytest.fixture(scope="module")
def models(cache: Path) -> dict[str, LoadedModel]:
    return {name: load_model(name, cache_dir=cache) for name in NAMES}


@pytest.fixture(params=NAMES)
def lm(request: pytest.FixtureRequest, models: dict[str, LoadedModel]) -> LoadedModel:
    return models[request.param]


@pytest.fixture
def generated(lm: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[torch.Tensor]]:
    """The sequences model.generate returns, which Generation only counts."""
    outputs: list[torch.Tensor] = []
    real = lm.model.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        outputs.append(out)
        return out

    monkeypatch.setattr(lm.model, "generate", spy)
    yield outputs


def test_loaded_model_describes_itself(lm: LoadedModel) -> None:
    assert lm.name in NAMES
    assert lm.device == torch.device("cpu")
    assert lm.dtype == torch.float32
    assert lm.max_positions == 8192
    assert not lm.model.training
    assert lm.model.config.vocab_size == len(lm.tokenizer)


@pytest.mark.parametrize("n", [1, 8, 33, 2048])
def test_prompt_has_exactly_n_tokens(lm: LoadedModel, n: int) -> None:
    ids = lm.prompt_ids(n)
    assert ids.shape == (1, n)
    assert ids.dtype == torch.long and ids.device == lm.device
    assert ids[0, 0].item() == lm.tokenizer.bos_token_id
    assert torch.equal(ids, lm.prompt_ids(n))  # deterministic


def test_prompt_is_the_sample_text(lm: LoadedModel) -> None:
    text = lm.tokenizer.decode(lm.prompt_ids(40)[0, 1:])
    assert SAMPLE_TEXT.startswith(text)
    long = lm.tokenizer.decode(lm.prompt_ids(2048)[0, 1:])
    assert long.count("The harbour town woke slowly") >= 2  # repeated to reach the length


def test_prompt_rejects_empty(lm: LoadedModel) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        lm.prompt_ids(0)


@pytest.mark.parametrize("m", [1, 8, 64])
def test_generates_exactly_m_tokens(lm: LoadedModel, m: int, generated: list[torch.Tensor]) -> None:
    gen = lm.generate(lm.prompt_ids(33), m)
    assert gen == Generation(input_tokens=33, output_tokens=m, first_token_at=gen.first_token_at)
    assert generated[0].shape == (1, 33 + m)
    assert gen.first_token_at is not None


def test_eos_does_not_stop_generation(lm: LoadedModel, generated: list[torch.Tensor]) -> None:
    eos = lm.tokenizer.eos_token_id

    def make_eos_win(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., eos] += 1e4
        return output

    ids = lm.prompt_ids(8)
    handle = lm.model.get_output_embeddings().register_forward_hook(make_eos_win)
    try:
        # Plain greedy generation would stop at once: EOS really is the greedy choice.
        plain = lm.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False
        )
        assert plain.shape[1] == 8 + 1 and plain[0, -1].item() == eos
        gen = lm.generate(ids, 8)
    finally:
        handle.remove()
    assert gen.output_tokens == 8
    assert eos not in generated[-1][0, 8:].tolist()


def test_first_token_splits_prefill_and_decode(lm: LoadedModel) -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(3600, 10.0)])})
    ids = lm.prompt_ids(64)
    with meter.measure() as m:
        gen = lm.generate(ids, 16)
    result = m.measurement
    assert list(result.phases) == ["prefill", "decode"]
    prefill, decode = result.phases["prefill"], result.phases["decode"]
    assert gen.first_token_at is not None
    assert result.t_start < gen.first_token_at < result.t_end
    # The meter reads just after first_token_at is taken.
    assert 0 <= decode.offset_s - (gen.first_token_at - result.t_start) < 0.05
    assert prefill.seconds > 0 and decode.seconds > 0
    assert prefill.seconds + decode.seconds == pytest.approx(result.seconds)
    assert prefill.joules == pytest.approx(10.0 * prefill.seconds)


def test_nested_window_gets_the_mark(lm: LoadedModel) -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(3600, 10.0)])})
    ids = lm.prompt_ids(8)
    with meter.measure("case") as outer, meter.measure() as inner:
        lm.generate(ids, 4)
    assert list(inner.phases) == ["prefill", "decode"]
    assert list(outer.phases) == ["case"]


def test_window_with_several_calls_is_split_at_the_first(lm: LoadedModel) -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(3600, 10.0)])})
    ids = lm.prompt_ids(8)
    with meter.measure() as m:
        first = lm.generate(ids, 4)
        second = lm.generate(ids, 4)
    assert list(m.phases) == ["prefill", "decode"]
    assert first.first_token_at is not None and second.first_token_at is not None
    assert m.phases["decode"].offset_s < second.first_token_at - m.measurement.t_start


def test_outside_a_window_nothing_is_marked(lm: LoadedModel) -> None:
    gen = lm.generate(lm.prompt_ids(8), 3)
    assert gen.output_tokens == 3 and gen.first_token_at is not None


def test_each_call_gets_a_fresh_cache(lm: LoadedModel, generated: list[torch.Tensor]) -> None:
    # (call, cache) per forward pass; holding the caches keeps their ids unique.
    seen: list[tuple[int, Any]] = []
    first_lengths: list[int] = []
    call = [0]

    def spy(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5 / 4
        assert isinstance(cache, DynamicCache)
        if not any(c == call[0] for c, _ in seen):
            first_lengths.append(cache.get_seq_length())
        seen.append((call[0], cache))

    handle = lm.model.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        ids = lm.prompt_ids(16)
        for i in range(2):
            call[0] = i
            assert lm.generate(ids, 6).output_tokens == 6
    finally:
        handle.remove()
    per_call = [{id(cache) for c, cache in seen if c == i} for i in range(2)]
    assert all(len(ids_) == 1 for ids_ in per_call)  # one cache throughout a call
    assert per_call[0].isdisjoint(per_call[1])  # never shared between calls
    assert first_lengths == [0, 0]  # and empty when the call starts
    assert len(seen) == 2 * 6  # prefill + 5 decode steps each
    assert torch.equal(generated[0], generated[1])


def test_generation_and_prefill_raise_no_warning(lm: LoadedModel) -> None:
    # transformers 5 deprecated ``past_key_values`` (FutureWarning) for ``cache``; the
    # package passes the keyword the installed version takes, so nothing warns at all
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lm.generate(lm.prompt_ids(8), 3).output_tokens == 3
        lm.prefill(lm.prompt_ids(8))


def test_the_packages_own_deprecation_warnings_fail_the_test_suite(
    pytester: pytest.Pytester, cache: Path
) -> None:
    # the project's pytest settings, as they are: a deprecated keyword the package passes
    # to transformers (what it did before transformers 5 renamed ``past_key_values``) is
    # an error; a warning from a user's own module is left alone
    from transformers import LlamaForCausalLM

    from pytest_llmenergy.llm.loader import _cache_keyword

    if _cache_keyword(LlamaForCausalLM) == "past_key_values":
        pytest.skip("this transformers deprecates nothing the loader could pass")
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    section = pyproject.split("[tool.pytest.ini_options]", 1)[1].split("\n[", 1)[0]
    assert "error::FutureWarning:pytest_llmenergy" in section
    pytester.makepyprojecttoml(f"[tool.pytest.ini_options]{section}")
    pytester.makepyfile(
        f"""
        import warnings
        from pytest_llmenergy.llm import loader

        def test_the_package_passes_a_deprecated_keyword(monkeypatch):
            monkeypatch.setattr(loader, "_cache_keyword", lambda model_class: "past_key_values")
            lm = loader.load_model("tiny-llama", cache_dir={str(cache)!r})
            lm.generate(lm.prompt_ids(8), 2)

        def test_a_users_own_deprecation_is_left_alone():
            warnings.warn("an old API of the user's", DeprecationWarning)
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FutureWarning: `past_key_values` is deprecated*"])


def test_too_long_for_the_model(lm: LoadedModel) -> None:
    with pytest.raises(ValueError, match="exceed the 8192 positions"):
        lm.generate(lm.prompt_ids(8), 8192)
    short = dataclasses.replace(lm, max_positions=16)
    assert short.generate(short.prompt_ids(8), 8).output_tokens == 8
    with pytest.raises(ValueError, match="8 input \\+ 9 output tokens exceed the 16"):
        short.generate(short.prompt_ids(8), 9)
    with pytest.raises(ValueError, match="at least 1"):
        lm.generate(lm.prompt_ids(8), 0)


def test_beyond_the_context_only_when_allowed_and_computed(lm: LoadedModel) -> None:
    assert lm.position_kind == ROTARY and not lm.allow_beyond_context
    short = dataclasses.replace(lm, max_positions=16)
    with pytest.raises(ConfigError, match="a prompt of 17 tokens exceeds the 16 positions") as e:
        short.prompt_ids(17)
    assert "allow_beyond_context=True" in str(e.value) and "\n" not in str(e.value)
    start = time.monotonic()
    with pytest.raises(ConfigError):
        short.prompt_ids(10**12)  # refused before a single id is built
    assert time.monotonic() - start < 1
    allowed = dataclasses.replace(lm, max_positions=16, allow_beyond_context=True)
    assert allowed.prompt_ids(24).shape == (1, 24)
    assert allowed.generate(allowed.prompt_ids(12), 12).output_tokens == 12  # 24 > 16
    learned = dataclasses.replace(allowed, position_kind=LEARNED)
    with pytest.raises(ConfigError, match="use fewer tokens: its positions are a learned table"):
        learned.prompt_ids(17)
    with pytest.raises(ValueError, match="12 input \\+ 12 output tokens exceed the 16"):
        learned.generate(learned.prompt_ids(12), 12)


def test_check_model_reads_the_context_without_weights(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("weights loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    default = GRIDS["default"]
    cases = default.cases(INPUT_SWEEP) + default.cases(OUTPUT_SWEEP)
    assert max(c.positions for c in cases) == 32 + 4096
    for name in NAMES:
        info = check_model(name, cache_dir=cache)
        assert (info.name, info.max_positions, info.position_kind) == (name, 8192, ROTARY)
        mine = [c for c in cases if c.model == name]
        assert beyond_context(info, mine, allow=False) is None  # the default grid runs whole
        short = dataclasses.replace(info, max_positions=4096)
        problem = beyond_context(short, mine, allow=False)
        assert problem is not None and problem.startswith(
            f"1 of 19 cases needs more than the model's context of 4096 positions "
            f"(input + output tokens): {name}-in32-out4096 (4128);"
        )
        assert beyond_context(short, mine, allow=True) is None


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        (transformers.LlamaConfig(), ROTARY),
        (transformers.MistralConfig(), ROTARY),
        (transformers.FalconConfig(alibi=False), ROTARY),
        (transformers.FalconConfig(alibi=True), ALIBI),
        (transformers.GPTJConfig(), ROTARY),
        (transformers.GPTNeoXConfig(), ROTARY),
        (transformers.BloomConfig(), ALIBI),
        (transformers.MptConfig(), ALIBI),
        (transformers.GPT2Config(), LEARNED),
        (transformers.OPTConfig(), LEARNED),
        (transformers.BertConfig(), LEARNED),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_position_kind(config: Any, kind: str) -> None:
    assert position_kind(config) == kind


def test_a_folder_without_tokenizer_is_one_line(cache: Path, tmp_path: Path) -> None:
    folder = tmp_path / "weights-only"
    shutil.copytree(ensure_tiny_model("tiny-llama", cache), folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    for load in (check_model, load_model):
        with pytest.raises(ConfigError, match="has no tokenizer files") as info:
            load(str(folder))
        assert str(info.value).startswith(f"model folder {folder} has no tokenizer files (")
        assert str(info.value).endswith(": copy the tokenizer next to the weights")


def test_an_unreachable_hub_fails_fast_and_suggests_a_built_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing listens on port 9; without the probe the hub client retries for 30 s.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for load in (check_model, load_model):
        start = time.monotonic()
        with pytest.raises(ConfigError) as info:
            load("tiny-lama")
        assert time.monotonic() - start < 10
        msg = str(info.value)
        assert msg.startswith(
            "cannot load model 'tiny-lama': it is not in the Hugging Face cache and "
            "http://127.0.0.1:9 cannot be reached: "
        )
        assert "did you mean tiny-llama? Else use a local checkpoint directory" in msg
        assert "\n" not in msg


def test_checkpoint_sampling_defaults_do_not_leak(
    cache: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sampler"
    shutil.copytree(ensure_tiny_model("tiny-llama", cache), path)
    gen_cfg = json.loads((path / "generation_config.json").read_text())
    gen_cfg.update(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3)
    (path / "generation_config.json").write_text(json.dumps(gen_cfg))
    lm = load_model(str(path))
    assert lm.model.generation_config.do_sample
    outputs: list[torch.Tensor] = []
    real = lm.model.generate
    lm.model.generate = lambda *a, **k: outputs.append(real(*a, **k)) or outputs[-1]
    capfd.readouterr()
    for _ in range(3):
        lm.generate(lm.prompt_ids(8), 24)
    err = capfd.readouterr().err
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[1], outputs[2])
    # The same tokens as the plain checkpoint: no sampling, no repetition penalty.
    plain = load_model("tiny-llama", cache_dir=cache)
    with torch.inference_mode():
        ref = plain.model.generate(
            plain.prompt_ids(8),
            attention_mask=torch.ones(1, 8, dtype=torch.long),
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
        )
    assert torch.equal(outputs[0], ref)
    assert "generation flags" not in err and "do_sample" not in err and "pad_token_id" not in err


def test_local_path_loads_the_same_weights(cache: Path, models: dict[str, LoadedModel]) -> None:
    path = ensure_tiny_model("tiny-mistral", cache)
    by_path = load_model(str(path))
    assert by_path.name == str(path)
    a, b = by_path.model.state_dict(), models["tiny-mistral"].model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_explicit_dtype(cache: Path) -> None:
    lm = load_model("tiny-llama", dtype="bfloat16", device="cpu", cache_dir=cache)
    assert lm.dtype == torch.bfloat16
    assert lm.generate(lm.prompt_ids(4), 4).output_tokens == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "fp16"}, "unknown dtype 'fp16'; allowed values: auto, float32"),
        ({"device": "gpu"}, "unknown device 'gpu'; allowed values: auto, cpu, cuda"),
        ({"device": "cuda:x"}, "unknown device 'cuda:x'"),
    ],
)
def test_bad_options_are_config_errors(kwargs: dict[str, str], match: str, cache: Path) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        load_model("tiny-llama", cache_dir=cache, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_cuda_is_a_config_error(cache: Path) -> None:
    with pytest.raises(ConfigError, match="CUDA is not available"):
        load_model("tiny-llama", device="cuda", cache_dir=cache)


def test_unknown_model_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hub reads the variable at import; patch the constant too so nothing retries.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as info:
        load_model("no-such-org/no-such-model")
    msg = str(info.value)
    assert "\n" not in msg
    assert "'no-such-org/no-such-model'" in msg
    assert "tiny-llama, tiny-mistral, tiny-falcon" in msg
    assert "local checkpoint directory" in msg


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_bad_path_is_a_config_error(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "nothing-here" if kind == "missing" else tmp_path
    with pytest.raises(ConfigError, match="cannot load model") as info:
        load_model(str(path))
    assert "\n" not in str(info.value) and "tiny-llama" in str(info.value)


def test_unwritable_cache_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache should be")
    with pytest.raises(ConfigError, match="LLMENERGY_CACHE") as info:
        load_model("tiny-llama", cache_dir=blocker)
    assert "\n" not in str(info.value)


def test_out_of_memory_is_not_swallowed(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def oom(*args: Any, **kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", oom)
    with pytest.raises(torch.OutOfMemoryError):
        load_model("tiny-llama", cache_dir=cache)


def test_pool_holds_one_model_at_a_time(cache: Path) -> None:
    with ModelPool(cache_dir=cache) as pool:
        assert pool.get("tiny-llama") is pool.get("tiny-llama")
        llama_ref = weakref.ref(pool.get("tiny-llama").model)
        mistral = pool.get("tiny-mistral")
        gc.collect()
        assert llama_ref() is None  # dropped before (or while) the next one loaded
        assert pool.current is mistral and mistral.name == "tiny-mistral"
        mistral_ref = weakref.ref(mistral.model)
        del mistral
    assert pool.current is None
    gc.collect()
    assert mistral_ref() is None


def test_pool_passes_its_options(cache: Path) -> None:
    pool = ModelPool(dtype="bfloat16", device="cpu", cache_dir=cache, allow_beyond_context=True)
    assert pool.get("tiny-falcon").dtype == torch.bfloat16
    assert pool.current is not None and pool.current.allow_beyond_context
    pool.close()
    with pytest.raises(ConfigError):
        ModelPool(dtype="half", cache_dir=cache).get("tiny-falcon")


def test_a_batch_is_distinct_prompts_of_exactly_n_tokens(lm: LoadedModel) -> None:
    batch = lm.prompt_ids(40, batch_size=4)
    assert tuple(batch.shape) == (4, 40)
    assert torch.equal(batch[0], lm.prompt_ids(40)[0])  # row 0: batch 1's prompt, as before
    assert len({tuple(row.tolist()) for row in batch}) == 4
    assert batch[1].tolist() == lm.prompt_list(40, 1)
    with pytest.raises(ValueError, match="at least 1 prompt"):
        lm.prompt_ids(8, batch_size=0)


def test_a_batch_generates_exactly_m_tokens_per_row(lm: LoadedModel) -> None:
    out = lm.generate(lm.prompt_ids(12, batch_size=3), 5)
    assert (out.input_tokens, out.output_tokens, out.queries) == (12, 5, 3)
