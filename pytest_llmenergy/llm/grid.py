"""Which model x token-size cases the benchmark suite runs.

Two sweeps, as in the research: input tokens varied at a fixed output length, and
output tokens varied at a fixed input length.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import values
from ..axes import LOCAL_MODELS, SERVERS, TORCHRUN, Axis, case_id
from ..errors import ConfigError
from .loader import PARALLEL

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
    """The cases as a product of axes, per sweep: the input sweep varies the input
    tokens at one output length, the output sweep the other way round."""

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
    # Axes added through the pytest_llmenergy_axes hook, with their chosen values.
    extra: tuple[tuple[Axis, tuple[Any, ...]], ...] = ()

    def axes(self, sweep: str) -> list[tuple[Axis, tuple[Any, ...]]]:
        """Every axis of the sweep with its values, in the order of the case ids."""
        if sweep == INPUT_SWEEP:
            ins, outs = self.input_tokens, (self.fixed_output_tokens,)
        elif sweep == OUTPUT_SWEEP:
            ins, outs = (self.fixed_input_tokens,), self.output_tokens
        else:
            raise ValueError(f"unknown sweep {sweep!r}")
        return [
            (MODEL_AXIS, tuple(map(split_model, self.models))),
            (INPUT_AXIS, ins),
            (OUTPUT_AXIS, outs),
            (BATCH_AXIS, self.batch_sizes),
            (CONCURRENCY_AXIS, self.concurrency),
            *self.extra,
        ]

    def cases(self, sweep: str) -> list[LLMCase]:
        axes = self.axes(sweep)
        n_builtin = len(axes) - len(self.extra)
        cases = []
        for point in itertools.product(*(chosen for _, chosen in axes)):
            (name, source), n_in, n_out, b, c = point[:n_builtin]
            extra = tuple((axis, v) for (axis, _), v in zip(self.extra, point[n_builtin:]))
            cases.append(LLMCase(sweep, source, n_in, n_out, name, b, c, extra))
        return cases

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
        for axis, chosen in self.extra:
            text += f"; {axis.describe(chosen)}"
        return text

    def n_cases(self) -> int:
        return sum(
            len(self.models) * len(sizes) for sizes in (self.input_tokens, self.output_tokens)
        ) * _product(len(v) for _, v in self.axes(INPUT_SWEEP)[3:])

    def models_text(self) -> str:
        """``3 tiny models, 57 cases``: what choosing this grid means, for help texts."""
        return f"{', '.join(m.rsplit('/', 1)[-1] for m in self.models)}; {self.n_cases()} cases"


def _product(counts: Any) -> int:
    out = 1
    for n in counts:
        out *= n
    return out


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

    ``model`` is where it loads from, ``name`` what it is called (see ``split_model``).
    Id and labels are made by the axes; ``value(name)`` reads any axis, a conftest's
    included."""

    sweep: str
    model: str
    input_tokens: int
    output_tokens: int
    name: str = ""
    batch_size: int = 1  # prompts generated together in one call
    concurrency: int = 1  # requests sent at once to a server
    extra: tuple[tuple[Axis, Any], ...] = ()  # the hook's axes and this case's values

    @property
    def queries(self) -> int:
        """Queries (prompt -> completion) one trial runs: the figures share its joules."""
        return self.batch_size * self.concurrency

    @property
    def model_name(self) -> str:
        return self.name or self.model

    def axis_values(self) -> list[tuple[Axis, Any]]:
        return [
            (MODEL_AXIS, (self.model_name, self.model)),
            (INPUT_AXIS, self.input_tokens),
            (OUTPUT_AXIS, self.output_tokens),
            (BATCH_AXIS, self.batch_size),
            (CONCURRENCY_AXIS, self.concurrency),
            *self.extra,
        ]

    def value(self, axis: str) -> Any:
        """The case's value on the axis of that name (``case.value("temperature")``)."""
        for a, v in self.axis_values():
            if a.name == axis:
                return v[1] if a is MODEL_AXIS else v
        known = ", ".join(a.name for a, _ in self.axis_values())
        raise KeyError(f"case {self.id} has no axis {axis!r}; its axes: {known}")

    @property
    def id(self) -> str:
        return case_id(axis.id_of(v) for axis, v in self.axis_values())

    @property
    def positions(self) -> int:
        """Positions the case occupies at its last token: what the model's context must hold."""
        return self.input_tokens + self.output_tokens

    def labels(self) -> dict[str, str]:
        labels = {"sweep": self.sweep}
        for axis, v in self.axis_values():
            labels.update(axis.labels_of(v))
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
    extra: Sequence[tuple[Axis, tuple[Any, ...]]] = (),
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
        extra=tuple(extra),
    )


# -- the case axes ---------------------------------------------------------------------


def _model_id(value: tuple[str, str]) -> str:
    return value[0].rstrip("/").rsplit("/", 1)[-1]


def _model_labels(name: str, value: tuple[str, str]) -> dict[str, str]:
    """The name, and where it loads from when that differs (a folder, ``NAME=SOURCE``)."""
    model_name, source = value
    return {name: model_name, **({"model_source": source} if source != model_name else {})}


def _no_labels(name: str, value: Any) -> dict[str, str]:
    """Token counts are the result's own fields (``input_tokens``), not labels."""
    return {}


def _models(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(map(split_model, values.names(text)))


MODEL_AXIS = Axis(
    "model",
    "models",
    _models,
    tuple(map(split_model, TINY_MODEL_NAMES)),
    id_part=_model_id,
    flag="--llm-model",
    labels=_model_labels,
)
INPUT_AXIS = Axis(
    "input_tokens",
    "input tokens",
    parse_token_list,
    powers_of_two(8, 2048),
    id_part="in{}",
    flag="--llm-input-tokens",
    labels=_no_labels,
)
OUTPUT_AXIS = Axis(
    "output_tokens",
    "output tokens",
    parse_token_list,
    powers_of_two(8, 4096),
    id_part="out{}",
    flag="--llm-output-tokens",
    labels=_no_labels,
)
BATCH_AXIS = Axis(
    "batch_size",
    "batch sizes",
    parse_count_list,
    (1,),
    id_part="bs{}",
    applies=LOCAL_MODELS,
    flag="--llm-batch-sizes",
    quiet=1,  # batch 1 keeps the id it always had, so it compares with runs before the axis
)
CONCURRENCY_AXIS = Axis(
    "concurrency",
    "concurrent requests",
    parse_count_list,
    (1,),
    id_part="c{}",
    applies=SERVERS,
    flag="--llm-concurrency",
    quiet=1,
)
CASE_AXES: tuple[Axis, ...] = (MODEL_AXIS, INPUT_AXIS, OUTPUT_AXIS, BATCH_AXIS, CONCURRENCY_AXIS)
# One value per session: every case of a torchrun session runs in the same layout, so it
# is no part of the ids; the run file keeps it in its torchrun record.
PARALLEL_AXIS = Axis(
    "parallel",
    "parallel layout",
    lambda text: (values.choice(PARALLEL)(text),),
    ("none",),
    id_part="",
    applies=TORCHRUN,
    flag="--llm-parallel",
    quiet="none",
)
