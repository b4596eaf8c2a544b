"""How big each stage of the proof is: on a real GPU (``h100``), and against the
stand-ins on a CPU (``smoke``: the same stages, a tiny model, seconds each)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Every size a stage takes; a stage's cap bounds its subprocess (seconds)."""

    name: str
    device: str  # where the models run
    dtype: str
    model: str  # the suite's and the frontier's
    batch_sizes: tuple[int, ...]
    input_tokens: int  # the input sweep's one size (output: the grid's fixed 32)
    output_tokens: int  # the output sweep's one size (input: the grid's fixed 32)
    case_max_time_s: float  # --energy-max-time of each suite case
    idle_s: float  # the probe's idle stretch (and the idle after the load)
    load_s: float  # the probe's loaded stretch
    windows_s: tuple[float, ...]
    power_limits: str  # --energy-gpu-power-limits, beside the default limit
    frontier_batch: int
    frontier_output_tokens: int
    gate_models: tuple[str, str]  # (unchanged: A/A, changed: the injected regression)
    gate_share: float
    # the campaign's cases, for each model: every input size at every batch size, each
    # generating ``gate_output_tokens``
    gate_input_tokens: tuple[int, ...]
    gate_batch_sizes: tuple[int, ...]
    gate_output_tokens: int
    work_model: str
    caps_s: dict[str, float]
    # the suite's case at this batch again in compiled execution (None: not run)
    compiled_batch: int | None = None
    # every pytest session's further options (a stand-in run on a shared CPU: keep the
    # trials another process disturbed, bound the trials) and llmenergy ab's own
    extra_args: tuple[str, ...] = ()
    ab_args: tuple[str, ...] = ()
    gate_args: tuple[str, ...] = ()  # the ab sides' pytest options
    suite_files: tuple[str, ...] = ("benchmarks/",)


H100 = Plan(
    name="h100",
    device="cuda",
    dtype="bfloat16",
    model="random-llama-3.1-8b",
    batch_sizes=(1, 8, 64),
    input_tokens=512,
    output_tokens=128,
    case_max_time_s=10.0,
    idle_s=10.5,
    load_s=10.5,
    windows_s=(0.05, 0.2, 1.0, 3.0, 10.0),
    power_limits="70%,50%",
    frontier_batch=8,
    frontier_output_tokens=64,
    gate_models=("random-llama-3.2-1b", "random-llama-3.1-8b"),
    gate_share=0.05,
    gate_input_tokens=(16, 32, 64, 128, 256, 512),  # x 2 batch sizes: 12 cases a model
    gate_batch_sizes=(1, 8),
    gate_output_tokens=16,
    work_model="tiny-llama",
    caps_s={"suite": 110.0, "compiled": 150.0, "settings": 60.0, "gate": 420.0, "work": 40.0},
    compiled_batch=8,
    # one process pair: on a GPU counter the processes hardly differ, and a second pair
    # would double the campaign (24 cases x 2 sides x 3-4 pairs of 3 s windows)
    ab_args=("--processes", "1", "--confirm", "off"),
    suite_files=("benchmarks/test_output_tokens.py",),
)

SMOKE = Plan(
    name="smoke",
    device="cpu",
    dtype="float32",
    model="tiny-llama",
    batch_sizes=(1, 2),
    input_tokens=16,
    output_tokens=8,
    case_max_time_s=15.0,  # the default rule's
    idle_s=5.0,  # room for idle windows of 3 s
    load_s=8.0,  # room for the trials' 3 s windows on the stand-in's 100 ms counter
    windows_s=(0.05, 0.2, 1.0, 3.0),
    power_limits="70%",
    frontier_batch=1,
    frontier_output_tokens=8,
    gate_models=("tiny-llama", "tiny-mistral"),
    # the path, not the precision (that is the h100 plan's): a regression this CPU's
    # speed cannot hide (+50 % read +27 % in one case beside an A/A case's +16 %)
    gate_share=1.0,
    gate_input_tokens=(8, 16),
    gate_batch_sizes=(1,),
    gate_output_tokens=32,
    work_model="tiny-llama",
    caps_s={"suite": 120.0, "compiled": 0.0, "settings": 90.0, "gate": 240.0, "work": 120.0},
    # trials enough for a case to converge on a busy CPU (the 15 s budget bounds them)
    extra_args=("--energy-max-background=off", "--energy-max-trials=12", "--energy-warmup=0"),
    ab_args=("--processes", "1", "--confirm", "off"),
    gate_args=(
        "--energy-max-background=off",
        "--energy-max-trials=4",
        "--energy-max-time=7",
        "--energy-warmup=0",
    ),
    suite_files=("benchmarks/test_input_tokens.py",),
)

PLANS = {p.name: p for p in (H100, SMOKE)}
