"""A sweep's standard heatmaps: a grid of facets (row × col) of one metric over y × x, sharing one colour scale,
laid out from the axes that vary (`default_layout`), one figure per metric (and per value of one more axis that
would otherwise hide under the best of it). The cells themselves are drawn by `analysis.heatmaps`."""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping, Optional

import pandas as pd
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from analysis.figures import FigureSpec, new_figure
from analysis.heatmaps import (
    EMULATED_OOM_LABEL,
    LAYOUT_AXES,
    OVERSUBSCRIBED,
    STATUS_STYLE,
    TIE,
    axis_values,
    cells,
    check_columns,
    cmap_of,
    draw_cells,
    emulated_oom,
    facet_label,
    metric_of,
    varying_axes,
)
from scaling.core.enums import Status

CELL_IN = (0.85, 0.4)
"""Width and height of a heatmap cell in a facet grid, inches."""


GAP_IN = (0.3, 0.55)
"""Space between the facets of a grid, inches: across, and down (room for a facet's title)."""


def filtered(df: pd.DataFrame, filters: Optional[Mapping[str, Any]]) -> pd.DataFrame:
    for column, value in (filters or {}).items():
        check_columns(df, filter=column)
        if not (df[column] == value).any():
            raise ValueError(
                f"filter {column}={value!r} matches no record: {column} takes "
                f"{', '.join(map(str, axis_values(df, column)))}"
            )
        df = df[df[column] == value]
    return df


def facet_grid(
    df: pd.DataFrame,
    x: str,
    y: str,
    metric: str,
    row: Optional[str] = None,
    col: Optional[str] = None,
    filters: Optional[Mapping[str, Any]] = None,
) -> Figure:
    """A grid of heatmaps of `metric` over y x x, one per (row, col) value, sharing one colour scale."""
    check_columns(df, x=x, y=y, row=row, col=col)
    df = filtered(df, filters)
    m = metric_of(metric, df)
    rows = axis_values(df, row) if row else [None]
    cols = axis_values(df, col) if col else [None]
    xs, ys = axis_values(df, x), axis_values(df, y)
    ok = df.loc[df["status"] == Status.OK, m.column].dropna()
    vmin, vmax = (float(ok.min()), float(ok.max())) if len(ok) else (0.0, 1.0)
    # All facets share one Axes in cell units (a cell is CELL_IN inches), laid out by hand: an Axes
    # per facet costs more to build and to draw than the facet's cells.
    nx, ny = len(xs), len(ys)
    gap_x, gap_y = GAP_IN[0] / CELL_IN[0], GAP_IN[1] / CELL_IN[1]  # between facets, in cells
    span_x, span_y = len(cols) * nx + (len(cols) - 1) * gap_x, len(rows) * ny + (len(rows) - 1) * gap_y
    left, right, top, bottom = 0.9, 1.4, 1.1, 1.0  # inches: y labels, colour bar, titles, x labels + legend
    grid_w, grid_h = span_x * CELL_IN[0], span_y * CELL_IN[1]
    width, height = max(grid_w + left + right, 9.0), grid_h + top + bottom
    left += (width - grid_w - left - right) / 2  # a small grid sits in the middle, its colour bar beside it
    fig = new_figure((width, height))
    ax = fig.add_axes((left / width, bottom / height, grid_w / width, grid_h / height))
    ax.set_xlim(0, span_x)
    ax.set_ylim(span_y, 0)
    ax.set_axis_off()
    facet_keys = [k for k in (row, col) if k]
    table = cells(df, x, y, metric, by=facet_keys)
    facets = {(): table}
    if facet_keys:  # one level goes by name: as a 1-list it warns on pandas 2 and gives 1-tuple keys on pandas 3
        level = facet_keys if len(facet_keys) > 1 else facet_keys[0]
        facets = {k if isinstance(k, tuple) else (k,): f for k, f in table.groupby(level=level, sort=False)}
    label_x, label_y = 0.12 / CELL_IN[0], 0.08 / CELL_IN[1]  # tick labels' distance from the cells
    for i, rv in enumerate(rows):
        y0 = i * (ny + gap_y)
        for j, cv in enumerate(cols):
            x0 = j * (nx + gap_x)
            key = tuple(v for v in (rv, cv) if v is not None)
            facet = facets.get(key, table.iloc[:0])
            if facet_keys:
                facet = facet.droplevel(facet_keys)
            draw_cells(ax, facet, xs, ys, m, vmin, vmax, origin=(x0, y0))
            if facet_keys:
                ax.text(
                    x0 + nx / 2,
                    y0 - label_y,
                    ", ".join(facet_label(k, v) for k, v in zip(facet_keys, key)),
                    ha="center",
                    va="bottom",
                    fontsize=10,
                    gid="facet",
                    clip_on=False,
                )
            if j == 0:  # the outer facets carry the tick labels and the axis names
                for k, v in enumerate(ys):
                    ax.text(-label_x, y0 + k + 0.5, str(v), ha="right", va="center", rotation=90, clip_on=False)
                ax.text(
                    -label_x - 0.3 / CELL_IN[0], y0 + ny / 2, y, ha="right", va="center", rotation=90, clip_on=False
                )
            if i == len(rows) - 1:
                for k, v in enumerate(xs):
                    ax.text(x0 + k + 0.5, y0 + ny + label_y, str(v), ha="center", va="top", clip_on=False)
                ax.text(x0 + nx / 2, y0 + ny + label_y + 0.25 / CELL_IN[1], x, ha="center", va="top", clip_on=False)
    shown = {p.get_gid() for p in ax.patches}
    n_max = int(table["n"].max()) if len(table) else 0
    cax = fig.add_axes(((left + grid_w + 0.35) / width, bottom / height, 0.18 / width, grid_h / height))
    bar = fig.colorbar(ScalarMappable(Normalize(vmin, vmax), cmap_of(m)), cax=cax, label=m.label)
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: m.fmt.format(v)))
    present = [s for s in STATUS_STYLE if f"status:{s}" in shown]
    names = {
        **{s: STATUS_STYLE[s][0] for s in present},
        **({Status.OOM: EMULATED_OOM_LABEL} if emulated_oom(df) else {}),
    }
    handles = [Patch(facecolor=STATUS_STYLE[s][1], hatch=STATUS_STYLE[s][3], label=names[s]) for s in present]
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=2, label="★ best"))
    if "tie" in shown:
        handles.append(Patch(facecolor="white", edgecolor="black", linestyle="--", label=f"{TIE} within noise of ★"))
    if any(OVERSUBSCRIBED in t.get_text() for t in ax.texts):
        handles.append(Patch(facecolor="white", edgecolor="white", label=f"{OVERSUBSCRIBED} oversubscribed"))
    fig.legend(
        handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9, bbox_to_anchor=(0.5, 0.0)
    )
    heading = f"{m.label}: {y} × {x}"
    if facet_keys:
        heading += " per " + " × ".join(facet_keys)
    if filters:
        heading += " (" + ", ".join(facet_label(k, v) for k, v in filters.items()) + ")"
    if n_max > 1:
        hidden = [a for a in varying_axes(df) if a not in (x, y, row, col)]
        heading += f"\nbest ok value of up to {n_max} records per cell" + (
            f" (over {', '.join(hidden)})" if hidden else ""
        )
    fig.suptitle(heading, fontsize=12, y=1 - 0.1 / height, va="top")
    return fig


def default_layout(df: pd.DataFrame) -> dict[str, Optional[str]]:
    """Pick y, x, row and col from the axes that vary: seq_len × mbs per zero_stage × dp when all do."""
    varying = varying_axes(df)
    fixed = [a for a in LAYOUT_AXES if a in df.columns and a not in varying]
    roles = (varying + fixed)[:2] + varying[2:4]
    roles += [None] * (4 - len(roles))
    return dict(zip(("y", "x", "row", "col"), roles))


def figure_specs(
    df: pd.DataFrame, metrics: tuple[str, ...] = ("tokens_per_s_per_gpu", "mfu", "peak_mem_bytes")
) -> dict[str, FigureSpec]:
    """The standard heatmaps of a sweep, by name, still to be drawn (see `draw_all`, `render_pngs`)."""
    layout = default_layout(df)
    placed = [a for a in layout.values() if a]
    # An axis that follows from the placed ones (grad_acc from dp at a fixed global batch) adds no
    # cells; one that takes several values within a cell would be hidden under the best of them.
    split = next(
        (
            a
            for a in LAYOUT_AXES
            if a in df.columns
            and a not in placed
            and df.groupby(placed, dropna=False)[a].nunique(dropna=True).max() > 1
        ),
        None,
    )
    if split is None:
        return {metric: partial(facet_grid, df, metric=metric, **layout) for metric in metrics}
    return {
        f"{metric}__{split}-{value}": partial(facet_grid, df, metric=metric, filters={split: value}, **layout)
        for metric in metrics
        for value in axis_values(df, split)
    }


def draw_all(
    df: pd.DataFrame, metrics: tuple[str, ...] = ("tokens_per_s_per_gpu", "mfu", "peak_mem_bytes")
) -> dict[str, Figure]:
    """The standard heatmaps of a sweep, laid out by `default_layout`: one faceted figure per metric,
    or, when one more axis varies (a sweep over models, say), one per metric and value of that axis,
    so that each model's out-of-memory cells show instead of the best value over models."""
    return {name: spec() for name, spec in figure_specs(df, metrics).items()}
