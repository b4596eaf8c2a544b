"""Which GPUs this process's work is on, found without a call that could open a CUDA
context on any other GPU.

A CUDA context (about 0.5 GB of the GPU's memory, and this process listed on it) is
opened on a GPU by the first call that touches it: ``torch.cuda.synchronize(i)`` on a
GPU the program never used opens one there, in every process that calls it (every rank
of a torchrun job).  So nothing here touches a GPU; two things tell where work is:

- **placements** (``hold``): what the package put on GPUs says so.  The loader holds the
  GPUs a model's parameters are on for as long as the model lives (a weak reference: a
  model that is collected lets go by itself; ``release`` lets go at once).  The GPU
  meters read these GPUs by default, in CUDA's numbering (``gpu:i`` is ``cuda:i``).
- **contexts** (``context_ordinals``): the GPUs where torch holds a primary context in
  this process, asked of the driver without opening one
  (``torch._C._cuda_hasPrimaryContext``): the only GPUs where this process can have
  queued work, and so the only ones a window's edge waits for (``synchronize``).

torch is never imported here: a program that did not import it queued nothing through it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

# torch's module for the GPUs of NVIDIA and AMD (ROCm keeps the torch.cuda names)
TORCH_API = "cuda"


@dataclass(frozen=True)
class Placement:
    """Work put on GPUs: ``what`` for people (a model's name), ``ordinals`` in CUDA's
    numbering (torch's ``cuda:i``)."""

    what: str
    ordinals: tuple[int, ...]


_lock = threading.Lock()
_placements: dict[int, Placement] = {}  # id(owner) -> its placement, while it lives


def hold(owner: object, what: str, ordinals: Iterable[int]) -> Placement | None:
    """Say that ``owner`` (a model) has its work on these GPUs until it is collected or
    ``release``d; None (nothing held): it is on no GPU."""
    placed = Placement(what, tuple(sorted(set(ordinals))))
    if not placed.ordinals:
        return None
    key = id(owner)
    with _lock:
        _placements[key] = placed
    with contextlib.suppress(TypeError):  # no weak references to it: held until release()
        weakref.finalize(owner, _drop, key)
    return placed


def hold_module(owner: Any, what: str, api: str = TORCH_API) -> Placement | None:
    """Hold the GPUs a torch module's parameters and buffers are on (and those accelerate's
    ``hf_device_map`` names, whose offloaded layers run there with no parameter of their
    own); None where it is on no GPU."""
    return hold(owner, what, module_ordinals(owner, api))


def module_ordinals(module: Any, api: str = TORCH_API) -> tuple[int, ...]:
    """The ordinals of the ``api`` devices a module's tensors are on (no GPU call: a
    tensor knows its device)."""
    found: set[int] = set()
    for get in ("parameters", "buffers"):
        for tensor in getattr(module, get, tuple)():
            device = getattr(tensor, "device", None)
            if getattr(device, "type", None) == api and device.index is not None:
                found.add(int(device.index))
    for device in (getattr(module, "hf_device_map", None) or {}).values():
        if isinstance(device, int) and not isinstance(device, bool):
            found.add(device)
        elif isinstance(device, str) and device.startswith(f"{api}:"):
            index = device.partition(":")[2]
            if index.isdecimal():
                found.add(int(index))
    return tuple(sorted(found))


def release(owner: object) -> None:
    """Let go of what ``owner`` held (nothing if it held nothing)."""
    _drop(id(owner))


def _drop(key: int) -> None:
    with _lock:
        _placements.pop(key, None)


def placements() -> tuple[Placement, ...]:
    """What is held now, oldest first."""
    with _lock:
        return tuple(_placements.values())


def held_ordinals() -> tuple[int, ...]:
    """Every GPU something holds now, in CUDA's numbering."""
    return tuple(sorted({i for placed in placements() for i in placed.ordinals}))


def held_by(owner: object) -> tuple[int, ...] | None:
    """The GPUs ``owner`` holds; None where it holds none."""
    with _lock:
        placed = _placements.get(id(owner))
    return placed.ordinals if placed is not None else None


def _torch_gpus(api: str) -> Any | None:
    """torch's GPU module where this process has used it (``is_initialized`` opens
    nothing), else None: then it queued nothing on any GPU."""
    torch = sys.modules.get("torch")
    gpus = getattr(torch, api, None) if torch is not None else None
    if gpus is None or not gpus.is_initialized():
        return None
    return gpus


def context_ordinals(api: str = TORCH_API) -> tuple[int, ...] | None:
    """The GPUs where torch holds a context in this process; () where it used none;
    None where this torch cannot tell without opening one (no primary-context query)."""
    gpus = _torch_gpus(api)
    if gpus is None:
        return ()
    probe = getattr(getattr(sys.modules["torch"], "_C", None), f"_{api}_hasPrimaryContext", None)
    if probe is None:
        return None
    try:
        return tuple(i for i in range(int(gpus.device_count())) if probe(i))
    except RuntimeError:  # a driver that fails the query: as if torch could not tell
        return None


def synchronize(among: Collection[int] | None = None, api: str = TORCH_API) -> tuple[int, ...]:
    """Wait for this process's queued work on each GPU that has a context (of ``among``
    only, where given), so that none of it crosses a window's edge; the ordinals waited
    for.  A GPU without a context has nothing queued, and waiting on it would open one.
    Where torch cannot say which have one, the GPUs something holds (``hold``) are waited
    for, and no other."""
    gpus = _torch_gpus(api)
    if gpus is None:
        return ()
    with_work = context_ordinals(api)
    if with_work is None:
        with_work = held_ordinals()
    chosen = tuple(i for i in with_work if among is None or i in among)
    for ordinal in chosen:
        gpus.synchronize(ordinal)
    return chosen
