"""A routing policy as a router loads it: ordered rules, the first that holds wins.

    {"format": "pytest-llmenergy-policy", "version": 1, "model": "Llama-2 (7B)",
     "by": "input", "rules": [{"system": "M1-Pro", "max_input_tokens": 32},
                              {"system": "Swing AMD+A100"}], ...}

A rule's bounds are inclusive upper limits; a rule with no bound takes every query, so
the last rule always has none.  ``Policy.route(input_tokens, output_tokens)`` is all a
router needs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

FORMAT, VERSION = "pytest-llmenergy-policy", 1


class PolicyError(ConfigError):
    """A policy file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Rule:
    system: str
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None

    def holds(self, input_tokens: int, output_tokens: int) -> bool:
        return (self.max_input_tokens is None or input_tokens <= self.max_input_tokens) and (
            self.max_output_tokens is None or output_tokens <= self.max_output_tokens
        )

    def describe(self) -> str:
        bounds = [
            f"{name} <= {limit}"
            for name, limit in (
                ("input", self.max_input_tokens),
                ("output", self.max_output_tokens),
            )
            if limit is not None
        ]
        return f"{' and '.join(bounds) or 'the rest'} -> {self.system}"


@dataclass(frozen=True)
class Policy:
    model: str
    by: str
    rules: tuple[Rule, ...]
    lam: float = 1.0
    p_ref_w: float = math.nan
    workload: str = ""
    expected: Mapping[str, Any] = field(default_factory=dict)  # totals, for people reading

    def __post_init__(self) -> None:
        if (
            not self.rules
            or self.rules[-1].max_input_tokens is not None
            or (self.rules[-1].max_output_tokens is not None)
        ):
            raise PolicyError("a policy's last rule must take every query (no bounds)")

    @property
    def systems(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.system for r in self.rules))

    def route(self, input_tokens: int, output_tokens: int = 0) -> str:
        for rule in self.rules:
            if rule.holds(input_tokens, output_tokens):
                return rule.system
        raise AssertionError("unreachable: the last rule has no bounds")

    def assign(self, input_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
        """Index into ``systems`` for every query, without a Python loop per query."""
        index = {s: i for i, s in enumerate(self.systems)}
        out = np.full(len(input_tokens), index[self.rules[-1].system], dtype=np.int64)
        undecided = np.ones(len(input_tokens), dtype=bool)
        for rule in self.rules[:-1]:
            hit = undecided.copy()
            if rule.max_input_tokens is not None:
                hit &= input_tokens <= rule.max_input_tokens
            if rule.max_output_tokens is not None:
                hit &= output_tokens <= rule.max_output_tokens
            out[hit] = index[rule.system]
            undecided &= ~hit
        return out

    def describe(self) -> str:
        return "; ".join(r.describe() for r in self.rules)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "by": self.by,
            "lambda": self.lam,
            "p_ref_w": self.p_ref_w if math.isfinite(self.p_ref_w) else None,  # strict JSON
            "workload": self.workload,
            "rules": [
                {
                    "system": r.system,
                    **(
                        {"max_input_tokens": r.max_input_tokens}
                        if r.max_input_tokens is not None
                        else {}
                    ),
                    **(
                        {"max_output_tokens": r.max_output_tokens}
                        if r.max_output_tokens is not None
                        else {}
                    ),
                }
                for r in self.rules
            ],
            "expected": dict(self.expected),
        }


def _bound(item: Mapping[str, Any], key: str, where: str) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PolicyError(f"{where}.{key} should be a whole number >= 0, got {value!r}")
    return value


def policy_from_json(data: Any, where: str = "policy") -> Policy:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PolicyError(f"{where}: not a {FORMAT} file")
    if data.get("version") != VERSION:
        raise PolicyError(
            f"{where}: policy version {data.get('version')!r}; this pytest-llmenergy reads "
            f"version {VERSION}"
        )
    rules = data.get("rules")
    if not isinstance(rules, list) or not rules:
        raise PolicyError(f"{where}: rules should be a non-empty list")
    parsed = []
    for i, item in enumerate(rules):
        at = f"{where}: rules[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("system"), str):
            raise PolicyError(f"{at} should be an object with a system name")
        parsed.append(
            Rule(
                item["system"],
                _bound(item, "max_input_tokens", at),
                _bound(item, "max_output_tokens", at),
            )
        )
    try:
        return Policy(
            model=str(data.get("model", "")),
            by=str(data.get("by", "")),
            rules=tuple(parsed),
            lam=float(data.get("lambda", 1.0)),
            p_ref_w=float(data.get("p_ref_w") or math.nan),
            workload=str(data.get("workload", "")),
            expected=data.get("expected") if isinstance(data.get("expected"), dict) else {},
        )
    except PolicyError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{where}: {exc}") from None


def load_policies(path: str | Path) -> list[Policy]:
    """Every policy of a file ``write_policies`` wrote: one, or one per model."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the policy: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: 100,000 '['
        raise PolicyError(f"{path}: not JSON ({exc})") from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise PolicyError(f"{path}: an empty list holds no policy")
    where = [f"{path}[{i}]" for i in range(len(items))] if isinstance(data, list) else [str(path)]
    return [policy_from_json(item, at) for item, at in zip(items, where)]


def load_policy(path: str | Path, model: str | None = None) -> Policy:
    """The policy for ``model``; without one, the file must hold a single policy."""
    policies = load_policies(path)
    if model is not None:
        for policy in policies:
            if policy.model == model:
                return policy
        raise PolicyError(
            f"{path}: no policy for model {model!r}; it has "
            f"{', '.join(repr(p.model) for p in policies)}"
        )
    if len(policies) > 1:
        raise PolicyError(
            f"{path}: holds policies for {', '.join(repr(p.model) for p in policies)}; "
            "pick one with model="
        )
    return policies[0]


def write_policies(path: str | Path, policies: Sequence[Policy]) -> Path:
    """One policy as an object, several (one per model) as a list; never overwrites."""
    path = Path(path)
    if not policies:
        raise PolicyError("no policy to write")
    data: Any = policies[0].to_json() if len(policies) == 1 else [p.to_json() for p in policies]
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.link(tmp, path)  # fails if anything is already there
    except FileExistsError:
        raise PolicyError(f"{path} exists; remove it or write the policy elsewhere") from None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot write the policy: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path
