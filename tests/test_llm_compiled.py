"""Compiled execution (issue 53, item 3): a static KV cache and the decode step compiled,
ready before the first window, the same greedy tokens as eager, recorded in the run; one
graph per shape for every built-in architecture, or eager with a reason (issue 60, item 4).

torch.compile runs here with the aot_eager backend (``LLMENERGY_COMPILE_BACKEND``):
TorchDynamo traces, guards and recompiles exactly as under inductor, without inductor's
C++ code generation, which takes minutes on a small CPU (``-m inductor`` runs that too).
CUDA graphs need a GPU; what to check there is in docs/guides/gpu.md.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters

from pytest_llmenergy import ConfigError, LLMEnergyError
from pytest_llmenergy.compare import OTHER_EXECUTION, CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.llm import LoadedModel, load_model
from pytest_llmenergy.llm.compiled import (
    BACKEND_ENV,
    COMPILED,
    EAGER,
    CompiledFallback,
    resolve_execution,
)
from pytest_llmenergy.predict.work_count import count_work
from tests.casefactory import make_case
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace
from tests.test_plugin import assert_one_line_usage_error
from tests.test_plugin_suite import model_cache, suite  # noqa: F401  # fixtures

IN, OUT, BATCH = 12, 6, 2
LONG_OUT = 32  # 31 decode steps: a graph a step shows as 31 graphs
ARCHITECTURES = ("tiny-llama", "tiny-mistral", "tiny-falcon")
# transformers' own static cache for a sliding-window model: a graph a decode step
KEEP_SLIDING_LAYERS = "pytest_llmenergy.llm.compiled._full_length_layers"


@pytest.fixture(scope="module")
def aot_eager() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(BACKEND_ENV, "aot_eager")
        yield


@pytest.fixture(scope="module")
def pair(tiny_cache: Path, aot_eager: None) -> tuple[LoadedModel, LoadedModel]:
    """tiny-llama twice, the same weights: eager, and compiled."""
    eager = load_model("tiny-llama", cache_dir=tiny_cache, device="cpu")
    compiled = load_model("tiny-llama", cache_dir=tiny_cache, device="cpu")
    compiled.execution = COMPILED
    return eager, compiled


def sequences(lm: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """What ``lm.model.generate`` returns from now on (``Generation`` only counts it)."""
    out: list[torch.Tensor] = []
    real = lm.model.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        out.append(real(*args, **kwargs))
        return out[-1]

    monkeypatch.setattr(lm.model, "generate", spy)
    return out


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def counting_backend(monkeypatch: pytest.MonkeyPatch) -> list[torch.fx.GraphModule]:
    """The graphs torch.compile hands compiled execution's backend from now on, each then
    compiled by aot_eager (no C compiler).  A backend of this test's own: dynamo reuses no
    graph compiled for another backend, so other tests' graphs are neither reused nor
    counted (``counters`` sum the whole session's)."""
    compiled: list[torch.fx.GraphModule] = []
    aot_eager = lookup_backend("aot_eager")

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        compiled.append(gm)
        return aot_eager(gm, example_inputs)

    monkeypatch.setattr("pytest_llmenergy.llm.compiled.compile_backend", lambda: backend)
    return compiled


def measured(lm: LoadedModel, prompt: torch.Tensor, output_tokens: int) -> None:
    """One generation inside a meter window, split at its first output token."""
    meter = TraceMeter({"gpu:0": PowerTrace([(3600, 10.0)])})
    with meter.measure() as m:
        gen = lm.generate(prompt, output_tokens)
    assert list(m.measurement.phases) == ["prefill", "decode"]
    assert gen.output_tokens == output_tokens


def test_auto_is_compiled_on_a_cuda_gpu_and_eager_elsewhere() -> None:
    plain = {"kv_cache": True, "parallel": "none"}
    assert resolve_execution("auto", "cuda", **plain) == COMPILED
    assert resolve_execution("auto", "cuda:1", **plain) == COMPILED
    assert resolve_execution("auto", "cpu", **plain) == EAGER
    assert resolve_execution("auto", "mps", **plain) == EAGER
    with_cuda = COMPILED if torch.cuda.is_available() else EAGER
    assert resolve_execution("auto", "auto", **plain) == with_cuda
    assert resolve_execution("auto", "cuda", kv_cache=False, parallel="none") == EAGER
    assert resolve_execution("auto", "cuda", kv_cache=True, parallel="tp") == EAGER
    assert resolve_execution("auto", "cuda", **plain, injected=True) == EAGER
    assert resolve_execution("compiled", "cpu", **plain) == COMPILED
    assert resolve_execution("eager", "cuda", **plain) == EAGER
    with pytest.raises(ConfigError, match="--llm-kv-cache=off has none"):
        resolve_execution("compiled", "cuda", kv_cache=False, parallel="none")
    with pytest.raises(ConfigError, match="allowed values: auto, eager, compiled"):
        resolve_execution("fast", "cuda", **plain)


def test_compiled_generates_the_eager_tokens_and_never_compiles_in_a_window(
    pair: tuple[LoadedModel, LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    eager, compiled = pair
    prompt = eager.prompt_ids(IN, BATCH)
    eager_out, compiled_out = sequences(eager, monkeypatch), sequences(compiled, monkeypatch)
    eager.generate(prompt, OUT)
    before = graphs()
    compiled.prepare(prompt, OUT)  # what the suite's run_case does before its windows
    assert graphs() > before, "prepare compiled nothing"
    assert len(compiled_out) == 3  # compile (one decode step), capture, then replay
    ready = graphs()
    meter = TraceMeter({"gpu:0": PowerTrace([(3600, 10.0)])})
    for _ in range(2):
        with meter.measure() as m:
            gen = compiled.generate(prompt, OUT)
        assert list(m.measurement.phases) == ["prefill", "decode"]
        assert (gen.input_tokens, gen.output_tokens, gen.queries) == (IN, OUT, BATCH)
    assert graphs() == ready, "a measured call compiled"
    assert torch.equal(compiled_out[-1], eager_out[-1])  # greedy: the same token ids
    assert torch.equal(compiled_out[1], eager_out[-1])
    assert torch.equal(compiled_out[0], eager_out[-1][:, : IN + 2])  # the one-step compile
    compiled.prefill(prompt)  # into the prepared static cache
    # a new shape inside a window would measure the compiler: it fails instead
    with meter.measure(), pytest.raises(LLMEnergyError, match="call prepare"):
        compiled.generate(prompt[:1], OUT)
    assert graphs() == ready


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_architecture_compiles_one_decode_graph_for_32_tokens(
    name: str, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiny-mistral compiled 31 graphs here, one a decode step: transformers' static
    sliding-window layer keeps its length in a Python int and branches on it, and dynamo
    guarded on its value; its layers are now plain static ones, which count in a tensor."""
    compiled = counting_backend(monkeypatch)
    lm = load_model(name, cache_dir=tiny_cache, device="cpu")
    prompt = lm.prompt_ids(IN, 1)
    out = sequences(lm, monkeypatch)
    lm.generate(prompt, LONG_OUT)  # eager first: the same weights
    lm.execution = COMPILED
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompiledFallback)  # compiled, not fallen back
        lm.prepare(prompt, LONG_OUT)
    assert len(compiled) == 1, f"{name}: {len(compiled)} graphs for {LONG_OUT} output tokens"
    measured(lm, prompt, LONG_OUT)
    assert len(compiled) == 1
    assert torch.equal(out[-1], out[0])


def test_a_window_shorter_than_the_case_compiles_once_and_still_slides(
    tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mistral 7B v0.1's 4,096-token window under a longer case, in small: a 16-token
    window over 12 + 32 tokens.  The full-length static layers keep every position; the
    sliding-window mask still hides those past the window, so compiled decodes eager's
    tokens, which the window changes."""
    compiled = counting_backend(monkeypatch)
    lm = load_model("tiny-mistral", cache_dir=tiny_cache, device="cpu")
    prompt = lm.prompt_ids(IN, BATCH)
    out = sequences(lm, monkeypatch)
    lm.generate(prompt, LONG_OUT)  # the model's own window: as long as its context
    lm.model.config.sliding_window = 16  # read at each call, by the caches and the mask
    lm.generate(prompt, LONG_OUT)
    assert not torch.equal(out[1], out[0]), "the window changed nothing: the test shows nothing"
    lm.execution = COMPILED
    lm.prepare(prompt, LONG_OUT)
    measured(lm, prompt, LONG_OUT)
    assert len(compiled) == 1
    assert torch.equal(out[-1], out[1])


def test_a_step_that_would_compile_again_falls_back_to_eager_before_any_window(
    tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were a later decode step to compile again (here tiny-mistral's sliding-window
    layers left as transformers builds them), prepare stops at the first step's graph,
    says why in one line, and the shape runs eager: eager's tokens, nothing compiled in a
    window, a prefill alone into an eager cache."""
    compiled = counting_backend(monkeypatch)
    monkeypatch.setattr(KEEP_SLIDING_LAYERS, lambda *args: None)
    lm = load_model("tiny-mistral", cache_dir=tiny_cache, device="cpu")
    prompt = lm.prompt_ids(IN, BATCH)
    out = sequences(lm, monkeypatch)
    lm.generate(prompt, LONG_OUT)
    lm.execution = COMPILED
    with pytest.warns(CompiledFallback) as caught:
        lm.prepare(prompt, LONG_OUT)
    (message,) = [str(w.message) for w in caught if w.category is CompiledFallback]
    assert "\n" not in message
    assert message.startswith(f"model 'tiny-mistral' runs {BATCH} x {IN + LONG_OUT} tokens eager")
    assert re.search(r"compile again at a later step \(guard \S.* failed\)$", message), message
    assert len(compiled) == 1, "the first step's graph only, not one a step"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompiledFallback)  # decided once for the shape
        lm.prepare(prompt, LONG_OUT)
        measured(lm, prompt, LONG_OUT)
    lm.prefill(prompt)
    assert len(compiled) == 1
    assert torch.equal(out[-1], out[0])


def test_a_session_shows_why_a_case_ran_eager(
    suite: pytest.Pytester,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BACKEND_ENV, "aot_eager")
    conftest = suite.path / "conftest.py"
    keep = f"\n\nimport pytest_llmenergy.llm.compiled\n\n{KEEP_SLIDING_LAYERS} = lambda *a: None\n"
    conftest.write_text(conftest.read_text() + keep)
    result = suite.runpytest_subprocess(
        "test_output_tokens.py",
        "--energy-backend=trace",
        "--llm-model=tiny-mistral",
        "--llm-output-tokens=4",
        "--llm-execution=compiled",
        "--energy-max-trials=4",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*CompiledFallback: model 'tiny-mistral' runs 1 x * tokens eager, not compiled: *"]
    )


def test_counted_work_sees_the_measured_generation_not_the_warm_up(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    """The first counted call of a new shape prepares it outside the count: the counted
    work is the same as a later call's, and the count runs the model eagerly (a compiled
    kernel's operators would be invisible to it)."""
    _, compiled = pair
    prompt = compiled.prompt_ids(IN + 4, 1)
    first = count_work(lambda: compiled.generate(prompt, OUT))
    again = count_work(lambda: compiled.generate(prompt, OUT))
    assert first.marked and again.marked
    for phase in ("prefill", "decode"):
        for what in ("calls", "flops", "bytes"):
            assert first.total(what, phase) == again.total(what, phase) > 0, (phase, what)


def test_other_execution_is_not_gated() -> None:
    base = make_case([1.0, 1.01, 0.99])
    faster = make_case([0.4, 0.41, 0.39])
    compiled = replace(faster, labels={**faster.labels, "execution": COMPILED})
    gates = CompareOptions(gates=parse_gates("j_per_token:5%"), session_noise=0.02)
    c = compare_cases([compiled], [base], gates)  # compiled baseline, eager (unlabelled) now
    assert not c.failed and c.deltas[0].verdict == OTHER_EXECUTION
    also = replace(base, labels={**base.labels, "execution": COMPILED})
    assert compare_cases([compiled], [also], gates).failed  # alike: gated as ever


def test_a_compiled_session_runs_the_suite_and_records_its_execution(
    suite: pytest.Pytester,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BACKEND_ENV, "aot_eager")  # the session's process inherits it
    result = suite.runpytest_subprocess(
        "test_output_tokens.py",  # one case: one shape to compile
        "--energy-backend=trace",
        "--llm-model=tiny-llama",
        "--llm-output-tokens=4",
        "--llm-execution=compiled",
        "--energy-max-trials=4",
        "--energy-json=run.json",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmenergy: execution: compiled (a static KV cache *"])
    run = json.loads((suite.path / "run.json").read_text())
    assert run["options"]["execution"] == "compiled"
    assert {c["labels"]["execution"] for c in run["cases"]} == {"compiled-aot_eager"}
    for case in run["cases"]:
        for trial in case["trials"]:
            assert set(trial["phases"]) == {"prefill", "decode"}


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--llm-execution=fast"], ["--llm-execution=fast", "one of auto, eager, compiled"]),
        (
            ["--llm-execution=compiled", "--llm-kv-cache=off"],
            ["--llm-kv-cache=off has none", "--llm-execution=eager"],
        ),
    ],
)
def test_a_bad_execution_is_one_line(
    pytester: pytest.Pytester, args: list[str], needles: list[str]
) -> None:
    pytester.makepyfile("def test_x(): pass")
    assert_one_line_usage_error(pytester.runpytest(*args), *needles)


@pytest.mark.inductor
def test_inductor_compiles_the_same_tokens(
    request: pytest.FixtureRequest, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default backend end to end: inductor's C++ code for the CPU (minutes on a
    small machine, so ``-m inductor`` selects it)."""
    if "inductor" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("inductor's code generation takes minutes: select it with -m inductor")
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    eager = load_model("tiny-llama", cache_dir=tiny_cache, device="cpu")
    compiled = load_model("tiny-llama", cache_dir=tiny_cache, device="cpu")
    compiled.execution = COMPILED
    prompt = eager.prompt_ids(IN, BATCH)
    eager_out, compiled_out = sequences(eager, monkeypatch), sequences(compiled, monkeypatch)
    eager.generate(prompt, OUT)
    compiled.prepare(prompt, OUT)
    ready = graphs()
    compiled.generate(prompt, OUT)
    assert graphs() == ready
    assert torch.equal(compiled_out[-1], eager_out[-1])
