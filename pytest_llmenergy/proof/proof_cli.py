"""``llmenergy proof --out DIR``: every check of the package on the GPU at hand, in one
prepared command, each a pass/fail line with its figure (see ``proof/__init__.py``).
``--part N`` runs one part of the plan, sized to one device call (``plans.py``).

Exit codes: 0 every check that ran passed, 1 one failed, 2 bad input, 4 no NVIDIA GPU
(NVML cannot open one: one line says why).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from ..commandline import Command, Outcome
from ..errors import ConfigError, MeterUnavailable
from ..tables import line_width, wrap
from . import stages
from .checks import Proof
from .plans import PLANS, Plan

EXIT_NO_GPU = 4


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where the proof's files go (a new or empty folder); the command exits 1 when "
        "a check fails, and writes them all the same",
    )
    parser.add_argument(
        "--plan",
        choices=("auto", *PLANS),
        default="auto",
        help="the stages' sizes: h100 (Llama-3.1-8B in bf16 on CUDA), smoke (the tiny "
        "model on the CPU, seconds a stage); auto: h100 where torch sees CUDA, else smoke",
    )
    parser.add_argument(
        "--part",
        type=int,
        metavar="N",
        help="run part N of the plan only: its stages within its budget, sized to one "
        "device call (h100: 1 the meter, the suite, the settings, compiled beside eager and "
        "counted work; 2 the gate's campaign; default: every part, one after the other)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="wall time for the stages run; a stage that no longer fits is not run "
        "(default: the part's budget, or every part's together: "
        + "; ".join(f"{p.name} {_budgets(p)}" for p in PLANS.values())
        + ")",
    )
    parser.add_argument(
        "--stage",
        action="append",
        choices=stages.STAGES,
        help="run this stage only (repeatable; default: all of the part, in order)",
    )


def _budgets(plan: Plan) -> str:
    return " + ".join(f"{p.budget_s:g}" for p in plan.parts) + " s"


def _out_folder(text: str) -> Path:
    folder = Path(text).resolve()  # the stages' processes run elsewhere
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"--out {text}: not a new or empty folder; give another one")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {text}: {exc.strerror or exc}") from None
    return folder


def _plan_name(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch
    except ImportError:
        return "smoke"
    return "h100" if torch.cuda.is_available() else "smoke"


def _chosen(args: argparse.Namespace, plan: Plan) -> tuple[list[str], float]:
    """The stages to run and the budget they share: the part's (or every part's), the
    ``--stage`` options among them, ``--budget`` where given."""
    parts = len(plan.parts)
    if args.part is not None and not 1 <= args.part <= parts:
        raise ConfigError(f"--part {args.part}: the {plan.name} plan has parts 1 to {parts}")
    in_part = plan.part_stages(args.part)
    chosen = [s for s in in_part if not args.stage or s in args.stage]
    if not chosen:
        raise ConfigError(
            f"--stage {', '.join(args.stage)}: not in part {args.part} of the {plan.name} "
            f"plan ({', '.join(in_part)}); drop --part or --stage"
        )
    return chosen, plan.budget_s(args.part) if args.budget is None else args.budget


def _run(args: argparse.Namespace, storage: object) -> Outcome:
    if args.budget is not None and not 0 < args.budget <= 3600:
        raise ConfigError(f"--budget {args.budget:g}: give seconds between 1 and 3600")
    try:
        nvml, handle = stages.open_nvml()
    except MeterUnavailable as exc:
        why = exc.reason.split("; use --energy-backend")[0]
        line = f"proof: no NVIDIA GPU to prove on ({why}); run it where nvidia-smi lists one"
        return Outcome("", notes=[line], exit_code=EXIT_NO_GPU)
    plan = PLANS[_plan_name(args.plan)]
    chosen, seconds = _chosen(args, plan)
    out = _out_folder(args.out)
    proof = Proof(stages.machine(nvml, handle, plan))
    proof.machine["stages"] = _part_text(args.part, plan, chosen, seconds)
    proof.stage_plan = {
        s: {"cap_s": plan.times[s].cap_s, "estimate_s": plan.times[s].estimate_s} for s in chosen
    }
    budget = stages.Budget(seconds, time.monotonic())

    log = _log_to(sys.stderr)
    with tempfile.TemporaryDirectory(prefix="llmenergy-proof-") as folder:
        work = stages.write_suite(Path(folder))
        bodies = {
            "meter": lambda: stages.meter_stage(proof, plan, nvml, handle, log),
            "suite": lambda: stages.suite_stage(proof, plan, work, out, budget, log),
            "settings": lambda: stages.settings_stage(
                proof, plan, nvml, handle, work, out, budget, log
            ),
            "compiled": lambda: stages.compiled_stage(proof, plan, out),
            "gate": lambda: stages.gate_stage(proof, plan, work, out, budget, log),
            "work": lambda: stages.work_stage(proof, plan, work, out, budget, log),
        }
        for name in stages.STAGES:
            if name in chosen:
                stages.run_stage(proof, name, budget, bodies[name], log)
                proof.write(out)
                for check in proof.checks:
                    if check.stage == name:
                        log(check.line())
    width = line_width(sys.stdout)
    lines = [part for c in proof.checks for part in wrap(c.line(), width)]
    return Outcome(
        "\n".join([*lines, proof.summary()]),
        notes=[f"proof written to {out / 'proof.md'} and {out / 'proof.json'}"],
        failed=bool(proof.failed),
    )


def _part_text(part: int | None, plan: Plan, chosen: list[str], budget_s: float) -> str:
    """Which stages ran, of which part, within what: the record of a proof run in parts."""
    which = "every part" if part is None else f"part {part} of {len(plan.parts)}"
    estimate = plan.estimate_sum_s(chosen)
    return (
        f"{', '.join(chosen)} ({which}; budget {budget_s:g} s, caps "
        f"{plan.caps_sum_s(chosen):g} s, estimate {estimate:.0f} s)"
    )


def _log_to(stream: TextIO) -> stages.Log:
    """The stages' progress, a line each, wrapped to the terminal like every command's
    notes; a command the proof runs stays one line, whole, to be copied and run again."""

    def log(line: str) -> None:
        text = f"llmenergy proof: {line}"
        width = None if line.startswith("$ ") else line_width(stream)
        print("\n".join(wrap(text, width)), file=stream, flush=True)

    return log


COMMANDS = (
    Command(
        "proof",
        "on a machine with an NVIDIA GPU: check the meter, the suite, the GPU settings, the "
        "gate and counted work there, each a pass/fail line (writes proof.md, proof.json)",
        _arguments,
        _run,
    ),
)
