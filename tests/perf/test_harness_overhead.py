"""What the harness adds to a trial, against a bare ``model.generate`` loop on the same case.

Target: at most 3 % more wall time.  Both loops run side by side in one test,
interleaved round by round so that drift on a shared machine hits both alike:
``k`` bare ``model.generate`` calls and ``k`` trials of ``energy_benchmark``, in turn
first, the overhead the median of the rounds' ratios (a pair shares its stretch of the
machine's speed; the medians of each side alone may come from different stretches)
(meter windows, first-token mark, token checks, trial records, the stopping rule
after every trial, the resource probe, the busy-machine check's readings, the case's
reading of the machine's speed).  Five trials and no warm-up: the case's fixed costs
weigh the most here, more than in a user's case of 1 warm-up and up to 25 trials.  Run
with ``pytest tests/perf --benchmark-only``.

Where the loops run changes the figure, as "Producing wrong data without doing
anything obviously wrong!" (Mytkowicz et al., 2009) warns: the depth of the C stack
alone moved it between +1.3 % and +3.5 % (8 depths, one per run), and run inside
``benchmark.pedantic``'s own frames it read +3.3 to +5.0 % against +1.2 to +2.1 % in
the test's frame (the same code, 2026-11-24).  So the rounds run in the test's frame, as
a user's test calls the harness, each at a depth drawn at random (0-15 extra frames,
the same for both loops), and the budget is judged on the median over those depths;
``benchmark.pedantic`` then times one more round, for the benchmark table only.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy import open_meter
from pytest_llmenergy.controller.benchmark import CaseFeatures, CaseIdentity, EnergyBenchmark
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.llm.loader import load_model
from pytest_llmenergy.probes.background import BackgroundCpu

TRIALS_PER_ROUND = 5
ROUNDS = 16
MAX_EXTRA_DEPTH = 15
OVERHEAD_BUDGET = 0.03


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llm-cache")


@pytest.mark.parametrize(
    ("model_name", "n_in", "n_out"), [("tiny-llama", 32, 32), ("tiny-llama", 512, 128)]
)
def test_harness_overhead_per_trial(
    benchmark: Any, perf_budget: Any, cache_dir: Path, model_name: str, n_in: int, n_out: int
) -> None:
    model = load_model(model_name, cache_dir=cache_dir)
    ids = model.prompt_ids(n_in)
    hf = model.model
    pad = model.tokenizer.pad_token_id
    meter = open_meter("estimate")
    # The busy-machine check reads the machine's CPU time around every trial, as by default;
    # judged against 100 % so that no trial is repeated (a repeat is the check at work on
    # this shared machine, not its cost).
    options = ControllerSettings(
        min_trials=TRIALS_PER_ROUND, max_trials=TRIALS_PER_ROUND, warmup=0, max_background=1.0
    )
    background = BackgroundCpu()
    bare_s: list[float] = []
    harness_s: list[float] = []

    def bare_loop() -> None:
        import torch

        t0 = time.perf_counter()
        for _ in range(TRIALS_PER_ROUND):
            with torch.inference_mode():
                out = hf.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=n_out,
                    min_new_tokens=n_out,
                    do_sample=False,
                    pad_token_id=pad,
                )
            assert out.shape[1] == n_in + n_out
        bare_s.append((time.perf_counter() - t0) / TRIALS_PER_ROUND)

    def harness_loop() -> None:
        t0 = time.perf_counter()
        bench = EnergyBenchmark(
            meter,
            options,
            CaseIdentity("perf", "perf", {}),
            lambda r: None,
            CaseFeatures(background=background),
        )
        result = bench(model.generate, ids, n_out, input_tokens=n_in, output_tokens=n_out)
        harness_s.append((time.perf_counter() - t0) / TRIALS_PER_ROUND)
        assert len(result.trials) == TRIALS_PER_ROUND and result.has_phases
        assert result.reference_s is not None and result.reference_s > 0  # it was read

    depths = random.Random(20261124)

    def both() -> None:
        first, second = (bare_loop, harness_loop) if len(bare_s) % 2 else (harness_loop, bare_loop)
        first()
        second()

    def one_round() -> None:
        call = both
        for _ in range(depths.randint(0, MAX_EXTRA_DEPTH)):
            call = functools.partial(call)  # each one a frame of the C stack
        call()

    one_round()  # warm-up of both paths, not counted
    bare_s.clear()
    harness_s.clear()
    for _ in range(ROUNDS):
        one_round()
    assert len(bare_s) == len(harness_s) == ROUNDS
    bare, harness = statistics.median(bare_s), statistics.median(harness_s)
    overhead = statistics.median(h / b for h, b in zip(harness_s, bare_s)) - 1.0
    benchmark.pedantic(one_round, rounds=1, iterations=1)  # the table's round, not judged
    benchmark.extra_info.update(
        bare_trial_ms=round(bare * 1e3, 3),
        harness_trial_ms=round(harness * 1e3, 3),
        overhead_pct=round(100 * overhead, 2),
    )
    print(
        f"\n{model_name} in{n_in} out{n_out}: bare generate {bare * 1e3:.2f} ms, harness trial "
        f"{harness * 1e3:.2f} ms per trial (medians of {ROUNDS} rounds: "
        f"{harness / bare - 1:+.2%}); overhead {overhead:+.2%} (median of the rounds' ratios)"
    )
    meter.close()
    perf_budget(
        f"harness overhead per trial, {model_name} {n_in}+{n_out} (bare generate "
        f"{bare * 1e3:.2f} ms, harness trial {harness * 1e3:.2f} ms)",
        overhead,
        OVERHEAD_BUDGET,
        "%",
    )
