"""Built-in configs of the research's 7B models: features without downloading anything.

Each is the architecture part of the model's public ``config.json`` on the Hugging Face
hub (the fields ``features.shape_from_config`` reads, and the positions and dtype), so
``llmenergy predict --model meta-llama/Llama-2-7b-hf`` and calibrations on runs of these
models need neither weights nor network.  Sources (read 2024-2025; the architectures
have not changed since release):

- https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json (the chat model,
  ``Llama-2-7b-chat-hf``, which the research's scripts load by default, has the same)
- https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
- https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json (``model_type`` is
  ``falcon`` since transformers took the model in; it was ``RefinedWebModel`` before)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BUILTIN_CONFIGS: Mapping[str, Mapping[str, Any]] = {
    "meta-llama/Llama-2-7b-hf": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "num_hidden_layers": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
    },
    "mistralai/Mistral-7B-v0.1": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
    },
    "tiiuae/falcon-7b": {
        "model_type": "falcon",
        "hidden_size": 4544,
        "num_attention_heads": 71,
        "num_hidden_layers": 32,
        "multi_query": True,
        "parallel_attn": True,
        "new_decoder_architecture": False,
        "alibi": False,
        "bias": False,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    },
}


def builtin_config(name: str) -> tuple[str, dict[str, Any]] | None:
    """The hub id and config of a built-in model, by its hub id or the id's last part
    (``Llama-2-7b-hf``), in any case; None for any other name."""
    wanted = name.strip().lower()
    for hub_id, config in BUILTIN_CONFIGS.items():
        if wanted in (hub_id.lower(), hub_id.rsplit("/", 1)[-1].lower()):
            return hub_id, {**config, "_name_or_path": hub_id}
    return None
