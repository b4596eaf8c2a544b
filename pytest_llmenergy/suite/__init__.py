"""The built-in benchmark suite: every model x token-size case is a parametrized test.

Its code lives here, in the package, so that an installed wheel runs the same suite as a
clone.  It runs as a folder of thin files, ``benchmarks/``, that import it: the clone's
own ``benchmarks/`` is such a folder, and ``llmenergy init-suite DIR`` writes one into
any project.  The files are generated from ``FILES`` (tests/test_suite_files.py checks
the clone's against them), so there is one suite, never two copies that drift; and a
case's node id (``benchmarks/test_input_tokens.py::test_input_tokens[...]``), which
saved runs are compared by, is the same from a clone and from a wheel.
"""

from __future__ import annotations

from dataclasses import dataclass

PACKAGE = __name__


@dataclass(frozen=True)
class SuiteFile:
    """One file of ``benchmarks/``: its name there, the module of this package it
    imports, the names it takes (the tests, or the fixture) and its docstring."""

    name: str
    module: str
    names: tuple[str, ...]
    doc: str

    def import_line(self) -> str:
        """The line that takes the suite's code into the file."""
        return f"from {PACKAGE}.{self.module} import {', '.join(self.names)}"

    def text(self) -> str:
        """The file's whole text (ruff-formatted as it stands)."""
        listed = ", ".join(f'"{n}"' for n in self.names)
        return (
            f'"""{self.doc}\n\n'
            f"The code is in the package ({PACKAGE}.{self.module}), so that a clone\n"
            "and an installed wheel run one suite; `llmenergy init-suite DIR` writes this\n"
            'file into a project.\n"""\n\n'
            f"{self.import_line()}\n\n"
            f"__all__ = [{listed}]\n"
        )


FILES: tuple[SuiteFile, ...] = (
    SuiteFile(
        "conftest.py",
        "fixtures",
        ("run_case",),
        "The suite's fixture: one case measured, by a model here or by a server.",
    ),
    SuiteFile(
        "test_input_tokens.py",
        "input_tokens",
        ("test_input_tokens",),
        "Energy and time against the number of input tokens, at a fixed output length.",
    ),
    SuiteFile(
        "test_output_tokens.py",
        "output_tokens",
        ("test_output_tokens",),
        "Energy and time against the number of output tokens, at a fixed input length.",
    ),
)
