"""From measurements and a workload to one routing decision per model: what the
``llmenergy route`` command and the plugin's routing section both run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import INPUT
from .fit import SystemModel, build_model
from .optimize import TOKENS, Capacity, Decision, Router, pareto
from .profile import Profile, select
from .served import build_served_model
from .workload import Workload

DEFAULT_LAMBDA_STEPS = 11


@dataclass(frozen=True)
class RouteSettings:
    by: str = INPUT
    lam: float = 1.0
    p_ref_w: float | None = None  # None: the largest average power among the systems
    capacities: tuple[Capacity, ...] = ()
    boundaries: str = TOKENS
    lambda_steps: int = DEFAULT_LAMBDA_STEPS  # points of the Pareto sweep, 0 for none
    systems: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class Routed:
    """One model's decision, and the lam sweep behind its Pareto front."""

    router: Router
    decision: Decision
    sweep: tuple[Decision, ...]
    front: tuple[Decision, ...]


def lambdas(steps: int) -> list[float]:
    return [float(x) for x in np.linspace(0.0, 1.0, steps)] if steps >= 2 else []


def model_for(profile: Profile) -> SystemModel:
    """A served workload's requests are fitted as scattered sizes; one-at-a-time cases
    along their sweeps."""
    return build_served_model(profile) if profile.served else build_model(profile)


def route(
    profiles: Sequence[Profile], workload: Workload, settings: RouteSettings = RouteSettings()
) -> list[Routed]:
    chosen = select(profiles, settings.systems, settings.models)
    routed = []
    for model_profiles in chosen.values():
        router = Router(
            [model_for(p) for p in model_profiles],
            workload,
            by=settings.by,
            p_ref_w=settings.p_ref_w,
            boundaries=settings.boundaries,
        )
        decision = router.solve(settings.lam, settings.capacities)
        sweep = tuple(router.sweep(lambdas(settings.lambda_steps), settings.capacities))
        routed.append(Routed(router, decision, sweep, tuple(pareto(sweep))))
    return routed
