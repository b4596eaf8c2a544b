"""``llmenergy route`` and ``plot``: which queries go to which system, what that saves,
and the figures of it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .. import values
from ..commandline import ROUTING_LIKE_OPTIONS, Command, Outcome
from ..errors import ConfigError
from ..frontier import at_best_settings
from ..plotting import FORMATS as PLOT_FORMATS
from ..routing.decide import DEFAULT_LAMBDA_STEPS, Routed, RouteSettings, route
from ..routing.optimize import BOUNDARY_CHOICES, CAPACITY_EXAMPLES, TOKENS, parse_capacity
from ..routing.policy import write_policies
from ..routing.profile import Profile, alone_case, profiles_from_run, read_profile_csv
from ..routing.route_tables import ROUTE_FORMATS, render_routed
from ..routing.served import served_profiles_from_run
from ..routing.workload import alpaca
from ..storage.store import FOLDER, NEW_FILE, STORAGE_HELP, Storage
from .cli_args import checked, table_width


def _route_arguments(route: argparse.ArgumentParser) -> None:
    _routing_arguments(route)
    route.add_argument("--format", choices=ROUTE_FORMATS, default="table")
    route.add_argument(
        "--policy-out",
        metavar="FILE",
        help="write the policy as JSON for a router (one object, or a list for several "
        "models); an existing file is left alone",
    )


def _plot_arguments(plot: argparse.ArgumentParser) -> None:
    _routing_arguments(plot)
    plot.add_argument("--out", default="llmenergy-plots", metavar="DIR", help="folder")
    plot.add_argument(
        "--image-format",
        action="append",
        choices=PLOT_FORMATS,
        help="png or svg, repeatable (default: png)",
    )


def _routing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        action="append",
        required=True,
        metavar="FILE",
        help="measurements: a CSV of system,model,input_tokens,output_tokens,seconds,joules "
        "(one row per trial), or a saved run (number, name, hardware/number, or a path: "
        "its one-at-a-time cases, and a served workload's requests routed beside them); "
        "repeatable",
    )
    parser.add_argument(
        "--system",
        action="append",
        default=[],
        metavar="NAME",
        help="route between these systems only, repeatable (default: every one profiled)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="route this model, repeatable (default: every model measured on every system; "
        "'all' pools each system's models)",
    )
    parser.add_argument(
        "--p-ref",
        type=checked(values.watts),
        default=None,
        metavar="W",
        help="watts that price a second of runtime (default: the largest average power "
        "among the systems)",
    )
    parser.add_argument(
        "--capacity",
        action="append",
        default=[],
        type=checked(parse_capacity),
        metavar="SYS=LIMIT",
        help=f"most a system may take: {CAPACITY_EXAMPLES}; repeatable".replace("%", "%%"),
    )
    parser.add_argument(
        "--boundaries",
        choices=BOUNDARY_CHOICES,
        default=TOKENS,
        help="thresholds at any token count (default), or at measured sizes only",
    )
    parser.add_argument(
        "--lambda-steps",
        type=checked(_steps),
        default=DEFAULT_LAMBDA_STEPS,
        metavar="N",
        help=f"lambdas from 0 to 1 for the Pareto front (default {DEFAULT_LAMBDA_STEPS}; "
        "0 for none)",
    )
    parser.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def _steps(text: str) -> int:
    value = values.integer(0, 1001)(text)
    if value == 1:
        raise ConfigError("expected 0 (no sweep) or 2 to 1001 steps, got '1'")
    return value


Profiles = tuple[list[Profile], list[Profile]]  # one at a time, served


def _profiles(specs: Sequence[str], storage: Storage, lam: float = 1.0) -> Profiles:
    """A ``.csv`` is read as a profile CSV; anything else names a saved run, whose
    one-at-a-time cases (each measured over GPU settings at its best setting for ``lam``)
    and served workloads (each request's joules) are profiled apart."""
    alone: list[Profile] = []
    served: list[Profile] = []
    for spec in specs:
        if spec.lower().endswith(".csv"):
            alone += read_profile_csv(spec)
            continue
        run = storage.load(spec)
        served += served_profiles_from_run(run)
        if any(alone_case(c) for c in run.cases) or not served:
            alone += profiles_from_run(run, pick=at_best_settings(lam))
    return alone, served


def _route_settings(args: argparse.Namespace) -> RouteSettings:
    return RouteSettings(
        by=args.by,
        lam=args.lam,
        p_ref_w=args.p_ref,
        capacities=tuple(args.capacity),
        boundaries=args.boundaries,
        lambda_steps=args.lambda_steps,
        systems=tuple(args.system),
        models=tuple(args.model),
    )


def _routed_apart(args: argparse.Namespace, storage: Storage) -> tuple[list[Routed], list[Routed]]:
    """Decisions from the one-at-a-time cases and from the served workloads, each
    routed on its own: their joules are of different operating points."""
    alone, served = _profiles(args.profile, storage, args.lam)
    workload, settings = args.workload or alpaca(), _route_settings(args)
    decided = route(alone, workload, settings) if alone else []
    return decided, route(served, workload, settings) if served else []


def _routed(args: argparse.Namespace, storage: Storage) -> list[Routed]:
    """The one-at-a-time decisions (the served ones where no case ran alone)."""
    alone, served = _routed_apart(args, storage)
    return alone or served


def _route(args: argparse.Namespace, storage: Storage) -> tuple[str, list[str]]:
    alone, served = _routed_apart(args, storage)
    notes = []
    if args.policy_out:
        chosen, kind = (served, "the served workload") if served else (alone, "")
        path = write_policies(args.policy_out, [r.decision.policy for r in chosen])
        notes.append(f"policy written to {path}" + (f" (from {kind})" if kind else ""))
    width = table_width(args.format)
    return render_routed(alone, args.format, width=width, served=served), notes


def _plot(args: argparse.Namespace, storage: Storage) -> tuple[str, list[str]]:
    from ..routing.fit import build_model
    from ..routing.route_plots import write_profile_plots, write_routing_plots

    profiles = _profiles(args.profile, storage, args.lam)[0]
    if not profiles:
        raise ConfigError("plot draws one-at-a-time cases; the runs hold served workloads only")
    formats = tuple(dict.fromkeys(args.image_format or ["png"]))
    out = Path(args.out)
    systems = {p.system for p in profiles if not args.system or p.system in args.system}
    written: list[Path] = []
    if len(systems) < 2:  # one system: its curves, nothing to route
        chosen = [p for p in profiles if p.system in systems]
        written += write_profile_plots([build_model(p) for p in chosen], out, formats)
    else:
        routed = _routed(args, storage)
        for r in routed:
            written += write_profile_plots(r.router.models, out, formats)
            lams = [d.policy.lam for d in r.sweep] or [r.decision.policy.lam]
            written += write_routing_plots(
                r.router, out, formats, lams=lams, capacities=tuple(args.capacity)
            )
    return "\n".join(str(p) for p in written), []


COMMANDS: tuple[Command, ...] = (
    Command(
        "route",
        "which queries go to which system (thresholds), and what that saves",
        _route_arguments,
        lambda args, storage: Outcome(*_route(args, storage)),
        like_options=ROUTING_LIKE_OPTIONS,
        writes=(("policy_out", NEW_FILE),),
    ),
    Command(
        "plot",
        "figures: energy per token and runtime per system; workload totals against the "
        "threshold; the energy-runtime Pareto front",
        _plot_arguments,
        lambda args, storage: Outcome(*_plot(args, storage)),
        like_options=ROUTING_LIKE_OPTIONS,
        writes=(("out", FOLDER),),
    ),
)
