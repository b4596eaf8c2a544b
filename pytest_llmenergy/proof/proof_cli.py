"""``llmenergy proof --out DIR``: every check of the package on the GPU at hand, in one
prepared command, each a pass/fail line with its figure (see ``proof/__init__.py``).

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
from .plans import PLANS

EXIT_NO_GPU = 4
# the h100 plan: every stage, the gate's campaign included, within 12 minutes on one H100
DEFAULT_BUDGET_S = 700.0


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
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help=f"wall time for all stages; a stage that no longer fits is not run "
        f"(default {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument(
        "--stage",
        action="append",
        choices=stages.STAGES,
        help="run this stage only (repeatable; default: all, in order)",
    )


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


def _run(args: argparse.Namespace, storage: object) -> Outcome:
    if not 0 < args.budget <= 3600:
        raise ConfigError(f"--budget {args.budget:g}: give seconds between 1 and 3600")
    try:
        nvml, handle = stages.open_nvml()
    except MeterUnavailable as exc:
        why = exc.reason.split("; use --energy-backend")[0]
        line = f"proof: no NVIDIA GPU to prove on ({why}); run it where nvidia-smi lists one"
        return Outcome("", notes=[line], exit_code=EXIT_NO_GPU)
    out = _out_folder(args.out)
    plan = PLANS[_plan_name(args.plan)]
    proof = Proof(stages.machine(nvml, handle, plan))
    budget = stages.Budget(args.budget, time.monotonic())

    log = _log_to(sys.stderr)
    chosen = args.stage or list(stages.STAGES)
    with tempfile.TemporaryDirectory(prefix="llmenergy-proof-") as folder:
        work = stages.write_suite(Path(folder))
        bodies = {
            "meter": lambda: stages.meter_stage(proof, plan, nvml, handle, log),
            "suite": lambda: stages.suite_stage(proof, plan, work, out, budget, log),
            "compiled": lambda: stages.compiled_stage(proof, plan, work, out, budget, log),
            "settings": lambda: stages.settings_stage(
                proof, plan, nvml, handle, work, out, budget, log
            ),
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
