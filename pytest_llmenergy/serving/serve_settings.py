"""What the serving options say (``--llm-endpoint``, ``--llm-serve`` and friends)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..errors import ConfigError
from .client import parse_endpoint_url
from .steady import DEFAULT_MIN_BATCH_FILL, DEFAULT_MIN_STEADY_S

DEFAULT_SERVE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ServeSettings:
    endpoint: str | None = None  # a running server's URL
    served_model: str | None = None  # its model's name there (None: the one it serves)
    engine: str | None = None  # an engine to start: vllm, llama.cpp
    python: str | None = None  # the engine's interpreter (None: $LLMENERGY_SERVE_PYTHON)
    args: tuple[str, ...] = ()  # extra engine flags
    timeout_s: float = DEFAULT_SERVE_TIMEOUT_S  # for the engine to answer
    server_pid: int | None = None  # the server's process (None: found from the port)
    converter: str | None = None  # llama.cpp's convert_hf_to_gguf.py (None: looked for)
    # a burst whose steady window (every request generating) is shorter is unstable
    min_steady_s: float = DEFAULT_MIN_STEADY_S
    # ... and so is one whose batch held fewer requests than this share, on average
    min_batch_fill: float = DEFAULT_MIN_BATCH_FILL
    # requests a burst sends, at most its concurrency at once (None: one per slot)
    requests: int | None = None

    def __post_init__(self) -> None:
        if self.endpoint and self.engine:
            raise ConfigError(
                "give either a running server (--llm-endpoint) or an engine to start "
                "(--llm-serve), not both"
            )
        if self.endpoint is not None:
            object.__setattr__(self, "endpoint", parse_endpoint_url(self.endpoint))
        if self.timeout_s <= 0:
            raise ConfigError(f"the engine's start timeout must be > 0 s, got {self.timeout_s}")

    @property
    def active(self) -> bool:
        return bool(self.endpoint or self.engine)


def parse_args(text: str) -> tuple[str, ...]:
    """Engine flags as a shell would split them (never run through a shell)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ConfigError(f"cannot split engine flags {text!r}: {exc}") from None


def engine_choice(text: str) -> str:
    from .engine import ENGINES

    name = text.strip().lower()
    if name not in ENGINES:
        raise ConfigError(f"unknown serving engine {text!r}; choose one of: {', '.join(ENGINES)}")
    return name
