"""What machine and code produced a run, and the storage folder its hardware is filed under.

Energy numbers only compare across runs on the same hardware, so every saved run
records the machine (CPU, memory, GPUs, OS, Python, key package versions) and the
commit it ran from, and runs are kept in one folder per hardware (:func:`hardware_key`).
Every probe here is read-only and best effort: a missing tool or library leaves a
``None`` and a note, never an exception that would lose the run it describes.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path, PurePath
from typing import Any, TypeVar

import psutil

from ..gpu.device import VENDORS, open_library
from ..meters.cpu_tdp import cpu_brand

__all__ = [
    "commit_info",
    "cpu_caches",
    "gpu_info",
    "hardware_key",
    "machine_info",
    "package_versions",
]

# Distributions whose versions change results; read from metadata, never imported
# (importing torch takes seconds).
PACKAGES = (
    "pytest-llmenergy",
    "pytest",
    "torch",
    "transformers",
    "accelerate",
    "nvidia-ml-py",
    "pyJoules",
    "numpy",
)
GIT_TIMEOUT_S = 5.0
KEY_SEPARATOR = "__"
MAX_PART = 60  # characters per hardware-key part
_HASH_LEN = 8  # hex digits kept from a too-long part's hash, so capped parts stay distinct

_TRADEMARK = re.compile(r"\((?:r|tm)\)")
_FREQUENCY = re.compile(r"@\s*\d+(?:\.\d+)?\s*[gmk]?hz")
_CPU_WORD = re.compile(r"(?<![a-z0-9])cpu(?![a-z0-9])")
_NOT_SLUG = re.compile(r"[^a-z0-9.]+")

T = TypeVar("T")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _probe(notes: list[str], what: str, fn: Callable[[], T], default: T) -> T:
    """``fn()``, or ``default`` and a note: one failed probe must not lose the others."""
    try:
        return fn()
    except Exception as exc:
        notes.append(f"{what}: {_one_line(exc)}")
        return default


# -- machine ---------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """This machine as JSON-ready data; never raises (failed probes give None and a note)."""
    notes: list[str] = []
    gpus, gpu_note = _probe(notes, "GPUs", gpu_info, ([], None))
    if gpu_note:
        notes.append(gpu_note)
    return {
        "node": _probe(notes, "node name", platform.node, None),
        "cpu": {
            "model": _probe(notes, "CPU model", cpu_brand, None),
            "arch": _probe(notes, "CPU architecture", platform.machine, None),
            "logical_cores": _probe(notes, "logical cores", psutil.cpu_count, None),
            "physical_cores": _probe(
                notes, "physical cores", lambda: psutil.cpu_count(logical=False), None
            ),
            "cache_bytes": _probe(notes, "CPU caches", cpu_caches, {}),
        },
        "memory_bytes": _probe(notes, "memory", lambda: int(psutil.virtual_memory().total), None),
        "gpus": gpus,
        "os": {
            "system": _probe(notes, "OS", platform.system, None),
            "release": _probe(notes, "OS release", platform.release, None),
            "platform": _probe(notes, "platform", platform.platform, None),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "packages": _probe(notes, "package versions", package_versions, {}),
        "notes": notes,
    }


_CACHE_ROOT = "/sys/devices/system/cpu/cpu0/cache"
_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def cpu_caches(root: str = _CACHE_ROOT) -> dict[str, int]:
    """Data cache sizes seen by one core, per level (``{"l1": 32768, "l2": ..., "l3":
    ...}``): predictions charge the weights that do not fit in the last level
    (``predict/features.py``).  Empty where Linux's sysfs does not tell."""
    out: dict[str, int] = {}
    if not os.path.isdir(root):
        return out
    for entry in sorted(os.listdir(root)):
        folder = os.path.join(root, entry)
        try:
            with open(os.path.join(folder, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(folder, "level")) as f:
                level = int(f.read().strip())
            with open(os.path.join(folder, "size")) as f:
                size = f.read().strip().upper()
        except (OSError, ValueError):
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)B?", size)
        if kind in ("Data", "Unified") and match:
            out[f"l{level}"] = int(match[1]) * _SIZE_UNITS[match[2]]
    return out


# -- GPUs ------------------------------------------------------------------------------


def gpu_info() -> tuple[list[dict[str, Any]], str | None]:
    """The GPUs of the first vendor (``gpu.device.VENDORS``, in order) whose library
    lists some, as that library reports them, and a note when there are none to report
    (the first vendor's reason).

    Only queries: no GPU setting is changed.  A field the driver cannot give is None.
    """
    first_note: str | None = None
    for vendor in VENDORS:
        rows, note = _vendor_gpus(vendor.name)
        if rows:
            return rows, note
        if first_note is None:
            first_note = f"no {vendor.label} GPU info: {note}"
    return [], first_note


def _vendor_gpus(vendor: str) -> tuple[list[dict[str, Any]], str | None]:
    try:
        library = open_library(vendor)
    except Exception as exc:  # a broken install is no reason to lose the run
        return [], _one_line(exc)
    try:
        return library.machine_rows()
    except Exception as exc:
        return [], _one_line(exc)
    finally:
        library.close()


# -- software --------------------------------------------------------------------------


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that shape results; None for those not installed."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = None
        except Exception:  # broken metadata: as good as unknown
            version = None
        versions[name] = str(version) if version else None
    return versions


def _git(args: list[str], cwd: str | os.PathLike[str]) -> str | None:
    """git's stdout, or None if git is missing, fails or hangs."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # `git status` must not take index.lock
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            env=env,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit_info(
    path: str | os.PathLike[str] = ".", *, own: Sequence[str | os.PathLike[str]] = ()
) -> dict[str, Any]:
    """The commit of the git work tree at ``path`` (as pytest-benchmark records it); else {}.

    ``dirty`` is True when ``git status --porcelain`` lists anything (tracked or
    untracked), None if that could not be asked.  ``own`` are folders the tool itself
    writes (the run storage): what is in them changes no code, and counting it would mark
    every session after the first as uncommitted (whose runs teach a gate no noise).
    """
    top = _git(["rev-parse", "--show-toplevel"], path)
    if not top:
        return {}
    sha = _git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], path)
    if not sha:
        return {}  # no commit yet
    status = _git(
        ["status", "--porcelain", "--untracked-files=normal", "--", ":/", *_excluded(top, own)],
        path,
    )
    return {
        "id": sha,
        "short_id": sha[:12],
        "branch": _git(["symbolic-ref", "--quiet", "--short", "HEAD"], path) or None,
        "time": _git(["log", "-1", "--format=%cI", sha], path) or None,
        "dirty": None if status is None else bool(status),
        "project": PurePath(top).name or None,
    }


def _excluded(top: str, folders: Sequence[str | os.PathLike[str]]) -> list[str]:
    """git pathspecs leaving out those of ``folders`` that lie in the work tree."""
    specs = []
    for folder in folders:
        try:
            inside = Path(folder).resolve().relative_to(Path(top).resolve())
        except (ValueError, OSError):
            continue  # elsewhere: git does not see it anyway
        if inside.parts:
            specs.append(f":(top,exclude){inside.as_posix()}")
    return specs


# -- storage key -----------------------------------------------------------------------


def _slug(text: str, *, brand: bool = True) -> str:
    """Lowercase, one ``-`` for every run of other characters; ``brand`` drops brand noise.

    The noise ("(R)", "(TM)", "CPU", "@ 2.20GHz") differs between tools reporting the
    same chip, so it must not split one machine's runs into two folders.
    """
    text = text.lower()
    if brand:
        text = _TRADEMARK.sub(" ", text)
        text = _FREQUENCY.sub(" ", text)
        text = _CPU_WORD.sub(" ", text)
    return _NOT_SLUG.sub("-", text).strip("-.")


def _cap(part: str) -> str:
    """At most MAX_PART characters; a cut part ends in a hash of the whole so it stays unique."""
    if len(part) <= MAX_PART:
        return part
    digest = hashlib.sha1(part.encode()).hexdigest()[:_HASH_LEN]
    head = part[: MAX_PART - _HASH_LEN - 1].rstrip("-.+")
    return f"{head}-{digest}"


def _gpu_part(gpus: object) -> str:
    if not isinstance(gpus, list) or not gpus:
        return "no-gpu"
    names: Counter[str] = Counter()
    for gpu in gpus:
        name = gpu.get("name") if isinstance(gpu, Mapping) else None
        names[(_slug(str(name)) if name else "") or "unknown-gpu"] += 1
    return "+".join(f"{n}x-{name}" for name, n in sorted(names.items()))


def hardware_key(machine: Mapping[str, Any], backend: str) -> str:
    """The storage folder for runs on this hardware with this meter backend.

    ``<cpu>__<gpus>__<backend>``, e.g. ``amd-epyc-7742-64-core-processor__4x-nvidia-a100-
    sxm4-40gb__nvml``: only ``[a-z0-9._+-]``, the same for the same hardware, different
    when the CPU model, the GPU models or count, or the backend differ.
    """
    cpu = machine.get("cpu")
    model = cpu.get("model") if isinstance(cpu, Mapping) else None
    cpu_part = (_slug(str(model)) if model else "") or "unknown-cpu"
    backend_part = _slug(str(backend), brand=False) or "unknown-backend"
    parts = (cpu_part, _gpu_part(machine.get("gpus")), backend_part)
    return KEY_SEPARATOR.join(_cap(p) for p in parts)
