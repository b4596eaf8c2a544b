"""Built-in tiny models: real architectures with random weights, built offline.

They let the suite and its tests run without the Hugging Face hub or a GPU while still
going through the same loading and generation code as a real checkpoint.  Each model
is built once into a cache directory and then loaded like any local checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# English text the tiny tokenizer is trained on; the loader also builds its prompts from
# it, so every model (tiny or real) is timed on the same natural text.
SAMPLE_TEXT = """\
The harbour town woke slowly on winter mornings. Fishing boats came back before dawn, \
their lamps swinging over the grey water, and the people who worked on the quay moved \
crates of ice and rope while the bakery on the corner opened its shutters. By eight \
o'clock the smell of bread and diesel had reached the school, where children argued \
about the weather and whether the ferry would sail in such a strong wind.

Most visitors came for the lighthouse, a white tower built on a spit of rock at the end \
of a long stone pier. The keeper had retired years ago, when the light was automated, \
but he still walked out every evening to check the door and look at the sea. He said \
that a machine could turn a lamp on and off, but it could not tell you when a storm was \
coming, and nobody in the town was willing to argue with him about that.

In the spring the gardens along the river filled with tulips, and the market moved from \
the old hall into the square. Farmers sold cheese, honey, eggs and early vegetables; a \
man with a cart repaired bicycles for a few coins; and students from the college played \
music on the steps of the library until the light faded. It was a small place, but \
people who left it often said that they measured every other town against it.

The railway reached the valley late, long after the canal had been dug and forgotten. \
Engineers surveyed the hills for three summers, arguing over gradients and the cost of \
tunnels, until a cheaper route was found through the marshes to the east. When the first \
train finally arrived, half the county turned out to watch it, and a brass band played a \
march that nobody could remember afterwards. Within a decade the mills had doubled their \
output, the population had grown by a third, and the old coaching inn had become a hotel \
with electric lights and a telephone in the hall.

Scientists who study sleep have found that the brain is surprisingly busy at night. \
During the deepest stages, slow waves sweep across the cortex and memories formed during \
the day appear to be replayed and strengthened. Dreaming happens mostly in a different \
stage, when the eyes move quickly beneath closed lids and the muscles of the body are \
almost completely relaxed. Researchers still disagree about why we dream, but nearly all \
of them agree that regular, sufficient sleep improves attention, mood, learning and \
physical health, and that a quiet, dark and cool bedroom helps.

A good recipe for vegetable soup begins with patience rather than with any particular \
ingredient. Onions, carrots and celery should be cooked gently in butter or oil until \
they are soft and sweet, which takes longer than most people expect. Then add potatoes, \
beans, tomatoes, herbs and enough stock to cover everything, and let the pot simmer \
quietly for an hour. Season it at the end, taste it twice, and serve it with fresh \
bread; it is usually even better on the second day, when the flavours have had time to \
settle and combine.

Mountain weather changes faster than visitors imagine. A clear blue morning can turn \
into fog, hail and freezing wind before lunch, and experienced walkers carry a map, a \
compass, warm layers, water and food even on short routes. They tell someone where they \
are going, check the forecast the night before, and turn back early rather than late, \
because the summit will still be there next year while a tired and cold walker may make \
poor decisions on a steep and slippery descent.
"""

SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
_BOS, _EOS, _UNK, _PAD = SPECIAL_TOKENS
_VOCAB_TARGET = 1024
_SEED = 20240611
_MAX_POSITIONS = 8192
_INIT_STD = 0.02
# Bump when the build changes in a way the recipe below does not capture.
_RECIPE_VERSION = 1


@dataclass(frozen=True)
class TinySpec:
    """How one built-in model is made: a transformers config class and its arguments."""

    name: str
    config_class: str  # attribute name in ``transformers``
    config_kwargs: Mapping[str, Any] = field(default_factory=dict)
    # A real checkpoint's size (billions of weights): no weights are written to disk; the
    # model is built on its device when loaded and filled there from the seed (seconds
    # on a GPU, where writing and reading 16 GB of random weights would take minutes).
    weights_at_load: bool = False
    dtype: str = "float32"  # the dtype the config records (what ``auto`` loads)


_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": _MAX_POSITIONS,
}

TINY_MODELS: Mapping[str, TinySpec] = {
    "tiny-llama": TinySpec(
        "tiny-llama",
        "LlamaConfig",
        {**_COMMON, "intermediate_size": 128, "num_key_value_heads": 4},
    ),
    "tiny-mistral": TinySpec(
        "tiny-mistral",
        "MistralConfig",
        # Grouped-query attention as in Mistral 7B; the window is as long as the model's
        # context so that long prompts are attended in full, like Mistral v0.2 and later.
        {
            **_COMMON,
            "intermediate_size": 128,
            "num_key_value_heads": 2,
            "sliding_window": _MAX_POSITIONS,
        },
    ),
    "tiny-falcon": TinySpec(
        "tiny-falcon",
        "FalconConfig",
        # Falcon-7B's layout: one shared key/value head, parallel attention and MLP.
        {
            **_COMMON,
            "ffn_hidden_size": 128,
            "new_decoder_architecture": False,
            "multi_query": True,
            "parallel_attn": True,
            "alibi": False,
            "bias": False,
        },
    ),
    # tiny-llama with two heads of 32 dimensions instead of four of 16: serving engines'
    # attention kernels take head sizes of 32 and up only (vLLM's CPU backend: 32, 64,
    # 80, ...), so this is the one to serve (--llm-serve); tiny-llama stays as it was.
    "tiny-llama-h32": TinySpec(
        "tiny-llama-h32",
        "LlamaConfig",
        {
            **_COMMON,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
        },
    ),
}


# Random-weight models of real architectures at their real sizes, from the configs those
# checkpoints publish (their tokenizers replaced by the built-in one: token ids stay below
# its 1024, the embedding and output layers keep the real vocabulary's size and cost).
# For a GPU (``llmenergy proof``): Llama-3.1-8B in bf16 is 16 GB of weights.
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
REAL_SIZE_MODELS: Mapping[str, TinySpec] = {
    "random-llama-3.1-8b": TinySpec(
        "random-llama-3.1-8b",
        "LlamaConfig",
        {
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": _LLAMA3_ROPE,
            "tie_word_embeddings": False,
        },
        weights_at_load=True,
        dtype="bfloat16",
    ),
    "random-llama-3.2-1b": TinySpec(
        "random-llama-3.2-1b",
        "LlamaConfig",
        {
            "vocab_size": 128256,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0},
            "tie_word_embeddings": True,
        },
        weights_at_load=True,
        dtype="bfloat16",
    ),
}
BUILTIN_MODELS: Mapping[str, TinySpec] = {**TINY_MODELS, **REAL_SIZE_MODELS}


def is_tiny(name: str) -> bool:
    """True for the names of the built-in models (not for paths or hub ids)."""
    return name in BUILTIN_MODELS


def weights_at_load(name: str) -> bool:
    """True for a built-in model whose weights are made on its device when loaded."""
    spec = BUILTIN_MODELS.get(name)
    return spec is not None and spec.weights_at_load


def default_cache_dir() -> Path:
    """``$LLMENERGY_CACHE``, else ``~/.cache/pytest-llmenergy``."""
    env = os.environ.get("LLMENERGY_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "pytest-llmenergy"


def recipe_hash(name: str) -> str:
    """Short hash of everything that decides the built files, so a change gets a new dir.

    The transformers version is part of it because the saved config format follows it.
    """
    import transformers

    spec = _spec(name)
    recipe = {
        "recipe": _RECIPE_VERSION,
        "name": spec.name,
        "config_class": spec.config_class,
        "config": dict(spec.config_kwargs),
        **({"weights": "at-load", "dtype": spec.dtype} if spec.weights_at_load else {}),
        "text": hashlib.sha256(SAMPLE_TEXT.encode()).hexdigest(),
        "vocab_target": _VOCAB_TARGET,
        "special": SPECIAL_TOKENS,
        "seed": _SEED,
        "init_std": _INIT_STD,
        "transformers": ".".join(transformers.__version__.split(".")[:2]),
    }
    blob = json.dumps(recipe, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def tiny_model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """Where ``ensure_tiny_model`` keeps the model ``name`` (it may not exist yet)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "models" / f"{name}-{recipe_hash(name)}"


# Written last into a build directory: a directory without it is never used.
_COMPLETE_MARKER = ".complete"
# A build takes seconds; a temporary directory this old belongs to a crashed run.
_STALE_BUILD_S = 3600.0


def ensure_tiny_model(name: str, cache_dir: Path | None = None) -> Path:
    """Build the built-in model ``name`` once and return its checkpoint directory.

    The build goes into a temporary directory beside the target and is renamed into
    place, so concurrent runs (xdist workers) never see a half-written model; the
    loser of a race discards its copy.
    """
    target = tiny_model_dir(name, cache_dir)
    if (target / _COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target)
    # Builds appear with their marker inside (rename is atomic), so a directory without
    # one is damaged, never another process's build in progress.
    if target.exists():
        if (target / _COMPLETE_MARKER).is_file():
            return target  # another process finished meanwhile
        _discard_broken(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build_tiny_model(name, tmp)
        (tmp / _COMPLETE_MARKER).write_text(f"{name}\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file():
                raise
            # Another process finished first: use its copy.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_stale_builds(target: Path) -> None:
    """Delete build directories that crashed runs left behind (never a live build's)."""
    cutoff = time.time() - _STALE_BUILD_S
    for leftover in target.parent.glob(f".{target.name}.*-*"):
        try:
            if leftover.is_dir() and leftover.stat().st_mtime < cutoff:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            pass  # another process removed it first


def _discard_broken(target: Path) -> None:
    """Move an incomplete directory out of the way (atomically) and delete it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.broken-", dir=target.parent))
    try:
        os.rename(target, trash / "model")
    except FileNotFoundError:
        pass  # another process moved it first
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def build_tiny_model(name: str, out_dir: Path) -> None:
    """Write config, ``model.safetensors`` and tokenizer files of ``name`` to ``out_dir``."""
    write_model(_spec(name), out_dir)


def write_model(spec: TinySpec, out_dir: Path) -> None:
    """Config, seeded random weights and the built-in tokenizer of ``spec``, written to
    ``out_dir``: any architecture transformers has, at any size (the held-out models of
    ``predict.heldout`` are larger ones)."""
    import transformers

    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab()
    config_class = getattr(transformers, spec.config_class)
    settings: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        **spec.config_kwargs,
        "bos_token_id": vocab[_BOS],
        "eos_token_id": vocab[_EOS],
        "pad_token_id": vocab[_PAD],
        "initializer_range": _INIT_STD,
        "dtype": spec.dtype,
    }
    config = config_class(**settings)
    if spec.weights_at_load:  # config and tokenizer only: load_model builds the weights
        config.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        return
    model = transformers.AutoModelForCausalLM.from_config(config)
    _fill_weights(model, _SEED)
    model.generation_config.pad_token_id = vocab[_PAD]
    # A progress bar for one small shard is noise in a pytest header; put it back after.
    bars = transformers.utils.logging
    was_enabled = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    finally:
        if was_enabled:
            bars.enable_progress_bar()
    tokenizer.save_pretrained(out_dir)


def build_tokenizer() -> Any:
    """A byte-level BPE trained on ``SAMPLE_TEXT`` that adds ``<s>`` like Llama's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=_UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_TARGET,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SAMPLE_TEXT.splitlines(keepends=True), trainer=trainer)
    bos_id = tok.token_to_id(_BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{_BOS} $A",
        pair=f"{_BOS} $A {_BOS} $B",
        special_tokens=[(_BOS, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=_BOS,
        eos_token=_EOS,
        unk_token=_UNK,
        pad_token=_PAD,
        model_max_length=_MAX_POSITIONS,
    )


def _fill_weights(model: Any, seed: int) -> None:
    """Overwrite every weight from one seeded generator, in name order.

    Independent of how transformers happens to initialise a model, so the same recipe
    gives the same weights on any version; norms start at one and biases at zero as in
    a trained model's layout.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.dim() >= 2:
                values = torch.randn(param.shape, generator=gen, dtype=torch.float32)
                param.copy_(values * _INIT_STD)
            elif pname.endswith("bias"):
                param.zero_()
            else:
                param.fill_(1.0)


def build_at_load(config: Any, dtype: Any, device: str) -> Any:
    """A ``weights_at_load`` model, made on ``device`` in ``dtype`` and filled from the
    seed there as ``_fill_weights`` fills the small ones (the same spread, norms at one,
    biases at zero); buffers such as rotary frequencies are the architecture's own."""
    import torch
    import transformers

    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(_SEED)
    with torch.no_grad():
        for pname, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.dim() >= 2:
                param.normal_(0.0, _INIT_STD, generator=gen)
            elif pname.endswith("bias"):
                param.zero_()
            else:
                param.fill_(1.0)
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def _spec(name: str) -> TinySpec:
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        known = ", ".join(BUILTIN_MODELS)
        raise ValueError(f"{name!r} is not a built-in tiny model (known: {known})") from None
