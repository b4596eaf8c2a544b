"""``llmenergy``: list, show and compare saved runs; gate CI on them; route queries
between systems and plot what that saves.

Exit codes: 0 fine, 1 an energy gate failed (``compare --fail-on``, ``report --gate``,
``ab``), 2 bad input (one line on stderr, no traceback), 3 the measurement could not
finish (a side of ``ab`` failed, a machine too busy for ``check``), 130
interrupted (Ctrl-C: one line; each file is written whole or not at all);
docs/exit-codes.md has every command's.
``--format csv`` and ``json`` print data only, so they can be piped into another
program; what people need besides (a gate's verdict) goes to stderr.  csv keeps every
name as it is for that program, and shows its control characters as escapes when it is
printed on a terminal (as the other formats always do).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .. import __version__
from ..commandline import Command, check_commands
from ..errors import LLMEnergyError
from ..figures import DeprecatedName
from ..frontier import frontier_cli
from ..plugin.options import plugin_option
from ..predict.predict_cli import COMMANDS as PREDICT_COMMANDS
from ..proof.proof_cli import COMMANDS as PROOF_COMMANDS
from ..storage.research import COMMANDS as IMPORT_COMMANDS
from ..storage.store import DEFAULT_STORAGE, STORAGE_HELP, Storage, check_output
from ..tables import FORMATS, line_width, printable, wrap
from .ab_cli import COMMANDS as AB_COMMANDS
from .check_cli import COMMANDS as CHECK_COMMANDS
from .cli_args import DATA_FORMATS, checked
from .compare_cli import COMMANDS as COMPARE_COMMANDS
from .route_cli import COMMANDS as ROUTE_COMMANDS
from .runs_cli import COMMANDS as RUNS_COMMANDS
from .suite_cli import COMMANDS as SUITE_COMMANDS

EXIT_OK, EXIT_GATE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C stopped


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its error line wrapped to the terminal as every other line
    the command prints (an unknown figure's line names every figure)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        lines = _fitted([f"{self.prog}: error: {message}"], sys.stderr)
        self.exit(EXIT_USAGE, "\n".join(lines) + "\n")


def _parser() -> argparse.ArgumentParser:
    """The parser, built from the command table: one subparser per record."""
    parser = _Parser(
        prog="llmenergy",
        description="Saved pytest-llmenergy runs: list them, show one, compare several.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--storage", default=DEFAULT_STORAGE, metavar="DIR", help=STORAGE_HELP)
    common = _Parser(add_help=False)
    common.add_argument("--format", choices=FORMATS, default="table")
    # Also after the command (``llmenergy list --storage DIR``); SUPPRESS keeps the global
    # value when it is not given here.
    common.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        parents = [common] if command.common else []
        command_parser = sub.add_parser(command.name, parents=parents, help=command.help)
        command.arguments(command_parser)
        for flag, option_flag in command.like_options:
            like_plugin_option(command_parser, flag, option_flag)
    return parser


def like_plugin_option(parser: argparse.ArgumentParser, flag: str, option_flag: str) -> None:
    """A flag that means what a pytest option means, built from that option's row (its
    parser, default, metavar and help): ``--session-noise`` is ``--energy-session-noise``.
    A repeatable row stays repeatable, its values parsed together as the option's are."""
    row = plugin_option(option_flag)
    help_text = f"{row.full_help()}; the pytest option {row.flag}".replace("%", "%%")
    if row.multiple:
        parser.add_argument(
            flag,
            dest=row.field_name,
            action=_JoinedValues,
            parse=row.parse,
            default=row.default,
            metavar=row.metavar,
            help=f"{help_text} (repeatable)",
        )
        return
    parser.add_argument(
        flag,
        dest=row.field_name,
        type=checked(row.parse),
        default=row.default,
        metavar=row.metavar,
        help=help_text,
    )


class _JoinedValues(argparse.Action):
    """Every value given so far, joined with commas and parsed once: ``--max-slowdown 0%
    --max-slowdown 5%`` means ``0%,5%``, as the repeated pytest option does."""

    def __init__(self, *args: Any, parse: Callable[[str], Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parse = parse

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = [*getattr(namespace, f"_{self.dest}_given", []), str(values)]
        setattr(namespace, f"_{self.dest}_given", given)
        try:
            setattr(namespace, self.dest, checked(self.parse)(",".join(given)))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None


# Every command, in the order ``llmenergy --help`` lists them; each package contributes its own.
COMMANDS: dict[str, Command] = check_commands(
    (
        *RUNS_COMMANDS,
        *COMPARE_COMMANDS,
        *AB_COMMANDS,
        *ROUTE_COMMANDS,
        *frontier_cli.COMMANDS,
        *PREDICT_COMMANDS,
        *IMPORT_COMMANDS,
        *CHECK_COMMANDS,
        *PROOF_COMMANDS,
        *SUITE_COMMANDS,
    )
)


# -- output ------------------------------------------------------------------------------
def _emit(text: str) -> None:
    """Print ``text``; a closed pipe (``| head``) or a console that cannot show ``—`` or
    ``±`` must not end in a traceback.  Nothing at all for no text: a command that says
    everything on stderr (``proof`` without a GPU) leaves stdout empty, not one blank line."""
    if not text:
        return
    out = sys.stdout
    if not text.endswith("\n"):
        text += "\n"
    try:
        try:
            out.write(text)
        except UnicodeEncodeError:
            encoding = out.encoding or "ascii"
            out.write(text.encode(encoding, "replace").decode(encoding))
        out.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at devnull so that is quiet too.
        with contextlib.suppress(OSError, ValueError):  # a stdout without a descriptor
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)


def _on_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed
        return False


def _shown_csv(text: str) -> str:
    """csv for a terminal: each row's control characters as escapes (``\\x1b``), so a
    name from a run file cannot clear the screen or retitle the window; the rows' own
    line breaks stay."""
    return "\n".join(printable(line) for line in text.split("\n"))


def _fitted(lines: Sequence[str], stream: Any) -> list[str]:
    """Each line wrapped to the terminal ``stream`` shows it on, continued indented."""
    width = line_width(stream)
    return [part for line in lines for part in wrap(line, width)]


def _error(message: str) -> int:
    """One line on stderr, wrapped to the terminal; what it quotes of a file (a run's
    status, a name) escaped."""
    _say(f"error: {printable(' '.join(message.splitlines()))}")
    return EXIT_USAGE


def _say(line: str) -> None:
    """``llmenergy: line`` on stderr, wrapped to the terminal."""
    for part in _fitted([f"llmenergy: {line}"], sys.stderr):
        print(part, file=sys.stderr)


def _glue_descending_sort(argv: Sequence[str]) -> list[str]:
    """``--sort -joules`` reads to argparse as an unknown option ``-joules``; make it
    ``--sort=-joules``, which it takes as the value."""
    out: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            return [*out, arg, *rest]
        if arg == "--sort" and rest and rest[0].startswith("-") and not rest[0].startswith("--"):
            arg = f"--sort={rest.pop(0)}"
        out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecatedName)
        try:
            return _main(argv)
        except KeyboardInterrupt:  # Ctrl-C, in any command: no traceback
            _say("interrupted; stopped before finishing (no file is left half-written)")
            return EXIT_INTERRUPTED
        finally:  # also when argparse exits on a usage error
            for warning in caught:
                if issubclass(warning.category, DeprecatedName):  # an old name: one line
                    _say(f"warning: {warning.message}")
                else:  # anything else goes where it would have gone
                    warnings.showwarning(
                        warning.message, warning.category, warning.filename, warning.lineno
                    )


def _main(argv: Sequence[str] | None) -> int:
    words = _glue_descending_sort(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in words:  # what follows goes to another program (llmenergy ab: pytest)
        at = words.index("--")
        words, rest = words[:at], words[at + 1 :]
    parser = _parser()
    args = parser.parse_args(words)
    if rest and not hasattr(args, "pytest_args"):
        parser.error(f"llmenergy {args.command} takes no arguments after --")
    if rest:
        args.pytest_args = rest
    storage = Storage(args.storage)
    command = COMMANDS[args.command]
    try:
        for dest, kind in command.writes:  # before any work: one line, exit 2
            value = getattr(args, dest, None)
            if value:
                flag = f"--{dest.replace('_', '-')}"
                check_output(value, kind, storage=storage.root, label=f"{flag} {value}")
        outcome = command.run(args, storage)
    except LLMEnergyError as exc:  # RunFileError, ConfigError: they name what is wrong
        return _error(str(exc))
    except OSError as exc:  # a storage folder that cannot be listed
        where = f"{exc.filename}: " if exc.filename else ""
        return _error(f"{where}{exc.strerror or exc}")
    out, verdicts = outcome.out, outcome.verdicts
    data = getattr(args, "format", None) in DATA_FORMATS  # report has no --format
    if getattr(args, "format", None) == "csv" and _on_terminal(sys.stdout):
        out = _shown_csv(out)
    if verdicts and not data:
        out = out.rstrip("\n") + "\n" + "\n".join(_fitted(verdicts, sys.stdout))
    _emit(out)
    # what was written where: stderr, so stdout stays data
    for line in outcome.notes:
        _say(line)
    if verdicts and data:
        for line in _fitted(verdicts, sys.stderr):  # CI logs still say why it failed
            print(line, file=sys.stderr)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return EXIT_GATE if outcome.failed else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
