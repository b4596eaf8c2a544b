"""Axes of a case: one kind for everything a case can vary along.

Model, input tokens, output tokens, batch size, concurrency, the GPU setting and the
parallel layout are each an ``Axis``; so is any axis a conftest adds through the
``pytest_llmenergy_axes`` hook.  A case's id, its labels (what reports group by and run
files keep) and the grid's size are derived from the axes, so a new axis is one row, not
a change in every place that names cases.

Each package declares the axes it owns beside the code that gives them meaning
(``llm.grid``: the case axes; ``conditions.settings``: the GPU setting; ``distributed``: the
parallel layout); the plugin gathers them, with the hook's, into one table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

# Where an axis applies: which cases get its values.
EVERY_CASE = "every case of the grid"
LOCAL_MODELS = "cases run on a local model"
SERVERS = "cases sent to a server (--llm-endpoint, --llm-serve)"
ENERGY_TESTS = "every energy_benchmark test"
TORCHRUN = "the whole session, under torchrun"


def _plain_id(value: Any) -> str:
    return str(value)


def _plain_labels(name: str, value: Any) -> dict[str, str]:
    return {name: str(value)}


@dataclass(frozen=True)
class Axis:
    """One dimension of the case grid.

    ``id_part`` makes the value's piece of the case id: a format such as ``"bs{}"`` or a
    function; ``""`` leaves the axis out of ids (a session-wide axis).  ``quiet`` is the
    value that leaves no trace in ids and labels, so that adding an axis keeps the ids of
    runs saved before it (batch size 1 is ``tiny-llama-in8-out32``, as it always was).
    ``parse`` turns the option's text into the values, ``default`` is used when no value
    is chosen, ``applies`` says which cases get the axis (for help and the docs), and
    ``flag`` names the option that chooses the values.
    """

    name: str  # the label key in run files and reports, e.g. "batch_size"
    label: str  # how headers and help texts name it, e.g. "batch size"
    # None: the values are resolved at session start by the feature that owns the axis
    # (the GPU settings need the GPU's allowed range), from its own options
    parse: Callable[[str], tuple[Any, ...]] | None
    default: tuple[Any, ...]
    id_part: str | Callable[[Any], str] = _plain_id
    applies: str = EVERY_CASE
    flag: str = ""
    quiet: Any = None
    labels: Callable[[str, Any], Mapping[str, str]] = field(default=_plain_labels)

    def id_of(self, value: Any) -> str:
        """The value's piece of the case id; "" for the quiet value or an id-less axis."""
        if self._is_quiet(value) or not self.id_part:
            return ""
        return self.id_part.format(value) if isinstance(self.id_part, str) else self.id_part(value)

    def labels_of(self, value: Any) -> dict[str, str]:
        """What a case records of its value; nothing for the quiet value."""
        return {} if self._is_quiet(value) else dict(self.labels(self.name, value))

    def values_from(self, text: str | None) -> tuple[Any, ...]:
        """The values the option's text chooses, or the default; a bad text is one line
        naming the axis."""
        if (text is None or not text.strip()) and not self.default:
            raise ConfigError(f"axis {self.name}: no default; choose its values with {self.flag}")
        if text is None or not text.strip():
            return self.default
        if self.parse is None:
            raise ConfigError(f"axis {self.name}: its values are chosen with {self.flag}")
        try:
            chosen = tuple(self.parse(text))
        except ConfigError as exc:
            raise ConfigError(f"axis {self.name}: {exc}") from None
        except (TypeError, ValueError) as exc:  # a conftest's parser, raising its own kind
            raise ConfigError(f"axis {self.name}: cannot read {text!r}: {exc}") from None
        if not chosen:
            raise ConfigError(f"axis {self.name}: no value in {text!r}")
        return chosen

    def describe(self, values: Sequence[Any]) -> str:
        return f"{self.label} {','.join(str(v) for v in values)}"

    def _is_quiet(self, value: Any) -> bool:
        return self.quiet is not None and value == self.quiet


def case_id(parts: Iterable[str]) -> str:
    """The pieces of the axes joined into an id: ``tiny-llama-in8-out32-bs8``."""
    return "-".join(p for p in parts if p)


def check_axes(axes: Sequence[Axis]) -> None:
    """Two axes of the same name would write the same label: the second is refused."""
    seen: set[str] = set()
    for axis in axes:
        if not axis.name.isidentifier():
            raise ConfigError(
                f"axis {axis.name!r}: its name is a label key; use letters, digits and _"
            )
        if axis.name in seen:
            raise ConfigError(f"axis {axis.name!r} is declared twice; give it another name")
        seen.add(axis.name)


def parse_axis_choices(text: str) -> tuple[tuple[str, str], ...]:
    """``temperature=0,0.7,seed=1,2`` -> (("temperature", "0,0.7"), ("seed", "1,2")): a
    word with ``=`` starts an axis, the words after it are its values (a repeated
    ``--llm-axis`` arrives joined with commas)."""
    example = "such as temperature=0,0.7"
    chosen: dict[str, list[str]] = {}
    current: list[str] | None = None
    for word in (w.strip() for w in text.split(",")):
        name, sep, first = word.partition("=")
        if sep:
            if not name.strip().isidentifier():
                raise ConfigError(f"expected NAME=VALUES {example}, got {text!r}")
            current = chosen.setdefault(name.strip(), [])
            word = first.strip()
        if current is None:
            raise ConfigError(f"expected NAME=VALUES {example}, got {text!r}")
        if word:
            current.append(word)
    empty = [name for name, words in chosen.items() if not words]
    if empty:
        raise ConfigError(f"axis {empty[0]}: no value given; expected NAME=VALUES {example}")
    return tuple((name, ",".join(words)) for name, words in chosen.items())
