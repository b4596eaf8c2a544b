"""Drawing figures to files, shared by the routing, frontier and scale plots: matplotlib
imported only when a figure is drawn (it is optional), on its own Agg canvas (no pyplot),
saved under a name no earlier figure has."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")
MISSING = "matplotlib is not installed: pip install 'pytest-llmenergy[plots]'"


class PlotError(ConfigError):
    """A figure that cannot be drawn or saved; the message says what to change."""


def slug(name: str) -> str:
    """A file-name-safe form of a model name: "Llama-2 (7B)" -> "llama-2-7b"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "model"


def check_formats(formats: Sequence[str]) -> tuple[str, ...]:
    if isinstance(formats, str):  # "png" for ("png",)
        formats = (formats,)
    chosen = tuple(dict.fromkeys(str(f).lower().lstrip(".") for f in formats))
    bad = [f for f in chosen if f not in FORMATS]
    if bad or not chosen:
        got = f"bad figure format {bad[0]!r}" if bad else "no figure format"
        raise PlotError(f"{got}: give one or more of {', '.join(FORMATS)}")
    return chosen


def make_dir(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(out_dir, exc) from None
    return out_dir


def _unwritable(path: Path, exc: OSError) -> PlotError:
    return PlotError(f"{path}: cannot write figures there: {exc.strerror or exc}")


def save_figure(fig: Figure, out_dir: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    """Every format under the first of ``stem``, ``stem-2``, ... that names no file yet,
    so a figure from an earlier run is never replaced."""
    for n in itertools.count(1):
        name = stem if n == 1 else f"{stem}-{n}"
        paths = [out_dir / f"{name}.{fmt}" for fmt in formats]
        if any(p.exists() for p in paths):
            continue
        done: list[Path] = []
        try:
            for path, fmt in zip(paths, formats):
                write_new_figure(fig, path, fmt)
                done.append(path)
        except FileExistsError:  # another writer took the name since the check
            for path in done:
                path.unlink(missing_ok=True)
            continue
        return paths
    raise AssertionError("unreachable")


def write_new_figure(fig: Figure, path: Path, fmt: str) -> None:
    """Create ``path`` (never replace it) and draw ``fig`` into it."""
    mpl, _, _ = matplotlib_parts()
    try:
        file = path.open("xb")  # FileExistsError goes to the caller, which tries -2, -3...
    except FileExistsError:
        raise
    except OSError as exc:
        raise _unwritable(path.parent, exc) from None
    try:
        # text stays text in SVG: searchable and editable
        with file, mpl.rc_context({"svg.fonttype": "none"}):
            fig.savefig(file, format=fmt, dpi=120, bbox_inches="tight")
    except BaseException as exc:
        path.unlink(missing_ok=True)  # our own half-written file
        if isinstance(exc, OSError):
            raise _unwritable(path.parent, exc) from None
        raise


def matplotlib_parts() -> tuple[Any, Any, Any]:
    """(matplotlib, Figure, FigureCanvasAgg), imported when a figure is drawn: matplotlib
    is an optional dependency."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(MISSING) from None
    return matplotlib, Figure, FigureCanvasAgg


def new_figure(
    nrows: int = 1, ncols: int = 1, sharex: bool = False, width: float = 7.5, height: float = 5.0
) -> tuple[Figure, Any]:
    """A figure on its own Agg canvas (no pyplot), with a grid of axes."""
    _, figure_class, canvas_class = matplotlib_parts()
    fig = figure_class(figsize=(width, height), layout="constrained")
    canvas_class(fig)
    return fig, fig.subplots(nrows, ncols, sharex=sharex, squeeze=False)
