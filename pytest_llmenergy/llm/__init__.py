"""Running models: built-in tiny models, loading by name, exact-count generation.

Importing this package imports torch and transformers lazily, on first use; the rest of
``pytest_llmenergy`` never imports it.
"""

from __future__ import annotations

from ..probes.resources import ResourceProbe, ResourceUsage
from .loader import Generation, LoadedModel, ModelPool, load_model
from .tiny import TINY_MODELS, ensure_tiny_model, is_tiny

__all__ = [
    "TINY_MODELS",
    "Generation",
    "LoadedModel",
    "ModelPool",
    "ResourceProbe",
    "ResourceUsage",
    "ensure_tiny_model",
    "is_tiny",
    "load_model",
]
