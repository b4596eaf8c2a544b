"""Issue 37, item 5: ``llmenergy calibrate`` chooses its form by held-out error on the
runs it is given, records every form's errors and says which and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.predict.calibrate import (
    AUTO,
    FORM_TIE,
    FORMS,
    LEAVE_ONE_CASE_OUT,
    LEAVE_ONE_MODEL_OUT,
    ROOFLINE_KS,
    calibrate_runs,
    pick_form,
)
from pytest_llmenergy.predict.features import COLUMNS, case_work, load_shape
from pytest_llmenergy.storage.runfile import dumps
from tests.test_predict import BIG, LLAMA, sizes, synthetic_case
from tests.test_predict_research import SYSTEMS, _case
from tests.test_predict_research import store as store  # the research's runs, imported
from tests.test_storage_runfile import sample_run

GPU_MODELS = ("meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1", "tiiuae/falcon-7b")
GPU_SIZES = [(n, 8) for n in (8, 64, 256, 1024, 2048)] + [(32, n) for n in (16, 64, 256)]


def _roofline_truth(k: float, per_byte: float, per_op: float, per_pass: float) -> list[float]:
    coef = dict.fromkeys(COLUMNS, 0.0)
    coef |= {"roofline": per_byte, "launches": per_op, "forward_passes": per_pass}
    return [coef[c] for c in COLUMNS]


def roofline_run(models: tuple[str, ...]) -> object:
    """A GPU whose every forward pass takes max(k x FLOPs, bytes) at its bandwidth, plus
    its launches and a fixed cost per pass; energy likewise at another balance point
    (power follows what bounds a pass).  Both balance points are ones the fit tries."""
    time_k, energy_k = ROOFLINE_KS[10], ROOFLINE_KS[14]
    time_coef = _roofline_truth(time_k, 5e-13, 8e-6, 0.02)
    energy_coef = _roofline_truth(energy_k, 2e-10, 1e-3, 4.0)
    cases = []
    for model in models:
        shape = load_shape(model, elem_bytes=2)
        for n_in, n_out in GPU_SIZES:
            work = case_work(shape, n_in, n_out, kv_cache=False).values()
            secs = sum(float(np.dot(time_coef, w.vector(time_k))) for w in work)
            joules = sum(float(np.dot(energy_coef, w.vector(energy_k))) for w in work)
            cases.append(_case(model, n_in, n_out, secs, watts=joules / secs))
    return sample_run(tuple(cases))


def test_a_machine_that_is_a_roofline_is_calibrated_in_the_roofline_form() -> None:
    (cal,) = calibrate_runs([roofline_run(GPU_MODELS)], ["gpu"])["calibrations"]
    choice = cal["form_choice"]
    assert cal["form"] == "roofline" and choice["requested"] == AUTO
    assert choice["scheme"] == LEAVE_ONE_MODEL_OUT
    scores = choice["held_out"]
    assert scores["roofline"]["energy_mean_abs_rel"] < 1e-3  # the truth's form, exactly
    assert scores["roofline"]["cases"] == len(GPU_MODELS) * len(GPU_SIZES)
    assert scores["shared"]["energy_mean_abs_rel"] > 0.05
    assert "--energy-profile-ops" in scores["kernels"]["skipped"]  # imported: no profiles
    assert choice["reason"].startswith("form roofline: held-out energy error 0.0 % (shared ")
    assert "leave one model out over 24 cases: the lowest energy error" in choice["reason"]
    assert "kernels not fitted: needs operator profiles" in choice["reason"]


def test_a_machine_that_is_linear_is_calibrated_in_the_simplest_form_that_fits() -> None:
    """Made from one cost per FLOP, per byte and per launch: shared and kernels predict
    the held-out model exactly, and the fewer coefficients win; per_class, fitted on one
    model, splits the cost between classes that grew together, and misses the other."""
    cases = [synthetic_case(shape, i, o) for shape in (LLAMA, BIG) for i, o in sizes()]
    (cal,) = calibrate_runs([sample_run(tuple(cases))], ["cpu"])["calibrations"]
    scores = cal["form_choice"]["held_out"]
    assert cal["form_choice"]["scheme"] == LEAVE_ONE_MODEL_OUT
    for form in ("shared", "kernels"):
        assert scores[form]["energy_mean_abs_rel"] < 1e-6, form
    for form in ("per_class", "roofline"):
        assert scores[form]["energy_mean_abs_rel"] > FORM_TIE, form
    assert cal["form"] == "shared"
    assert cal["time_s"]["leave_one_out"]["mean_abs_rel"] < 1e-6


def test_one_model_holds_out_cases_and_scores_as_the_calibration_does() -> None:
    rng = np.random.default_rng(11)
    cases = [synthetic_case(LLAMA, i, o, noise=rng.normal(0, 0.05)) for i, o in sizes()]
    (cal,) = calibrate_runs([sample_run(tuple(cases))], ["noisy"])["calibrations"]
    choice = cal["form_choice"]
    assert choice["scheme"] == LEAVE_ONE_CASE_OUT
    assert set(choice["held_out"]) == set(FORMS)
    mine = choice["held_out"][cal["form"]]
    assert mine["cases"] == len(sizes())
    if cal["form"] != "kernels":  # kernels' rates: from the held-out fit's cases alone
        for target, key in (("time_s", "time"), ("energy_j", "energy")):
            loo = cal[target]["leave_one_out"]["mean_abs_rel"]
            assert mine[f"{key}_mean_abs_rel"] == pytest.approx(loo, rel=1e-9)


def test_too_few_cases_to_hold_out_fall_back_to_the_default_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "three.json"
    run.write_text(dumps(sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes()[:3]))))
    assert main(["calibrate", str(run), "--out", str(tmp_path / "cal.json")]) == 0
    (cal,) = json.loads((tmp_path / "cal.json").read_text())["calibrations"]
    assert cal["form"] == "shared" and cal["form_choice"]["scheme"] is None
    line = "form shared (the default): 3 cases are too few to hold any out and compare forms"
    assert cal["form_choice"]["reason"].startswith(line)
    assert f"llmenergy: {cal['system']}: {line}" in capsys.readouterr().err


def test_an_explicit_form_is_kept_and_says_it_was_asked_for() -> None:
    cases = [synthetic_case(LLAMA, i, o) for i, o in sizes()]
    (cal,) = calibrate_runs([sample_run(tuple(cases))], ["r"], "per_class")["calibrations"]
    assert cal["form"] == "per_class"
    assert cal["form_choice"] == {
        "requested": "per_class",
        "scheme": None,
        "held_out": {},
        "reason": "form per_class, as asked (not compared with the others)",
    }


@pytest.mark.parametrize(
    ("scores", "chosen"),
    [
        ({"shared": (0.20, 0.1), "roofline": (0.08, 0.3)}, "roofline"),  # energy first
        ({"shared": (0.100, 0.30), "per_class": (0.097, 0.10)}, "per_class"),  # time breaks
        ({"per_class": (0.097, 0.10), "shared": (0.100, 0.103)}, "shared"),  # then simpler
        ({"roofline": (0.050, 0.05), "shared": (0.054, 0.05)}, "shared"),
        ({"roofline": (0.050, 0.05), "shared": (0.056, 0.05)}, "roofline"),
    ],
)
def test_ties_go_to_time_then_to_fewer_coefficients(
    scores: dict[str, tuple[float, float]], chosen: str
) -> None:
    named = {f: {"energy_mean_abs_rel": e, "time_mean_abs_rel": t} for f, (e, t) in scores.items()}
    assert pick_form(named) == chosen


# -- the research's GPU runs (examples/wilkins2024) --------------------------------------
def test_the_research_gpu_runs_are_calibrated_in_the_roofline_form(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: fitted on Swing's Llama-2 and Mistral, Falcon-7B on the Palmetto
    A100 was predicted 27.4 % off in energy by the default form, 7.8 % by roofline."""
    base = ["--storage", str(store)]
    cal = tmp_path / "swing.json"
    fit_on = ["--fit-on", "Llama-2-7b-hf,Mistral-7B-v0.1"]
    assert main([*base, "calibrate", "swing-amd-a100/0001", *fit_on, "--out", str(cal)]) == 0
    out, err = capsys.readouterr()
    line = next(x for x in err.splitlines() if "form " in x)
    assert line.startswith("llmenergy: swing-amd-a100: form roofline: held-out energy error ")
    assert "leave one model out over 38 cases: the lowest energy error" in line
    (swing,) = json.loads(cal.read_text())["calibrations"]
    assert swing["form"] == "roofline" and swing["models"] == list(GPU_MODELS[:2])
    held = swing["form_choice"]["held_out"]
    assert held["roofline"]["energy_mean_abs_rel"] < held["shared"]["energy_mean_abs_rel"] - 0.1
    assert "form roofline: held-out energy error" in out  # the table says it too

    def falcon_on_palmetto(calibration: Path) -> tuple[float, str]:
        args = ["predict", "--calibration", str(calibration), "--system", "swing-amd-a100"]
        args += ["--against", "palmetto-intel-a100/0001"]
        assert main([*base, *args, "--format", "json"]) == 0
        models = json.loads(capsys.readouterr().out)["models"]
        (falcon,) = [m for m in models if m["model"] == GPU_MODELS[2]]
        assert main([*base, *args]) == 0
        return falcon["energy_mean_abs_err"], capsys.readouterr().out

    error, text = falcon_on_palmetto(cal)
    assert error == pytest.approx(0.078, abs=0.0005)
    assert text.startswith("form roofline: held-out energy error")
    shared = tmp_path / "shared.json"
    args = ["calibrate", "swing-amd-a100/0001", *fit_on, "--form", "shared", "--out", str(shared)]
    assert main([*base, *args]) == 0
    capsys.readouterr()
    error, text = falcon_on_palmetto(shared)
    assert error == pytest.approx(0.274, abs=0.0005)
    assert text.startswith("form shared, as asked")


def test_every_research_gpu_system_is_calibrated_in_the_roofline_form(store: Path) -> None:
    from pytest_llmenergy.storage.store import Storage

    runs = [Storage(store).load(f"{s}/0001") for s in SYSTEMS]
    data = calibrate_runs(runs, list(SYSTEMS))
    assert [c["system"] for c in data["calibrations"]] == list(SYSTEMS)
    for cal in data["calibrations"]:
        assert cal["form"] == "roofline", cal["form_choice"]["reason"]
        assert cal["form_choice"]["scheme"] == LEAVE_ONE_MODEL_OUT
        held = cal["form_choice"]["held_out"]
        assert held["roofline"]["energy_mean_abs_rel"] < held["shared"]["energy_mean_abs_rel"]


# -- bad input -------------------------------------------------------------------------
def test_fit_on_a_model_not_measured_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.json"
    run.write_text(dumps(sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes()))))
    args = ["calibrate", str(run), "--out", str(tmp_path / "c.json"), "--fit-on", "falcon-7b"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        err == "llmenergy: error: --fit-on falcon-7b: not measured in these runs; their models: l\n"
    )
    assert not (tmp_path / "c.json").exists()


def test_a_calibration_from_before_auto_still_predicts_and_names_its_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = calibrate_runs(
        [sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes()))], ["r"]
    )
    del data["calibrations"][0]["form_choice"]
    cal = tmp_path / "old.json"
    cal.write_text(json.dumps(data))
    args = ["predict", "--calibration", str(cal), "--model", "tiny-llama"]
    assert main([*args, "--input-tokens", "8", "--output-tokens", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "form shared"
