"""Hostile names for the outputs' tests, and a reader of a page's script elements that
finds each one's end the way a browser's HTML tokenizer does (the WHATWG "script data"
states, escape states included: Python's ``html.parser`` ends a script at the first
``</script`` and so would not notice data that a browser reads past)."""

from __future__ import annotations

import dataclasses
import re

from pytest_llmenergy.storage.runfile import Run
from tests.casefactory import synthetic_run

# Strings that change how a page parses if they reach it as themselves.  The comment and
# the opening tag are the issue's: ``<!--<script>`` keeps a script element open past its
# ``</script>`` (the script-data double escape), and the page went blank.
HOSTILE = (
    "<!--<script>",
    "</script><script>window.llmenergyInjected=1</script>",
    "<!--",
    "-->",
    "]]>",
    "</SCRIPT\t>",
    "<script>alert(1)</script>",
    "<img src=x onerror=window.llmenergyInjected=2>",
    "\u2028 and \u2029",
    "\"'&amp;&",
    "\\u003c\\",
    "\U0001f600 emoji",
    "long-" + "\u00e9<!--" * 400,
)

_WHITESPACE = "\t\n\f "


def _is_alpha(c: str) -> bool:
    return c.isascii() and c.isalpha()


def script_end(text: str, start: int) -> int:
    """Where the script element whose content starts at ``start`` ends: the index of the
    ``</script`` that closes it, or ``len(text)`` if none does (the page never closes it)."""
    state, buffer, i, tag_at = "data", "", start, 0
    while i < len(text):
        c = text[i]
        if state in ("data", "escaped", "escaped_dash", "escaped_dash_dash"):
            if c == "<":
                tag_at = i
                state = "lt" if state == "data" else "escaped_lt"
            elif state == "data":
                pass
            elif c == "-":
                state = {"escaped": "escaped_dash"}.get(state, "escaped_dash_dash")
            elif c == ">" and state == "escaped_dash_dash":
                state = "data"
            else:
                state = "escaped"
            i += 1
        elif state in ("lt", "escaped_lt"):
            escaped = state == "escaped_lt"
            if c == "/":
                state, buffer = ("escaped_end_open" if escaped else "end_open"), ""
                i += 1
            elif c == "!" and not escaped:
                state = "escape_start"
                i += 1
            elif _is_alpha(c) and escaped:
                state, buffer = "double_start", ""
            else:
                state = "escaped" if escaped else "data"
        elif state in ("end_open", "escaped_end_open"):
            escaped = state == "escaped_end_open"
            if _is_alpha(c):
                state = "escaped_end_name" if escaped else "end_name"
            else:
                state = "escaped" if escaped else "data"
        elif state in ("end_name", "escaped_end_name"):
            if c in _WHITESPACE + "/>" and buffer == "script":
                return tag_at
            if _is_alpha(c):
                buffer += c.lower()
                i += 1
            else:
                state = "escaped" if state == "escaped_end_name" else "data"
        elif state in ("escape_start", "escape_start_dash"):
            if c == "-":
                state = "escape_start_dash" if state == "escape_start" else "escaped_dash_dash"
                i += 1
            else:
                state = "data"
        elif state in ("double_start", "double_end"):
            if c in _WHITESPACE + "/>":
                ending = state == "double_end"
                if buffer == "script":
                    state = "escaped" if ending else "double"
                else:
                    state = "double" if ending else "escaped"
                i += 1
            elif _is_alpha(c):
                buffer += c.lower()
                i += 1
            else:
                state = "double" if state == "double_end" else "escaped"
        elif state in ("double", "double_dash", "double_dash_dash"):
            if c == "-":
                state = "double_dash" if state == "double" else "double_dash_dash"
            elif c == "<":
                state = "double_lt"
            elif c == ">" and state == "double_dash_dash":
                state = "data"
            else:
                state = "double"
            i += 1
        else:  # double_lt
            if c == "/":
                state, buffer = "double_end", ""
                i += 1
            else:
                state = "double"
    return len(text)


def script_texts(page: str) -> dict[str, str]:
    """Each script element's text by its id (those with one), ended where a browser ends
    it."""
    found: dict[str, str] = {}
    for opening in re.finditer(r"<script\b([^>]*)>", page):
        ident = re.search(r'\bid="([^"]*)"', opening.group(1))
        if ident is not None:
            found[ident.group(1)] = page[opening.end() : script_end(page, opening.end())]
    return found


def hostile_run(n_cases: int = 26, *, seed: int = 1, slower: float = 1.0) -> Run:
    """A run whose every case has a hostile name and model label, and whose header
    (machine, commit, meter, hardware) holds hostile text too; the names stay distinct."""
    run = synthetic_run(n_cases, seed=seed, slower=slower)
    cases = []
    for i, case in enumerate(run.cases):
        word = HOSTILE[i % len(HOSTILE)]
        name = f"test_x[{word}#{i}]"
        cases.append(
            dataclasses.replace(
                case,
                name=name,
                nodeid=f"t.py::{name}",
                labels={**case.labels, "model": f"{word}{i % 3}"},
            )
        )
    return dataclasses.replace(
        run,
        cases=tuple(cases),
        hardware="cpu-<!--<script>__no-gpu__estimate",
        machine={"cpu": {"model": HOSTILE[1], "logical_cores": 2}, "gpus": [{"name": "<!--"}]},
        commit={"id": "<!--<script>0123", "dirty": False, "branch": HOSTILE[0]},
        meter={"backend": "estimate", "description": "estimate: " + HOSTILE[6]},
    )
