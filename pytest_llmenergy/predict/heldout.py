"""Larger random models for the held-out error table: real architectures, random weights.

The calibration is fitted on a built-in tiny model; these are what it is checked
against.  They are built like the tiny models (``llm/tiny.py``: the same tokenizer and
seeded weights) into a folder of your choice, then measured with the plugin like any
checkpoint: ``--llm-model=rand-llama-256=DIR/rand-llama-256``.

    python -m pytest_llmenergy.predict.heldout DIR   # builds every model below in DIR
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..llm.tiny import TinySpec

_POSITIONS = 8192

HELDOUT_MODELS: Mapping[str, TinySpec] = {
    "rand-llama-256": TinySpec(
        "rand-llama-256",
        "LlamaConfig",
        {
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "intermediate_size": 688,
            "max_position_embeddings": _POSITIONS,
        },
    ),
    "rand-mistral-384": TinySpec(
        "rand-mistral-384",
        "MistralConfig",
        {
            "hidden_size": 384,
            "num_hidden_layers": 6,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "intermediate_size": 1024,
            "sliding_window": _POSITIONS,
            "max_position_embeddings": _POSITIONS,
        },
    ),
    "rand-falcon-512": TinySpec(
        "rand-falcon-512",
        "FalconConfig",
        {
            "hidden_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "new_decoder_architecture": False,
            "multi_query": True,
            "parallel_attn": True,
            "alibi": False,
            "bias": False,
            "max_position_embeddings": _POSITIONS,
        },
    ),
}


def build_model(spec: TinySpec, out_dir: Path) -> Path:
    """Write config, weights and tokenizer of ``spec`` to ``out_dir`` (must not exist)."""
    import transformers

    from ..llm.tiny import _BOS, _EOS, _PAD, _SEED, build_tokenizer

    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; choose an empty place for the model")
    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab()
    config_class = getattr(transformers, spec.config_class)
    config = config_class(
        **spec.config_kwargs,
        vocab_size=len(tokenizer),
        bos_token_id=vocab[_BOS],
        eos_token_id=vocab[_EOS],
        pad_token_id=vocab[_PAD],
        initializer_range=0.02,
        dtype="float32",
    )
    model: Any = transformers.AutoModelForCausalLM.from_config(config)
    _seeded(model, _SEED)
    model.generation_config.pad_token_id = vocab[_PAD]
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _seeded(model: Any, seed: int) -> None:
    from ..llm.tiny import _fill_weights

    _fill_weights(model, seed)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pytest_llmenergy.predict.heldout DIR", file=sys.stderr)
        return 2
    root = Path(args[0])
    for name, spec in HELDOUT_MODELS.items():
        target = root / name
        if target.exists():
            print(f"{target}: exists, kept")
            continue
        build_model(spec, target)
        print(f"{target}: built")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
