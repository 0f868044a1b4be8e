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
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.patches import Rectangle
from seaborn.utils import relative_luminance

from analysis.collect import CONFIG_AXES
from analysis.figures import new_figure
from scaling.core.enums import Status
from scaling.core.noise import NOISE_BAND_KEY, THROUGHPUT_KEYS, within_noise
from scaling.core.units import GIB, memory_unit


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

STATUS_PRIORITY = {
    Status.OK: 0,
    Status.OOM: 1,
    Status.PREDICTED_OOM: 2,
    Status.TIMEOUT: 3,
    Status.FAILED: 4,
    Status.INVALID: 5,
}
"""Which status a cell shows when its records differ: an ok value first, then the most telling failure."""

LAYOUT_FIRST = (
    "seq_len",
    "mbs",
    "zero_stage",
    "dp",
    "grad_acc",
    "model",
    "recompute",
    "precision",
    "hardware",
    "memory_gb",
    "threads_per_device",
    "oversubscribe",
)
LAYOUT_AXES = (*LAYOUT_FIRST, *(a for a in CONFIG_AXES if a not in LAYOUT_FIRST))
"""Axes in the order `default_layout` gives them the roles y, x, facet row, facet column: LAYOUT_FIRST, then every
other configuration axis (analysis.collect.CONFIG_AXES, from the schema), so none is merged into a cell unseen."""


def varying_axes(df: pd.DataFrame) -> list[str]:
    """The axes that vary in `df`, in LAYOUT_AXES order: each of LAYOUT_FIRST that takes several values, then each
    other axis that still does once those are known (max_seq_len following seq_len, gbs following mbs × dp add
    nothing)."""
    first = [a for a in LAYOUT_FIRST if a in df.columns and df[a].nunique(dropna=True) > 1]
    groups = df.groupby(first, dropna=False, observed=True) if first else None
    rest = [
        a
        for a in LAYOUT_AXES[len(LAYOUT_FIRST) :]
        if a in df.columns and (df[a].nunique(dropna=True) > 1 if groups is None else groups[a].nunique().max() > 1)
    ]
    return first + rest


PRETTY = {"zero_stage": "ZeRO-{}", "dp": "dp={}", "seq_len": "seq {}", "mbs": "mbs={}", "grad_acc": "grad_acc={}"}


def metric_of(name: str, df: Optional[pd.DataFrame] = None) -> Metric:
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


def check_columns(df: pd.DataFrame, **axes: Optional[str]) -> None:
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
    m = metric_of(metric, df)
    keys = [*by, y, x]
    check_columns(df, x=x, y=y, **{f"by[{i}]": k for i, k in enumerate(by)})
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


def cmap_of(m: Metric) -> str:
    # the good end is always yellow, whichever way the metric improves
    return "viridis" if m.higher_is_better else "viridis_r"


def axis_values(df: pd.DataFrame, column: str) -> list[Any]:
    return sorted(df[column].dropna().unique().tolist())


def draw_cells(
    ax: Axes,
    table: pd.DataFrame,
    xs: list,
    ys: list,
    m: Metric,
    vmin: Optional[float],
    vmax: Optional[float],
    origin: tuple[float, float] = (0.0, 0.0),
) -> Any:
    """One facet's cells on `ax`, cell (i-th y, j-th x) at origin + (j, i) in data units: the ok values
    in colour and print, status cells as labelled patches, the best cell boxed and starred, its ties marked.
    Returns the QuadMesh (for a colour bar)."""
    x0, y0 = origin
    ok_values, noise, over = (
        table[c].unstack(-1).reindex(index=ys, columns=xs).to_numpy() for c in ("value", "noise", "oversubscribed")
    )
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
    mesh = ax.pcolormesh(
        x0 + np.arange(len(xs) + 1),
        y0 + np.arange(len(ys) + 1),
        np.ma.masked_invalid(ok_values),
        cmap=cmap_of(m),
        vmin=vmin,
        vmax=vmax,
        edgecolors="white",
        linewidth=0.5,
    )
    colours = mesh.cmap(Normalize(vmin, vmax)(ok_values))  # (len(ys), len(xs), RGBA)
    for i, j in zip(*np.nonzero(finite)):
        mark = "★ " if (i, j) == best else f"{TIE} " if tied[i, j] else ""
        text = mark + m.fmt.format(ok_values[i, j]) + (OVERSUBSCRIBED if over[i, j] else "")
        ax.text(
            x0 + j + 0.5,
            y0 + i + 0.5,
            text,
            ha="center",
            va="center",
            fontsize=fontsize,
            color="black" if relative_luminance(colours[i, j]) > 0.408 else "white",
        )
    position = {(yv, xv): (ys.index(yv), xs.index(xv)) for yv, xv in table.index if yv in ys and xv in xs}
    for (yv, xv), status in table["status"].items():
        if status == Status.OK or (yv, xv) not in position:
            continue
        i, j = position[(yv, xv)]
        label, face, text_colour, hatch = STATUS_STYLE[status]
        ax.add_patch(
            Rectangle(
                (x0 + j, y0 + i),
                1,
                1,
                facecolor=face,
                edgecolor="white",
                hatch=hatch,
                linewidth=0.5,
                gid=f"status:{status}",
            )
        )
        ax.text(
            x0 + j + 0.5,
            y0 + i + 0.5,
            label,
            ha="center",
            va="center",
            color=text_colour,
            fontsize=0.9 * fontsize,
            fontweight="bold",
        )
    if best is not None:
        ax.add_patch(
            Rectangle(
                (x0 + best[1], y0 + best[0]), 1, 1, fill=False, edgecolor="black", linewidth=2.5, gid="best", zorder=5
            )
        )
    for i, j in zip(*np.nonzero(tied)):
        ax.add_patch(
            Rectangle(
                (x0 + j, y0 + i),
                1,
                1,
                fill=False,
                edgecolor="black",
                linewidth=1.5,
                linestyle="--",
                gid="tie",
                zorder=5,
            )
        )
    return mesh


def heatmap(
    df: pd.DataFrame,
    x: str,
    y: str,
    metric: str,
    ax: Optional[Axes] = None,
    title: Optional[str] = None,
    xs: Optional[list] = None,
    ys: Optional[list] = None,
    vmin: Optional[float] = None,
    vmax: Optional[float] = None,
    cbar: bool = True,
    note_aggregation: bool = True,
    table: Optional[pd.DataFrame] = None,
) -> Axes:
    """Draw one heatmap of `metric` over y x x on `ax`; status cells labelled, the best cell starred.

    `table` is `cells(df, x, y, metric)` when the caller has it already.
    """
    m = metric_of(metric, df)
    table = cells(df, x, y, metric) if table is None else table
    xs = axis_values(df, x) if xs is None else xs
    ys = axis_values(df, y) if ys is None else ys
    if ax is None:
        ax = new_figure((0.85 * len(xs) + 2.6, 0.45 * len(ys) + 2.0)).subplots()
    mesh = draw_cells(ax, table, xs, ys, m, vmin, vmax)
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
