"""Exceptions whose message tells the user how to fix the problem."""

from __future__ import annotations

from collections.abc import Callable


def one_line(text: str, limit: int = 300) -> str:
    """Text from a file or a user (a field's name or value, a file's name, an option's
    value) as one short line of a message: control characters escaped, cut at ``limit``."""
    if text.isprintable() and len(text) <= limit:
        return text
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("…" if len(text) > limit else "")


class LLMEnergyError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(LLMEnergyError):
    """An option or argument has a value that cannot be used."""


class MeterUnavailable(LLMEnergyError):
    """A backend cannot measure on this machine; the message says why and what to do."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"energy backend {backend!r} is unavailable: {reason}")
        self.backend = backend
        self.reason = reason


class TrialRejected(LLMEnergyError):
    """The target ran, but what it did is not the case: a server generated other token
    counts than asked (llama.cpp overshoots inside a multi-byte character).  Raised inside
    a trial, it makes that trial kept, left out of every figure and repeated (within the
    trial limit), like a disturbed one; never silently measured."""


class MeterError(LLMEnergyError):
    """A meter failed while measuring (a device vanished, a reader died)."""


def renamed_names(
    module: str, renamed: dict[str, str], namespace: dict[str, object], stacklevel: int = 2
) -> Callable[[str], object]:
    """A module ``__getattr__`` that still answers to names renamed in 0.2.0, with a
    warning that says the new name: code written for 0.1 keeps importing until 0.3.
    ``stacklevel`` 3 where a module's own ``__getattr__`` calls it (the warning names the
    code that used the old name)."""
    import warnings

    def __getattr__(name: str) -> object:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} was renamed {renamed[name]} in 0.2.0; the old name goes in 0.3.0",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        return namespace[renamed[name]]

    return __getattr__
