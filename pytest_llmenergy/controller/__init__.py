"""Repeating: the stopping rule, CI targets, case order, and the benchmark loop."""

from .results import CaseResult, PhaseRecord, Trial
from .rule import ControllerOptions, Decision, decide
from .targets import CITarget, parse_ci_target, parse_ci_targets

__all__ = [
    "CITarget",
    "CaseResult",
    "ControllerOptions",
    "Decision",
    "PhaseRecord",
    "Trial",
    "decide",
    "parse_ci_target",
    "parse_ci_targets",
]
