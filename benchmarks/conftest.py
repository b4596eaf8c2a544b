"""The suite's fixture: one case measured, by a model here or by a server.

The code is in the package (pytest_llmenergy.suite.fixtures), so that a clone
and an installed wheel run one suite; `llmenergy init-suite DIR` writes this
file into a project.
"""

from pytest_llmenergy.suite.fixtures import run_case

__all__ = ["run_case"]
