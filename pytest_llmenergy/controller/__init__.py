"""Repeating: the stopping rule, CI targets, case order, and the benchmark loop.

What a case leaves behind (``CaseResult``, ``Trial``) is the package's core data model
and lives in :mod:`pytest_llmenergy.results`.
"""

from .rule import ControllerOptions, StopDecision, decide
from .targets import CITarget, parse_ci_target, parse_ci_targets

__all__ = [
    "CITarget",
    "ControllerOptions",
    "StopDecision",
    "decide",
    "parse_ci_target",
    "parse_ci_targets",
]
