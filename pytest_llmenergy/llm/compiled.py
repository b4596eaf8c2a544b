"""Compiled execution: a static KV cache sized to the case, and the decode step compiled.

Eager decoding in transformers is bound by kernel launches on a GPU: every decode step
is hundreds of small kernels queued from Python, and a step takes as long at batch 1 as
at batch 64, so joules per token measure the Python loop more than the GPU's work.  A
static cache (``StaticCache``, one fixed-size buffer per layer) gives every decode step
the same shapes, so transformers' own ``generate`` can compile the step with
``torch.compile(mode="reduce-overhead")``: CUDA graphs, one launch replayed per step.

Compiling and capturing take seconds to minutes and happen once per shape (batch, input
+ output tokens), so ``CompiledDecode.prepare`` runs unmeasured generations of the case's
shape before its first measured window: one of a single decode step compiles it, then two
of the case's length under ``torch.compiler.set_stance("fail_on_recompile")`` capture and
replay it as the measured calls will.  Were a later step to compile again (a guard on a
value that changes every step), the shape falls back to eager there, before any window,
with a ``CompiledFallback`` warning that says why.  A measured call runs under the same
stance: were anything to compile inside a window, the call fails instead of measuring the
compiler.  The prefill stays eager (as transformers runs it); the cache is reset, not
replaced, between calls of one shape, so the captured graphs keep their addresses.

Sliding-window layers: transformers' static sliding-window cache layer counts the tokens
it holds in a Python int and branches on it, so dynamo guards on its value and compiles a
graph per decode step (tiny-mistral: 31 graphs for 32 output tokens).  Each such layer is
swapped for a plain static layer of the case's length, which counts in a tensor; the
window is still applied, by the sliding-window attention mask over absolute positions.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ConfigError, LLMEnergyError
from ..meters.marks import current_window

EAGER, COMPILED, AUTO = "eager", "compiled", "auto"
EXECUTIONS = (AUTO, EAGER, COMPILED)
COMPILE_MODE = "reduce-overhead"  # inductor with CUDA graphs
DEFAULT_BACKEND = "inductor"
# The torch.compile backend, for tests only: inductor generates and compiles C++ on a CPU
# (minutes on a small shared machine); aot_eager traces and guards alike without it.
BACKEND_ENV = "LLMENERGY_COMPILE_BACKEND"
# Every shape of a session is a recompilation of the decode step; torch's default limit
# (8) would silently fall back to eager after the eighth shape.
_RECOMPILE_LIMIT = 4096
_WARMUP_GENERATIONS = 2  # after the one-step compile: the first captures, the second replays
_COMPILE_TOKENS = 2  # the first output token is the prefill's, the second one decode step


class CompiledFallback(UserWarning):
    """A case shape whose decode step would not compile once runs eager; the message says
    why (pytest shows it in the session's warnings summary)."""


def execution_conflict(
    execution: str, *, kv_cache: bool, parallel: str, device: str, injected: bool = False
) -> str:
    """Why ``execution`` cannot run with these settings ("" when it can); read from the
    option texts alone, so it stops the session before anything imports torch."""
    if execution != COMPILED:
        return ""
    if injected:
        return (
            "the injected regressions time Python hooks around the model's passes, which a "
            "compiled decode step would trace away; with --llm-inject-regression or "
            "--llm-inject-work use --llm-execution=eager"
        )
    if not kv_cache:
        return (
            "compiled execution decodes into a static KV cache, and --llm-kv-cache=off has "
            "none; drop one of the two, or use --llm-execution=eager"
        )
    if parallel == "tp":
        return (
            "compiled execution runs one model per process; with --llm-parallel=tp use "
            "--llm-execution=eager"
        )
    if device == "mps":
        return "compiled execution runs on cuda or cpu; on mps use --llm-execution=eager"
    return ""


def resolve_execution(
    execution: str, device: str, *, kv_cache: bool, parallel: str, injected: bool = False
) -> str:
    """``eager`` or ``compiled``: ``auto`` is compiled where the model runs on a CUDA GPU
    (device ``auto`` with CUDA, ``cuda``, ``cuda:N``) with a KV cache, one model per
    process and no injected regression, eager elsewhere (a CPU gains little: its steps
    are not launch-bound)."""
    if execution not in EXECUTIONS:
        raise ConfigError(
            f"unknown execution {execution!r}; allowed values: {', '.join(EXECUTIONS)}"
        )
    conflict = execution_conflict(
        execution, kv_cache=kv_cache, parallel=parallel, device=device, injected=injected
    )
    if conflict:
        raise ConfigError(conflict)
    if execution != AUTO:
        return execution
    if not kv_cache or parallel == "tp" or injected:
        return EAGER
    if device.startswith("cuda"):
        return COMPILED
    if device == "auto":
        import torch

        return COMPILED if torch.cuda.is_available() else EAGER
    return EAGER


def compile_backend() -> str:
    """The torch.compile backend compiled execution uses (``inductor`` unless a test set
    ``LLMENERGY_COMPILE_BACKEND``)."""
    return os.environ.get(BACKEND_ENV, "").strip() or DEFAULT_BACKEND


def execution_label(execution: str) -> str:
    """The case label of an execution: ``compiled``, or ``compiled-aot_eager`` under
    another backend, so that runs compiled otherwise are not compared as alike."""
    if execution != COMPILED:
        return execution
    backend = compile_backend()
    return COMPILED if backend == DEFAULT_BACKEND else f"{COMPILED}-{backend}"


def describe_execution(execution: str, given: str) -> str:
    """The header's line: what the execution is and which option chose it."""
    chosen = f"--llm-execution={given}"
    if execution == EAGER:
        return f"execution: eager (transformers' generate loop, a new KV cache per call; {chosen})"
    backend = compile_backend()
    how = f"torch.compile mode={COMPILE_MODE}" if backend == DEFAULT_BACKEND else backend
    return (
        f"execution: compiled (a static KV cache of each case's size, the decode step "
        f"compiled with {how}: CUDA graphs on a GPU; compiled and captured unmeasured, "
        f"before each case shape's first window; {chosen})"
    )


class CompiledDecode:
    """One model's static cache and compile settings; ``generate`` and ``prepare`` take a
    ``run(input_ids, output_tokens, generation_config, cache_kwargs, quiet)`` that
    generates as ``LoadedModel`` does, and ``eager_cache()`` gives the cache keyword
    argument of an eager call (a shape that falls back)."""

    def __init__(
        self,
        model: Any,
        name: str,
        cache_keyword: str,
        eager_cache: Callable[[], dict[str, Any]],
    ) -> None:
        self.model = model
        self.name = name
        self.cache_keyword = cache_keyword
        self.eager_cache = eager_cache
        self.shape: tuple[int, int] | None = None  # (batch, cache positions) prepared
        self.cache: Any = None  # None where the prepared shape runs eager
        self.eager_reason = ""  # why the prepared shape runs eager ("" compiled)
        self._compile_config: Any = None

    # -- what LoadedModel calls -------------------------------------------------------
    def prepare(
        self, input_ids: Any, output_tokens: int, base_config: Any, run: Callable[..., Any]
    ) -> None:
        """Compile and capture this shape's decode step, unmeasured: a static cache of its
        size, then generations that no meter window, counter or listener sees.  Where the
        step would compile again, the shape runs eager instead (a CompiledFallback warning
        says why)."""
        shape = _shape(input_ids, output_tokens)
        if shape == self.shape:
            return
        import torch

        if not hasattr(torch.compiler, "set_stance"):
            raise ConfigError(
                f"compiled execution needs torch 2.6 or newer (torch.compiler.set_stance), "
                f"this is {torch.__version__}; upgrade it, or use --llm-execution=eager"
            )
        if current_window() is not None:
            raise LLMEnergyError(
                f"model {self.name!r} runs compiled: a first generation of {shape[0]} x "
                f"{shape[1]} tokens would compile inside a measured window; call "
                f"prepare(prompt, output_tokens) on it before measuring (the suite's run_case "
                "does), or use --llm-execution=eager"
            )
        self.cache = None  # the last shape's cache goes before the new one is allocated
        self.shape, self.eager_reason = None, ""
        _raise_recompile_limits()
        with _outside_counting():  # the new cache's tensors too
            cache = self._new_cache(shape[1])
            config, kwargs = self._config(base_config), {self.cache_keyword: cache}
            guard = _warm_up(input_ids, output_tokens, config, kwargs, run)
        self.shape = shape
        if not guard:
            self.cache = cache
            return
        self.eager_reason = (
            f"model {self.name!r} runs {shape[0]} x {shape[1]} tokens eager, not compiled: its "
            f"decode step would compile again at a later step (guard {guard} failed)"
        )
        warnings.warn(self.eager_reason, CompiledFallback, stacklevel=3)

    def generate(
        self, input_ids: Any, output_tokens: int, base_config: Any, run: Callable[..., Any]
    ) -> Any:
        """One measured generation of a prepared shape (prepared first where no window is
        open).  Under a work counter (a dispatch mode) it runs eagerly: the same model and
        cache, its operators seen one by one."""
        import torch

        self.prepare(input_ids, output_tokens, base_config, run)
        if self.cache is None:  # this shape fell back to eager
            return run(input_ids, output_tokens, base_config, self.eager_cache(), False)
        config = self._config(base_config)
        _reset(self.cache)
        kwargs = {self.cache_keyword: self.cache}
        if _counting():
            with torch.compiler.set_stance("force_eager"):
                return run(input_ids, output_tokens, config, kwargs, False)
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return run(input_ids, output_tokens, config, kwargs, False)
        except RuntimeError as exc:
            if "fail_on_recompile" not in str(exc):
                raise
            first = str(exc).strip().splitlines()[0]
            raise LLMEnergyError(
                f"model {self.name!r} would compile again inside a measured call "
                f"({self.shape[0] if self.shape else '?'} x {self.shape[1] if self.shape else '?'}"
                f" tokens): {first}; use --llm-execution=eager for it"
            ) from None

    def prefill_cache(self, input_ids: Any) -> dict[str, Any] | None:
        """The prepared cache, reset, for a prefill alone of the prepared batch (what the
        measured generate's prefill writes into); None where no such shape is prepared."""
        if self.cache is None or self.shape is None or int(input_ids.shape[0]) != self.shape[0]:
            return None
        if int(input_ids.shape[1]) > self.shape[1]:
            return None
        _reset(self.cache)
        return {self.cache_keyword: self.cache}

    # -- helpers -----------------------------------------------------------------------
    def _new_cache(self, positions: int) -> Any:
        try:
            from transformers import StaticCache

            cache = StaticCache(config=self.model.config, max_cache_len=positions)
        except (ImportError, TypeError) as exc:
            raise ConfigError(
                f"compiled execution needs a transformers whose StaticCache takes (config, "
                f"max_cache_len) (4.56 or newer): {exc}; upgrade it, or use "
                "--llm-execution=eager"
            ) from None
        _full_length_layers(cache, self.model.config, positions)
        return cache

    def _config(self, base_config: Any) -> Any:
        """The greedy settings plus transformers' compile settings for the decode step:
        static shapes (each case its own graphs), the backend's mode."""
        if self._compile_config is None:
            from transformers import CompileConfig

            backend = compile_backend()
            config = CompileConfig(
                fullgraph=False,
                dynamic=False,
                backend=backend,
                mode=COMPILE_MODE if backend == DEFAULT_BACKEND else None,
            )
            # transformers compiles on CUDA by itself; elsewhere only when asked to
            config._compile_all_devices = True
            self._compile_config = config
        base_config.compile_config = self._compile_config
        return base_config


def _shape(input_ids: Any, output_tokens: int) -> tuple[int, int]:
    return int(input_ids.shape[0]), int(input_ids.shape[1]) + output_tokens


def _warm_up(
    input_ids: Any,
    output_tokens: int,
    config: Any,
    cache_kwargs: dict[str, Any],
    run: Callable[..., Any],
) -> str:
    """Compile the decode step with one step, then capture and replay it over the case's
    length with no compiling allowed.  Returns "" where that held, else the first guard
    that failed: its step would compile a graph of its own (a per-step value guarded)."""
    import torch

    (cache,) = cache_kwargs.values()
    first = copy.copy(config)
    first.max_new_tokens = first.min_new_tokens = min(_COMPILE_TOKENS, output_tokens)
    _reset(cache)
    run(input_ids, first.max_new_tokens, first, cache_kwargs, True)
    for _ in range(_WARMUP_GENERATIONS):
        _reset(cache)
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                run(input_ids, output_tokens, config, cache_kwargs, True)
        except RuntimeError as exc:
            if "fail_on_recompile" not in str(exc):
                raise
            return _failed_guard(str(exc))
    return ""


def _failed_guard(message: str) -> str:
    """The first guard failure in dynamo's fail_on_recompile message, without its source
    comment (``kwargs['cache'].layers[0].cumulative_length_int == 12``); "?" if none."""
    for line in message.splitlines():
        text = line.strip()
        if text.startswith("- "):  # "- 0/0: GUARD  # SOURCE" (frame/entry: ...)
            guard = re.sub(r"^\d+/\d+:\s*", "", text[2:]).split("  # ")[0].strip()
            return guard or "?"
    return "?"


def _full_length_layers(cache: Any, model_config: Any, positions: int) -> None:
    """Swap each static sliding-window layer for a plain static layer of ``positions``.

    transformers' static sliding-window layer keeps its length in a Python int and
    branches on it, so dynamo guards on the int and compiles a graph per decode step; a
    plain static layer keeps it in a tensor.  The attention is the same: the model's
    sliding-window mask hides keys past the window by absolute position (past the window,
    the cache holds every position of the case where eager keeps the window's)."""
    try:
        from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
    except ImportError:  # another layout: the warm-up finds out whether it recompiles
        return
    config = _text_config(model_config)
    if getattr(config, "attention_chunk_size", None) is not None:
        return  # chunked attention: its mask is not a sliding window
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        return
    for i, layer in enumerate(layers):
        if type(layer) is StaticSlidingWindowLayer:
            layers[i] = StaticLayer(max_cache_len=positions)


def _text_config(config: Any) -> Any:
    """The decoder's config of a (possibly multimodal) model config."""
    get = getattr(config, "get_text_config", None)
    if get is None:
        return config
    try:
        return get(decoder=True)
    except TypeError:  # transformers before the decoder keyword
        return get()


def _reset(cache: Any) -> None:
    """Empty the cache in place (its tensors keep their addresses for the graphs)."""
    import torch

    with torch.inference_mode():
        cache.reset()


def _raise_recompile_limits() -> None:
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), _RECOMPILE_LIMIT))


def _counting() -> bool:
    """A TorchDispatchMode is active: work is being counted (predict.work_count)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is not None


@contextlib.contextmanager
def _outside_counting() -> Iterator[None]:
    """Run with no dispatch mode and no function mode on: a work count around the first
    call of a shape counts the measured generation, not the warm-up's two (the count's
    whole-attention hooks see no dispatch mode, and count nothing either)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    if not _counting():
        yield
        return
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        yield
