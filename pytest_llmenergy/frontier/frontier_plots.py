"""One figure per model: time against energy of every GPU setting, frontier drawn.

Each case (token size) is one colour: its settings as points, its Pareto frontier as a
line through them, the GPU's default ringed, the minimum-energy setting starred.  Drawn
with the routing figures' helpers (own Agg canvas, never replacing a file).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..plotting import make_dir, new_figure, save_figure, slug
from . import CaseFrontier

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STEM = "frontier"


def frontier_figure(items: Sequence[CaseFrontier], model: str, system: str = "") -> Figure:
    fig, axes = new_figure()
    ax = axes[0][0]
    for f in items:
        label = f"{f.sweep} in {f.input_tokens} / out {f.output_tokens}".strip()
        xs = [p.time_s for p in f.points]
        ys = [p.energy_j for p in f.points]
        dots = ax.scatter(xs, ys, s=18, alpha=0.6)
        colour = dots.get_facecolor()[0]
        front = f.pareto
        ax.plot(
            [p.time_s for p in front], [p.energy_j for p in front], "-", color=colour, label=label
        )
        if f.default is not None:
            ax.scatter(
                [f.default.time_s], [f.default.energy_j], s=90, facecolors="none", edgecolors=colour
            )
        ax.scatter([f.min_energy.time_s], [f.min_energy.energy_j], marker="*", s=90, color=colour)
        for p in f.points:
            ax.annotate(p.setting, (p.time_s, p.energy_j), fontsize=6, alpha=0.7)
    ax.set_xscale("log")  # token sizes span orders of magnitude
    ax.set_yscale("log")
    ax.set_xlabel("time per query (s, log)")
    ax.set_ylabel("energy per query (J, log)")
    where = f" on {system}" if system else ""
    ax.set_title(f"{model}{where}: time vs energy over GPU settings (o default, * least energy)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


def write_frontier_plots(
    items: Sequence[CaseFrontier],
    out_dir: Path,
    formats: Sequence[str] = ("png",),
    system: str = "",
) -> list[Path]:
    """One file per model (and system, when named); an existing file is never replaced
    (``-2``, ``-3``, ...)."""
    out_dir = make_dir(out_dir)
    by_model: dict[str, list[CaseFrontier]] = {}
    for f in items:
        by_model.setdefault(f.model, []).append(f)
    written: list[Path] = []
    for model, members in by_model.items():
        stem = "-".join([STEM, *([slug(system)] if system else []), slug(model)])
        written += save_figure(frontier_figure(members, model, system), out_dir, stem, formats)
    return written
