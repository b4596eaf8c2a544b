"""The reference pages, written at build time from the package's registries.

MkDocs loads this file as a hook (``hooks:`` in ``mkdocs.yml``).  Each page is made from
what the code declares: the pytest options (``plugin.options.SECTIONS``), the figures
(``figures.describe``), the ``llmenergy`` command line (its argparse parser), the meters
(``meters.BUILTIN_BACKENDS``) and the run file (a real run file written by a short
session on the estimate meter).  Nothing here lists an option, a figure, a command or a
meter by hand, so a new one appears in the docs the day it is registered, and a page
cannot describe one that is gone.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REFERENCE_DIR = "reference"
SAMPLE_TIMEOUT_S = 600  # the sample session takes a few seconds on an idle machine


# -- small helpers --------------------------------------------------------------------
def cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    return f"`{text}`" if str(text) else ""


def rst_to_md(text: str) -> str:
    """Docstrings use reST roles, double backticks and definition lists (a term, then its
    indented text); the pages use Markdown, where indented text would be code."""
    text = re.sub(r":\w+:`~?\.*([\w.]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    text = text.replace("``", "`")
    text = re.sub(r"::\n", ":\n", text)
    text = re.sub(r"^(\S[^\n]*)\n(?=    \S)", r"**\1**\n\n", text, flags=re.M)
    return re.sub(r"^    (?=\S)", "", text, flags=re.M)


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def generated_note(source: str) -> str:
    return (
        f'!!! info "Generated"\n    This page is written when the docs are built, from '
        f"{source}. It lists what the installed version has.\n"
    )


# -- options ----------------------------------------------------------------------------
def _option_usage(option: Any) -> str:
    metavar = getattr(option, "metavar", "")
    if getattr(option, "const", None) is not None:
        return f"{option.flag}[={metavar}]"
    return f"{option.flag}={metavar}" if metavar else option.flag


def _option_meaning(option: Any) -> str:
    choices = option.choices() if getattr(option, "choices", None) else []
    try:
        text = option.help.format(choices=", ".join(choices))
    except (KeyError, IndexError, AttributeError):
        text = str(getattr(option, "help", ""))
    if getattr(option, "multiple", False):
        text += "; repeatable (a comma list in the ini file)"
    return text


def _declared_in(sections: Sequence[Any]) -> dict[str, str]:
    """Where each section is declared (module and name) and the settings it fills, found
    by looking for the very object in the plugin's modules: a newcomer's way to the code."""
    import pkgutil

    plugin = importlib.import_module("pytest_llmenergy.plugin")
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(plugin.__path__):
        if info.name == "options":  # the collector, not where a section is declared
            continue
        module = importlib.import_module(f"pytest_llmenergy.plugin.{info.name}")
        for name, value in vars(module).items():
            for section in sections:
                if value is section and section.name not in found:
                    found[section.name] = (
                        f"`pytest_llmenergy/plugin/{info.name}.py` (`{name}`), into "
                        f"`{section.settings.__name__}`"
                    )
    return found


def options_page() -> str:
    from pytest_llmenergy.plugin import options as registry

    sections = {s.name: (s.title, s.options) for s in registry.SECTIONS}
    parts = [
        "# pytest options\n",
        generated_note(
            "the sections each feature declares (`Section`), collected in "
            "`pytest_llmenergy/plugin/options.py` (`SECTIONS`)"
        ),
        f"Every option has an ini twin: set it under `[pytest]` in `pytest.ini` or "
        f"`[tool.pytest.ini_options]` in `pyproject.toml`; the command line wins. "
        f"{len(registry.OPTIONS)} options. A bad value stops the session at start with one "
        f"line naming the option, and exit code 4.\n",
        "| section | options |\n|---|---|\n"
        + "".join(
            f"| [{title}](#{name}) | {len(opts)} |\n" for name, (title, opts) in sections.items()
        ),
    ]
    declared = _declared_in(registry.SECTIONS)
    for section, (title, opts) in sections.items():
        parts.append(f"## {title} {{#{section}}}\n")
        if section in declared:
            parts.append(f"Declared beside its feature: {declared[section]}.\n")
        rows = [
            (code(_option_usage(o)), code(o.ini), o.describe_default(), _option_meaning(o))
            for o in opts
        ]
        parts.append(table(("option", "ini", "default", "meaning"), rows))
    marker = getattr(registry, "marker_help", None)
    if marker is not None:
        parts.append(
            "## Per test: the `llmenergy` marker\n\n"
            f"`@pytest.mark.{marker('llmenergy')}`. An unknown argument stops the session "
            "with the list of allowed ones.\n"
        )
    return "\n".join(parts)


# -- figures ----------------------------------------------------------------------------
def figures_page() -> str:
    from pytest_llmenergy import figures

    records = figures.describe()
    parts = [
        "# Figures\n",
        generated_note("the figure registry, `pytest_llmenergy/figures.py` (`FIGURES`)"),
        "Every quantity a case yields, under one name. The same key names a table column "
        "(`--energy-columns`, `llmenergy show --columns`), a gate (`--energy-compare-fail`, "
        "`llmenergy compare --fail-on`), a CI target (`--energy-ci-target`) and a column of "
        "the exports. `llmenergy metrics` prints this table. *Per trial*: the figure has a "
        "value per trial, so it can be compared between runs, gated and targeted. "
        "The counted work (`flops_per_token` and its kin, `--energy-count-work`) is exact: "
        "gated without statistics, not a CI target. "
        "*Phases*: it needs the prefill | decode split. *Default*: a column of the default "
        f"tables. {len(records)} figures.\n",
        table(
            ("key", "label", "unit", "meaning", "better", "per trial", "phases", "default"),
            (
                (
                    code(r["key"]),
                    r.get("label", ""),
                    r.get("unit", ""),
                    str(r.get("meaning", ""))
                    + (f" (old names: {r['old_names']})" if r.get("old_names") else ""),
                    r.get("better", ""),
                    "yes" if r.get("per_trial") else "",
                    "yes" if r.get("needs_phases") else "",
                    "yes" if r.get("default_column") else "",
                )
                for r in records
            ),
        ),
    ]
    # The module docstring after its summary and its paragraph for developers: how the
    # per-token figures are meant, and which figures can be gated.
    paragraphs = (inspect.getdoc(figures) or "").split("\n\n")[2:]
    if paragraphs:
        meant = rst_to_md("\n\n".join(paragraphs))
        parts.append("## How the per-token figures are meant\n\n" + meant + "\n")
    return "\n".join(parts)


# -- the llmenergy command ----------------------------------------------------------------
def cli_parser() -> argparse.ArgumentParser:
    """The ``llmenergy`` parser, wherever ``cli/__init__.py`` builds it."""
    cli = importlib.import_module("pytest_llmenergy.cli")
    for name in ("build_parser", "make_parser", "parser", "_parser"):
        found = getattr(cli, name, None)
        if isinstance(found, argparse.ArgumentParser):
            return found
        if callable(found):
            made = found()
            if isinstance(made, argparse.ArgumentParser):
                return made
    raise RuntimeError("pytest_llmenergy.cli builds no argparse parser that the docs can find")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    try:
        return parser._get_formatter()._expand_help(action)  # fills %(default)s, unescapes %%
    except (KeyError, TypeError, ValueError):
        return action.help.replace("%%", "%")


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs == 0:
            return name
        metavar = action.metavar or (
            "{" + ",".join(map(str, action.choices)) + "}"
            if action.choices
            else action.dest.upper()
        )
        return f"{name} {metavar}"
    return str(action.metavar or action.dest)


def _notes(action: argparse.Action) -> str:
    notes = []
    if action.required and action.option_strings:
        notes.append("required")
    if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
        notes.append("repeatable" if action.option_strings else "one or more")
    if action.choices and not isinstance(action.choices, Mapping):
        notes.append("one of " + ", ".join(map(str, action.choices)))
    default = action.default
    if (
        action.option_strings
        and default not in (None, False, [], argparse.SUPPRESS)
        and "default" not in (action.help or "")
    ):
        notes.append(f"default {default}")
    return "; ".join(notes)


def _subcommands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name, ""), sub
                yield from _subcommands(sub, f"{prefix} {name}")


def _arguments_table(parser: argparse.ArgumentParser) -> str:
    rows = [
        (", ".join(code(part) for part in _argument(a).split(", ")), _help(parser, a), _notes(a))
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and a.help != argparse.SUPPRESS
    ]
    return table(("argument", "meaning", "notes"), rows) if rows else "No arguments.\n"


def commands_page() -> str:
    parser = cli_parser()
    prog = parser.prog
    commands = [
        c
        for c in _subcommands(parser, prog)
        if not any(isinstance(a, argparse._SubParsersAction) for a in c[2]._actions)
    ]
    parts = [
        f"# The `{prog}` command\n",
        generated_note("the argparse parser of `pytest_llmenergy/cli/`"),
        f"Also `python -m pytest_llmenergy`. {parser.description or ''} Exit codes: 0; 1 when "
        "a gate failed (`compare --fail-on`, `report --gate`, `ab`); 2 for bad input (one "
        "line on stderr); 130 when stopped by Ctrl-C (one line; no file is left "
        "half-written); every command's in [Exit codes](../exit-codes.md).\n",
        table(
            ("command", "what it does"), ((f"[`{n}`](#{_anchor(n)})", h) for n, h, _ in commands)
        ),
        "## Global options\n",
        _arguments_table(parser),
    ]
    for name, help_text, sub in commands:
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        parts.append(f"## `{name}` {{#{_anchor(name)}}}\n")
        if help_text:
            parts.append(help_text[0].upper() + help_text[1:] + ".\n")
        parts.append(f"```text\n{textwrap.fill(usage, 88, subsequent_indent='    ')}\n```\n")
        parts.append(_arguments_table(sub))
    return "\n".join(parts)


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# -- meters -----------------------------------------------------------------------------
def meters_page() -> str:
    from pytest_llmenergy import meters
    from pytest_llmenergy.gpu.device import vendor_named

    parts = [
        "# Meters\n",
        generated_note("the backend registry, `pytest_llmenergy/meters/__init__.py`"),
        "Choose one with `--energy-backend=NAME` (or `open_meter(NAME)` in Python). "
        "Your own: [Writing your own meter](../guides/own-meter.md).\n",
        table(
            ("backend", "module", "in short"),
            (
                (f"[`{name}`](#{name})", code(target.split(":")[0]), _first_line(about))
                for name, target in meters.BUILTIN_BACKENDS.items()
                # a vendor the device meter reads: its module says what it is
                for about in [target if target != meters.DEVICE_METER else _library(name)]
            ),
        ),
    ]
    for name, target in meters.BUILTIN_BACKENDS.items():
        module_name = target.partition(":")[0]
        module = importlib.import_module(module_name)  # vendor libraries load only on open
        parts.append(f"## `{name}` {{#{name}}}\n")
        parts.append(rst_to_md(inspect.getdoc(module) or "") + "\n")
        if target == meters.DEVICE_METER:  # a GPU vendor measured through the device layer
            library = importlib.import_module(_library(name).partition(":")[0])
            parts.append(f"### {vendor_named(name).label}\n")
            parts.append(rst_to_md(inspect.getdoc(library) or "") + "\n")
    return "\n".join(parts)


def _library(backend: str) -> str:
    """``module:class`` of the device layer's library of a GPU backend."""
    from pytest_llmenergy.gpu.device import vendor_named

    return vendor_named(backend).library


def _first_line(target: str) -> str:
    doc = inspect.getdoc(importlib.import_module(target.split(":")[0])) or ""
    return rst_to_md(doc.split("\n\n", 1)[0])


# -- the run file -----------------------------------------------------------------------
_SAMPLE_TEST = """
import time

from pytest_llmenergy import mark_phase


def _target():
    time.sleep(0.01)
    mark_phase("decode", ending="prefill")
    time.sleep(0.01)


def test_case(energy_benchmark):
    energy_benchmark.pedantic(_target, rounds=2, input_tokens=8, output_tokens=8)
"""


def sample_run_file() -> dict[str, Any]:
    """A real run file: a two-trial session on the estimate meter, in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_sample.py").write_text(_SAMPLE_TEST)
        Path(tmp, "pytest.ini").write_text("[pytest]\n")  # no configuration from above
        _commit(tmp)
        out = Path(tmp, "run.json")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTEST_ADDOPTS", None)
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-p",
                    "no:randomly",
                    "--energy-backend=estimate",
                    "--energy-max-background=off",  # a busy build machine must not empty trials
                    f"--energy-json={out}",
                    "test_sample.py",
                ],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=SAMPLE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"the sample session for the run-file page took over {SAMPLE_TIMEOUT_S} s "
                "(a machine this busy cannot build the docs; try again when it is quieter)"
            ) from None
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"the sample session failed:\n{done.stdout}\n{done.stderr}")
        data: dict[str, Any] = json.loads(out.read_text())
        return data


def _commit(folder: str) -> None:
    """Make the folder a git work tree with one commit, so the run file has its commit."""
    git = ["git", "-c", "user.name=docs", "-c", "user.email=docs@example.invalid", "-C", folder]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "sample"]):
        try:
            subprocess.run([*git, *args], capture_output=True, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return  # no git: the sample's commit record is empty, and says so


_JSON_KINDS = {"float": "number", "int": "integer", "str": "string", "bool": "boolean",
               "None": "null", "Mapping": "object", "dict": "object", "tuple": "array"}  # fmt: skip


def _json_kind(annotation: str) -> str:
    """A field's annotation in JSON's words: ``float | None`` is ``number or null``."""
    parts = [p.strip().split("[")[0] for p in annotation.split("|")]
    return " or ".join(_JSON_KINDS.get(p, "object") for p in parts)


def _field_kinds(cls: type) -> dict[str, str]:
    return {f.name: _json_kind(str(f.type)) for f in dataclasses.fields(cls)}


def field_notes(cls: type) -> dict[str, str]:
    """A dataclass's field comments (inline or on the lines just above), by field name."""
    lines = inspect.getsource(cls).splitlines()
    notes: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        m = re.match(r"(\w+): [^#]+?(?:#\s*(.*))?$", stripped)
        if m and not stripped.startswith(("def ", "@", "return")):
            note = " ".join([*above, m.group(2) or ""]).strip()
            if note:
                notes[m.group(1)] = note
        above = []
    return notes


def _schema_classes() -> dict[str, type]:
    """Which dataclass a path of the run file is written from (its fields' comments)."""
    from pytest_llmenergy import results
    from pytest_llmenergy.controller.rule import ControllerSettings
    from pytest_llmenergy.probes.resources import ResourceUsage
    from pytest_llmenergy.storage.runfile import Run

    trial = results.Trial
    return {
        "run": Run,
        "cases[]": results.CaseResult,
        "cases[].trials[]": trial,
        "cases[].disturbed_trials[]": trial,
        "cases[].prefill_passes[]": trial,
        "cases[].resources": ResourceUsage,
        "cases[].controller": ControllerSettings,
        "cases[].trials[].phases.<phase>": results.PhaseRecord,
        "cases[].trials[].gpu": results.GpuTelemetry,
        "cases[].trials[].requests[]": results.RequestRecord,
        "cases[].thermal": results.ThermalWait,
        "cases[].work": results.CountedWork,
        "cases[].work.prefill[]": results.OpWork,
        "cases[].work.decode[]": results.OpWork,
    }


# What each part of the file is (its fields come from the code; these are the parts).
SECTIONS = {
    "format": "always `pytest-llmenergy-run`: a foreign JSON file is refused",
    "schema_version": "a newer version than this package reads is refused, saying so",
    "run": "the session: its name, times, status and command line",
    "machine": "what it ran on (`storage/machine.py`): CPU, memory, GPUs with driver and "
    "power limits, OS, Python and package versions; failed probes are null with a note",
    "commit": "the git commit of the working directory (empty outside git); `dirty` is "
    "true when anything was uncommitted",
    "meter": "the meter that measured: its backend, identity (what a baseline must share "
    "to be compared), each domain's method and whether it counts in the totals, idle power",
    "cases": "every case, with every trial: not only summaries",
}

_DYNAMIC = {"joules_by_domain", "net_joules_by_domain", "methods", "counted", "domains",
            "idle_power_w", "phases", "conversions", "identity"}  # fmt: skip


def _walk(value: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """(path, JSON type, example) for every field; maps keyed by data become ``<key>``."""
    if isinstance(value, dict):
        yield path, "object", None
        name = path.rsplit(".", 1)[-1]
        if name in _DYNAMIC and value:
            key = (
                "<phase>"
                if name == "phases"
                else "<domain>"
                if ":" in next(iter(value))
                else "<key>"
            )
            yield from _walk(next(iter(value.values())), f"{path}.{key}")
            return
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        yield path, "array", None
        if value:
            yield from _walk(value[0], f"{path}[]")
    else:
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
            type(value), "null"
        )
        yield path, kind, value


def _example(value: Any) -> str:
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
    return code(text if len(text) <= 40 else text[:37] + "…")


def runfile_page(sample: Mapping[str, Any] | None = None) -> str:
    from pytest_llmenergy.storage import runfile

    data = dict(sample if sample is not None else sample_run_file())
    options = data.pop("options", {})
    classes = _schema_classes()
    notes = {prefix: field_notes(cls) for prefix, cls in classes.items()}
    kinds = {prefix: _field_kinds(cls) for prefix, cls in classes.items()}
    rows = []
    seen: set[str] = set()
    for path, kind, example in _walk(data, ""):
        if not path:
            continue
        generic = re.sub(r"\.(disturbed_trials|prefill_passes)\[\]", ".trials[]", path)
        if generic != path and generic in seen:
            continue  # disturbed trials and prefill passes are trials: listed once
        seen.add(path)
        parent, _, leaf = path.rpartition(".")
        owner = re.sub(r"\.(disturbed_trials|prefill_passes)\[\]", ".trials[]", parent)
        known = notes.get(owner, {})
        # Run's fields are named run_id, ...: the file nests them under "run"; a case's
        # disturbed trials are its "disturbed".
        name = next(
            (n for n in (leaf, f"{parent}_{leaf}", leaf.removesuffix("_trials")) if n in known),
            leaf,
        )
        note = known.get(name, "") or (SECTIONS.get(leaf, "") if not parent else "")
        if kind == "null":  # the sample has no value here: the field's declared type
            kind = kinds.get(owner, {}).get(name, kind)
        rows.append((code(path), kind, note, _example(example)))
    # A trial's fields the sample did not write (no GPU read, nothing rejected): still listed.
    written = {r[0].strip("`") for r in rows}
    trial_prefix = "cases[].trials[]"
    for f in dataclasses.fields(classes[trial_prefix]):
        path = f"{trial_prefix}.{f.name}"
        note = notes[trial_prefix].get(f.name)
        if path not in written and note:
            rows.append((code(path), f"{_json_kind(str(f.type))}, only when present", note, ""))
    doc = inspect.getdoc(runfile) or ""
    history = _schema_history(runfile)
    return "\n".join(
        [
            "# The run file\n",
            generated_note(
                "a run file that a two-trial session on the `estimate` meter writes while the "
                "docs build, and the comments of the dataclasses it is written from "
                "(`pytest_llmenergy/results.py`, `storage/runfile.py`)"
            ),
            rst_to_md(doc) + "\n",
            f"Format `{runfile.FORMAT}`, schema version {runfile.SCHEMA_VERSION}. Written by "
            "`--energy-save`, `--energy-autosave` and `--energy-json`; read by every "
            "`llmenergy` command. Run files are JSON with no NaN or Infinity, so any JSON "
            "reader can take them.\n",
            "## Fields\n",
            "`[]` is every element of a list; `<domain>` (e.g. `cpu:process`, `gpu:0`) and "
            "`<phase>` (`prefill`, `decode`) stand for keys that are data. "
            "`disturbed_trials[]` and `prefill_passes[]` hold trials, with the fields of "
            "`trials[]`.\n",
            table(("field", "type", "meaning", "example"), rows),
            "## `options`\n",
            "Every pytest option by its name (the ini key without `llmenergy_`) with the "
            f"value in effect: {len(options)} entries, e.g. "
            + ", ".join(code(f"{k}: {json.dumps(v)}") for k, v in list(options.items())[:4])
            + ". See [pytest options](options.md).\n",
            "## Versions\n",
            history,
        ]
    )


def _schema_history(runfile: Any) -> str:
    """The comment above ``SCHEMA_VERSION``: what each version changed."""
    source = inspect.getsource(runfile)
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SCHEMA_VERSION" for t in node.targets
        ):
            comments: list[str] = []
            i = node.lineno - 2
            while i >= 0 and lines[i].lstrip().startswith("#"):
                comments.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            return " ".join(comments) + "\n"
    return ""


# -- axes -------------------------------------------------------------------------------
def _example_id(axis: Any) -> str:
    if not axis.id_part:
        return "none (one value per session)"
    sample = {"model": ("tiny-llama", "tiny-llama"), "gpu_setting": None}
    if axis.name in sample:
        return "`tiny-llama`" if axis.name == "model" else "`pl250W`, `sm1410MHz`"
    value = axis.default[-1] if axis.default else 8
    value = 8 if value == axis.quiet else value
    return code(axis.id_of(value))


def axes_page() -> str:
    from pytest_llmenergy import hookspec
    from pytest_llmenergy.plugin.cases import BUILTIN_AXES

    hook = rst_to_md(inspect.getdoc(hookspec.pytest_llmenergy_axes) or "")
    return "\n".join(
        [
            "# Axes\n",
            generated_note("the axis table, `BUILTIN_AXES` in `pytest_llmenergy/plugin/cases.py`"),
            "Everything a case varies along is an axis: its values make the case ids, the "
            "labels the run file keeps and reports group by, and the grid (the product of "
            "the axes). A value equal to the axis's quiet value adds nothing, so ids stay "
            "as they were before the axis existed.\n",
            table(
                ("axis (label)", "chosen with", "id part", "quiet value", "applies to"),
                (
                    (
                        code(a.name),
                        a.flag,
                        _example_id(a),
                        code(a.quiet) if a.quiet is not None else "",
                        a.applies,
                    )
                    for a in BUILTIN_AXES
                ),
            ),
            "## Your own axis\n",
            "The `pytest_llmenergy_axes` hook, from a `conftest.py` or a plugin; its values "
            "with `--llm-axis NAME=VALUES` (ini `llmenergy_axis`).\n",
            hook + "\n",
        ]
    )


# -- the hook -----------------------------------------------------------------------------
PAGES: dict[str, Callable[[], str]] = {
    "options.md": options_page,
    "figures.md": figures_page,
    "commands.md": commands_page,
    "meters.md": meters_page,
    "axes.md": axes_page,
    "run-file.md": runfile_page,
}


def on_files(files: Any, config: Any) -> Any:
    """Adds the reference pages to the site (MkDocs 1.6's generated files)."""
    from mkdocs.structure.files import File

    for name, make in PAGES.items():
        files.append(File.generated(config, f"{REFERENCE_DIR}/{name}", content=make()))
    return files
