"""Deprecated: moved to :mod:`pytest_llmenergy.results` in 0.2.0; removed in 0.3.0."""

import warnings

from ..results import (  # noqa: F401
    CONVERGED,
    DECODE,
    LIMIT,
    OOM,
    PREFILL,
    ROUNDS,
    CaseResult,
    PhaseRecord,
    Trial,
)

warnings.warn(
    "pytest_llmenergy.controller.results moved to pytest_llmenergy.results; "
    "import CaseResult and Trial from there (or from pytest_llmenergy)",
    DeprecationWarning,
    stacklevel=2,
)
