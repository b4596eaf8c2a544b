"""``llmenergy init-suite [DIR]``: the built-in suite's files written into a project, so
that an installed package runs it as a clone does, ``python -m pytest benchmarks/``,
with the same case ids (saved runs compare across the two)."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from ..commandline import Command, Outcome
from ..errors import ConfigError
from ..storage.store import FOLDER, AtomicFile, Storage, check_output
from ..suite import FILES

DEFAULT_DIR = "benchmarks"


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir",
        nargs="?",
        default=DEFAULT_DIR,
        metavar="DIR",
        help=f"the folder to write them to, made if missing (default: {DEFAULT_DIR}, as in "
        "a clone, so that case ids match a clone's runs)",
    )


def _run(args: argparse.Namespace, storage: Storage) -> Outcome:
    folder = check_output(args.dir, FOLDER, storage=storage.root)
    todo, kept = [], []
    for suite_file in FILES:  # everything is checked before anything is written
        path, text = folder / suite_file.name, suite_file.text()
        if _holds(path, text, suite_file.import_line()):
            kept.append(path)
            continue
        if os.path.lexists(path):
            raise ConfigError(
                f"{path} exists and is not the suite's {suite_file.name}: move it away, "
                "give another folder (llmenergy init-suite DIR), or add the suite's line "
                f"to it yourself: {suite_file.import_line()}"
            )
        todo.append((path, text))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in todo:
            AtomicFile(path).write(text)
    except OSError as exc:
        raise ConfigError(f"{args.dir}: cannot write there: {exc.strerror or exc}") from None
    notes = [f"wrote {p}" for p, _ in todo]
    if kept:
        notes.append(f"already there: {', '.join(p.name for p in kept)}")
    command = f"python -m pytest {_shown(folder)}"
    return Outcome(
        f"run the suite with: {command} (a first, short run: {command} --llm-grid=quick)",
        notes=notes,
    )


def _holds(path: Path, text: str, line: str) -> bool:
    """Is ``path`` a regular file with exactly ``text`` (a rerun writes nothing), or one
    of the project's own that has the suite's line (a conftest of its own, say)?"""
    try:
        if not path.is_file():
            return False
        found = path.read_text(encoding="utf-8")
        return found == text or line in found.splitlines()
    except (OSError, UnicodeDecodeError):
        return False


def _shown(folder: Path) -> str:
    """The folder as a shell word, with pytest's trailing slash: ``benchmarks/``."""
    return shlex.quote(os.path.join(os.fspath(folder), ""))


COMMANDS = (
    Command(
        "init-suite",
        "write the built-in benchmark suite (benchmarks/: thin files that import it from "
        "the installed package) into a project, to run it without a clone of this "
        "repository: llmenergy init-suite, then python -m pytest benchmarks/",
        _arguments,
        _run,
    ),
)
