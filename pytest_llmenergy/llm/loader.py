"""Loading a model by name, and generating exactly the number of tokens a case asks for.

Energy per token only means something if the token counts are exact, so prompts are
cut to the exact length and generation ignores EOS.  The prefill | decode split is
marked on the innermost open measurement window at the first output token.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import gc
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..gpu import in_use
from ..meters.marks import mark_phase, mark_token
from .compiled import COMPILED, EAGER, CompiledDecode, resolve_execution
from .tiny import (
    SAMPLE_TEXT,
    TINY_MODELS,
    build_at_load,
    ensure_tiny_model,
    is_tiny,
    weights_at_load,
)

DTYPES = ("auto", "float32", "float16", "bfloat16")
# How a model is spread over the ranks of a torchrun job: ``none`` (every rank runs the
# whole model) or ``tp`` (tensor-parallel, transformers' own plan for the architecture).
PARALLEL = ("none", "tp")
DEVICES_HELP = "auto, cpu, cuda, cuda:N, mps"
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
# Without a limit in the config the model's real context is unknown; this one is safe
# for nearly every causal LM of the last years.
_FALLBACK_MAX_POSITIONS = 2048
_TINY_HINT = "a built-in tiny model: " + ", ".join(TINY_MODELS)
# Any one of these in a model folder means it ships a tokenizer (fast, SentencePiece,
# BPE or WordPiece vocabularies).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "tokenizer.tiktoken",
)
# How a model encodes positions: computed ones (rotary, ALiBi) can run past the context
# the model was trained for; a learned table has no row beyond its last.
ROTARY, ALIBI, LEARNED = "rotary", "alibi", "learned"
_ROTARY_ATTRS = (
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "rotary_dim",
    "rotary_pct",
    "rotary_emb_base",
    "partial_rotary_factor",
)
_ALIBI_MODEL_TYPES = ("bloom",)  # ALiBi always, with no setting that says so
# Without an answer by then the hub counts as unreachable (its client retries for 30 s).
_HUB_PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ModelInfo:
    """What ``check_model`` learns from a model's config, before any weights load."""

    name: str
    max_positions: int  # the context: input + output tokens of one case
    position_kind: str  # ROTARY, ALIBI or LEARNED (also when the config does not say)
    config_sha256: str = ""  # the architecture, wherever the files lie (config_hash)

    @property
    def can_exceed_context(self) -> bool:
        """Computed positions can go past ``max_positions``; a learned table cannot."""
        return self.position_kind != LEARNED

    @property
    def positions_text(self) -> str:
        """``its positions are rotary (RoPE)``: why it can or cannot run past its context."""
        return positions_text(self.position_kind)


@dataclass(frozen=True)
class Generation:
    """What one ``generate`` call did: counts read back from the tensors, not requested."""

    input_tokens: int  # per query (every row of a batch has as many)
    output_tokens: int  # per query
    first_token_at: float | None  # time.perf_counter() when the first new token appeared
    queries: int = 1  # rows of the batch


@dataclass(eq=False)
class LoadedModel:
    """A model with its tokenizer, ready to run cases of (input tokens, output tokens)."""

    name: str
    model: Any
    tokenizer: Any
    device: Any  # torch.device of the input embeddings: where input ids must go
    dtype: Any  # torch.dtype of the weights
    max_positions: int
    position_kind: str = LEARNED  # ROTARY, ALIBI or LEARNED (see ModelInfo)
    # Let cases run past max_positions (computed positions only): the research measured
    # Llama-2-7B (context 4096) at 32 + 4096 tokens.
    allow_beyond_context: bool = False
    # Generate with a KV cache (transformers' default); off, every decoded token runs the
    # model over the whole sequence again, as the research's scripts did.
    kv_cache: bool = True
    # eager, or compiled: a static KV cache and the decode step compiled (llm/compiled.py)
    execution: str = EAGER
    _text_ids: list[int] | None = field(default=None, init=False, repr=False)
    _compiled: CompiledDecode | None = field(default=None, init=False, repr=False)
    _start: list[int] | None = field(default=None, init=False, repr=False)

    def prompt_ids(self, n: int, batch_size: int = 1) -> Any:
        """A prompt of exactly ``n`` tokens of natural text, shape (batch_size, n), on
        ``device``.

        Natural text rather than random ids, so attention patterns and (for MoE models)
        routing look like real use; the BOS token comes first if the tokenizer adds one.
        The rows of a batch start at different places in the text (all of exactly ``n``
        tokens, so no padding), as distinct prompts would.
        """
        import torch

        if n < 1:
            raise ValueError(f"a prompt needs at least 1 token, got {n}")
        if n > self.max_positions and not self._may_exceed_context:
            # Checked before building it: a count such as 10**9 would fill the memory.
            raise ConfigError(
                f"a prompt of {n} tokens exceeds the {self.max_positions} positions of model "
                f"{self.name!r}; {self._beyond_context_fix()}"
            )
        if batch_size < 1:
            raise ValueError(f"a batch needs at least 1 prompt, got {batch_size}")
        return torch.tensor(
            [self.prompt_list(n, row) for row in range(batch_size)],
            dtype=torch.long,
            device=self.device,
        )

    def prompt_list(self, n: int, row: int = 0) -> list[int]:
        """Row ``row`` of ``prompt_ids``: exactly ``n`` token ids, as a list (what a server
        takes); row 0 is the prompt a batch of one gets."""
        if self._text_ids is None or self._start is None:
            self._text_ids = self._build_text_ids()
            self._start = self._start_ids()
        text = self._text_ids
        shift = (row * 7) % len(text)  # another place in the text for each row
        ids = list(self._start)
        rotated = text[shift:] + text[:shift]
        while len(ids) < n:
            ids.extend(rotated)
        return ids[:n]

    def generate(self, input_ids: Any, output_tokens: int) -> Generation:
        """Greedily generate exactly ``output_tokens`` new tokens after ``input_ids``.

        EOS cannot end it early (it is masked at every step) and every call starts from
        an empty KV cache (a new one; compiled, the shape's static one emptied), so
        repeated cases cost the same.  The first output token
        marks the ``decode`` phase of the innermost open measurement window (a window
        that sees several calls is split at the first one only).  On MPS transformers
        streams tokens one step late, so there the mark comes one decode step late.
        """
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must have shape (batch, tokens), got {tuple(input_ids.shape)}"
            )
        if output_tokens < 1:
            raise ValueError(f"output_tokens must be at least 1, got {output_tokens}")
        n_in = int(input_ids.shape[1])
        if n_in + output_tokens > self.max_positions and not self._may_exceed_context:
            raise ValueError(
                f"{n_in} input + {output_tokens} output tokens exceed the {self.max_positions} "
                f"positions of model {self.name!r}; {self._beyond_context_fix()}"
            )
        input_ids = input_ids.to(self.device)
        if self.execution == COMPILED:
            return self._compiled_decode().generate(
                input_ids, output_tokens, self._generation_config(output_tokens), self._run
            )
        cache = self._cache_kwargs() if self.kv_cache else {}
        return self._run(input_ids, output_tokens, self._generation_config(output_tokens), cache)

    def prepare(self, input_ids: Any, output_tokens: int) -> None:
        """Get ready, unmeasured, for ``generate(input_ids, output_tokens)``: compiled,
        the static cache of this shape and its decode step compiled once and captured
        (three generations; a step that would compile again makes the shape eager, with
        a CompiledFallback warning); eager, nothing.  Call it before the measured window:
        a compiled model's first generation of a shape inside a window fails rather than
        measure the compiler (outside any window, ``generate`` prepares by itself)."""
        if self.execution == COMPILED:
            self._compiled_decode().prepare(
                input_ids.to(self.device),
                output_tokens,
                self._generation_config(output_tokens),
                self._run,
            )

    def _run(
        self,
        input_ids: Any,
        output_tokens: int,
        generation_config: Any,
        cache_kwargs: dict[str, Any],
        quiet: bool = False,
    ) -> Generation:
        """One greedy generation; ``quiet``: a warm-up's, whose tokens mark nothing."""
        import torch

        streamer = _streamer_class()(self._synchronize, output_tokens, quiet)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=generation_config,
                streamer=streamer,
                **cache_kwargs,
            )
        self._synchronize()
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        return Generation(
            input_tokens=int(input_ids.shape[1]),
            output_tokens=int(sequences.shape[1]) - int(input_ids.shape[1]),
            first_token_at=streamer.first_token_at,
            queries=int(sequences.shape[0]),
        )

    def prefill(self, input_ids: Any) -> None:
        """The prefill alone: one forward pass over the prompt into a new, empty cache,
        and the first token's choice.  What ``generate`` does before its first token, to
        be repeated back to back where one prefill is too short for the meter."""
        import torch

        input_ids = input_ids.to(self.device)
        static = self._compiled.prefill_cache(input_ids) if self._compiled is not None else None
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                use_cache=True,
                **(static or self._cache_kwargs()),
            )
            out.logits[:, -1, :].argmax(dim=-1)
        self._synchronize()

    # -- helpers -----------------------------------------------------------------
    @property
    def _may_exceed_context(self) -> bool:
        return self.allow_beyond_context and self.position_kind != LEARNED

    def _beyond_context_fix(self) -> str:
        why = positions_text(self.position_kind)
        if self.position_kind == LEARNED:
            return f"use fewer tokens: {why}"
        return (
            "use fewer tokens, or load it with allow_beyond_context=True "
            f"(--llm-allow-beyond-context): {why}"
        )

    def _build_text_ids(self) -> list[int]:
        ids = self.tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"the tokenizer of {self.name!r} turns the sample text into nothing")
        return list(ids)

    def _start_ids(self) -> list[int]:
        """The BOS token if this tokenizer puts one in front of text, else nothing."""
        bos = self.tokenizer.bos_token_id
        if bos is None:
            return []
        probe = self.tokenizer("x", add_special_tokens=True)["input_ids"]
        return [bos] if probe and probe[0] == bos else []

    def _generation_config(self, output_tokens: int) -> Any:
        """Greedy settings with every other knob at its neutral value.

        transformers fills unset fields from the checkpoint's ``generation_config.json``,
        so a checkpoint's sampling or repetition-penalty defaults would leak in; setting
        them all keeps every model on the same plain greedy loop.  ``min_new_tokens ==
        max_new_tokens`` masks EOS at every step; pad must be set or transformers falls
        back to EOS with a warning.
        """
        from transformers import GenerationConfig

        eos = self.tokenizer.eos_token_id
        if eos is None:
            eos = self.model.generation_config.eos_token_id
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = eos[0] if isinstance(eos, list) else eos
        defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
        params: dict[str, Any] = dict(defaults()) if defaults is not None else {}
        params.pop("max_length", None)  # max_new_tokens decides
        params.pop("min_length", None)
        params.update(
            max_new_tokens=output_tokens,
            min_new_tokens=output_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=eos,
            pad_token_id=pad,
            bos_token_id=self.tokenizer.bos_token_id,
            use_cache=self.kv_cache,
            return_dict_in_generate=False,
        )
        return GenerationConfig(**params)

    def _cache_kwargs(self) -> dict[str, Any]:
        """A new, empty cache owned by this call alone, under the keyword this
        transformers takes: ``cache`` where the model's forward has it (transformers 5.x
        renamed ``past_key_values``, which now warns), else ``past_key_values``."""
        from transformers import DynamicCache

        try:
            cache = DynamicCache(config=self.model.config)
        except TypeError:  # transformers before 4.56 takes no config
            cache = DynamicCache()
        return {_cache_keyword(type(self.model)): cache}

    def _compiled_decode(self) -> CompiledDecode:
        if self._compiled is None:
            self._compiled = CompiledDecode(
                self.model, self.name, _cache_keyword(type(self.model)), self._cache_kwargs
            )
        return self._compiled

    def _synchronize(self) -> None:
        """Wait for queued GPU work so that time and energy land in the right phase: on
        the GPUs the model is on, and no other (waiting on a GPU this process never used
        would open a CUDA context there, in every rank of a torchrun job: gpu/in_use.py)."""
        import torch

        if self.device.type == "cuda" or _on_cuda(self.model):
            on = in_use.held_by(self.model) or in_use.module_ordinals(self.model)
            in_use.synchronize(frozenset(on) if on else None)
        elif self.device.type == "mps":
            torch.mps.synchronize()


@functools.cache
def _cache_keyword(model_class: type) -> str:
    """The keyword this model class's forward (and so its generate) takes its KV cache
    by; read from the signature once per class, so no call passes a deprecated name."""
    import inspect

    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@functools.cache
def _streamer_class() -> type:
    """A ``BaseStreamer`` that marks the phase at the first new token.

    Made on first use so that importing this module does not import transformers.
    """
    from transformers.generation.streamers import BaseStreamer

    class FirstTokenStreamer(BaseStreamer):
        """``put`` receives the prompt first, then each new token; each put is marked
        (``mark_token``: the prompt is token 0 of ``output_tokens``) for counted work."""

        def __init__(
            self, synchronize: Callable[[], None], output_tokens: int, quiet: bool = False
        ) -> None:
            self._synchronize = synchronize
            self._output_tokens = output_tokens
            self._quiet = quiet  # a warm-up's tokens: no counter hears them
            self._puts = 0
            self.first_token_at: float | None = None

        def put(self, value: Any) -> None:
            self._puts += 1
            if self._quiet:
                return
            mark_token(self._puts - 1, self._output_tokens)
            if self._puts == 2:  # the first put after the prompt
                self._synchronize()
                self.first_token_at = time.perf_counter()
                # ValueError: an earlier generate() in this window already split it.
                with contextlib.suppress(ValueError):
                    mark_phase("decode", ending="prefill")

        def end(self) -> None:
            pass

    return FirstTokenStreamer


def _on_cuda(model: Any) -> bool:
    device_map = getattr(model, "hf_device_map", None) or {}
    return any(str(d).startswith("cuda") or isinstance(d, int) for d in device_map.values())


def _checked_target(dtype: str, device: str) -> str:
    """Check both choices; the device to load onto (``auto`` only with CUDA)."""
    _check_choice("dtype", dtype, DTYPES)
    if not _DEVICE_RE.match(device):
        raise ConfigError(f"unknown device {device!r}; allowed values: {DEVICES_HELP}")
    return _resolve_device(device)


def check_model(
    name_or_path: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
) -> ModelInfo:
    """Fail now, with load_model's one-line ConfigError, if the model cannot be loaded:
    the device and dtype are checked, the config and tokenizer are read (no weights).

    Seconds, so a session finds a bad model, or a case beyond the returned context,
    before the first case rather than after the others' measurements.
    """
    _checked_target(dtype, device)
    source = _resolve_source(name_or_path, cache_dir)
    unreachable = _hub_unreachable(name_or_path)
    hub: dict[str, Any] = {"local_files_only": True} if unreachable else {}
    try:
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **hub)
        _check_tokenizer_files(name_or_path, source)  # after the config: is it a model folder
        tokenizer = AutoTokenizer.from_pretrained(
            source, trust_remote_code=trust_remote_code, **hub
        )
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as exc:
        raise _cannot_load(name_or_path, exc, unreachable) from exc
    return ModelInfo(
        name=name_or_path,
        max_positions=_max_positions(config, tokenizer),
        position_kind=position_kind(config),
        config_sha256=config_hash(config),
    )


# Fields of a config that say where or by which version it was saved, not what the model is.
_NOT_THE_MODEL = frozenset({"_name_or_path", "transformers_version", "_commit_hash"})


def config_hash(config: Any) -> str:
    """A short hash of what the config says the model is (architecture, sizes, dtype), so
    that two runs of "the same" model can tell whether it really was."""
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    kept = {k: v for k, v in data.items() if k not in _NOT_THE_MODEL}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_model(
    name_or_path: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
    allow_beyond_context: bool = False,
    parallel: str = "none",
) -> LoadedModel:
    """Load a built-in tiny model, a local checkpoint directory or a Hugging Face id.

    ``device="auto"`` spreads the model over the GPUs with accelerate when CUDA is
    available, else uses the CPU.  ``dtype="auto"`` keeps a half-precision checkpoint
    in half precision on a GPU (bfloat16 becomes float16 where the GPU lacks bfloat16)
    and uses float32 on the CPU, where half-precision kernels are slow or missing.
    ``cache_dir`` is where built-in tiny models are kept (see ``ensure_tiny_model``).
    ``allow_beyond_context`` lets a model with rotary or ALiBi positions run prompts and
    generations longer than its context; a model with learned positions never does.
    A hub id is read from the HF cache alone when the hub cannot be reached.
    ``parallel="tp"`` (under torchrun, the process group joined) shards the model over
    the ranks with transformers' tensor-parallel plan (``DistributedConfig(tp_plan="auto")``).
    """
    import torch

    _check_choice("parallel layout", parallel, PARALLEL)
    target = _checked_target(dtype, device)
    source = _resolve_source(name_or_path, cache_dir)
    unreachable = _hub_unreachable(name_or_path)
    hub: dict[str, Any] = {"local_files_only": True} if unreachable else {}
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **hub)
        _check_tokenizer_files(name_or_path, source)  # after the config: is it a model folder
        torch_dtype = _resolve_dtype(dtype, target, config)
        kwargs: dict[str, Any] = {
            "trust_remote_code": trust_remote_code,
            _dtype_kwarg(): torch_dtype,
            **hub,
        }
        if parallel == "tp":
            from transformers import DistributedConfig

            kwargs["distributed_config"] = DistributedConfig(tp_plan="auto")
        elif target == "auto":
            kwargs["device_map"] = "auto"
        elif target != "cpu":
            kwargs["device_map"] = {"": target}
        tokenizer = AutoTokenizer.from_pretrained(
            source, trust_remote_code=trust_remote_code, **hub
        )
        if weights_at_load(name_or_path) and parallel != "tp":
            model = build_at_load(config, torch_dtype, _one_device(target))
        else:
            model = AutoModelForCausalLM.from_pretrained(source, config=config, **kwargs)
    except _out_of_memory_error(torch):
        raise  # a real model too big for the device: not a configuration problem
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as exc:
        raise _cannot_load(name_or_path, exc, unreachable) from exc
    model.eval()
    in_use.hold_module(model, name_or_path)  # the GPU meters read these GPUs while it lives
    embeddings = model.get_input_embeddings()
    weight = next(embeddings.parameters(), None) if embeddings is not None else None
    first = weight if weight is not None else next(model.parameters())
    return LoadedModel(
        name=name_or_path,
        model=model,
        tokenizer=tokenizer,
        device=first.device,
        dtype=first.dtype,
        max_positions=_max_positions(model.config, tokenizer),
        position_kind=position_kind(model.config),
        allow_beyond_context=allow_beyond_context,
    )


class ModelPool:
    """Keeps at most one model loaded, so a sweep over big models never holds two."""

    def __init__(
        self,
        *,
        dtype: str = "auto",
        device: str = "auto",
        trust_remote_code: bool = False,
        cache_dir: Path | None = None,
        allow_beyond_context: bool = False,
        parallel: str = "none",
        on_load: Callable[[LoadedModel], None] | None = None,
        inject_regression: float | Mapping[str, float] = 0.0,
        inject_work: tuple[str, ...] = (),
        kv_cache: bool = True,
        execution: str = "auto",
    ) -> None:
        self.dtype = dtype
        self.execution = execution  # auto, eager or compiled (llm/compiled.py)
        self.inject_work = inject_work  # llm/inject.py: does a failed gate say why?
        self.kv_cache = kv_cache
        self.inject_regression = inject_regression  # llm/inject.py: the gate's self-check
        self.parallel = parallel
        self.on_load = on_load  # e.g. check that the meter reads every GPU the model is on
        self.device = device
        self.trust_remote_code = trust_remote_code
        self.cache_dir = cache_dir
        self.allow_beyond_context = allow_beyond_context
        self._current: LoadedModel | None = None

    @property
    def current(self) -> LoadedModel | None:
        return self._current

    def get(self, name: str) -> LoadedModel:
        """The model ``name``, loading it (after dropping any other one) on first use."""
        if self._current is not None and self._current.name == name:
            return self._current
        self.close()
        self._current = load_model(
            name,
            dtype=self.dtype,
            device=self.device,
            trust_remote_code=self.trust_remote_code,
            cache_dir=self.cache_dir,
            allow_beyond_context=self.allow_beyond_context,
            parallel=self.parallel,
        )
        share = self.inject_regression
        if isinstance(share, Mapping):  # some models only: model name -> share
            share = share.get(name, 0.0)
        if share > 0:
            from .inject import inject_regression

            inject_regression(self._current.model, share)
        if self.inject_work:
            from .inject import inject_work

            inject_work(self._current.model, self.inject_work)
        self._current.kv_cache = self.kv_cache
        self._current.execution = resolve_execution(
            self.execution,
            self.device,
            kv_cache=self.kv_cache,
            parallel=self.parallel,
            # any model injected makes the session eager: its cases compare as alike
            injected=bool(self.inject_regression) or bool(self.inject_work),
        )
        if self.on_load is not None:
            self.on_load(self._current)
        return self._current

    def close(self) -> None:
        """Drop the loaded model and give its memory back before anything new loads."""
        if self._current is None:
            return
        in_use.release(self._current.model)  # its GPUs are no longer in use
        self._current = None
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __enter__(self) -> ModelPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- resolution helpers ------------------------------------------------------------
def _one_device(target: str) -> str:
    """Where a model built in place goes: ``auto`` (CUDA there) is the first GPU."""
    return "cuda:0" if target == "auto" else target


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {what} {value!r}; allowed values: {', '.join(allowed)}")


def _resolve_device(device: str) -> str:
    """``auto`` stays ``auto`` with CUDA (device_map) and becomes ``cpu`` without."""
    import torch

    if device == "auto":
        return "auto" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r} requested but CUDA is not available to torch; "
                f"use --device=cpu or install a CUDA build of torch"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {device!r} requested but torch sees {torch.cuda.device_count()} GPU(s)"
            )
    if device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps' requested but MPS is not available; use cpu")
    return device


def _resolve_source(name_or_path: str, cache_dir: Path | None) -> str:
    """A directory or hub id that ``from_pretrained`` can read."""
    if is_tiny(name_or_path):
        try:
            return str(ensure_tiny_model(name_or_path, cache_dir))
        except OSError as exc:
            raise ConfigError(
                f"cannot build the built-in model {name_or_path!r}: {_short_reason(exc)}; "
                f"point LLMENERGY_CACHE at a writable directory"
            ) from exc
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if _looks_like_path(name_or_path):
        raise ConfigError(
            f"cannot load model {name_or_path!r}: no such directory; use a local checkpoint "
            f"directory, a Hugging Face id, or {_TINY_HINT}"
        )
    return name_or_path


def _looks_like_path(name: str) -> bool:
    """Hub ids are ``org/name``; anything else with a separator is meant as a path."""
    return (
        name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def _is_hub_id(name_or_path: str) -> bool:
    """Neither a built-in model nor a directory (``_resolve_source`` refused other paths)."""
    return not is_tiny(name_or_path) and not Path(name_or_path).expanduser().is_dir()


def _check_tokenizer_files(name_or_path: str, source: str) -> None:
    """A local folder without tokenizer files fails here, in words, not deep in transformers."""
    if _is_hub_id(name_or_path):
        return
    folder = Path(source)
    if any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return
    raise ConfigError(
        f"model folder {name_or_path} has no tokenizer files ({' / '.join(_TOKENIZER_FILES)}): "
        f"copy the tokenizer next to the weights"
    )


def _hub_unreachable(name_or_path: str) -> str | None:
    """Why the hub cannot be reached for a hub id (None: reachable, offline mode or local).

    One request without retries: unanswered, the hub client retries each file for 30 s
    before it looks in its cache, so the loaders then read the cache alone.
    """
    if not _is_hub_id(name_or_path):
        return None
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return None  # the hub client already reads its cache alone, at once
    try:
        get_session().head(constants.ENDPOINT, timeout=_HUB_PROBE_TIMEOUT_S)
    except Exception as exc:  # the client's HTTP library decides the class (httpx, requests)
        return f"{constants.ENDPOINT} cannot be reached: {_short_reason(exc)}"
    return None


def position_kind(config: Any) -> str:
    """ROTARY or ALIBI when the config computes positions, else LEARNED (also unknown)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    declared = getattr(text_config, "position_embedding_type", None)
    if isinstance(declared, str) and declared.lower() in ("rotary", "rope"):
        return ROTARY
    attn_config = getattr(text_config, "attn_config", None)
    alibi = getattr(text_config, "alibi", None)
    if alibi is None and attn_config is not None:  # MPT keeps it with the attention settings
        alibi = (
            attn_config.get("alibi")
            if isinstance(attn_config, dict)
            else getattr(attn_config, "alibi", None)
        )
    if alibi is True or getattr(text_config, "model_type", None) in _ALIBI_MODEL_TYPES:
        return ALIBI
    if any(getattr(text_config, attr, None) is not None for attr in _ROTARY_ATTRS):
        return ROTARY
    return LEARNED


def positions_text(kind: str) -> str:
    """Why a model of this position kind can or cannot run past its context, for messages."""
    if kind == ROTARY:
        return "its positions are rotary (RoPE), computed for any length"
    if kind == ALIBI:
        return "its positions are ALiBi biases, computed for any length"
    return "its positions are a learned table (no rotary or ALiBi settings in its config)"


def _resolve_dtype(dtype: str, target: str, config: Any) -> Any:
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if target == "cpu":
        return torch.float32
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    if saved not in (torch.float16, torch.bfloat16):
        return torch.float32
    if saved is torch.bfloat16 and target != "mps" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return saved


def _out_of_memory_error(torch: Any) -> type[BaseException]:
    """``torch.OutOfMemoryError`` (torch 2.5+), else its older name under ``torch.cuda``."""
    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def _dtype_kwarg() -> str:
    """``from_pretrained`` renamed ``torch_dtype`` to ``dtype`` in transformers 4.56."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def _max_positions(config: Any, tokenizer: Any) -> int:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in (
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "seq_length",
        "max_seq_len",
    ):
        value = getattr(text_config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10_000_000:  # huge values mean "not set"
        return limit
    return _FALLBACK_MAX_POSITIONS


def _cannot_load(
    name_or_path: str, exc: BaseException, unreachable: str | None = None
) -> ConfigError:
    reason = _short_reason(exc)
    if unreachable and isinstance(exc, OSError):
        reason = f"it is not in the Hugging Face cache and {unreachable}"
    close = difflib.get_close_matches(name_or_path, list(TINY_MODELS), n=1)
    guess = f"did you mean {close[0]}? Else " if close else ""
    return ConfigError(
        f"cannot load model {name_or_path!r}: {reason}; {guess}use a local checkpoint "
        f"directory, a Hugging Face id that is downloadable or already in the HF cache, "
        f"or {_TINY_HINT}"
    )


def _short_reason(exc: BaseException) -> str:
    """The first line of an exception, short enough for a one-line message."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = text or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


NO_TP_PLAN = (
    "transformers has no tensor-parallel plan for its architecture ({architecture}); "
    "leave it out (--llm-models) or run it with --llm-parallel=none"
)


def tensor_parallel_problem(
    name_or_path: str,
    world_size: int,
    *,
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
) -> str | None:
    """Why ``name_or_path`` cannot be split over ``world_size`` ranks (None if it can).

    Tensor parallelism gives every rank whole attention heads (and key/value heads), so
    their counts must divide by the world size; checked from the config before any rank
    loads weights, so a bad layout is one line at start instead of a hang mid-load."""
    from transformers import AutoConfig

    source = _resolve_source(name_or_path, cache_dir)
    hub: dict[str, Any] = {"local_files_only": True} if _hub_unreachable(name_or_path) else {}
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **hub)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        return f"cannot read its config: {_short_reason(exc)}"
    config = getattr(config, "text_config", None) or config
    if not getattr(config, "base_model_tp_plan", None):
        return NO_TP_PLAN.format(architecture=type(config).__name__.removesuffix("Config"))
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for what, count in (("attention heads", heads), ("key/value heads", kv_heads)):
        if isinstance(count, int) and count % world_size:
            return (
                f"its {count} {what} do not divide by the world size {world_size}; run "
                f"tensor-parallel with a number of ranks that divides {count} "
                "(torchrun --nproc-per-node/--nnodes), or --llm-parallel=none"
            )
    return None


def occupied_gpus(model: Any) -> tuple[int, ...]:
    """The CUDA ordinals a model's layers sit on (``device_map="auto"`` spreads a big model
    over several GPUs; accelerate records where in ``hf_device_map``)."""
    device_map = getattr(model, "hf_device_map", None) or {}
    found: set[int] = set()
    for device in device_map.values():
        if isinstance(device, int) and not isinstance(device, bool):
            found.add(device)
        elif isinstance(device, str) and re.fullmatch(r"cuda(:\d+)?", device):
            found.add(int(device.partition(":")[2] or 0))
    return tuple(sorted(found))


def unmetered_gpus(occupied: tuple[int, ...], domains: Any) -> list[int]:
    """The GPUs a model occupies that no meter domain (``gpu:N``) reads."""
    metered = {name.split("@", 1)[0] for name in domains}
    return [gpu for gpu in occupied if f"gpu:{gpu}" not in metered]


def load_prompts(
    name_or_path: str, *, trust_remote_code: bool = False, cache_dir: Path | None = None
) -> LoadedModel:
    """A model's tokenizer alone, for the prompts of a server serving that model:
    ``prompt_list`` works on it; ``generate`` does not (no weights are loaded)."""
    source = _resolve_source(name_or_path, cache_dir)
    unreachable = _hub_unreachable(name_or_path)
    hub: dict[str, Any] = {"local_files_only": True} if unreachable else {}
    try:
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **hub)
        _check_tokenizer_files(name_or_path, source)
        tokenizer = AutoTokenizer.from_pretrained(
            source, trust_remote_code=trust_remote_code, **hub
        )
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as exc:
        raise _cannot_load(name_or_path, exc, unreachable) from exc
    return LoadedModel(
        name=name_or_path,
        model=None,
        tokenizer=tokenizer,
        device=None,
        dtype=None,
        max_positions=_max_positions(config, tokenizer),
        position_kind=position_kind(config),
    )


def model_source(name_or_path: str, cache_dir: Path | None = None) -> str:
    """Where a model's files are (a built-in one is built first): what a server loads."""
    return _resolve_source(name_or_path, cache_dir)
