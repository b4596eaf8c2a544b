"""Energy and time against the number of output tokens, at a fixed input length.

The code is in the package (pytest_llmenergy.suite.output_tokens), so that a clone
and an installed wheel run one suite; `llmenergy init-suite DIR` writes this
file into a project.
"""

from pytest_llmenergy.suite.output_tokens import test_output_tokens

__all__ = ["test_output_tokens"]
