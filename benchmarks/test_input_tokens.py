"""Energy and time against the number of input tokens, at a fixed output length.

The code is in the package (pytest_llmenergy.suite.input_tokens), so that a clone
and an installed wheel run one suite; `llmenergy init-suite DIR` writes this
file into a project.
"""

from pytest_llmenergy.suite.input_tokens import test_input_tokens

__all__ = ["test_input_tokens"]
