"""The operator-level model (issue 17): features against the profiler, the fit against
data made from known coefficients, the run file's op_profile, and the commands."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.predict.calibrate import (
    FORMS,
    calibrate_runs,
    fit,
    nnls,
    points_from_cases,
    rows_for,
)
from pytest_llmenergy.predict.features import (
    COLUMNS,
    MATMUL,
    ModelShape,
    case_work,
    forward_work,
    load_shape,
    shape_from_config,
)
from pytest_llmenergy.predict.predict import predict
from pytest_llmenergy.results import CONVERGED, CaseResult, PhaseRecord, Trial
from pytest_llmenergy.storage.runfile import COMPLETE, Run, dumps, load, loads
from tests.test_storage_runfile import sample_run

LLAMA = ModelShape("l", "llama", 64, 2, 4, 4, 16, 128, 1024)
BIG = ModelShape("big", "mistral", 256, 6, 8, 2, 32, 688, 2048)
# s per FLOP, per byte, per launch: a machine whose truth we know
TRUE = {"flops": 2e-11, "bytes": 5e-11, "launches": 6e-6, "generations": 1e-3, "roofline": 0.0}
TRUE |= {"forward_passes": 0.0}


def true_coef() -> list[float]:
    return [TRUE[c] if c in TRUE else TRUE[c.rsplit("_", 1)[1]] for c in COLUMNS]


def synthetic_case(shape: ModelShape, n_in: int, n_out: int, noise: float = 0.0) -> CaseResult:
    """A case whose phases take exactly what the true coefficients say (x 1+noise)."""
    work = case_work(shape, n_in, n_out)
    coef = true_coef()
    secs = {p: float(np.dot(coef, w.vector())) * (1 + noise) for p, w in work.items()}
    total = sum(secs.values())
    phases = {p: PhaseRecord(s, 20.0 * s, {"cpu:process": 20.0 * s}) for p, s in secs.items()}
    trial = Trial(
        1, total, 20 * total, 20 * total, {"cpu:process": 20 * total}, {}, n_in, n_out, phases
    )
    return CaseResult(
        nodeid=f"t.py::t[{shape.name}-{n_in}-{n_out}]",
        name=f"t[{shape.name}-{n_in}-{n_out}]",
        labels={"model": shape.name},
        input_tokens=n_in,
        output_tokens=n_out,
        status=CONVERGED,
        options=ControllerSettings(),
        trials=(trial, trial),
        methods={"cpu:process": "counter"},
        counted={"cpu:process": True},
        backend="trace",
        op_profile={
            "model_name": shape.name,
            "model_config": shape_config(shape),
            "classes": {},
            "ops": kernel_rows(n_in),
        },
    )


def shape_config(shape: ModelShape) -> dict[str, object]:
    """A config.json with these sizes (llama or mistral layout)."""
    return {
        "model_type": shape.family,
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab,
    }


def kernel_rows(n: int) -> list[dict[str, object]]:
    """Profiled kernel calls that cost the true seconds per FLOP plus 3 us per call (the
    profiler's overhead)."""
    rows: list[dict[str, object]] = []
    for cls, flops, calls in (("matmul", 2.0e6 * n, 7), ("attention", 5.0e3 * n * n, 2)):
        self_s = TRUE["flops"] * flops + 3e-6 * calls
        rows.append({"class": cls, "flops": flops, "calls": calls, "self_cpu_s": self_s})
    return rows


def sizes() -> list[tuple[int, int]]:
    return [(n, 32) for n in (8, 64, 256, 1024, 2048)] + [(32, n) for n in (8, 64, 256)]


# -- features --------------------------------------------------------------------------
def test_batch_multiplies_activations_not_weight_bytes() -> None:
    one, four = forward_work(LLAMA, 16, 0, batch=1), forward_work(LLAMA, 16, 0, batch=4)
    assert four.flops[MATMUL] == pytest.approx(4 * one.flops[MATMUL])
    weights = (LLAMA.layer_weights * LLAMA.layers + LLAMA.hidden * LLAMA.vocab) * 4
    assert one.bytes[MATMUL] - weights == pytest.approx((four.bytes[MATMUL] - weights) / 4)
    assert four.ops == one.ops  # launches do not depend on the batch


def test_decode_attention_grows_with_the_cache() -> None:
    short, long = case_work(LLAMA, 8, 64)["decode"], case_work(LLAMA, 1024, 64)["decode"]
    assert long.flops["attention"] > 20 * short.flops["attention"]  # mean cache 1056 vs 40
    assert long.flops[MATMUL] == pytest.approx(short.flops[MATMUL])


def test_configs_of_the_three_layouts() -> None:
    falcon = shape_from_config(
        {
            "model_type": "falcon",
            "hidden_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "multi_query": True,
            "vocab_size": 1024,
        }
    )
    assert (falcon.kv_heads, falcon.intermediate, falcon.mlp_matrices) == (1, 2048, 2)
    mistral = shape_from_config(
        {
            "model_type": "mistral",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 32000,
        }
    )
    # Mistral 7B: 7.24 B parameters, of which the layers' matrices are all but the
    # embeddings (2 x 32000 x 4096) and the norms
    params = mistral.layer_weights * mistral.layers + 2 * 32000 * 4096
    assert params == pytest.approx(7.24e9, rel=0.01)
    with pytest.raises(Exception, match="model_type 'gpt2' is not modelled"):
        shape_from_config({"model_type": "gpt2"})


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-falcon"])
def test_features_match_the_profilers_flops_and_operator_count(
    name: str, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Matmul FLOPs and the launched operators of a real generate() on the tiny models."""
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    from pytest_llmenergy.llm.loader import load_model
    from pytest_llmenergy.predict.op_profile import profile_call

    model = load_model(name)
    prompt = model.prompt_ids(48)
    model.generate(prompt, 3)  # warm
    profile = profile_call(lambda: model.generate(prompt, 3))
    work = case_work(load_shape(name), 48, 3)
    flops = sum(w.flops[MATMUL] for w in work.values())
    assert profile["classes"][MATMUL]["flops"] == pytest.approx(flops, rel=0.02)
    ops = sum(w.ops for w in work.values())
    assert profile["top_level_ops"] == pytest.approx(ops, rel=0.05)
    # Falcon: SDPA's math path, whose matmuls (every pair) the profiler counts; the
    # others: the fused kernel's, from its shapes (causal)
    attention = sum(w.flops["attention"] for w in work.values())
    assert profile["classes"]["attention"]["flops"] == pytest.approx(attention, rel=0.02)


# -- the fit ---------------------------------------------------------------------------
def test_nnls_meets_its_optimality_conditions() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(30, 6)), rng.normal(size=30)
    x = nnls(a, b)
    grad = a.T @ (a @ x - b)
    assert (x >= 0).all()
    assert np.allclose(grad[x > 0], 0, atol=1e-8)  # free coordinates: stationary
    assert (grad[x == 0] >= -1e-8).all()  # bound ones: pushing them up does not help
    assert x.min() == 0  # on this problem some bound is active


def test_calibration_recovers_known_coefficients_and_predicts_a_bigger_model() -> None:
    cases = [synthetic_case(LLAMA, i, o) for i, o in sizes()]
    points = points_from_cases(cases)
    coef = fit(rows_for(points), "time_s", "shared")
    assert coef == pytest.approx(true_coef(), rel=1e-6)
    run = Run(**{**sample_run(tuple(cases)).__dict__, "status": COMPLETE})
    cal = calibrate_runs([run], ["synthetic"])["calibrations"][0]
    assert cal["time_s"]["leave_one_out"]["mean_abs_rel"] < 1e-6
    # the synthetic machine draws 20 W whatever it does: energy is power x time alone
    assert cal["energy_j"]["power_w"] == pytest.approx(20.0)
    energy_coef = [cal["energy_j"]["coefficients"][c] for c in COLUMNS]
    assert energy_coef == pytest.approx([20.0 * c for c in true_coef()], rel=1e-6)
    truth = synthetic_case(BIG, 512, 64)
    (pred,) = predict(cal, BIG, [512], [64])
    assert pred.time_s == pytest.approx(truth.trials[0].seconds, rel=1e-6)
    assert pred.energy_j == pytest.approx(truth.trials[0].joules, rel=1e-6)
    assert pred.predicted


def test_kernel_form_takes_the_kernels_rates_from_the_profiles() -> None:
    from pytest_llmenergy.predict.calibrate import calibrate_points

    points = points_from_cases([synthetic_case(LLAMA, i, o) for i, o in sizes()])
    fitted = calibrate_points(points, "kernels")
    assert fitted["kernel_s_per_flop"]["matmul_flops"] == pytest.approx(TRUE["flops"], rel=1e-6)
    coef = fitted["time_s"]["coefficients"]
    assert coef["launches"] == pytest.approx(TRUE["launches"], rel=1e-4)
    assert fitted["time_s"]["leave_one_out"]["rms_rel"] < 1e-4
    unprofiled = [replace(p, profile={"classes": {}}) for p in points]
    with pytest.raises(Exception, match="--energy-profile-ops"):
        calibrate_points(unprofiled, "kernels")


def test_noise_shows_in_the_error_estimate() -> None:
    rng = np.random.default_rng(7)
    cases = [synthetic_case(LLAMA, i, o, noise=rng.normal(0, 0.1)) for i, o in sizes()]
    run = Run(**{**sample_run(tuple(cases)).__dict__, "status": COMPLETE})
    cal = calibrate_runs([run], ["noisy"])["calibrations"][0]
    assert 0.02 < cal["time_s"]["leave_one_out"]["rms_rel"] < 0.4
    assert set(FORMS) == {"shared", "per_class", "kernels", "roofline"}


# -- the run file ------------------------------------------------------------------------
def test_op_profile_round_trips_and_old_cases_read_without_it(tmp_path: Path) -> None:
    case = synthetic_case(LLAMA, 8, 4)
    text = dumps(sample_run((case,)))
    back = loads(text, "x.json").cases[0]
    assert back.op_profile == case.op_profile
    data = json.loads(text)
    del data["cases"][0]["op_profile"]  # a run written before issue 17
    assert loads(json.dumps(data), "old.json").cases[0].op_profile is None


# -- the commands ------------------------------------------------------------------------
def test_calibrate_then_predict_from_the_command_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tiny_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    run = sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes()))
    (tmp_path / "run.json").write_text(dumps(run))
    cal = tmp_path / "cal.json"
    assert main(["calibrate", str(tmp_path / "run.json"), "--out", str(cal)]) == 0
    out = capsys.readouterr().out
    assert "held-out" in out and "launches" in out
    assert main(["calibrate", str(tmp_path / "run.json"), "--out", str(cal)]) == 2
    assert "already exists" in capsys.readouterr().err
    config = tmp_path / "big"
    config.mkdir()
    (config / "config.json").write_text(
        json.dumps(
            {
                "model_type": "mistral",
                "hidden_size": 256,
                "num_hidden_layers": 6,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "intermediate_size": 688,
                "vocab_size": 2048,
            }
        )
    )
    args = [
        "predict",
        "--calibration",
        str(cal),
        "--model",
        str(config),
        "--input-tokens",
        "512",
        "--output-tokens",
        "64",
        "--format",
        "json",
    ]
    assert main(args) == 0
    (row,) = json.loads(capsys.readouterr().out)
    truth = synthetic_case(BIG, 512, 64).trials[0].seconds
    assert row["time_s"] == pytest.approx(truth, rel=1e-6) and row["predicted"] is True
    assert main([*args[:4], "tiny-llama", *args[5:], "--batch-size", "4"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["batch_size"] == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/nowhere"], "no config.json there"),
        (["--input-tokens", "x"], "--input-tokens: expected token counts"),
        (["--batch-size", "0"], "--batch-size: expected a whole number"),
        (["--calibration", "/nope.json"], "no such calibration file"),
    ],
)
def test_bad_predict_input_is_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal = tmp_path / "cal.json"
    run = Run(**{**sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes())).__dict__})
    cal.write_text(json.dumps(calibrate_runs([run], ["r"])))
    base = {
        "--calibration": str(cal),
        "--model": "/nowhere",
        "--input-tokens": "8",
        "--output-tokens": "4",
        "--batch-size": "1",
    }
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    if args[0] != "--model":
        base["--model"] = str(tmp_path)
        (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    assert main(["predict", *[x for kv in base.items() for x in kv]]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1024,
}


@pytest.mark.parametrize("deep", [False, True])  # True, issue 33: a RecursionError before
def test_a_file_that_is_not_a_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], deep: bool
) -> None:
    bad = tmp_path / "run.json"
    bad.write_text("[" * 100_000 if deep else dumps(sample_run(())))
    assert (
        main(
            [
                "predict",
                "--calibration",
                str(bad),
                "--model",
                "tiny-llama",
                "--input-tokens",
                "8",
                "--output-tokens",
                "4",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "not a calibration file" in err and err.count("\n") == 1


def test_calibrating_too_few_cases_says_what_to_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run.json").write_text(dumps(sample_run((synthetic_case(LLAMA, 8, 4),))))
    assert main(["calibrate", str(tmp_path / "run.json"), "--out", str(tmp_path / "c.json")]) == 2
    assert "measure more token sizes" in capsys.readouterr().err
    assert load(tmp_path / "run.json").cases  # the run is untouched


def test_predictions_feed_routing_marked_predicted(tmp_path: Path) -> None:
    from pytest_llmenergy.predict.predict import to_profile_csv
    from pytest_llmenergy.routing.profile import read_profile_csv

    run = sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes()))
    cal = calibrate_runs([run], ["r"])["calibrations"][0]
    rows = predict(cal, BIG, [8, 64, 512], [32])
    path = tmp_path / "predicted.csv"
    path.write_text(to_profile_csv(rows))
    (read,) = read_profile_csv(path)
    assert read.model == "big (predicted)" and read.system == cal["system"]
    assert [p.input_tokens for p in read.points] == [8, 64, 512]
    assert read.points[2].mean_seconds == pytest.approx(rows[2].time_s)


class FakeEvent:
    """A raw profiler event with a known place in a known trace."""

    def __init__(self, name: str, start: int, dur: int, shapes: list, flops: int = 0) -> None:
        self._v = (name, start, dur, shapes, flops)

    def name(self) -> str:
        return self._v[0]

    def start_ns(self) -> int:
        return self._v[1]

    def duration_ns(self) -> int:
        return self._v[2]

    def shapes(self) -> list:
        return self._v[3]

    def dtypes(self) -> list:
        return ["float"] * len(self._v[3])

    def flops(self) -> int:
        return self._v[4]

    def start_thread_id(self) -> int:
        return 1


def test_profile_summary_rebuilds_nesting_and_self_times() -> None:
    from pytest_llmenergy.predict.op_profile import summarize_events

    us = 1000
    events = [  # linear -> addmm; sdpa -> flash kernel -> a nested mul; a top-level add
        FakeEvent("aten::linear", 0, 100 * us, [[8, 64], [128, 64]]),
        FakeEvent("aten::addmm", 10 * us, 80 * us, [[128], [8, 64], [64, 128]], 131072),
        FakeEvent("aten::scaled_dot_product_attention", 200 * us, 50 * us, [[1, 4, 8, 16]] * 3),
        FakeEvent(
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            205 * us,
            40 * us,
            [[1, 4, 8, 16]] * 3,
        ),
        FakeEvent("aten::mul", 210 * us, 5 * us, [[1, 4, 8, 8], []]),
        FakeEvent("aten::add", 300 * us, 7 * us, [[8, 64], [8, 64]]),
    ]
    s = summarize_events(events)
    mm, att, el = (s["classes"][c] for c in ("matmul", "attention", "elementwise"))
    assert s["top_level_ops"] == 3 and s["events"] == 6
    assert mm["self_cpu_s"] == pytest.approx(100e-6)  # 20 linear + 80 addmm
    assert mm["flops"] == 131072 and mm["calls"] == 1
    assert mm["bytes"] == (8 * 64 + 128 * 64) * 4  # the outermost operator's inputs
    # everything inside attention is attention's, the mul included; flash FLOPs derived
    assert att["self_cpu_s"] == pytest.approx(50e-6) and att["calls"] == 1
    assert att["flops"] == pytest.approx(4 * 4 * (8 * 9 / 2) * 16)
    assert el["self_cpu_s"] == pytest.approx(7e-6) and el["bytes"] == 2 * 8 * 64 * 4


def test_the_held_out_error_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Calibrated on one model, checked against another's measured cases: cases that
    follow the model exactly show no error; cases 20 % slower than it show -16.7 %."""

    def at_speed(run: Run, speed_s: float) -> Run:
        return replace(run, machine={**run.machine, "speed_reference_s": speed_s})

    cal_run = sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes()))
    (tmp_path / "cal-run.json").write_text(dumps(at_speed(cal_run, 0.004)))
    slow = [synthetic_case(BIG, 512, 64, noise=0.2), synthetic_case(BIG, 64, 256, noise=0.2)]
    held = sample_run((synthetic_case(BIG, 256, 32), *slow))
    (tmp_path / "held.json").write_text(dumps(at_speed(held, 0.005)))
    cal = tmp_path / "cal.json"
    assert main(["calibrate", str(tmp_path / "cal-run.json"), "--out", str(cal)]) == 0
    capsys.readouterr()
    args = ["predict", "--calibration", str(cal), "--against", str(tmp_path / "held.json")]
    assert main([*args, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    errors = sorted(c["predicted_time_s"] / c["time_s"] - 1 for c in data["cases"])
    assert errors == pytest.approx([1 / 1.2 - 1, 1 / 1.2 - 1, 0.0], abs=1e-9)
    (row,) = data["models"]
    assert row["model"] == "big" and row["cases"] == 3
    assert row["time_mean_abs_err"] == pytest.approx(2 / 3 * (1 - 1 / 1.2))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "time |err|" in out
    assert "calibration 4.00 ms;" in out and "held.json 5.00 ms (+25%)" in out
    assert main(["predict", "--calibration", str(cal)]) == 2
    assert "predict needs --model, --input-tokens, --output-tokens" in capsys.readouterr().err


def test_one_calibration_per_setting_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU setting (issue 14's axes label their cases) is calibrated apart; predict asks
    which one when the file holds several."""
    cases = []
    for setting, slower in (("250W", 0.0), ("150W", 0.5)):
        for i, o in sizes():
            case = synthetic_case(LLAMA, i, o, noise=slower)
            cases.append(replace(case, labels={**case.labels, "setting": setting}))
    run = sample_run(tuple(cases))
    cals = calibrate_runs([run], ["r"])["calibrations"]
    assert sorted(c["setting"] for c in cals) == ["150W", "250W"]
    by = {c["setting"]: c["time_s"]["coefficients"]["launches"] for c in cals}
    assert by["150W"] == pytest.approx(1.5 * by["250W"])
    (tmp_path / "run.json").write_text(dumps(run))
    cal = tmp_path / "cal.json"
    assert main(["calibrate", str(tmp_path / "run.json"), "--out", str(cal)]) == 0
    args = [
        "predict",
        "--calibration",
        str(cal),
        "--model",
        str(tmp_path),
        "--input-tokens",
        "8",
        "--output-tokens",
        "4",
    ]
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    capsys.readouterr()
    assert main(args) == 2
    assert "choose with --system/--setting" in capsys.readouterr().err
    assert main([*args, "--setting", "150W", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["setting"] == "150W"


def test_profiling_without_torch_stops_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from pytest_llmenergy.predict.plugin import OpProfiling

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(pytest.UsageError, match="--energy-profile-ops needs torch"):
        OpProfiling()


# -- the CPU's cache sizes, recorded with every run (issue 28) ----------------------------
def _sysfs(root: Path, entries: list[tuple[int, str, str]]) -> None:
    for i, (level, kind, size) in enumerate(entries):
        folder = root / f"index{i}"
        folder.mkdir(parents=True)
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")


def test_cache_sizes_are_read_from_sysfs(tmp_path: Path) -> None:
    from pytest_llmenergy.storage.machine import cpu_caches

    _sysfs(
        tmp_path,
        [
            (1, "Data", "32K"),
            (1, "Instruction", "32K"),
            (2, "Unified", "1024K"),
            (3, "Unified", "32M"),
        ],
    )
    caches = cpu_caches(str(tmp_path))
    assert caches == {"l1": 32768, "l2": 2**20, "l3": 32 * 2**20}
    assert cpu_caches(str(tmp_path / "absent")) == {}
