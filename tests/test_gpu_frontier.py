"""The time-energy frontier (issue 14, items 1, 3, 4, 5): a sweep on the fake A100 whose
physics gives the true time and energy of every setting, so the test knows the true
frontier, minimum-energy setting, bloat and lambda optimum, and checks the tool finds them;
and how the GPU is given back at the end of the session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.frontier import (
    Point,
    at_best_settings,
    bloat,
    frontier,
    frontiers,
    lam_best,
    pareto_front,
    setting_for,
    setting_policy,
    with_settings,
)
from pytest_llmenergy.storage.runfile import loads
from tests.fakes.gpu_project import QUERIES, TEST_FILE, FakeQuery, install_for_test

LIMITS_W = (400.0, 280.0, 160.0)  # 400 W: the default
LAM = 0.6
P_REF_W = 400.0


def truth_points(query: FakeQuery) -> list[Point]:
    return [
        Point(f"pl{w:g}W", *query.truth(w), default=w == 400.0, power_limit_w=w) for w in LIMITS_W
    ]


# -- the math, on the true points ------------------------------------------------------------
def test_pareto_bloat_and_lambda_on_known_points() -> None:
    pts = [Point("a", 1.0, 10.0, default=True), Point("b", 1.02, 8.0), Point("c", 1.5, 7.0)]
    pts.append(Point("d", 1.6, 9.0))  # slower and dearer than c: dominated
    assert [p.setting for p in pareto_front(pts)] == ["a", "b", "c"]
    assert bloat(pts, pts[0], 0.0).saved_j == 0.0
    five = bloat(pts, pts[0], 0.05)
    assert five.best.setting == "b" and five.saved_share == pytest.approx(0.2)
    assert lam_best(pts, 1.0, 10.0).setting == "c"
    assert lam_best(pts, 0.0, 10.0).setting == "a"


def test_a_batched_cases_point_has_its_intervals_on_the_scale_of_its_means() -> None:
    """Issue 46: a point's energy interval was ``CaseResult.energy``'s, over the trials'
    joules, beside a mean per query: a batch of 4 showed +-4x its interval."""
    import dataclasses

    from pytest_llmenergy.figures import FIGURES
    from pytest_llmenergy.frontier import SETTING_LABEL, point_of
    from tests.casefactory import make_case

    case = make_case([1.0, 1.1, 0.9, 1.05])
    trials = tuple(dataclasses.replace(t, queries=4) for t in case.trials)
    case = dataclasses.replace(
        case, trials=trials, queries=4, labels={**case.labels, SETTING_LABEL: "pl280W"}
    )
    point = point_of(case)
    assert point is not None
    energy, time = FIGURES["energy_j"].summary(case), FIGURES["time_s"].summary(case)
    assert energy is not None and time is not None
    assert point.energy_j == pytest.approx(energy.mean)
    assert point.energy_half_j == pytest.approx(energy.half_width)
    assert point.time_half_s == pytest.approx(time.half_width)


def test_prefill_and_decode_have_different_lambda_optima() -> None:
    """The physics: the cap stretches compute-bound prefill, hardly memory-bound decode."""
    prefill, decode = QUERIES
    f_pre = frontier("t", {}, 2048, 8, truth_points(prefill), lam=LAM, p_ref_w=P_REF_W)
    f_dec = frontier("t", {}, 8, 256, truth_points(decode), lam=LAM, p_ref_w=P_REF_W)
    assert f_pre.lam_best.setting == "pl280W" and f_dec.lam_best.setting == "pl160W"
    assert f_dec.bloat[1].best.setting == "pl280W"  # 5 %: decode loses energy, not time
    assert f_pre.bloat[1].saved_j == 0.0  # prefill: every cap costs more than 5 %
    rules = setting_policy([f_pre], "sys")[0]["rules"]
    assert rules == [{"setting": "pl280W", "power_limit_w": 280.0, "sm_clock": None}]


# -- the sweep, as users run it -------------------------------------------------------------
@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("LLMENERGY_GPU_STATE", str(tmp_path / "llmenergy-gpu-state.json"))
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "driver-state.json"))
    return install_for_test(monkeypatch)


SWEEP = (
    "-p",
    "no:randomly",
    "--energy-backend=nvml",
    "--energy-gpu-power-limits=280W,160W",
    f"--energy-route-lambda={LAM}",
    "--energy-min-trials=3",
    "--energy-max-trials=3",
    "--energy-warmup=1",
    "--energy-min-time=0",  # one call a trial: the stand-in's sleeps are ranked per call
)


@pytest.mark.serial  # sleeps' energies ranked to a few percent
def test_the_sweep_finds_the_true_frontier_and_gives_the_gpu_back(
    pytester: pytest.Pytester, gpu: Any
) -> None:
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    out = pytester.path / "frontier.json"
    result = pytester.runpytest(*SWEEP, f"--energy-frontier-json={out}", "--energy-json=run.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*GPU settings: 3 per case on gpu:0 NVIDIA A100*pl400W, pl280W, pl160W*",
            "*time-energy frontier over GPU settings*",
            "*GPU settings restored (session end)*power limit 400 W, clocks unlocked*",
        ]
    )
    result.assert_outcomes(passed=6)
    ids = {r.nodeid.split("[")[1] for r in result.reprec.getreports("pytest_runtest_logreport")}
    assert "fake-7b-in2048-out8-pl280W]" in ids and "fake-7b-in8-out256-pl400W]" in ids
    # the GPU as it was, and nothing left to restore
    board = gpu.fake.gpus[0]
    assert board.power_limit_mw == 400_000 and board.locked_clocks_mhz is None
    assert not (Path(str(pytester.path)) / "llmenergy-gpu-state.json").exists()

    data = json.loads(out.read_text())
    assert data["system"].endswith("nvidia-a100-sxm4-40gb__nvml")  # the hardware key
    by_case = {(c["input_tokens"], c["output_tokens"]): c for c in data["cases"]}
    for query in QUERIES:
        case = by_case[(query.input_tokens, query.output_tokens)]
        truth = {p.setting: p for p in truth_points(query)}
        for point in case["points"]:  # every setting measured as the physics says
            true = truth[point["setting"]]
            assert point["energy_j"] == pytest.approx(true.energy_j, rel=0.01)
            assert point["time_s"] == pytest.approx(true.time_s, rel=0.01)
        true_front = frontier(
            "t", {}, 0, 0, list(truth.values()), lam=LAM, p_ref_w=P_REF_W
        )  # the truth
        assert case["min_energy"] == true_front.min_energy.setting
        assert case["lambda_best"] == true_front.lam_best.setting
        assert case["pareto"] == [p.setting for p in true_front.pareto]
        assert [b["setting"] for b in case["bloat"]] == [b.best.setting for b in true_front.bloat]
        for found, true_bloat in zip(case["bloat"], true_front.bloat):
            assert found["saved_share"] == pytest.approx(true_bloat.saved_share, abs=0.01)
        assert case["p_ref_w"] == P_REF_W  # the GPU's highest limit, as Zeus prices time
    policies = {p["sweep"]: p for p in data["policies"]}
    assert setting_for(policies["input"], 2048) == "pl280W"
    assert setting_for(policies["output"], 256) == "pl160W"

    # every trial carries the telemetry; the cap shows as a lower clock and its reason
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    capped = [c for c in run.cases if c.labels["gpu_setting"] == "pl160W"]
    default = [c for c in run.cases if c.labels["gpu_setting"] == "pl400W"]
    for case in capped:
        for trial in case.trials:  # the setting, read on every trial, and what it did
            assert trial.gpu is not None and trial.gpu.power_limit_w == 160.0
            assert "sw_power_cap" in trial.gpu.reasons
    pre_capped = next(c for c in capped if c.input_tokens == 2048).trials[0].gpu
    pre_default = next(c for c in default if c.input_tokens == 2048).trials[0].gpu
    assert pre_capped.sm_clock_mhz_mean < pre_default.sm_clock_mhz_mean
    assert len(frontiers(run.cases, lam=LAM)) == 2  # the saved run gives the same frontier


def test_a_thermally_throttled_trial_is_marked_left_out_and_repeated(
    pytester: pytest.Pytester, gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu.fake.gpus[0].thermal_works = frozenset({3})  # warm-up 1, trials 2, 3, ...
    pytester.makepyfile(
        test_one="""
        from tests.fakes.gpu_project import QUERIES, run

        def test_query(energy_benchmark):
            q = QUERIES[0]
            energy_benchmark(run, q, input_tokens=q.input_tokens, output_tokens=q.output_tokens)
        """
    )
    result = pytester.runpytest(
        "--energy-backend=nvml",
        "--energy-gpu-telemetry",
        "--energy-min-trials=3",
        "--energy-max-trials=4",  # the limit counts the trials left out too
        "--energy-json=run.json",
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*2048    8  3 * +1t *",
            "+Nt: N more trials ran while the GPU was slowed by heat or a power brake*",
            "*1 trial(s) of 1 case(s) ran throttled (hw_thermal*",
        ]
    )
    case = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json").cases[0]
    assert len(case.trials) == 3 and len(case.throttled) == 1
    assert not case.busy  # throttled is not "machine busy"
    assert case.throttled[0].gpu is not None and case.throttled[0].gpu.temperature_c_max == 92


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--energy-gpu-power-limits=500W",),
            "*--energy-gpu-power-limits: 500 W is outside the range: gpu:0 NVIDIA A100-SXM4-40GB "
            "allows 100 W to 400 W (default 400 W)",
        ),
        (
            ("--energy-gpu-clocks=3000MHz",),
            "*--energy-gpu-clocks: 3000 MHz is outside the range: *210 MHz to 1410 MHz",
        ),
        (("--energy-gpu-power-limits=fast",), "*expected 200W,250W,300W, 80%, all or all:25W*"),
    ],
)
def test_bad_values_are_one_line_at_start(
    pytester: pytest.Pytester, gpu: Any, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest("--energy-backend=nvml", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()


def test_locked_clocks_axis(pytester: pytest.Pytester, gpu: Any) -> None:
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(
        "-v", "-p", "no:randomly", "--energy-backend=nvml", "--energy-gpu-clocks=1005MHz",
        "--energy-min-trials=2", "--energy-max-trials=2", "--energy-json=run.json",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*fake-7b-in2048-out8-sm1005MHz] PASSED*"])
    result.stdout.fnmatch_lines(["*fake-7b-in2048-out8-smauto] PASSED*"])
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    locked = [c for c in run.cases if c.labels["gpu_setting"] == "sm1005MHz"]
    assert all(t.gpu and t.gpu.sm_clock_mhz_mean == 1005 for c in locked for t in c.trials)
    assert gpu.fake.gpus[0].locked_clocks_mhz is None  # unlocked again


# -- routing: system and setting together ----------------------------------------------------
def test_with_settings_splits_each_routed_range_at_its_systems_best_setting() -> None:
    from pytest_llmenergy.routing.policy import Policy, Rule

    routing = Policy("m", "input", (Rule("small", max_input_tokens=300), Rule("big")))
    settings = [
        {"system": "small", "model": "m", "by": "input", "rules": [
            {"max_input_tokens": 100, "setting": "pl60W"}, {"setting": "pl72W"}]},
        {"system": "big", "model": "m", "by": "input", "rules": [
            {"max_input_tokens": 200, "setting": "pl150W"},
            {"max_input_tokens": 1000, "setting": "pl250W"}, {"setting": "pl400W"}]},
    ]  # fmt: skip
    rules = with_settings(routing, settings)
    assert rules == [
        {"system": "small", "setting": "pl60W", "max_input_tokens": 100},
        {"system": "small", "setting": "pl72W", "max_input_tokens": 300},
        {"system": "big", "setting": "pl250W", "max_input_tokens": 1000},
        {"system": "big", "setting": "pl400W"},
    ]


def test_routing_profiles_use_each_case_at_its_best_setting(
    pytester: pytest.Pytester, gpu: Any
) -> None:
    from pytest_llmenergy.routing.profile import ProfileError, profiles_from_run

    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(*SWEEP, "--energy-json=run.json")
    assert result.ret == 0, result.stdout.str()
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    (profile,) = profiles_from_run(run, "a100", pick=at_best_settings(LAM))
    by_size = {(pt.input_tokens, pt.output_tokens): pt for pt in profile.points}
    for query in QUERIES:
        best = frontier("t", {}, 0, 0, truth_points(query), lam=LAM, p_ref_w=P_REF_W).lam_best
        point = by_size[(query.input_tokens, query.output_tokens)]
        assert len(point.joules) == 3  # one setting's trials, not all three pooled
        assert point.mean_joules == pytest.approx(best.energy_j, rel=0.01)
    # Without the frontier's choice, three settings' trials are refused, never pooled.
    with pytest.raises(ProfileError, match="a case measured at 3 GPU settings"):
        profiles_from_run(run, "a100")


def test_llmenergy_frontier_on_saved_runs(pytester: pytest.Pytester, gpu: Any) -> None:
    from pytest_llmenergy.cli import EXIT_USAGE, main

    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    assert pytester.runpytest(*SWEEP, "--energy-save=sweep").ret == 0
    code = main(["frontier", "sweep", "--lambda", str(LAM), "--json", "f.json"])
    assert code == 0
    data = json.loads((pytester.path / "f.json").read_text())
    assert [c["lambda_best"] for c in data["cases"]] == ["pl280W", "pl160W"]
    assert main(["frontier", "sweep", "--json", "f.json"]) == EXIT_USAGE  # never overwritten
    pytester.makepyfile(test_plain="def test_x(): pass")
    assert pytester.runpytest("test_plain.py", "--energy-save=plain").ret == 0
    assert main(["frontier", "plain"]) == EXIT_USAGE  # no sweep in it: one line


def test_one_figure_per_model_never_replacing_a_file(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pytest_llmenergy.frontier.frontier_plots import write_frontier_plots

    items = [
        frontier("t", {"model": "fake-7b"}, q.input_tokens, q.output_tokens, truth_points(q))
        for q in QUERIES
    ]
    (first,) = write_frontier_plots(items, tmp_path, system="a100")
    (second,) = write_frontier_plots(items, tmp_path, system="a100")
    assert first.name == "frontier-a100-fake-7b.png" and second.name.endswith("-2.png")
    assert first.read_bytes()[:4] == b"\x89PNG"


def test_ini_twins(pytester: pytest.Pytester, gpu: Any) -> None:
    pytester.makeini(
        """
        [pytest]
        llmenergy_gpu_power_limits = 160W
        llmenergy_max_slowdown = 10%
        """
    )
    pytester.makepyfile(test_fake_gpu=TEST_FILE)
    result = pytester.runpytest(
        "--energy-backend=nvml", "--energy-min-trials=2", "--energy-max-trials=2"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*GPU settings: 2 per case*pl400W, pl160W*", "*bloat (<= 10% slower)*"]
    )
    result.assert_outcomes(passed=4)  # 2 queries x (160 W, the default)
