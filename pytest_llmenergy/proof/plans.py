"""How big each stage of the proof is: on a real GPU (``h100``), and against the
stand-ins on a CPU (``smoke``: the same stages, a tiny model, seconds each).

A GPU is lent for minutes at a time (15 minutes of device time, start-up included, one
H200 on the day this was written), so a plan is cut into parts, each one device call
(``llmenergy proof --part N``) with a budget of its own, and every stage carries its cap
(what its subprocesses may take) beside the estimate the cap was sized from and where
that estimate comes from.  The caps of a part add to at most ``CAPS_SHARE`` of its
budget: the rest is the room for what no estimate sees (a stopped stage's grace, a slow
start), so that a part that runs as estimated is never cut at its budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Every stage, in the order they run: a stage reads only files of stages before it.
STAGES = ("meter", "suite", "settings", "compiled", "work", "gate")
# A part's stage caps add to at most this share of its budget.
CAPS_SHARE = 0.85
# The longest device call a part may need, its budget included (8 minutes).
MAX_CALL_S = 480.0


@dataclass(frozen=True)
class StageTime:
    """How long a stage may take (``cap_s``: its subprocesses' time limit) and how long
    it was estimated to take, with the measurement the estimate rests on, so the first
    run on a new GPU says which estimate was wrong, not only that a stage was cut."""

    cap_s: float
    estimate_s: float
    source: str


@dataclass(frozen=True)
class Part:
    """Stages run in one device call, within ``budget_s`` of wall time."""

    stages: tuple[str, ...]
    budget_s: float


@dataclass(frozen=True)
class Plan:
    """Every size a stage takes; a stage's cap bounds its subprocess (seconds)."""

    name: str
    device: str  # where the models run
    dtype: str
    model: str  # the suite's and the settings stage's
    batch_sizes: tuple[int, ...]
    input_tokens: int  # the input sweep's one size (output: the grid's fixed 32)
    output_tokens: int  # the output sweep's one size (input: the grid's fixed 32)
    case_max_time_s: float  # --energy-max-time of each suite case
    idle_s: float  # the probe's idle stretch (and the idle after the load)
    load_s: float  # the probe's loaded stretch
    windows_s: tuple[float, ...]
    power_limits: str  # --energy-gpu-power-limits, beside the default limit
    frontier_batch: int  # the settings stage's one case: the suite's shape at this batch
    gate_models: tuple[str, str]  # (unchanged: A/A, changed: the injected regression)
    gate_share: float
    # the campaign's cases, for each model: every input size at every batch size (the
    # input sweep: 32 output tokens each)
    gate_input_tokens: tuple[int, ...]
    gate_batch_sizes: tuple[int, ...]
    work_model: str
    times: Mapping[str, StageTime]
    parts: tuple[Part, ...]
    # the suite's compiled case at this batch beside the settings stage's eager one at
    # the default power limit (None: not compared; frontier_batch must be the same)
    compiled_batch: int | None = None
    # every pytest session's further options (a stand-in run on a shared CPU: keep the
    # trials another process disturbed, bound the trials) and llmenergy ab's own
    extra_args: tuple[str, ...] = ()
    ab_args: tuple[str, ...] = ()
    gate_args: tuple[str, ...] = ()  # the ab sides' pytest options
    settings_args: tuple[str, ...] = ()  # the settings session's (after extra_args)
    suite_files: tuple[str, ...] = ("benchmarks/",)

    @property
    def caps_s(self) -> dict[str, float]:
        return {name: t.cap_s for name, t in self.times.items()}

    def part_stages(self, number: int | None) -> tuple[str, ...]:
        """The stages of part ``number`` (1-based), or of every part (None)."""
        if number is None:
            return tuple(s for s in STAGES if any(s in p.stages for p in self.parts))
        return self.parts[number - 1].stages

    def budget_s(self, number: int | None) -> float:
        """Part ``number``'s budget, or every part's together (one long call)."""
        if number is None:
            return sum(p.budget_s for p in self.parts)
        return self.parts[number - 1].budget_s

    def caps_sum_s(self, stages: Sequence[str]) -> float:
        return sum(self.times[s].cap_s for s in stages)

    def estimate_sum_s(self, stages: Sequence[str]) -> float:
        return sum(self.times[s].estimate_s for s in stages)


# -- h100: one H100 or H200, Llama-3.1-8B in bf16 ---------------------------------------------
# Every estimate below rests on the first H100's three runs (docs/hardware-proof.md, their
# files beside it: "Wall time by stage" in each proof.md, the run files' wall_seconds):
#   run 1: meter 24.3 s, suite 95.0 s (3 cases of 12.2-14.9 s wall each, so 53 s for the
#   session's start and the 8B model's build), settings 58.3 s (3 settings of one case),
#   work 36.3 s; runs 1-3: work 36.3, 37.9, 43.7 s; run 3: gate 147.7 s for two passes of
#   2 + 1 cases in 4 sessions, about 50 s of them trials (16 + 4 pairs of ~1.2 s calls).
# The H200 lent on the day is an H100's compute with more memory bandwidth: no slower.
_SESSION_8B_S = 53.0  # run 1's suite: 95.0 s - 41.9 s of its cases, a cold first session
_COMPILE_S = 33.0  # one shape's compile and capture (unmeasured on a GPU; see the suite's)
H100_TIMES = {
    "meter": StageTime(
        28.0,
        25.0,
        "run 1: 24.3 s; not a subprocess: its recording (idle_s + load_s + 3 s idle) and "
        "the meter's opening bound it",
    ),
    "suite": StageTime(
        213.0,
        _SESSION_8B_S + 3 * _COMPILE_S + 3 * 13.0,
        "the session and the 8B build: 53 s (run 1's suite); each of 3 shapes compiled and "
        "captured before its first window: 33 s, not measured on a GPU (the H100's runs "
        "predate compiled decode; transformers#34923 reads 24-27 s a decode-step "
        "compile on an A100, MindAct#1718 35 s for Llama-2-7B); each case at "
        "--energy-max-time=8: 13 s (run 1: 12.2-14.9 s wall at 10 s); the cap leaves "
        "each compile up to 40 s",
    ),
    "settings": StageTime(
        62.0,
        20.0 + 3 * 10.5,
        "run 1: 58.3 s for 3 settings of a 1.6 s call, so ~20 s of session; here 3 "
        "settings x (a 2.5 s warm-up call, 2 trials of one 2.5 s eager call, 2 prefill "
        "windows of 1 s, the limit's change)",
    ),
    "compiled": StageTime(0.0, 0.0, "no subprocess: reads suite.json and settings.json"),
    "work": StageTime(52.0, 45.0, "runs 1-3: 36.3, 37.9 and 43.7 s"),
    "gate": StageTime(
        355.0,
        46.0 + 24 * 2 * (0.5 + 2 * 1.3 + 2 * 1.02 + 0.2),
        "both sides' sessions and builds (1B, 8B) and the comparison: 46 s (run 3: 147.7 "
        "s in 4 sessions, ~50 s of it trials); then 24 cases x 2 sides x (a warm-up call "
        "of 0.5 s, 2 trials of 1.3 s (1 s windows and half a 0.35-0.7 s call), 2 "
        "prefill-pass windows of 1.02 s, 0.2 s of turns): every case one ABBA block. The "
        "same options on the Hopper stand-in, this project's CPU: 8.4-9.1 s a case, both "
        "sides",
    ),
}

H100 = Plan(
    name="h100",
    device="cuda",
    dtype="bfloat16",
    model="random-llama-3.1-8b",
    batch_sizes=(1, 8, 64),
    input_tokens=512,
    output_tokens=128,
    case_max_time_s=8.0,
    idle_s=10.5,
    load_s=10.5,
    windows_s=(0.05, 0.2, 1.0, 3.0, 10.0),
    power_limits="70%,50%",
    frontier_batch=8,
    gate_models=("random-llama-3.2-1b", "random-llama-3.1-8b"),
    # "the GPU kept busy for 30 % of each forward pass": run 3 read +17.7 % energy per
    # token at 10 %; a 2-pair case of 1 s windows cannot tell a +10 % one from noise
    gate_share=0.30,
    gate_input_tokens=(16, 32, 64, 128, 256, 512),  # x 2 batch sizes: 12 cases a model
    gate_batch_sizes=(1, 8),
    work_model="tiny-llama",
    times=H100_TIMES,
    # two device calls of at most 7 minutes: the 8B's figures, then the campaign
    parts=(
        Part(("meter", "suite", "settings", "compiled", "work"), 420.0),
        Part(("gate",), 420.0),
    ),
    compiled_batch=8,
    # one process pair: on a GPU counter the processes hardly differ, and a second pair
    # would double the campaign
    ab_args=("--processes", "1", "--confirm", "off"),
    # the campaign sized to its cap: windows of 1 s (10 counter refreshes: the energy
    # target that sets them is 30 %), one ABBA block (2 pairs) a case, whose verdict
    # borrows the 24 cases' pooled noise (sessions.POOL_DF), 2 prefill-pass windows
    gate_args=(
        "--energy-min-trials=2",
        "--energy-max-trials=2",
        "--energy-max-time=0",
        "--energy-ci-target=energy_j:30%",
    ),
    # the settings' points: 2 trials of one eager call each (windows of 1.5 s, shorter
    # than the 2.5 s call); the frontier's figures are not judged here
    settings_args=("--energy-min-trials=2", "--energy-max-time=3"),
    suite_files=("benchmarks/test_output_tokens.py",),
)

# -- smoke: the stand-ins on this project's 2-core CI VM ------------------------------------
SMOKE_TIMES = {  # the slow tier's runs: against the Hopper stand-in, and the basic one
    "meter": StageTime(20.0, 16.0, "16 s against both (5 + 8 + 2.5 s of recording)"),
    "suite": StageTime(120.0, 45.0, "Hopper stand-in 45 s (3 s windows), basic 16 s"),
    "settings": StageTime(90.0, 53.0, "Hopper stand-in 53 s, basic 12 s"),
    "compiled": StageTime(0.0, 0.0, "not in this plan"),
    "work": StageTime(120.0, 19.0, "Hopper stand-in 19 s, basic 11 s"),
    "gate": StageTime(
        240.0,
        110.0,
        "basic stand-in 27 s; the Hopper stand-in's 4 cases x 2 sides of 3 s windows: 90-114 s",
    ),
}

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
    gate_models=("tiny-llama", "tiny-mistral"),
    # the path, not the precision (that is the h100 plan's): a regression this CPU's
    # speed cannot hide (+50 % read +27 % in one case beside an A/A case's +16 %)
    gate_share=1.0,
    gate_input_tokens=(8, 16),
    gate_batch_sizes=(1,),
    work_model="tiny-llama",
    times=SMOKE_TIMES,
    parts=(
        Part(("meter", "suite", "settings", "compiled", "work"), 420.0),
        Part(("gate",), 300.0),
    ),
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
