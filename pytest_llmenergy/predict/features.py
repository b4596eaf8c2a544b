"""What a forward pass of a decoder costs, from its config alone (no weights).

Per operator class: FLOPs and bytes moved, and the number of operators dispatched (each
costs a launch whatever its size, the AstraWattch observation that launch delays do not
depend on the hardware's speed).  ``case_features`` sums them over one generation:
the prefill of ``n_in`` tokens, then ``n_out - 1`` decode steps with the KV cache
growing.  The batch size multiplies activations and attention, never the weight bytes.

The operator counts per layer are the eager transformers code's (measured with
torch.profiler, checked by ``tests/test_predict_features.py`` against the tiny models);
a new transformers version that changes them fails that test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

MATMUL, ATTENTION, ELEMENTWISE, EMBEDDING, OTHER = (
    "matmul",
    "attention",
    "elementwise",
    "embedding",
    "other",
)
# Classes with their own work terms (``other`` is launches only).
WORK_CLASSES = (MATMUL, ATTENTION, ELEMENTWISE, EMBEDDING)
CLASSES = (*WORK_CLASSES, OTHER)

# Top-level operators (Python -> aten dispatches) of one forward pass: a per-layer count
# per phase and a per-model base (embedding, final norm, rotary tables, lm_head, masks).
# Measured on transformers' eager code with torch.profiler (tiny models, 2 and 4 layers).
_OPS: Mapping[str, tuple[int, int, int]] = {
    # family: (per layer in a prefill, per layer in a decode step, base per pass)
    "llama": (63, 55, 25),
    "mistral": (70, 57, 25),
    "falcon": (59, 51, 38),
}
# generate()'s own operators: every step (logits processing, stopping criteria, cat of
# the new token) and once before the first (inputs, masks, cache position).
GENERATE_STEP_OPS = 38
GENERATE_SETUP_OPS = 33

_FAMILIES = {
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mistral",
    "qwen2": "llama",
    "falcon": "falcon",
}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that decide its cost."""

    name: str
    family: str  # llama, mistral or falcon: decides the operator counts and the MLP
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    mlp_matrices: int = 3  # gated MLP (llama, mistral): 3; falcon: 2
    norms_per_layer: int = 2  # falcon's parallel attention and MLP share one
    elem_bytes: int = 4  # float32 on CPU
    # Scores over every (query, key) pair, masked after: SDPA's math path, which
    # transformers' Falcon takes (an explicit mask, one shared key/value head); the
    # others' fused kernels skip the causal half.
    full_attention: bool = False

    @property
    def layer_weights(self) -> int:
        """Parameters of one layer's matrices."""
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        attn += self.heads * self.head_dim * self.hidden
        return attn + self.mlp_matrices * self.hidden * self.intermediate


def shape_from_config(config: Mapping[str, Any], name: str = "", elem_bytes: int = 4) -> ModelShape:
    """A ``config.json``'s sizes (llama, mistral, qwen2, falcon layouts)."""
    model_type = str(config.get("model_type", ""))
    family = _FAMILIES.get(model_type)
    if family is None:
        known = ", ".join(sorted(_FAMILIES))
        raise ConfigError(
            f"model {name or '?'}: model_type {model_type!r} is not modelled (known: {known}); "
            f"give the config of one of those architectures"
        )

    def need(*keys: str) -> int:
        for key in keys:
            value = config.get(key)
            if isinstance(value, int) and value > 0:
                return value
        raise ConfigError(f"model {name or '?'}: its config has no {' or '.join(keys)}")

    hidden = need("hidden_size", "d_model")
    layers = need("num_hidden_layers", "n_layer")
    heads = need("num_attention_heads", "n_head")
    if family == "falcon":
        if config.get("new_decoder_architecture"):
            kv_heads = need("num_kv_heads")
        elif config.get("multi_query", True):
            kv_heads = 1
        else:
            kv_heads = heads
        intermediate = config.get("ffn_hidden_size") or 4 * hidden
        mlp, norms = 2, 1 if config.get("parallel_attn", True) else 2
    else:
        kv_heads = config.get("num_key_value_heads") or heads
        intermediate = need("intermediate_size")
        mlp, norms = 3, 2
    head_dim = config.get("head_dim") or hidden // heads
    return ModelShape(
        name=name or str(config.get("_name_or_path") or model_type),
        family=family,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate=int(intermediate),
        vocab=need("vocab_size"),
        mlp_matrices=mlp,
        norms_per_layer=norms,
        elem_bytes=elem_bytes,
        full_attention=family == "falcon",
    )


def load_shape(model: str, elem_bytes: int = 4) -> ModelShape:
    """A built-in tiny model's name, a ``config.json`` path or a model folder (optionally
    ``NAME=SOURCE``): its sizes.  Only the config is read; no weights are loaded."""
    name, config = load_config(model)
    return shape_from_config(config, name, elem_bytes)


def load_config(model: str) -> tuple[str, dict[str, Any]]:
    """The model's name and its ``config.json``.  A tiny model is built if it is not in
    the cache yet (seconds), as the plugin would; the research's 7B models are built in
    (``configs.py``), unless a folder of that name is here."""
    from ..llm.tiny import ensure_tiny_model, is_tiny
    from .configs import builtin_config

    name, _, source = model.partition("=")
    if not source:
        name, source = "", model
    path = Path(source).expanduser()
    builtin = None if path.exists() else builtin_config(source)
    if builtin is not None:
        return name or builtin[0], builtin[1]
    if is_tiny(source):
        path = ensure_tiny_model(source) / "config.json"
        name = name or source
    elif path.is_dir():
        path = path / "config.json"
        name = name or path.parent.name
    if not path.is_file():
        raise ConfigError(
            f"model {model!r}: no config.json there; give a built-in model name (tiny-llama, "
            f"meta-llama/Llama-2-7b-hf, ...), a config.json path or a model folder"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a model config (a JSON object)")
    return name or path.parent.name, config


@dataclass
class Work:
    """Per class: FLOPs, bytes and operators; plus generate steps."""

    flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    bytes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    ops: float = 0.0
    # generate() calls: its Python set-up (validating the generation config, building
    # logits processors) costs a fixed time per generation, with few operators in it
    generations: float = 0.0
    # Every forward pass's FLOPs and bytes (and how many times it ran), for the roofline
    # column: a pass takes as long as the larger of its compute and its memory traffic.
    passes: list[tuple[float, float, float]] = field(default_factory=list)
    # Forward passes: each costs the generate loop's fixed work (sampling the token,
    # the Python around the model) whatever the model; ``ops`` carries what differs.
    forward_passes: float = 0.0

    def add(self, other: Work, times: float = 1.0) -> None:
        for c in CLASSES:
            self.flops[c] += other.flops[c] * times
            self.bytes[c] += other.bytes[c] * times
        self.ops += other.ops * times
        self.generations += other.generations * times
        self.forward_passes += other.forward_passes * times
        self.passes += [(f, b, n * times) for f, b, n in other.passes]

    def roofline(self, k: float) -> float:
        """Sum over passes of max(k x FLOPs, bytes): byte-equivalents of the slower side,
        ``k`` being the machine's bytes per FLOP at balance (fitted)."""
        return roofline(self.pass_array(), k)

    def pass_array(self) -> np.ndarray:
        """``passes`` as an (n, 3) array: FLOPs, bytes, count."""
        return np.asarray(self.passes, dtype=float).reshape(-1, 3)

    def vector(self, k: float = 0.0) -> list[float]:
        """The regression's columns, in ``COLUMNS`` order (``k``: see ``roofline``)."""
        return [
            *(self.flops[c] for c in WORK_CLASSES),
            *(self.bytes[c] for c in WORK_CLASSES),
            self.ops,
            self.generations,
            self.roofline(k),
            self.forward_passes,
        ]


COLUMNS = (
    *(f"{c}_flops" for c in WORK_CLASSES),
    *(f"{c}_bytes" for c in WORK_CLASSES),
    "launches",
    "generations",
    "roofline",
    "forward_passes",
)
ROOFLINE_INDEX = COLUMNS.index("roofline")


def roofline(passes: np.ndarray, k: float) -> float:
    """See ``Work.roofline``; ``passes`` from ``Work.pass_array``."""
    if k <= 0 or not len(passes):
        return 0.0
    return float(np.maximum(k * passes[:, 0], passes[:, 1]) @ passes[:, 2])


def forward_work(shape: ModelShape, new: int, past: int, batch: int = 1) -> Work:
    """One forward pass of ``new`` tokens per sequence over ``past`` cached ones.

    Weight bytes are charged at one rate whatever their size: on the 2-core EPYC
    (1 MiB L2, 32 MiB L3) a decode step of a 14 MB model (inside L3) and of a 53 MB one
    (beyond it) read the weights at the same 8-9 GB/s, so a term for bytes beyond the
    last-level cache took cost from the models inside it (docs/predicting.md).
    """
    w = Work()
    e, h, b, n = shape.elem_bytes, shape.hidden, batch, new
    tokens = b * n
    q_dim, kv_dim = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # matrices: every layer's, then the lm_head for the last position only (generate
    # asks for the last token's logits alone)
    layer_w = shape.layer_weights
    w.flops[MATMUL] = 2.0 * tokens * layer_w * shape.layers + 2.0 * b * h * shape.vocab
    act_in_out = (h + q_dim + 2 * kv_dim) + (q_dim + h)  # qkv in/out, o in/out
    act_in_out += shape.mlp_matrices * h + shape.mlp_matrices * shape.intermediate
    w.bytes[MATMUL] = e * (
        (layer_w * shape.layers + h * shape.vocab)
        + tokens * act_in_out * shape.layers
        + b * (h + shape.vocab)
    )
    # attention: causal scores and values over the context, and the cache append (the
    # dynamic cache concatenates: the whole cache is copied every step)
    total = past + n
    pairs = n * total if shape.full_attention else n * past + n * (n + 1) / 2
    w.flops[ATTENTION] = 4.0 * b * shape.heads * pairs * shape.head_dim * shape.layers
    cache = b * total * kv_dim * 2  # keys and values
    # SDPA's math path materializes the scores: written by q.k, scaled, masked (the mask
    # read too), softmaxed, read by the values' matmul: 9 passes per layer, and the
    # float mask built once per pass (4)
    scores = b * shape.heads * pairs if shape.full_attention else 0
    w.bytes[ATTENTION] = e * shape.layers * (cache * 3 + 2 * tokens * q_dim + 9 * scores)
    w.bytes[ATTENTION] += e * 4 * b * pairs if shape.full_attention else 0
    # element-wise: norms, residuals, rotary, activation (passes over the activations)
    per_layer = shape.norms_per_layer * 6 * h + 6 * h + 8 * (q_dim + kv_dim)
    per_layer += 5 * shape.intermediate
    w.bytes[ELEMENTWISE] = e * tokens * (per_layer * shape.layers + 6 * h)
    w.flops[ELEMENTWISE] = tokens * (per_layer * shape.layers + 6 * h) / 2
    w.bytes[EMBEDDING] = e * tokens * h
    per_prefill, per_decode, base = _OPS[shape.family]
    w.ops = base + shape.layers * (per_prefill if past == 0 else per_decode)
    w.passes = [(sum(w.flops.values()), sum(w.bytes.values()), 1.0)]
    w.forward_passes = 1.0
    return w


def case_work(
    shape: ModelShape,
    input_tokens: int,
    output_tokens: int,
    batch: int = 1,
    kv_cache: bool = True,
) -> dict[str, Work]:
    """The prefill (with the first token) and the decode steps of one generation.

    Without a KV cache (``generate(use_cache=False)``, as the research's scripts ran) every
    decode step is a whole forward pass over the prompt and the tokens made so far.
    """
    if input_tokens < 1 or output_tokens < 1 or batch < 1:
        raise ValueError("input_tokens, output_tokens and batch must be at least 1")
    prefill = forward_work(shape, input_tokens, 0, batch)
    prefill.ops += GENERATE_SETUP_OPS + GENERATE_STEP_OPS
    prefill.generations = 1.0
    decode = Work()
    for step in range(output_tokens - 1):
        if kv_cache:
            decode.add(forward_work(shape, 1, input_tokens + step, batch))
        else:
            decode.add(forward_work(shape, input_tokens + step + 1, 0, batch))
        decode.ops += GENERATE_STEP_OPS
    return {"prefill": prefill, "decode": decode}
