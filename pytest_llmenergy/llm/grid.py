"""Which model x token-size cases the benchmark suite runs.

Two sweeps, as in the research: input tokens varied at a fixed output length, and
output tokens varied at a fixed input length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

TINY_MODEL_NAMES = ("tiny-llama", "tiny-mistral", "tiny-falcon")
# The research's models (7B each; Falcon was not run on the M1 Pro).
PAPER_MODELS = ("meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1", "tiiuae/falcon-7b")

INPUT_SWEEP, OUTPUT_SWEEP = "input", "output"


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    out, n = [], low
    while n <= high:
        out.append(n)
        n *= 2
    return tuple(out)


@dataclass(frozen=True)
class Grid:
    name: str
    models: tuple[str, ...]
    input_tokens: tuple[int, ...]  # the input sweep's sizes
    output_tokens: tuple[int, ...]  # the output sweep's sizes
    fixed_output_tokens: int = 32  # output length during the input sweep
    fixed_input_tokens: int = 32  # input length during the output sweep
    # Queries per trial: prompts generated together in one batch (``bs8``), or requests
    # in flight at once to a server (``c8``).  Every token-size case runs at each.
    batch_sizes: tuple[int, ...] = (1,)
    concurrency: tuple[int, ...] = (1,)

    def cases(self, sweep: str) -> list[LLMCase]:
        if sweep == INPUT_SWEEP:
            sizes = [(n, self.fixed_output_tokens) for n in self.input_tokens]
        elif sweep == OUTPUT_SWEEP:
            sizes = [(self.fixed_input_tokens, n) for n in self.output_tokens]
        else:
            raise ValueError(f"unknown sweep {sweep!r}")
        return [
            LLMCase(sweep, source, n_in, n_out, name, batch_size=b, concurrency=c)
            for name, source in map(split_model, self.models)
            for n_in, n_out in sizes
            for b in self.batch_sizes
            for c in self.concurrency
        ]

    def describe(self) -> str:
        def span(sizes: Sequence[int]) -> str:
            return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 2 else ",".join(map(str, sizes))

        text = (
            f"grid {self.name}: input {span(self.input_tokens)} (output "
            f"{self.fixed_output_tokens}), output {span(self.output_tokens)} (input "
            f"{self.fixed_input_tokens}); models {', '.join(self.models)}"
        )
        if self.batch_sizes != (1,):
            text += f"; batch sizes {','.join(map(str, self.batch_sizes))}"
        if self.concurrency != (1,):
            text += f"; concurrent requests {','.join(map(str, self.concurrency))}"
        return text

    def models_text(self) -> str:
        """``3 tiny models, 57 cases``: what choosing this grid means, for help texts."""
        n = len(self.models) * (len(self.input_tokens) + len(self.output_tokens))
        n *= len(self.batch_sizes) * len(self.concurrency)
        return f"{', '.join(m.rsplit('/', 1)[-1] for m in self.models)}; {n} cases"


GRIDS: dict[str, Grid] = {
    # The research's token sizes on the built-in models: runs on 2 CPU cores in minutes.
    "default": Grid("default", TINY_MODEL_NAMES, powers_of_two(8, 2048), powers_of_two(8, 4096)),
    # The research's full grid: its three 7B models (from the hub or a local mirror).
    "paper": Grid("paper", PAPER_MODELS, powers_of_two(8, 2048), powers_of_two(8, 4096)),
    # A smoke test of the whole path.
    "quick": Grid("quick", TINY_MODEL_NAMES, (8, 64, 512), (8, 64, 512)),
}


def split_model(spec: str) -> tuple[str, str]:
    """``NAME=SOURCE`` -> (name, source); a bare source gets a name that does not depend on
    where the model lies: a built-in or hub id as given, a folder by the hub id its config
    was saved from (``_name_or_path``), else by the folder's name.  So the same model in
    two directories, or on two machines, lines up in comparisons and routing."""
    name, sep, source = spec.partition("=")
    if sep and name.strip() and source.strip():
        return name.strip(), source.strip()
    return _default_name(spec), spec


def _default_name(source: str) -> str:
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return source  # a built-in name or a hub id
    try:
        saved = json.loads((folder / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        saved = None
    if isinstance(saved, str) and saved.count("/") == 1 and not Path(saved).exists():
        return saved  # "meta-llama/Llama-2-7b-hf": a hub id, not a path on that machine
    return folder.resolve().name


@dataclass(frozen=True)
class LLMCase:
    """One parametrized case; its ``id`` is what pytest shows: ``tiny-llama-in512-out32``.

    ``model`` is where it loads from, ``name`` what it is called (see ``split_model``)."""

    sweep: str
    model: str
    input_tokens: int
    output_tokens: int
    name: str = ""
    batch_size: int = 1  # prompts generated together in one call
    concurrency: int = 1  # requests sent at once to a server

    @property
    def queries(self) -> int:
        """Queries (prompt -> completion) one trial runs: the figures share its joules."""
        return self.batch_size * self.concurrency

    @property
    def model_name(self) -> str:
        return self.name or self.model

    @property
    def id(self) -> str:
        short = self.model_name.rstrip("/").rsplit("/", 1)[-1]
        text = f"{short}-in{self.input_tokens}-out{self.output_tokens}"
        # batch 1 keeps the id it always had, so it compares with runs before the axis
        if self.batch_size != 1:
            text += f"-bs{self.batch_size}"
        if self.concurrency != 1:
            text += f"-c{self.concurrency}"
        return text

    @property
    def positions(self) -> int:
        """Positions the case occupies at its last token: what the model's context must hold."""
        return self.input_tokens + self.output_tokens

    def labels(self) -> dict[str, str]:
        labels = {"sweep": self.sweep, "model": self.model_name}
        if self.model != self.model_name:
            labels["model_source"] = self.model
        if self.batch_size != 1:
            labels["batch_size"] = str(self.batch_size)
        if self.concurrency != 1:
            labels["concurrency"] = str(self.concurrency)
        return labels

    def __str__(self) -> str:
        return self.id


def parse_count_list(text: str) -> tuple[int, ...]:
    """Batch sizes or concurrent requests: ``1,8,32`` or ``1..64`` (powers of two)."""
    try:
        return parse_token_list(text, what="counts >= 1 such as 1,8,32 or 1..64")
    except ConfigError:
        raise ConfigError(f"expected counts >= 1 such as 1,8,32 or 1..64, got {text!r}") from None


def parse_token_list(
    text: str, what: str = "token counts >= 1 such as 8,64,512 or 8..2048"
) -> tuple[int, ...]:
    """``8,16,32`` or ``8..2048`` (powers of two between) or a mix."""
    bad = ConfigError(f"expected {what}, got {text!r}")
    sizes: list[int] = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        low_text, dots, high_text = part.partition("..")
        if not (low_text.isdecimal() and (not dots or high_text.isdecimal())):
            raise bad
        if dots:
            low, high = int(low_text), int(high_text)
            if low < 1 or high < low:
                raise bad
            sizes.extend(powers_of_two(low, high))
        else:
            sizes.append(int(low_text))
    if not sizes or any(n < 1 for n in sizes):
        raise bad
    return tuple(sorted(set(sizes)))


def make_grid(
    name: str,
    models: Sequence[str] | None = None,
    input_tokens: Sequence[int] | None = None,
    output_tokens: Sequence[int] | None = None,
    batch_sizes: Sequence[int] = (1,),
    concurrency: Sequence[int] = (1,),
) -> Grid:
    if name not in GRIDS:
        raise ConfigError(f"unknown grid {name!r}; choose one of: {', '.join(GRIDS)}")
    base = GRIDS[name]
    return Grid(
        name=name if not (models or input_tokens or output_tokens) else f"{name}, overridden",
        models=tuple(models) if models else base.models,
        input_tokens=tuple(input_tokens) if input_tokens else base.input_tokens,
        output_tokens=tuple(output_tokens) if output_tokens else base.output_tokens,
        fixed_output_tokens=base.fixed_output_tokens,
        fixed_input_tokens=base.fixed_input_tokens,
        batch_sizes=tuple(batch_sizes) or (1,),
        concurrency=tuple(concurrency) or (1,),
    )
