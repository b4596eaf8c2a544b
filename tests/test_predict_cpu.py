"""Predictions for models never calibrated on this 2-core CPU (issue 28, item 4), checked
against its quiet measurements: three sessions of seven models (``data/cpu_heldout.json``,
how they were measured is in its ``about``).  The fits here see only the calibration
models' cases; every figure is the held-out models' mean |time error|."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.predict.calibrate import Point, calibrate_runs, fit_both, predict_work
from pytest_llmenergy.predict.calibrate import rows_for as calibration_rows
from pytest_llmenergy.predict.features import case_work, shape_from_config
from pytest_llmenergy.results import CaseResult, PhaseRecord, Trial
from pytest_llmenergy.storage.runfile import Run, dumps
from tests.test_predict import LLAMA, sizes, synthetic_case
from tests.test_storage_runfile import sample_run

DATA = json.loads((Path(__file__).parent / "data" / "cpu_heldout.json").read_text())
# The same seven models and cases, each session visiting every case three times in a new
# random order (--energy-interleave=3), so every case's mean spans the session's speeds.
INTERLEAVED = json.loads(
    (Path(__file__).parent / "data" / "cpu_heldout_interleaved.json").read_text()
)
TWO_SIZES = ("tiny-llama", "rand-llama-512")  # two sizes of the calibrated architecture


def _point(case: Mapping[str, Any], scale: float = 1.0) -> Point:
    shape = shape_from_config(DATA["configs"][case["model"]], case["model"])
    n_in, n_out = case["input_tokens"], case["output_tokens"]
    return Point(
        model=case["model"],
        input_tokens=n_in,
        output_tokens=n_out,
        batch_size=1,
        time_s=case["time_s"] * scale,
        energy_j=case["energy_j"] * scale,
        work=case_work(shape, n_in, n_out),
        profile=None,
        phases={k: (s * scale, j * scale) for k, (s, j) in case["phases"].items()},
    )


def session(
    n: int, spoil: Mapping[str, float] | None = None, data: Mapping[str, Any] = DATA
) -> list[Point]:
    """Session ``n``'s cases; ``spoil``: a model's times and joules multiplied."""
    spoil = spoil or {}
    cases = data["sessions"][n - 1]["cases"]
    return [_point(c, spoil.get(c["model"], 1.0)) for c in cases]


def merged() -> list[Point]:
    """The three sessions as one run: each case's mean over all its trials."""
    groups: dict[tuple[str, int, int], list[Mapping[str, Any]]] = {}
    for s in DATA["sessions"]:
        for c in s["cases"]:
            groups.setdefault((c["model"], c["input_tokens"], c["output_tokens"]), []).append(c)
    out = []
    for parts in groups.values():
        n = sum(c["trials"] for c in parts)

        def mean(get: Any, parts: Sequence[Mapping[str, Any]] = parts, n: int = n) -> float:
            return math.fsum(get(c) * c["trials"] for c in parts) / n

        case = {
            **parts[0],
            "time_s": mean(lambda c: c["time_s"]),
            "energy_j": mean(lambda c: c["energy_j"]),
            "phases": {
                k: [mean(lambda c, k=k, i=i: c["phases"][k][i]) for i in (0, 1)]
                for k in parts[0]["phases"]
            },
        }
        out.append(_point(case))
    return out


def time_errors(train: Sequence[Point], test: Iterable[Point]) -> dict[str, list[float]]:
    """Per held-out model, each case's relative time error, from a fit on ``train``."""
    f = fit_both(calibration_rows(train), "shared", {})
    out: dict[str, list[float]] = {}
    for p in test:
        out.setdefault(p.model, []).append(predict_work(f.time, p.work) / p.time_s - 1)
    return out


def fitted_on(points: Sequence[Point], models: Sequence[str]) -> dict[str, list[float]]:
    return time_errors(
        [p for p in points if p.model in models], [p for p in points if p.model not in models]
    )


def mean_abs(errors: Mapping[str, list[float]]) -> float:
    flat = [e for v in errors.values() for e in v]
    return math.fsum(abs(e) for e in flat) / len(flat)


def bias(errors: list[float]) -> float:
    return math.fsum(errors) / len(errors)


def test_the_data_is_three_sessions_of_seven_models() -> None:
    for data in (DATA, INTERLEAVED):
        assert data["configs"] == DATA["configs"]
        for n in (1, 2, 3):
            points = session(n, data=data)
            assert len(points) == 49 and len({p.model for p in points}) == 7


def leave_one_model_out(points: Sequence[Point]) -> dict[str, list[float]]:
    errors: dict[str, list[float]] = {}
    for model in sorted({p.model for p in points}):
        errors |= time_errors(
            [p for p in points if p.model != model], [p for p in points if p.model == model]
        )
    return errors


@pytest.mark.parametrize("n", [1, 2, 3])
def test_interleaved_sessions_predict_models_never_calibrated_within_ten_percent(n: int) -> None:
    """Issue 28's goal on this CPU, in every single session measured with
    --energy-interleave=3: calibrated on two sizes of one architecture, and each model
    left out of a fit on the other six.  (The blocked sessions, whose cases each ran at
    whatever speed the machine had then, miss it: 12.8 and 11.3 % over their rows.)"""
    points = session(n, data=INTERLEAVED)
    two_sizes = fitted_on(points, TWO_SIZES)
    assert len(two_sizes) == 5 and mean_abs(two_sizes) <= 0.10
    left_out = leave_one_model_out(points)
    assert len(left_out) == 7 and mean_abs(left_out) <= 0.10
    # a model of another architecture and size is still inside the goal on its own
    assert mean_abs({"rand-falcon-512": two_sizes["rand-falcon-512"]}) <= 0.10


# The machine record of the sessions' runs: sizes read from sysfs, as every run has them.
MACHINE = {
    "cpu": {"model": "AMD EPYC", "logical_cores": 2, "cache_bytes": {"l2": 2**20, "l3": 2**25}},
    "gpus": [],
}


def session_run(
    n: int, models: Sequence[str], configs: Path, data: Mapping[str, Any] = DATA
) -> Run:
    """Session ``n``'s cases of ``models`` as a saved run (one trial: the case's means),
    each model's config.json in ``configs``, where the run's labels point."""
    cases = []
    for c in data["sessions"][n - 1]["cases"]:
        model = c["model"]
        if model not in models:
            continue
        folder = configs / model
        if not folder.exists():
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(DATA["configs"][model]))
        n_in, n_out = c["input_tokens"], c["output_tokens"]
        phases = {k: PhaseRecord(s, j, {"cpu:process": j}) for k, (s, j) in c["phases"].items()}
        energy = {"cpu:process": c["energy_j"]}
        trial = Trial(1, c["time_s"], c["energy_j"], c["energy_j"], energy, {}, n_in, n_out, phases)
        name = f"t[{model}-in{n_in}-out{n_out}]"
        base: CaseResult = synthetic_case(LLAMA, n_in, n_out)
        cases.append(
            CaseResult(
                **{
                    **base.__dict__,
                    "nodeid": f"t.py::{name}",
                    "name": name,
                    "labels": {"model": model, "model_source": str(folder)},
                    "trials": (trial,),
                    "op_profile": None,
                }
            )
        )
    return Run(**{**sample_run(tuple(cases)).__dict__, "machine": MACHINE})


def test_two_sizes_of_one_architecture_predict_the_other_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Calibrated on tiny-llama and rand-llama-512 (llmenergy calibrate, then predict
    --against the other five models' runs), over the three sessions.  While weights were
    charged extra beyond the 32 MiB L3 (only rand-llama-512's), the fit put rand-llama-512's
    weight traffic there, and rand-llama-256 (14 MB, inside L3, between the two sizes) was
    predicted 24 % too fast, the five models 16.6 % off."""
    others = sorted(set(DATA["configs"]) - set(TWO_SIZES))
    errors: dict[str, list[float]] = {}
    for n in (1, 2, 3):
        cal_run, held_run = tmp_path / f"cal{n}.json", tmp_path / f"held{n}.json"
        cal_run.write_text(dumps(session_run(n, TWO_SIZES, tmp_path / "configs")))
        held_run.write_text(dumps(session_run(n, others, tmp_path / "configs")))
        cal = tmp_path / f"cal{n}-calibration.json"
        assert main(["calibrate", str(cal_run), "--out", str(cal), "--format", "json"]) == 0
        capsys.readouterr()
        args = ["predict", "--calibration", str(cal), "--against", str(held_run)]
        assert main([*args, "--format", "json"]) == 0
        for row in json.loads(capsys.readouterr().out)["cases"]:
            errors.setdefault(row["model"], []).append(row["predicted_time_s"] / row["time_s"] - 1)
    assert sorted(errors) == others and all(len(e) == 21 for e in errors.values())
    assert mean_abs(errors) < 0.135
    assert abs(bias(errors["rand-llama-256"])) < 0.15
    assert mean_abs(fitted_on(merged(), TWO_SIZES)) < 0.11


def test_leave_one_model_out_on_the_merged_sessions_is_within_ten_percent() -> None:
    errors = leave_one_model_out(merged())
    assert len(errors) == 7
    assert mean_abs(errors) <= 0.10


def test_only_the_calibration_models_move_the_predictions() -> None:
    """Spoiling a held-out model's measurements changes nothing predicted for the others;
    spoiling a calibration model's moves every prediction."""
    base = fitted_on(session(3), TWO_SIZES)
    held = fitted_on(session(3, spoil={"tiny-falcon": 10.0}), TWO_SIZES)
    for model in ("tiny-mistral", "rand-llama-256", "rand-mistral-384", "rand-falcon-512"):
        assert held[model] == pytest.approx(base[model], abs=1e-12)
    spoiled = fitted_on(session(3, spoil={"tiny-llama": 10.0}), TWO_SIZES)
    for model, errs in base.items():
        assert bias(spoiled[model]) > bias(errs) + 0.3


def test_a_calibration_charging_the_dropped_cache_column_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = sample_run(tuple(synthetic_case(LLAMA, i, o) for i, o in sizes()))
    data = calibrate_runs([run], ["r"])
    args = ["predict", "--model", "tiny-llama", "--input-tokens", "8", "--output-tokens", "4"]
    for value, code in ((0.0, 0), (2e-10, 2)):
        for target in ("time_s", "energy_j"):
            data["calibrations"][0][target]["coefficients"]["beyond_cache_bytes"] = value
        cal = tmp_path / f"cal-{value}.json"
        cal.write_text(json.dumps(data))
        assert main([*args, "--calibration", str(cal)]) == code
    err = capsys.readouterr().err
    assert "beyond_cache_bytes, which is no longer modelled; calibrate again" in err
    assert len(err.strip().splitlines()) == 1


def test_heldout_fit_on_is_the_chosen_models_protocol_in_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``llmenergy heldout RUN --fit-on A,B`` fits on those models alone and predicts each
    other one, then all of them: the same figures as the fit here, per interleaved session."""
    for n in (1, 2, 3):
        run = tmp_path / f"s{n}.json"
        run.write_text(dumps(session_run(n, tuple(DATA["configs"]), tmp_path / "c", INTERLEAVED)))
        args = ["heldout", str(run), "--fit-on", ",".join(TWO_SIZES), "--format", "json"]
        assert main(args) == 0
        rows = {r["predicted"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
        expected = fitted_on(session(n, data=INTERLEAVED), TWO_SIZES)
        assert set(rows) == {*expected, "all the others"}
        for model, errors in expected.items():
            assert rows[model]["time_mean_abs_err"] == pytest.approx(mean_abs({model: errors}))
            assert rows[model]["fitted_on"] == "rand-llama-512, tiny-llama"
        assert rows["all the others"]["time_mean_abs_err"] <= 0.10
    assert main(["heldout", str(tmp_path / "s1.json"), "--fit-on", "gpt2"]) == 2
    assert "--fit-on gpt2: not measured on" in capsys.readouterr().err
