"""The models and their cases: grid, models, token sizes, batch sizes, added axes, and
how a model is loaded (dtype, device, remote code, tensor parallel).

``CasePlan`` parametrizes the tests over this section's grid; the ``llm_pool`` fixture
loads models with its settings; a server target (``serving.py``) reads its one model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import values
from ..axes import Axis, parse_axis_choices
from ..errors import ConfigError
from ..llm.compiled import EXECUTIONS, execution_conflict
from ..llm.grid import (
    BATCH_AXIS,
    CONCURRENCY_AXIS,
    GRIDS,
    INPUT_AXIS,
    OUTPUT_AXIS,
    TINY_MODEL_NAMES,
    Grid,
    make_grid,
)
from ..llm.inject import WORK_INJECTIONS
from ..llm.loader import DTYPES, PARALLEL
from .option_rows import Option, Section


@dataclass(frozen=True)
class LLMSettings:
    grid_name: str = "default"
    models: tuple[str, ...] | None = None  # None: the grid's
    input_tokens: tuple[int, ...] | None = None
    output_tokens: tuple[int, ...] | None = None
    dtype: str = "auto"
    device: str = "auto"
    trust_remote_code: bool = False
    allow_beyond_context: bool = False  # rotary/ALiBi models may run cases past their context
    parallel: str = "none"  # under torchrun: none (a whole model per rank) or tp
    batch_sizes: tuple[int, ...] = (1,)  # prompts per generate call
    concurrency: tuple[int, ...] = (1,)  # requests at once to a server
    # A known regression added to the models' work, to measure what a gate can see.
    # one share for every model, or model name -> share (the others unchanged)
    inject_regression: float | Mapping[str, float] = 0.0
    # Changes of a known kind to every linear layer (llm/inject.py's WORK_INJECTIONS).
    inject_work: tuple[str, ...] = ()
    kv_cache: bool = True  # off: generate without a KV cache, as the research did
    # auto (compiled on a CUDA GPU, else eager), eager, or compiled (llm/compiled.py)
    execution: str = "auto"
    # (I, N): run the I-th of N parts of the session's cases (a job array's task)
    shard: tuple[int, int] | None = None
    # --llm-axis NAME=VALUES: values of the axes conftests add (pytest_llmenergy_axes)
    axis_choices: tuple[tuple[str, str], ...] = ()
    # those axes with their values, set at configure once the hook has answered
    extra_axes: tuple[tuple[Axis, tuple[Any, ...]], ...] = ()
    grid: Grid = field(init=False, compare=False)

    def __post_init__(self) -> None:
        conflict = execution_conflict(
            self.execution,
            kv_cache=self.kv_cache,
            parallel=self.parallel,
            device=self.device,
            injected=bool(self.inject_regression) or bool(self.inject_work),
        )
        if conflict:
            raise ConfigError(conflict)
        grid = make_grid(
            self.grid_name,
            self.models,
            self.input_tokens,
            self.output_tokens,
            self.batch_sizes,
            self.concurrency,
            self.extra_axes,
        )
        object.__setattr__(self, "grid", grid)


# -- options -----------------------------------------------------------------------------
def _model_choices() -> list[str]:
    from ..llm.tiny import REAL_SIZE_MODELS

    return [*TINY_MODEL_NAMES, *REAL_SIZE_MODELS, "a Hugging Face id", "a local path"]


def _injected(text: str) -> float | dict[str, float]:
    """``25%`` for every model, or ``tiny-llama=25%,tiny-mistral=10%`` for those only."""
    if text.strip().lower() in ("off", "none", "no", "0"):
        return 0.0
    if "=" not in text:
        return _share(text)
    out: dict[str, float] = {}
    for part in text.split(","):
        model, _, share = part.partition("=")
        if not model.strip() or not share:
            raise ConfigError(
                f"expected MODEL=SHARE pairs such as tiny-llama=25%,tiny-mistral=10%, got {text!r}"
            )
        out[model.strip()] = _share(share)
    return out


def _shard(text: str) -> tuple[int, int] | None:
    """``2/3``: the second of three parts; ``off`` or ``1/1``: all cases."""
    if text.strip().lower() in ("off", "none", "all"):
        return None
    part, slash, total = text.partition("/")
    try:
        i, n = int(part), int(total)
    except ValueError:
        i = n = 0
    if not slash or not 1 <= i <= n or n > 10_000:
        raise ConfigError(
            f"expected a part such as 2/3 (the second of three, 1 <= I <= N), got {text!r}"
        )
    return None if n == 1 else (i, n)


def _work_injections(text: str) -> tuple[str, ...]:
    """``linear-twice`` or ``linear-slow`` (or both, comma-separated), or off."""
    if text.strip().lower() in ("off", "none", "no", ""):
        return ()
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in WORK_INJECTIONS]
    if unknown:
        raise ConfigError(
            f"unknown work injection {unknown[0]!r}; choose from: {', '.join(WORK_INJECTIONS)}"
        )
    return kinds


def _share(text: str) -> float:
    parsed = values.split_number(text)
    if not parsed or parsed[1] not in ("", "%") or parsed[0] <= 0 or parsed[0] == float("inf"):
        raise ConfigError(f"expected a regression such as 25% or 0.25, or off, got {text!r}")
    return parsed[0] / 100 if parsed[1] == "%" else parsed[0]


LLM_OPTIONS = Section(
    "llm",
    "Models and cases",
    LLMSettings,
    (
        Option(
            "--llm-model",
            "models",
            values.names,
            "MODEL",
            "model to benchmark: {choices} (repeatable)",
            choices=_model_choices,
            default_text="the grid's models",
            multiple=True,
            ini_name="llmenergy_models",
        ),
        Option(
            "--llm-input-tokens",
            "input_tokens",
            INPUT_AXIS.parse,
            "LIST",
            "sizes of the input sweep, e.g. 8,64,512 or 8..2048 (powers of two)",
            default_text="the grid's",
        ),
        Option(
            "--llm-output-tokens",
            "output_tokens",
            OUTPUT_AXIS.parse,
            "LIST",
            "sizes of the output sweep, e.g. 8,64,512 or 8..4096 (powers of two)",
            default_text="the grid's",
        ),
        Option(
            "--llm-grid",
            "grid_name",
            values.choice(tuple(GRIDS)),
            "NAME",
            "case grid: {choices}",
            choices=lambda: [f"{name} ({grid.models_text()})" for name, grid in GRIDS.items()],
        ),
        Option(
            "--llm-dtype",
            "dtype",
            values.choice(DTYPES),
            "DTYPE",
            "model weights' dtype: {choices}",
            choices=lambda: DTYPES,
        ),
        Option(
            "--llm-device",
            "device",
            values.text,
            "DEVICE",
            "where the model runs: auto (device_map=auto with a GPU, else cpu), cpu, cuda, "
            "cuda:N, mps",
        ),
        Option(
            "--llm-trust-remote-code",
            "trust_remote_code",
            values.switch,
            "on|off",
            "allow models whose repository ships Python code to run it",
            const="on",
        ),
        Option(
            "--llm-allow-beyond-context",
            "allow_beyond_context",
            values.switch,
            "on|off",
            "let models with rotary (RoPE) or ALiBi positions run cases whose input + output "
            "tokens exceed their context (the research ran Llama-2-7B at 4128 of 4096); "
            "off: such a case stops the session at start",
            const="on",
        ),
        Option(
            "--llm-inject-regression",
            "inject_regression",
            _injected,
            "SHARE",
            "slow every model down on purpose: after each forward pass, extra CPU work of "
            "SHARE times the pass's own CPU time (25%: about +25 % time, and energy on CPU "
            "meters; on a GPU, the GPU kept multiplying for SHARE of each pass's time), to "
            "learn which regressions a gate finds on this runner "
            "(llmenergy gatecheck); MODEL=SHARE,... slows those models only; never in a baseline",
            default_text="off",
            testing=True,
        ),
        Option(
            "--llm-inject-work",
            "inject_work",
            _work_injections,
            "KIND",
            "change every linear layer of every model on purpose, to see whether a failed gate "
            "says why: {choices} (comma-separated for several); never in a baseline",
            choices=lambda: tuple(WORK_INJECTIONS),
            default_text="off",
            testing=True,
        ),
        Option(
            "--llm-shard",
            "shard",
            _shard,
            "I/N",
            "run the I-th of N parts of the session's energy cases (1 <= I <= N), balanced by "
            "their tokens and the same on every machine, so that a Slurm job array, a CI "
            "matrix or an indexed job runs one grid across machines; llmenergy merge joins "
            "the parts' runs; other tests run in part 1",
            default_text="all cases",
        ),
        Option(
            "--llm-kv-cache",
            "kv_cache",
            values.switch,
            "on|off",
            "generate with a KV cache (on, the default) or without one (off: every decoded "
            "token runs the model over the whole sequence again, as the research's scripts "
            "did; its labels record kv_cache=off)",
            default_text="on",
        ),
        Option(
            "--llm-execution",
            "execution",
            values.choice(EXECUTIONS),
            "MODE",
            "how models generate: compiled (a static KV cache of each case's size and the "
            "decode step compiled with torch.compile mode=reduce-overhead, CUDA graphs on a "
            "GPU, compiled unmeasured before each case's first window), eager (transformers' "
            "generate loop as it comes), or auto: compiled where the model runs on a CUDA GPU, "
            "eager elsewhere; cases run compiled are labelled execution=compiled; "
            "choices: {choices}",
            choices=lambda: EXECUTIONS,
        ),
        Option(
            "--llm-parallel",
            "parallel",
            values.choice(PARALLEL),
            "LAYOUT",
            "under torchrun: tp (the model split tensor-parallel over the ranks by transformers) "
            "or none (every rank runs a whole model); choices: {choices}",
            choices=lambda: PARALLEL,
        ),
        Option(
            "--llm-batch-sizes",
            "batch_sizes",
            BATCH_AXIS.parse,
            "LIST",
            "run every case at these batch sizes, e.g. 1,8,32 (ids get -bs8): a batch of "
            "distinct prompts of exactly the case's input tokens, each generating exactly its "
            "output tokens; per-query figures share the batch's joules, J/token sums its tokens",
        ),
        Option(
            "--llm-concurrency",
            "concurrency",
            CONCURRENCY_AXIS.parse,
            "LIST",
            "send this many requests at once to the server (--llm-endpoint or --llm-serve) per "
            "trial, e.g. 1,8 (ids get -c8); the window covers the whole burst",
        ),
        Option(
            "--llm-axis",
            "axis_choices",
            parse_axis_choices,
            "NAME=VALUES",
            "values of an axis a conftest or plugin adds through the pytest_llmenergy_axes "
            "hook, e.g. temperature=0,0.7 (repeatable): every case runs at each",
            default_text="the axis's own default",
            multiple=True,
        ),
    ),
)
