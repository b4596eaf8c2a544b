"""Repeating: the stopping rule, CI targets, case order, and the benchmark loop.

What a case leaves behind (``CaseResult``, ``Trial``) is the package's core data model
and lives in :mod:`pytest_llmenergy.results`.
"""

from ..errors import renamed_names
from .rule import ControllerSettings, StopDecision, decide
from .targets import CITarget, parse_ci_target, parse_ci_targets

__all__ = [
    "CITarget",
    "ControllerSettings",
    "StopDecision",
    "decide",
    "parse_ci_target",
    "parse_ci_targets",
]

# The 0.1 names, until 0.3.0.
__getattr__ = renamed_names(
    "pytest_llmenergy.controller", {"ControllerOptions": "ControllerSettings"}, globals()
)
