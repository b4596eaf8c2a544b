"""``llmenergy gpu restore`` and ``llmenergy frontier RUN``: the CLI side of GPU settings.

``gpu restore`` gives back the GPUs a killed session left changed (from its state file);
``frontier`` computes the time-energy frontier of a saved run measured over GPU settings,
with the table, JSON (the per-token-range setting policy included) and figures.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..commandline import ROUTING_LIKE_OPTIONS, Command, Outcome
from ..conditions.control import StateFile, default_state_path, recover
from ..errors import ConfigError
from ..storage.runfile import Run
from ..storage.store import FOLDER, NEW_FILE, AtomicFile
from ..tables import render
from . import (
    at_best_settings,
    frontier_json,
    frontier_table,
    frontiers,
    with_settings,
)


def _gpu_arguments(gpu: argparse.ArgumentParser) -> None:
    gpu_sub = gpu.add_subparsers(dest="gpu_command", required=True, metavar="ACTION")
    restore = gpu_sub.add_parser(
        "restore",
        help="give back the power limits and clocks a killed session left changed",
    )
    restore.add_argument(
        "--state",
        metavar="FILE",
        help=f"the state file (default: $LLMENERGY_GPU_STATE or {default_state_path()})",
    )
    restore.add_argument(
        "--force",
        action="store_true",
        help="restore even though the session that wrote the file seems alive",
    )


def _frontier_arguments(front: argparse.ArgumentParser) -> None:
    front.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="number, name, hardware/number, or a path; several runs (one per system): "
        "also route between the systems, each at its best settings",
    )
    front.add_argument(
        "--p-ref",
        type=float,
        default=None,
        metavar="WATTS",
        help="price of time in W (default: the GPU's highest power limit, as recorded)",
    )
    front.add_argument("--json", metavar="FILE", help="also write the frontier and policy here")
    front.add_argument("--plots", metavar="DIR", help="also write one figure per model here")


def restore_command(args: argparse.Namespace) -> tuple[str, list[str]]:
    state = StateFile(Path(args.state) if args.state else None)
    found = recover(state, force=args.force)
    if found is None:
        return f"nothing to restore: no GPU state file at {state.path}", []
    data, back = found
    lines = [
        f"restored the GPU settings a session left changed (pid {data.get('pid')}, "
        f"started {data.get('started')}):"
    ]
    lines += [f"  {b.describe()}" for b in back]
    return "\n".join(lines), []


def frontier_command(runs: list[Run], args: argparse.Namespace) -> tuple[str, list[str]]:
    tables = []
    documents: list[dict[str, Any]] = []
    notes: list[str] = []
    for run in runs:
        items = frontiers(
            run.cases, max_slowdowns=args.max_slowdowns, lam=args.lam, p_ref_w=args.p_ref
        )
        if not items:
            raise ConfigError(
                f"{run.path}: no case was measured at two or more GPU settings; run the "
                "suite with --energy-gpu-power-limits or --energy-gpu-clocks"
            )
        system = run.hardware or run.label
        table = frontier_table(items)
        tables.append(replace(table, title=f"{table.title} · {system}"))
        documents.append(frontier_json(items, system))
        if args.plots:
            from .frontier_plots import write_frontier_plots

            written = write_frontier_plots(items, Path(args.plots), system=system)
            notes += [f"figure {p}" for p in written]
    routes = _route(runs, documents, args) if len(runs) > 1 else []
    document: dict[str, Any] = documents[0] if len(documents) == 1 else {"systems": documents}
    if routes:
        document["routes"] = routes
    if args.json:
        path = Path(args.json)
        try:  # whole or not at all, and never over a file that appeared meanwhile
            AtomicFile(path).write(json.dumps(document, indent=1))
        except FileExistsError:
            raise ConfigError(f"--json {path}: the file exists; choose another name") from None
        notes.append(f"frontier written to {path}")
    if args.format == "json":
        return json.dumps(document, indent=1), notes
    text = render(tables, args.format)
    for r in routes:
        rules = "; ".join(
            f"{_bound(rule, r['by'])} -> {rule['system']} at {rule['setting'] or 'as it is'}"
            for rule in r["rules"]
        )
        text += f"\nroute {r['model']} (lambda {args.lam:g}, by {r['by']}): {rules}"
    return text, notes


def _bound(rule: dict[str, Any], by: str) -> str:
    limit = rule.get(f"max_{by}_tokens")
    return f"{by} <= {limit}" if limit is not None else "the rest"


def _route(
    runs: list[Run], documents: list[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Route between the systems, each at its lam-best settings: system and setting
    chosen together."""
    from ..routing.decide import RouteSettings, route
    from ..routing.profile import profiles_from_run
    from ..routing.workload import alpaca

    pick = at_best_settings(args.lam)
    profiles = [p for run in runs for p in profiles_from_run(run, pick=pick)]
    routed = route(
        profiles,
        args.workload or alpaca(),
        RouteSettings(by=args.by, lam=args.lam, lambda_steps=0),
    )
    setting_policies = [p for d in documents for p in d["policies"]]
    return [
        {
            "model": r.decision.policy.model,
            "by": r.decision.policy.by,
            "lambda": args.lam,
            "rules": with_settings(r.decision.policy, setting_policies),
        }
        for r in routed
    ]


def _restore(args: argparse.Namespace, storage: Any) -> Outcome:
    return Outcome(*restore_command(args))


def _frontier(args: argparse.Namespace, storage: Any) -> Outcome:
    return Outcome(*frontier_command([storage.load(spec) for spec in args.runs], args))


COMMANDS: tuple[Command, ...] = (
    Command("gpu", "GPU settings a session changed: restore them", _gpu_arguments, _restore),
    Command(
        "frontier",
        "the time-energy frontier of a run measured over GPU settings",
        _frontier_arguments,
        _frontier,
        common=True,
        like_options=(("--max-slowdown", "--energy-max-slowdown"), *ROUTING_LIKE_OPTIONS),
        writes=(("json", NEW_FILE), ("plots", FOLDER)),
    ),
)
