"""Figures on the Agg canvas, made without pyplot: no global figure registry, no GUI, any backend set.

Every figure of `analysis` comes from `new_figure`, so it renders to PNG the same way in a script,
a test, CI or a notebook (where IPython displays it inline), whatever `matplotlib.use` says.
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def new_figure(figsize: tuple[float, float]) -> Figure:
    """An empty figure of `figsize` inches drawn by Agg; freed like any object, no close() needed."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig
