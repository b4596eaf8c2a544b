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
    # About 55 MB of float32 weights: a second size of the calibrated architecture, with
    # weights far beyond the tiny model's, so that a CPU calibration sees what reading
    # them costs (with tiny-llama alone that cost is hidden under the launches).
    "rand-llama-512": TinySpec(
        "rand-llama-512",
        "LlamaConfig",
        {
            "hidden_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "intermediate_size": 1376,
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
    from ..llm.tiny import write_model

    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; choose an empty place for the model")
    write_model(spec, out_dir)
    return out_dir


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
