"""Heatmaps of a metric over two config axes, faceted by two more, with every status visible.

A cell holds the best `ok` value of the records that fall into it. A cell without an `ok` record
shows why: "OOM" (measured; on CPU against an emulated capacity, which the legend says),
"pred OOM" (skipped by the memory predictor), "timeout", "failed" or "invalid", each in its own
colour; a cell no record reached stays blank. The best cell of a facet carries a box and a star;
for a throughput metric every cell within noise of it (their bands v·(1 ± noise_band_frac)
overlap, `scaling.core.noise.within_noise`) is a tie, marked "≈" with a dashed box. A value measured
with ranks sharing cores (`env.oversubscribed`, under hardware.oversubscribe) carries a "†".
Status cells are drawn as patches with their own text on top of the colour mesh.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter
from seaborn.utils import relative_luminance

from analysis.collect import CONFIG_AXES
from analysis.figures import FigureSpec, new_figure
from scaling.core.noise import NOISE_BAND_KEY, THROUGHPUT_KEYS, within_noise
from scaling.core.units import GIB, memory_unit
from scaling.engine.enums import Status


@dataclass(frozen=True)
class Metric:
    """How a metric column is shown: its label, which way is better and how a cell prints it."""

    column: str
    label: str
    higher_is_better: bool
    fmt: str

    @property
    def noisy(self) -> bool:
        """Whether the metric moves with the step time, so its cells have a noise band."""
        return self.column in THROUGHPUT_KEYS


METRICS = {
    "tokens_per_s_per_gpu": Metric("tokens_per_s_per_gpu", "tokens/s per GPU", True, "{:,.0f}"),
    "tokens_per_s": Metric("tokens_per_s", "tokens/s", True, "{:,.0f}"),
    "mfu": Metric("mfu", "MFU", True, "{:.1%}"),
    "peak_mem_gib": Metric("peak_mem_gib", "peak memory per rank (GiB)", False, "{:.1f}"),
    "peak_mem_mib": Metric("peak_mem_mib", "peak memory per rank (MiB)", False, "{:.1f}"),
    "step_time_s": Metric("step_time_s", "step time (s)", False, "{:.3g}"),
}
"""Metrics a heatmap can show, by the name a caller passes; `peak_mem_bytes` shows in GiB or MiB."""

STATUS_STYLE = {
    Status.OOM: ("OOM", "#d62728", "white", None),
    Status.PREDICTED_OOM: ("pred OOM", "#f4a6a6", "black", "//"),
    Status.TIMEOUT: ("timeout", "#8c564b", "white", None),
    Status.FAILED: ("failed", "#404040", "white", None),
    Status.INVALID: ("invalid", "#d9d9d9", "black", "xx"),
}
"""Label, face colour, text colour and hatch of a cell whose records have no `ok` among them."""

EMULATED_OOM_LABEL = "OOM (emulated capacity)"
"""The legend's name for OOM cells measured against an emulated capacity (CPU, hardware.memory_gb)."""
MFU_MEASURED_PEAK_LABEL = "MFU against a measured matmul peak"
"""The MFU label when the peak was measured on the host (CPU): not comparable with a datasheet MFU."""
TIE, OVERSUBSCRIBED = "≈", "†"
"""Marks of a cell within noise of the best one, and of a value measured oversubscribed."""

STATUS_PRIORITY = {Status.OK: 0, Status.OOM: 1, Status.PREDICTED_OOM: 2, Status.TIMEOUT: 3, Status.FAILED: 4, Status.INVALID: 5}
"""Which status a cell shows when its records differ: an ok value first, then the most telling failure."""

LAYOUT_AXES = ("seq_len", "mbs", "zero_stage", "dp", "grad_acc", "model", "recompute", "precision", "hardware",
               "memory_gb", "threads_per_device", "oversubscribe")
"""Axes in the order `default_layout` gives them the roles y, x, facet row, facet column."""

CELL_IN = (0.85, 0.4)
"""Width and height of a heatmap cell in a facet grid, inches."""
GAP_IN = (0.3, 0.55)
"""Space between the facets of a grid, inches: across, and down (room for a facet's title)."""

PRETTY = {"zero_stage": "ZeRO-{}", "dp": "dp={}", "seq_len": "seq {}", "mbs": "mbs={}", "grad_acc": "grad_acc={}"}


def _metric(name: str, df: Optional[pd.DataFrame] = None) -> Metric:
    if name == "peak_mem_bytes":  # the unit that reads best for the data at hand
        largest = df["peak_mem_bytes"].max() if df is not None and len(df) else None
        return METRICS["peak_mem_" + memory_unit(largest if pd.notna(largest) else GIB)[0].lower()]
    if name not in METRICS:
        raise ValueError(f"metric={name!r} has no heatmap: use one of peak_mem_bytes, {', '.join(METRICS)}")
    if name == "mfu" and df is not None and measured_peak(df):
        return Metric("mfu", MFU_MEASURED_PEAK_LABEL, True, METRICS["mfu"].fmt)
    return METRICS[name]


def measured_peak(df: pd.DataFrame) -> bool:
    """Whether any ok point's MFU divides by a peak measured on the host (a matmul), not a datasheet's."""
    if "peak_flops_source" not in df.columns:
        return False
    return bool(df.loc[df["status"] == Status.OK, "peak_flops_source"].isin(["measured", "cache"]).any())


def emulated_oom(df: pd.DataFrame) -> bool:
    """Whether an OOM among these records was measured against an emulated capacity (CPU)."""
    return bool(((df["status"] == Status.OOM) & (df["memory_capacity"] == "emulated")).any())


def _check_columns(df: pd.DataFrame, **axes: Optional[str]) -> None:
    for role, column in axes.items():
        if column is not None and column not in df.columns:
            raise ValueError(f"{role}={column!r} is not a column: use one of {', '.join(CONFIG_AXES)}")


def facet_label(column: str, value: Any) -> str:
    """How a facet value reads in a title: `ZeRO-1`, `dp=8`, `seq 4096`, `model=llama_1b`, `2 threads/device`."""
    if column == "oversubscribe":
        return "oversubscription allowed" if value else "no oversubscription"
    if column == "threads_per_device":
        return f"{value} thread{'' if value == 1 else 's'}/device"
    return PRETTY.get(column, f"{column}={{}}").format(value)


def cells(df: pd.DataFrame, x: str, y: str, metric: str, by: Sequence[str] = ()) -> pd.DataFrame:
    """One row per ([*by,] y, x) cell: the best ok `value`, its `noise` band (0 for memory or when not
    measured) and whether its ranks shared cores (`oversubscribed`), the `status` shown and `n` records in the cell."""
    m = _metric(metric, df)
    keys = [*by, y, x]
    _check_columns(df, x=x, y=y, **{f"by[{i}]": k for i, k in enumerate(by)})
    if len(set(keys)) < len(keys):
        raise ValueError(f"x={x!r}, y={y!r} and facets {list(by)} must be different columns")
    extra = [c for c in (NOISE_BAND_KEY, "oversubscribed") if c in df.columns]
    d = df[[*keys, "status", m.column, *extra]].dropna(subset=keys)
    d = d.assign(status=d["status"].astype(str), rank=d["status"].astype(str).map(STATUS_PRIORITY))
    grouped = d.groupby(keys, sort=True, observed=True)
    out = pd.DataFrame({"n": grouped.size(), "rank": grouped["rank"].min()})
    ok = d[(d["status"] == Status.OK) & d[m.column].notna()]
    values = ok.groupby(keys, observed=True)[m.column]
    best = ok.loc[values.idxmax() if m.higher_is_better else values.idxmin()].set_index(keys)  # the cell's record
    out["value"] = best[m.column].reindex(out.index).astype("float64")
    noise = best[NOISE_BAND_KEY] if m.noisy and NOISE_BAND_KEY in best else pd.Series(0.0, index=best.index)
    out["noise"] = noise.reindex(out.index).astype("float64").fillna(0.0)
    over = best["oversubscribed"] if "oversubscribed" in best else pd.Series(False, index=best.index)
    out["oversubscribed"] = over.reindex(out.index).eq(True)
    by_rank = {rank: status for status, rank in STATUS_PRIORITY.items()}
    out["status"] = out["rank"].map(by_rank)
    return out.drop(columns="rank")


def ties(values: np.ndarray, noise: np.ndarray, best: tuple[int, ...]) -> np.ndarray:
    """Cells whose value is within noise of the best cell's (the best cell included); NaN cells never."""
    if not np.isfinite(values[best]):
        raise ValueError(f"best cell {best} has no value")
    out = np.zeros(values.shape, dtype=bool)
    for index in zip(*np.nonzero(np.isfinite(values))):
        out[index] = within_noise(values[index], noise[index], values[best], noise[best])
    return out


def _cmap(m: Metric) -> str:
    # the good end is always yellow, whichever way the metric improves
    return "viridis" if m.higher_is_better else "viridis_r"


def _values(df: pd.DataFrame, column: str) -> list[Any]:
    return sorted(df[column].dropna().unique().tolist())


def _draw_cells(ax: Axes, table: pd.DataFrame, xs: list, ys: list, m: Metric, vmin: Optional[float],
                vmax: Optional[float], origin: tuple[float, float] = (0.0, 0.0)) -> Any:
    """One facet's cells on `ax`, cell (i-th y, j-th x) at origin + (j, i) in data units: the ok values
    in colour and print, status cells as labelled patches, the best cell boxed and starred, its ties marked.
    Returns the QuadMesh (for a colour bar)."""
    x0, y0 = origin
    ok_values, noise, over = (table[c].unstack(-1).reindex(index=ys, columns=xs).to_numpy()
                              for c in ("value", "noise", "oversubscribed"))
    ok_values, noise = ok_values.astype("float64"), noise.astype("float64")
    over = over == True  # noqa: E712 - NaN (no ok record) is not oversubscribed
    finite = np.isfinite(ok_values)
    if vmin is None or vmax is None:
        lo, hi = (np.nanmin(ok_values), np.nanmax(ok_values)) if finite.any() else (0.0, 1.0)
        vmin, vmax = (lo if vmin is None else vmin), (hi if vmax is None else vmax)
    best, tied = None, np.zeros(ok_values.shape, dtype=bool)
    if finite.any():
        flat = np.where(finite, ok_values, -np.inf if m.higher_is_better else np.inf)
        best = np.unravel_index(np.argmax(flat) if m.higher_is_better else np.argmin(flat), flat.shape)
        tied = ties(ok_values, noise, best)
        tied[best] = False
    fontsize = max(5.0, min(10.0, 48.0 / max(len(xs), len(ys), 1)))
    # One pcolormesh per facet (first y value at the top when the y axis runs downwards): seaborn's
    # heatmap renders the whole figure per call to check tick overlap, several times the cost.
    mesh = ax.pcolormesh(x0 + np.arange(len(xs) + 1), y0 + np.arange(len(ys) + 1), np.ma.masked_invalid(ok_values),
                         cmap=_cmap(m), vmin=vmin, vmax=vmax, edgecolors="white", linewidth=0.5)
    colours = mesh.cmap(Normalize(vmin, vmax)(ok_values))  # (len(ys), len(xs), RGBA)
    for i, j in zip(*np.nonzero(finite)):
        mark = "★ " if (i, j) == best else f"{TIE} " if tied[i, j] else ""
        text = mark + m.fmt.format(ok_values[i, j]) + (OVERSUBSCRIBED if over[i, j] else "")
        ax.text(x0 + j + 0.5, y0 + i + 0.5, text, ha="center", va="center", fontsize=fontsize,
                color="black" if relative_luminance(colours[i, j]) > 0.408 else "white")
    position = {(yv, xv): (ys.index(yv), xs.index(xv)) for yv, xv in table.index if yv in ys and xv in xs}
    for (yv, xv), status in table["status"].items():
        if status == Status.OK or (yv, xv) not in position:
            continue
        i, j = position[(yv, xv)]
        label, face, text_colour, hatch = STATUS_STYLE[status]
        ax.add_patch(Rectangle((x0 + j, y0 + i), 1, 1, facecolor=face, edgecolor="white", hatch=hatch,
                               linewidth=0.5, gid=f"status:{status}"))
        ax.text(x0 + j + 0.5, y0 + i + 0.5, label, ha="center", va="center", color=text_colour,
                fontsize=0.9 * fontsize, fontweight="bold")
    if best is not None:
        ax.add_patch(Rectangle((x0 + best[1], y0 + best[0]), 1, 1, fill=False, edgecolor="black", linewidth=2.5,
                               gid="best", zorder=5))
    for i, j in zip(*np.nonzero(tied)):
        ax.add_patch(Rectangle((x0 + j, y0 + i), 1, 1, fill=False, edgecolor="black", linewidth=1.5,
                               linestyle="--", gid="tie", zorder=5))
    return mesh


def heatmap(df: pd.DataFrame, x: str, y: str, metric: str, ax: Optional[Axes] = None,
            title: Optional[str] = None, xs: Optional[list] = None, ys: Optional[list] = None,
            vmin: Optional[float] = None, vmax: Optional[float] = None, cbar: bool = True,
            note_aggregation: bool = True, table: Optional[pd.DataFrame] = None) -> Axes:
    """Draw one heatmap of `metric` over y x x on `ax`; status cells labelled, the best cell starred.

    `table` is `cells(df, x, y, metric)` when the caller has it already.
    """
    m = _metric(metric, df)
    table = cells(df, x, y, metric) if table is None else table
    xs = _values(df, x) if xs is None else xs
    ys = _values(df, y) if ys is None else ys
    if ax is None:
        ax = new_figure((0.85 * len(xs) + 2.6, 0.45 * len(ys) + 2.0)).subplots()
    mesh = _draw_cells(ax, table, xs, ys, m, vmin, vmax)
    ax.set_xlim(0, len(xs))
    ax.set_ylim(len(ys), 0)
    ax.set_xticks(np.arange(len(xs)) + 0.5, labels=[str(v) for v in xs])
    ax.set_yticks(np.arange(len(ys)) + 0.5, labels=[str(v) for v in ys], rotation=90, va="center")
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    if cbar:
        ax.figure.colorbar(mesh, ax=ax, label=m.label)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    n_max = int(table["n"].max()) if len(table) else 0
    heading = title if title is not None else f"{m.label}: {y} × {x}"
    if note_aggregation and n_max > 1:
        heading += f"\n(best ok value of up to {n_max} records per cell)"
    ax.set_title(heading, fontsize=10)
    return ax


def _filter(df: pd.DataFrame, filters: Optional[Mapping[str, Any]]) -> pd.DataFrame:
    for column, value in (filters or {}).items():
        _check_columns(df, filter=column)
        if not (df[column] == value).any():
            raise ValueError(f"filter {column}={value!r} matches no record: {column} takes "
                             f"{', '.join(map(str, _values(df, column)))}")
        df = df[df[column] == value]
    return df


def facet_grid(df: pd.DataFrame, x: str, y: str, metric: str, row: Optional[str] = None,
               col: Optional[str] = None, filters: Optional[Mapping[str, Any]] = None) -> Figure:
    """A grid of heatmaps of `metric` over y x x, one per (row, col) value, sharing one colour scale."""
    _check_columns(df, x=x, y=y, row=row, col=col)
    df = _filter(df, filters)
    m = _metric(metric, df)
    rows = _values(df, row) if row else [None]
    cols = _values(df, col) if col else [None]
    xs, ys = _values(df, x), _values(df, y)
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
    facets = dict(iter(table.groupby(level=facet_keys, sort=False))) if facet_keys else {(): table}
    label_x, label_y = 0.12 / CELL_IN[0], 0.08 / CELL_IN[1]  # tick labels' distance from the cells
    for i, rv in enumerate(rows):
        y0 = i * (ny + gap_y)
        for j, cv in enumerate(cols):
            x0 = j * (nx + gap_x)
            key = tuple(v for v in (rv, cv) if v is not None)
            facet = facets.get(key, table.iloc[:0])
            if facet_keys:
                facet = facet.droplevel(facet_keys)
            _draw_cells(ax, facet, xs, ys, m, vmin, vmax, origin=(x0, y0))
            if facet_keys:
                ax.text(x0 + nx / 2, y0 - label_y, ", ".join(facet_label(k, v) for k, v in zip(facet_keys, key)),
                        ha="center", va="bottom", fontsize=10, gid="facet", clip_on=False)
            if j == 0:  # the outer facets carry the tick labels and the axis names
                for k, v in enumerate(ys):
                    ax.text(-label_x, y0 + k + 0.5, str(v), ha="right", va="center", rotation=90, clip_on=False)
                ax.text(-label_x - 0.3 / CELL_IN[0], y0 + ny / 2, y, ha="right", va="center", rotation=90,
                        clip_on=False)
            if i == len(rows) - 1:
                for k, v in enumerate(xs):
                    ax.text(x0 + k + 0.5, y0 + ny + label_y, str(v), ha="center", va="top", clip_on=False)
                ax.text(x0 + nx / 2, y0 + ny + label_y + 0.25 / CELL_IN[1], x, ha="center", va="top", clip_on=False)
    shown = {p.get_gid() for p in ax.patches}
    n_max = int(table["n"].max()) if len(table) else 0
    cax = fig.add_axes(((left + grid_w + 0.35) / width, bottom / height, 0.18 / width, grid_h / height))
    bar = fig.colorbar(ScalarMappable(Normalize(vmin, vmax), _cmap(m)), cax=cax, label=m.label)
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: m.fmt.format(v)))
    present = [s for s in STATUS_STYLE if f"status:{s}" in shown]
    names = {**{s: STATUS_STYLE[s][0] for s in present}, **({Status.OOM: EMULATED_OOM_LABEL} if emulated_oom(df) else {})}
    handles = [Patch(facecolor=STATUS_STYLE[s][1], hatch=STATUS_STYLE[s][3], label=names[s]) for s in present]
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=2, label="★ best"))
    if "tie" in shown:
        handles.append(Patch(facecolor="white", edgecolor="black", linestyle="--", label=f"{TIE} within noise of ★"))
    if any(OVERSUBSCRIBED in t.get_text() for t in ax.texts):
        handles.append(Patch(facecolor="white", edgecolor="white", label=f"{OVERSUBSCRIBED} oversubscribed"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 0.0))
    heading = f"{m.label}: {y} × {x}"
    if facet_keys:
        heading += " per " + " × ".join(facet_keys)
    if filters:
        heading += " (" + ", ".join(facet_label(k, v) for k, v in filters.items()) + ")"
    if n_max > 1:
        hidden = [a for a in LAYOUT_AXES if a in df.columns and a not in (x, y, row, col)
                  and df[a].nunique(dropna=True) > 1]
        heading += f"\nbest ok value of up to {n_max} records per cell" + (f" (over {', '.join(hidden)})"
                                                                          if hidden else "")
    fig.suptitle(heading, fontsize=12, y=1 - 0.1 / height, va="top")
    return fig


def default_layout(df: pd.DataFrame) -> dict[str, Optional[str]]:
    """Pick y, x, row and col from the axes that vary: seq_len × mbs per zero_stage × dp when all do."""
    varying = [a for a in LAYOUT_AXES if a in df.columns and df[a].nunique(dropna=True) > 1]
    fixed = [a for a in LAYOUT_AXES if a in df.columns and a not in varying]
    roles = (varying + fixed)[:2] + varying[2:4]
    roles += [None] * (4 - len(roles))
    return dict(zip(("y", "x", "row", "col"), roles))


def figure_specs(df: pd.DataFrame, metrics: tuple[str, ...] = ("tokens_per_s_per_gpu", "mfu", "peak_mem_bytes")
                 ) -> dict[str, FigureSpec]:
    """The standard heatmaps of a sweep, by name, still to be drawn (see `draw_all`, `render_pngs`)."""
    layout = default_layout(df)
    placed = [a for a in layout.values() if a]
    # An axis that follows from the placed ones (grad_acc from dp at a fixed global batch) adds no
    # cells; one that takes several values within a cell would be hidden under the best of them.
    split = next((a for a in LAYOUT_AXES if a in df.columns and a not in placed
                  and df.groupby(placed, dropna=False)[a].nunique(dropna=True).max() > 1), None)
    if split is None:
        return {metric: partial(facet_grid, df, metric=metric, **layout) for metric in metrics}
    return {f"{metric}__{split}-{value}": partial(facet_grid, df, metric=metric, filters={split: value}, **layout)
            for metric in metrics for value in _values(df, split)}


def draw_all(df: pd.DataFrame, metrics: tuple[str, ...] = ("tokens_per_s_per_gpu", "mfu", "peak_mem_bytes")
             ) -> dict[str, Figure]:
    """The standard heatmaps of a sweep, laid out by `default_layout`: one faceted figure per metric,
    or, when one more axis varies (a sweep over models, say), one per metric and value of that axis,
    so that each model's out-of-memory cells show instead of the best value over models."""
    return {name: spec() for name, spec in figure_specs(df, metrics).items()}
