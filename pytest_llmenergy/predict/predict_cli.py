"""``llmenergy calibrate`` and ``llmenergy predict``: the command-line side of predict/."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..commandline import Command, Outcome
from ..errors import ConfigError
from ..storage.store import NEW_FILE, STORAGE_HELP
from .calibrate import AUTO, FORMS

_OUT_FORMATS = ("table", "json")


def _calibrate_arguments(cal: argparse.ArgumentParser) -> None:
    cal.add_argument("runs", nargs="+", metavar="RUN", help="saved runs (number, name, path)")
    cal.add_argument("--out", required=True, metavar="FILE", help="calibration JSON to write (new)")
    cal.add_argument(
        "--form",
        choices=(AUTO, *FORMS),
        default=AUTO,
        help="auto: every form that these runs can fit, scored by its error on held-out "
        "cases (each model left out in turn when there are several, else each case), the "
        "lowest energy error kept and the reason printed; shared: one cost per FLOP, per byte "
        "and per launch (for one model); per_class: each operator class its own (several "
        "models); kernels: the matmul and attention kernels' cost per FLOP from the operator "
        "profiles (--energy-profile-ops), the rest shared; roofline: each forward pass the "
        "larger of its compute and its memory traffic (GPUs) (default: auto)",
    )
    cal.add_argument(
        "--fit-on",
        type=_model_names,
        default=(),
        metavar="MODEL[,MODEL...]",
        help="only these models' cases (full or short names), e.g. Llama-2-7b-hf,Mistral-7B-v0.1",
    )
    cal.add_argument("--format", choices=_OUT_FORMATS, default="table")
    cal.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _predict_arguments(pred: argparse.ArgumentParser) -> None:
    pred.add_argument("--calibration", required=True, metavar="FILE")
    pred.add_argument(
        "--model",
        metavar="CONFIG_OR_NAME",
        help="a built-in tiny model, a config.json or a model folder (only the config is read)",
    )
    pred.add_argument("--input-tokens", metavar="N[,N...]")
    pred.add_argument("--output-tokens", metavar="N[,N...]")
    pred.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="RUN",
        help="instead of --model and sizes: predict every measured case of these saved runs "
        "and print the error table (per model: time and energy error), repeatable",
    )
    pred.add_argument("--batch-size", default="1", metavar="B")
    pred.add_argument("--system", metavar="HARDWARE", help="which calibration, when several")
    pred.add_argument("--setting", metavar="LABEL", help="which setting's calibration")
    pred.add_argument(
        "--format",
        choices=(*_OUT_FORMATS, "csv"),
        default="table",
        help="table, json, or csv: the profile CSV llmenergy route --profile reads, with "
        "the model named '... (predicted)' (default: table)",
    )


def _model_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected model names such as a,b, got {text!r}")
    return names


def _heldout_arguments(held: argparse.ArgumentParser) -> None:
    from .crossval import SPLITS

    held.add_argument("runs", nargs="+", metavar="RUN", help="saved runs, one system each")
    held.add_argument(
        "--split",
        action="append",
        choices=SPLITS,
        help="sweep: fit on the input sweep, predict the output sweep and the reverse; "
        "model: leave one model out; system: fit on one system, predict another with the "
        "same GPU; repeatable (default: all three)",
    )
    held.add_argument(
        "--fit-on",
        type=_model_names,
        default=(),
        metavar="MODEL[,MODEL...]",
        help="fit on these models (full or short names) and predict every other model of "
        "each run, then all of them together, e.g. tiny-llama,rand-llama-512; without "
        "--split, only this",
    )
    held.add_argument("--form", choices=tuple(FORMS), default="shared")
    held.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    held.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def heldout_command(args: argparse.Namespace, storage: Any) -> str:
    from tabulate import tabulate

    from .crossval import ASTRAWATTCH, CHOSEN, SPLITS, held_out

    runs = [storage.load(spec) for spec in args.runs]
    splits = args.split or (() if args.fit_on else SPLITS)
    rows, skipped = held_out(runs, splits, args.form, args.fit_on)
    if args.fit_on:
        splits = (CHOSEN, *splits)
    if args.format == "json":
        return json.dumps(
            {"rows": [r.to_dict() for r in rows], "skipped": skipped, "form": args.form},
            indent=1,
            allow_nan=False,
        )
    titles = {
        "sweep": "(a) fitted on one sweep, predicting the other",
        "model": "(b) leave one model out: fitted on the other models",
        "system": "(c) leave one system out: fitted on another system with the same GPU",
        "chosen": "fitted on the models chosen (--fit-on), predicting the others",
    }
    parts = []
    for split in splits:
        body = [
            (
                r.system,
                r.fitted_on,
                r.predicted,
                r.cases,
                f"{100 * r.time_mean_abs_err:.1f} %",
                f"{100 * r.time_mean_err:+.1f} %",
                f"{100 * r.energy_mean_abs_err:.1f} %",
                f"{100 * r.energy_mean_err:+.1f} %",
            )
            for r in rows
            if r.split == split
        ]
        if not body:
            parts.append(f"{titles[split]}: no such split in these runs")
            continue
        headers = ["system", "fitted on", "predicted", "cases", "time |err|", "time bias"]
        headers += ["energy |err|", "energy bias"]
        if args.format == "markdown":  # a bare | would split the cell
            headers = [h.replace("|", "\\|") for h in headers]
        table = tabulate(
            body, headers=headers, tablefmt="github" if args.format == "markdown" else "simple"
        )
        parts.append(f"{titles[split]} (form {args.form}):\n{table}")
    parts.append(
        f"{ASTRAWATTCH}. Errors are per case (the mean of its trials), averaged over the "
        "predicted cases; bias is the mean signed error."
    )
    if skipped:
        parts.append("not used (no config for their model): " + "; ".join(skipped))
    return "\n\n".join(parts)


def _sizes(text: str, what: str) -> list[int]:
    from ..llm.grid import parse_token_list

    try:
        sizes = list(parse_token_list(text))
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{what}: expected token counts of at least 1 such as 8,64 or 8..2048")
    return sizes


def calibrate_command(args: argparse.Namespace, storage: Any) -> tuple[str, list[str]]:
    from ..storage.store import AtomicFile
    from .calibrate import calibrate_runs

    target = Path(args.out)  # checked by the front end (the command's ``writes``)
    runs = [storage.load(spec) for spec in args.runs]
    data = calibrate_runs(runs, [str(spec) for spec in args.runs], args.form, args.fit_on)
    try:
        AtomicFile(target).write(json.dumps(data, indent=1, allow_nan=False))
    except FileExistsError:
        raise ConfigError(f"{target} already exists; calibrations are never overwritten") from None
    notes = [f"{_cal_name(cal)}: {cal['form_choice']['reason']}" for cal in data["calibrations"]]
    notes.append(f"wrote {target}: {len(data['calibrations'])} calibration(s)")
    notes += [f"skipped {line}" for line in data["skipped"]]
    if args.format == "json":
        return json.dumps(data, indent=1, allow_nan=False), notes
    return render_calibration(data), notes


def _cal_name(cal: dict[str, Any]) -> str:
    return cal["system"] + (f", setting {cal['setting']}" if cal.get("setting") else "")


def _form_line(cal: dict[str, Any]) -> str:
    """Which form a calibration has and why (files before auto: the form alone)."""
    choice = cal.get("form_choice")
    return choice["reason"] if isinstance(choice, dict) else f"form {cal['form']}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f} %"


def render_calibration(data: dict[str, Any]) -> str:
    from tabulate import tabulate

    parts: list[str] = []
    for cal in data["calibrations"]:
        est = " (estimated energy)" if cal.get("estimated") else ""
        parts.append(
            f"calibration for {_cal_name(cal)}, meter {cal['meter']}{est}, "
            f"models {', '.join(cal['models'])}\n{_form_line(cal)}"
        )
        coef_rows = [
            (
                name,
                f"{cal['time_s']['coefficients'][name]:.4g}",
                f"{cal['energy_j']['coefficients'][name]:.4g}",
            )
            for name in cal["columns"]
        ]
        parts.append(
            tabulate(coef_rows, headers=("column", "s per unit", "J per unit"))
            + f"\nenergy = {cal['energy_j']['power_w']:.4g} W x time + J per unit of work "
            "drawn above that power; the J column holds both (W x s per unit + the extra)"
        )
        err_rows = [
            (
                target,
                f"{100 * cal[target]['in_sample']['mean_abs_rel']:.1f} %",
                f"{100 * cal[target]['leave_one_out']['mean_abs_rel']:.1f} %",
                f"{100 * cal[target]['leave_one_out']['rms_rel']:.1f} %",
            )
            for target in ("time_s", "energy_j")
        ]
        parts.append(
            tabulate(
                err_rows, headers=("fit of", "mean |err|", "held-out mean |err|", "held-out RMS")
            )
        )
        case_rows = [
            (
                c["model"],
                c["input_tokens"],
                c["output_tokens"],
                c["batch_size"],
                f"{c['time_s']:.4g}",
                f"{c['predicted_time_s']:.4g}",
                _pct((c["predicted_time_s"] - c["time_s"]) / c["time_s"]),
                f"{c['energy_j']:.4g}",
                f"{c['predicted_energy_j']:.4g}",
                _pct((c["predicted_energy_j"] - c["energy_j"]) / c["energy_j"]),
            )
            for c in cal["cases"]
        ]
        parts.append(
            tabulate(
                case_rows,
                headers=("model", "in", "out", "batch", "s", "fit s", "err", "J", "fit J", "err"),
            )
        )
        if cal["classes"]:
            class_rows = [
                (
                    r["class"],
                    f"{r['profiled_s']:.4g}",
                    f"{r['predicted_s']:.4g}",
                    _pct(r["error_rel"]),
                )
                for r in cal["classes"]
            ]
            parts.append(
                "per operator class, over the profiled cases (profile shares x measured time):\n"
                + tabulate(class_rows, headers=("class", "profiled s", "model s", "err"))
            )
        else:
            parts.append(
                "per operator class: no profiled cases (measure with --energy-profile-ops)"
            )
    return "\n\n".join(parts) + "\n"


def predict_command(args: argparse.Namespace, storage: Any = None) -> str:
    from .calibrate import load_calibration
    from .features import load_shape
    from .predict import choose, predict, to_profile_csv

    if args.against:
        return against_command(args, storage)
    missing = [
        flag
        for flag, value in (
            ("--model", args.model),
            ("--input-tokens", args.input_tokens),
            ("--output-tokens", args.output_tokens),
        )
        if not value
    ]
    if missing:
        raise ConfigError(f"predict needs {', '.join(missing)} (or --against RUN)")

    try:
        batch = int(args.batch_size)
    except ValueError:
        batch = 0
    if batch < 1:
        raise ConfigError(
            f"--batch-size: expected a whole number of at least 1, got {args.batch_size!r}"
        )
    n_in = _sizes(args.input_tokens, "--input-tokens")
    n_out = _sizes(args.output_tokens, "--output-tokens")
    cal = choose(load_calibration(args.calibration), args.system, args.setting)
    shape = load_shape(args.model, int(cal.get("elem_bytes", 4)))
    rows = predict(cal, shape, n_in, n_out, batch, bool(cal.get("kv_cache", True)))
    if args.format == "json":
        return json.dumps([r.to_dict() for r in rows], indent=1, allow_nan=False)
    if args.format == "csv":
        return to_profile_csv(rows)
    from tabulate import tabulate

    table = [
        (
            r.model,
            r.batch_size,
            r.input_tokens,
            r.output_tokens,
            f"{r.ttft_s:.4g}",
            f"{r.time_s:.4g} ± {r.time_err_s:.2g}",
            f"{r.energy_j:.4g} ± {r.energy_err_j:.2g}",
            f"{r.j_per_token:.4g}",
        )
        for r in rows
    ]
    head = (
        f"predicted (not measured) on {_cal_name(cal)}, from a calibration on "
        f"{', '.join(cal['models'])}; ± is the calibration's held-out RMS error\n" + _form_line(cal)
    )
    return (
        head
        + "\n"
        + tabulate(table, headers=("model", "batch", "in", "out", "ttft s", "s", "J", "J/token"))
    )


def against_command(args: argparse.Namespace, storage: Any) -> str:
    """The held-out error table: measured cases of saved runs against their predictions."""
    from .calibrate import SPEED_KEY, load_calibration
    from .predict import check_against, choose, error_table

    data = load_calibration(args.calibration)
    runs = [storage.load(spec) for spec in args.against]
    skipped: list[str] = []
    rows = []
    for run in runs:
        cal = choose(data, args.system or run.hardware, args.setting)
        rows += check_against(cal, run.cases, skipped)
    if not rows:
        raise ConfigError(
            "no measured case in those runs could be predicted: " + "; ".join(skipped)
        )
    table = error_table(rows)
    if args.format == "json":
        return json.dumps(
            {"models": table, "cases": [dict(r.__dict__) for r in rows], "skipped": skipped},
            indent=1,
            allow_nan=False,
        )
    from tabulate import tabulate

    first = choose(data, args.system or runs[0].hardware, args.setting)
    cal_models = ", ".join(first["models"])
    body = [
        (
            t["model"] + (f" [{t['setting']}]" if t["setting"] else ""),
            t["cases"],
            f"{100 * t['time_mean_abs_err']:.1f} %",
            f"{100 * t['time_mean_err']:+.1f} %",
            f"{100 * t['energy_mean_abs_err']:.1f} %",
            f"{100 * t['energy_mean_err']:+.1f} %",
        )
        for t in table
    ]
    n = len(rows)
    body.append(
        (
            "all",
            n,
            f"{100 * sum(abs(r.time_err) for r in rows) / n:.1f} %",
            f"{100 * sum(r.time_err for r in rows) / n:+.1f} %",
            f"{100 * sum(abs(r.energy_err) for r in rows) / n:.1f} %",
            f"{100 * sum(r.energy_err for r in rows) / n:+.1f} %",
        )
    )
    head = f"predicted from a calibration on {cal_models}, against measured means:"
    text = (
        _form_line(first)
        + "\n"
        + head
        + "\n"
        + tabulate(
            body,
            headers=("model", "cases", "time |err|", "time bias", "energy |err|", "energy bias"),
        )
    )
    cal_speed = first.get(SPEED_KEY)
    speeds = []
    for spec, run in zip(args.against, runs, strict=True):
        speed = run.machine.get(SPEED_KEY)
        if cal_speed and isinstance(speed, int | float) and speed > 0:
            speeds.append(f"{spec} {1000 * speed:.2f} ms ({speed / cal_speed - 1:+.0%})")
    if speeds:
        text += (
            "\nmachine speed (CPU time of a fixed workload at each session's start; higher "
            f"is slower): calibration {1000 * cal_speed:.2f} ms; " + "; ".join(speeds)
        )
    if skipped:
        text += "\nnot predicted: " + "; ".join(skipped)
    return text


def _calibrate(args: argparse.Namespace, storage: Any) -> Outcome:
    out, notes = calibrate_command(args, storage)
    return Outcome(out, notes)


COMMANDS: tuple[Command, ...] = (
    Command(
        "calibrate",
        "fit the operator-class time/energy model to saved runs, per system and setting",
        _calibrate_arguments,
        _calibrate,
        writes=(("out", NEW_FILE),),
    ),
    Command(
        "predict",
        "time and energy of cases never run, from a calibration and a model's config",
        _predict_arguments,
        lambda args, storage: Outcome(predict_command(args, storage)),
    ),
    Command(
        "heldout",
        "error tables of predictions on held-out cases: fit on one sweep, model or system of "
        "saved runs, predict the others",
        _heldout_arguments,
        lambda args, storage: Outcome(heldout_command(args, storage)),
    ),
)
