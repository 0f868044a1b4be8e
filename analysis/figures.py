"""Figures on the Agg canvas, made without pyplot, and written to PNG, several at once when there are cores.

Every figure of `analysis` comes from `new_figure`, so it renders to PNG the same way in a script,
a test, CI or a notebook (where IPython displays it inline), whatever `matplotlib.use` says.
`save_png` is the one place that says how a figure becomes a PNG; `render_pngs` builds and writes
many figures in forked processes, one per core, since a report's heatmaps are thousands of text
artists and matplotlib draws them on one core.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Optional, TypeVar

import matplotlib as mpl
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from scaling.core.host import usable_cores

DPI = 100
PNG_RC = {"text.hinting": "none"}
"""Unhinted glyphs: a quarter less time per text artist, and no visible loss at 100 dpi."""
PNG_COMPRESS_LEVEL = 1
"""zlib level of the PNG: level 1 takes a fraction of the default level's time for ~10% more bytes."""

PALETTE = tuple(sns.color_palette("colorblind"))
"""The colours of the line figures, in order: seaborn's colour-blind-safe palette."""
THEME_RC: dict[str, Any] = {
    **sns.axes_style("whitegrid"),
    **sns.plotting_context("notebook", font_scale=0.8),
    "axes.prop_cycle": mpl.cycler(color=PALETTE),
}
"""seaborn's whitegrid theme at the notebook scale, as rc settings: the line figures (DP scaling, extrapolation,
memory) draw under it; the heatmaps keep their own look (and their fast drawing, see analysis.heatmaps)."""
_Plot = TypeVar("_Plot", bound=Callable[..., Any])


def themed(plot: _Plot) -> _Plot:
    """Draw `plot`'s figure under THEME_RC (matplotlib reads most rc settings when an artist is made)."""

    @functools.wraps(plot)
    def drawn(*args: Any, **kwargs: Any) -> Any:
        with mpl.rc_context(THEME_RC):
            return plot(*args, **kwargs)

    return drawn  # type: ignore[return-value]


FigureSpec = Callable[[], Figure]
"""How to build a figure (a `functools.partial` of a plotting function, say), so a worker can draw it."""


def new_figure(figsize: tuple[float, float]) -> Figure:
    """An empty figure of `figsize` inches drawn by Agg; freed like any object, no close() needed."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, target: str | os.PathLike | IO[bytes]) -> None:
    """Write `fig` as the report's PNGs are written: drawn once at DPI with unhinted text, stored as
    opaque RGB (the figures have a white background) with fast compression."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    with mpl.rc_context(PNG_RC):
        canvas.draw()
    rgba = Image.frombuffer("RGBA", canvas.get_width_height(physical=True), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    rgba.convert("RGB").save(target, format="png", compress_level=PNG_COMPRESS_LEVEL)


_PENDING: dict[str, tuple[Figure | FigureSpec, Path]] = {}
"""The specs a `render_pngs` call hands its forked workers: inherited with the memory, never pickled."""


def _render(name: str) -> tuple[str, Path]:
    # A faceted figure is some 10^5 new objects; the collector would otherwise scan the heap over
    # and over while it is built (a fifth of the time). Its cycles are freed once it is written.
    spec, path = _PENDING[name]
    enabled = gc.isenabled()
    gc.disable()
    try:
        save_png(spec if isinstance(spec, Figure) else spec(), path)
    finally:
        if enabled:
            gc.enable()
        gc.collect()
    return name, path


def render_pngs(
    specs: Mapping[str, Figure | FigureSpec], directory: str | os.PathLike, jobs: Optional[int] = None
) -> dict[str, Path]:
    """Build each figure (or take it, when drawn already) and write it to `directory/<name>.png` (made
    if missing); return the paths in order.

    `jobs` processes (default: one per usable core, at most one per figure) draw in parallel; they
    are forked, so the specs and the data they close over are shared, not copied through pickle.
    Without fork (or with one job) the figures are drawn here, one after the other.
    """
    directory = Path(directory)
    jobs = min(usable_cores() if jobs is None else jobs, len(specs))
    if jobs < 1 and specs:
        raise ValueError(f"jobs={jobs} must be at least 1")
    directory.mkdir(parents=True, exist_ok=True)
    _PENDING.update({name: (spec, directory / f"{name}.png") for name, spec in specs.items()})
    try:
        gc.freeze()  # the data and modules already here are not garbage: collections skip them
        if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            done = dict(map(_render, specs))
        else:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                done = dict(pool.imap_unordered(_render, specs))
                pool.close()
                pool.join()
    finally:
        gc.unfreeze()
        for name in specs:
            _PENDING.pop(name, None)
    return {name: done[name] for name in specs}
