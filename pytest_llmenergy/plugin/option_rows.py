"""What an option row is: a flag, its ini twin, its parser, and the settings field it sets.

A feature module declares its options as one ``Section``: the settings dataclass it
reads, and a row per option naming a field of it.  The field's default is the option's
default, and help texts take their choices from the registries, so a row repeats
nothing declared elsewhere.  ``options.py`` collects the sections; the functions here
turn any list of them into pytest options and back into settings.  The command line
wins over the ini file, and a bad value stops the session with one line naming the
option and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .. import values
from ..errors import ConfigError, one_line
from ..storage.store import check_output

INI_PREFIX = "llmenergy_"


@dataclass(frozen=True)
class Option:
    """One command-line option and its ini twin, and the settings field it sets.

    ``help`` may use ``{choices}`` (filled from ``choices``) and ends with the default,
    unless ``default_text`` says what the default means in words.  ``section`` and
    ``settings`` are filled in by the ``Section`` the row belongs to.
    """

    flag: str
    field_name: str
    parse: Callable[[str], Any]
    metavar: str
    help: str
    choices: Callable[[], Sequence[str]] | None = None
    default_text: str | Callable[[], str] | None = None
    multiple: bool = False  # repeatable on the command line; comma lists in the ini
    const: str | None = None  # the value of the bare flag (``--energy-shuffle``)
    ini_name: str | None = None  # only where 0.1.0 named the ini key otherwise
    record: Callable[[Any], Any] | None = None  # how the run file keeps the value
    # What the value names to write (storage.store's NEW_FILE, DERIVED_FILE or FOLDER),
    # checked before the session starts; ``paths`` takes (the text as given, the path)
    # out of a value that names more than one.
    writes: str = ""
    paths: Callable[[Any], Sequence[tuple[str, Any]]] | None = None
    # A deliberate fault, for testing a gate or this package (llmenergy gatecheck, ab):
    # --help lists it in its own group, apart from the options that measure.
    testing: bool = False
    section: str = field(default="", compare=False)
    settings: type | None = field(default=None, compare=False, repr=False)

    @property
    def to(self) -> str:
        """``section.field``: where the value goes, for messages and tests."""
        return f"{self.section}.{self.field_name}"

    @property
    def name(self) -> str:
        """The option's name in ini files (after the prefix) and in run files."""
        return self.ini[len(INI_PREFIX) :]

    @property
    def ini(self) -> str:
        if self.ini_name:
            return self.ini_name
        bare = self.flag.lstrip("-").removeprefix("energy-").removeprefix("llm-")
        return INI_PREFIX + bare.replace("-", "_")

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def default(self) -> Any:
        if self.settings is None:
            raise AssertionError(f"{self.flag} belongs to no Section")  # pragma: no cover
        f = {f.name: f for f in dataclasses.fields(self.settings)}[self.field_name]
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        raise AssertionError(f"{self.to} has no default")  # pragma: no cover

    def describe_default(self) -> str:
        if self.default_text is not None:
            return self.default_text if isinstance(self.default_text, str) else self.default_text()
        value = self.default
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value) or "none"
        return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    def full_help(self) -> str:
        text = self.help.format(choices=", ".join(self.choices()) if self.choices else "")
        return f"{text} (default: {self.describe_default()})"

    def to_record(self, value: Any) -> Any:
        if self.record is not None:
            return self.record(value)
        return _plain(value)


@dataclass(frozen=True)
class Section:
    """One feature's options and the settings dataclass their values build.

    ``name`` is the feature's field in the collected settings (``options.keep``) and the
    anchor of its part of the reference page; ``title`` heads that part.  ``complete``
    may add values that follow from the given ones before the settings are built (the
    controller lowers its minimum trials under a smaller given maximum).
    """

    name: str
    title: str
    settings: type
    options: tuple[Option, ...]
    complete: Callable[[dict[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        fields = {f.name for f in dataclasses.fields(self.settings)}
        for option in self.options:
            if option.field_name not in fields:
                raise AssertionError(  # pragma: no cover - a declaration mistake
                    f"{option.flag}: {self.settings.__name__} has no field {option.field_name}"
                )
        bound = tuple(
            dataclasses.replace(o, section=self.name, settings=self.settings) for o in self.options
        )
        object.__setattr__(self, "options", bound)

    def build(self, given: Mapping[str, Any], origins: Sequence[str]) -> Any:
        """The settings from the given values; a value they refuse stops the session
        with one line naming the options it came from."""
        values = dict(given)
        if self.complete is not None:
            self.complete(values)
        try:
            return self.settings(**values)
        except (ConfigError, ValueError) as exc:
            where = "/".join(origins) or "--" + self.name
            raise pytest.UsageError(one_line(f"{where}: {exc}", limit=10_000)) from None


def _plain(value: Any) -> Any:
    """An option's value as JSON: tuples as lists, other objects by their text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return str(value)


# --help's groups: the options that measure, and the deliberate faults apart from them
GROUP = ("llmenergy", "LLM energy measurement (pytest-llmenergy)")
TESTING_GROUP = (
    "llmenergy-testing",
    "pytest-llmenergy: deliberate faults, for testing gates and this package",
)


def add_options(parser: pytest.Parser, sections: Sequence[Section]) -> None:
    """Every row as a flag, in the ``llmenergy`` group or (a deliberate fault) the
    testing group after it, and as its ini twin."""
    groups = {
        False: parser.getgroup(*GROUP),
        True: parser.getgroup(*TESTING_GROUP, after=GROUP[0]),
    }
    for section in sections:
        for option in section.options:
            groups[option.testing].addoption(option.flag, **_flag_kwargs(option))
            # the flag's help says it all once: the ini key only points to it
            parser.addini(option.ini, help=f"as {option.flag} (see its help)", default="")


def _flag_kwargs(option: Option) -> dict[str, Any]:
    """argparse's arguments for the row's flag: its default is None, so that an option
    not given is told from one given (the ini file's value is read apart)."""
    kwargs: dict[str, Any] = {
        "dest": option.dest,
        "default": None,
        "metavar": option.metavar,
        "help": f"{option.full_help()}. ini: {option.ini}".replace("%", "%%"),
    }
    if option.multiple:
        kwargs["action"] = "append"
    if option.const is not None:
        kwargs.update(nargs="?", const=option.const)
    return kwargs


def _raw(config: pytest.Config, option: Option) -> tuple[str, str] | None:
    """The option's text and where it came from: the command line wins over the ini file."""
    value = config.getoption(option.dest, default=None)
    if isinstance(value, list):
        value = ",".join(value)
    if value is not None:
        return str(value), f"{option.flag}={value}"
    ini = _ini_text(option, config.getini(option.ini), config.inipath)
    if ini not in ("", None):
        return ini.strip(), f"{option.ini} = {ini} (ini)"
    return None


def _ini_text(option: Option, value: Any, inipath: Path | None) -> str | None:
    """An ini value as the option's text.  A list of strings is joined with commas; a
    list of anything else is refused in one line (``llmenergy_gpus = [0, 1]``).  pytest
    hands a TOML file's true and false over as "True" and "False" (Python's text of a
    boolean, never what anyone types): a switch takes them as on and off, any other
    option refuses them (``llmenergy_save = true`` would save a run named "True")."""
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return ",".join(value)
        example = ",".join(str(v) for v in value)
        raise pytest.UsageError(
            one_line(
                f"{option.ini} = {value!r} (ini): a list of strings or one string, "
                f'e.g. {option.ini} = "{example}"'
            )
        )
    toml = inipath is not None and inipath.suffix == ".toml"
    if not (toml and value in ("True", "False")) or option.parse is values.switch:
        return None if value is None else str(value)
    raise pytest.UsageError(
        f"{option.ini} = {str(value).lower()} (ini): true or false is not a {option.metavar} "
        f'here; give one as a string, e.g. {option.ini} = "{option.metavar}"'
    )


def _parse(option: Option, text: str, origin: str) -> Any:
    try:
        return option.parse(text)
    except (ConfigError, ValueError) as exc:
        message = f"{values.shown(origin)}: {exc or 'expected ' + option.metavar}"
        raise pytest.UsageError(one_line(message, limit=10_000)) from None


def read_sections(config: pytest.Config, sections: Sequence[Section]) -> dict[str, Any]:
    """Parse every option once: each section's settings, by section name, with the given
    values over the fields' defaults."""
    built: dict[str, Any] = {}
    for section in sections:
        given: dict[str, Any] = {}
        origins: list[str] = []
        for option in section.options:
            raw = _raw(config, option)
            if raw is None:
                continue
            given[option.field_name] = _parse(option, *raw)
            origins.append(raw[1].split("=", 1)[0].strip())
        built[section.name] = section.build(given, origins)
    return built


def sections_record(sections: Sequence[Section], built: Mapping[str, Any]) -> dict[str, Any]:
    """What the run file keeps of the options: every option by its name (the ini key
    without the prefix), with the value in effect.  Written option by option, so renaming
    a settings field never changes saved files."""
    record: dict[str, Any] = {}
    for section in sections:
        for option in section.options:
            record[option.name] = option.to_record(getattr(built[section.name], option.field_name))
    return record


def check_targets(sections: Sequence[Section], built: Mapping[str, Any], storage: str) -> None:
    """Every output option's target, before anything starts: a path that cannot be
    written, or would replace what must stay (a saved run, anything in ``storage``'s
    hardware folders, another output of this session), stops the session in one line
    naming the option."""
    taken: dict[str, str] = {}  # each output's real path: which option writes there
    for section in sections:
        for option in section.options:
            value = getattr(built[section.name], option.field_name)
            if not option.writes or value in (None, "", ()):
                continue
            for given, path in option.paths(value) if option.paths else [(value, value)]:
                label = f"{option.flag}={given}"
                try:
                    check_output(path, option.writes, storage=storage, label=label)
                except ConfigError as exc:
                    raise pytest.UsageError(str(exc)) from None
                real = os.path.realpath(path)
                if real in taken:
                    raise pytest.UsageError(
                        f"{values.shown(label)}: {taken[real]} writes there too; give each "
                        "output its own path"
                    )
                taken[real] = label
