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
from ..routing.profile import Profile, profiles_from_run, read_profile_csv
from ..routing.route_tables import ROUTE_FORMATS, render_routed
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
        "(one row per trial), or a saved run (number, name, hardware/number, or a path); "
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


def _profiles(specs: Sequence[str], storage: Storage, lam: float = 1.0) -> list[Profile]:
    """A ``.csv`` is read as a profile CSV; anything else names a saved run (whose cases
    measured over GPU settings count at their best setting for ``lam``)."""
    profiles: list[Profile] = []
    for spec in specs:
        if spec.lower().endswith(".csv"):
            profiles += read_profile_csv(spec)
        else:
            profiles += profiles_from_run(storage.load(spec), pick=at_best_settings(lam))
    return profiles


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


def _routed(args: argparse.Namespace, storage: Storage) -> list[Routed]:
    profiles = _profiles(args.profile, storage, args.lam)
    return route(profiles, args.workload or alpaca(), _route_settings(args))


def _route(args: argparse.Namespace, storage: Storage) -> tuple[str, list[str]]:
    routed = _routed(args, storage)
    notes = []
    if args.policy_out:
        path = write_policies(args.policy_out, [r.decision.policy for r in routed])
        notes.append(f"policy written to {path}")
    return render_routed(routed, args.format, width=table_width(args.format)), notes


def _plot(args: argparse.Namespace, storage: Storage) -> tuple[str, list[str]]:
    from ..routing.fit import build_model
    from ..routing.route_plots import write_profile_plots, write_routing_plots

    profiles = _profiles(args.profile, storage, args.lam)
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
