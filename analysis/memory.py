"""Memory checks of a sweep: each prediction against the measurement, and two measurements side by side.

The measured peak (`peak_mem_bytes`) is what `peak_mem_source` names: on CPU the live tensor bytes
under torch's memory tracker (`mem_tracker`), on CUDA the allocator's `max_memory_allocated`. The
analytic prediction is a formula, so its error against either is a check. The traced prediction
runs the model under the same tracker on fake tensors: against the CPU tracker it is the same
instrument twice, so it shows that the trace reproduces the tracker, never an accuracy. The
independent measure on CPU is the OS's: each rank's peak resident memory growth over its baseline
after imports (`peak_rss_growth_bytes`, the largest rank's). Points predicted not to fit that ran
anyway as a sample (`pred_sampled`) count the pre-screen's false positives.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd
from matplotlib.figure import Figure

from analysis.figures import new_figure, themed
from analysis.heatmaps import EMULATED_OOM_LABEL
from scaling.core.enums import Status
from scaling.core.units import memory_unit
from scaling.predictor.analytic import CALIBRATION_MODELS

MEASUREMENTS = {
    "mem_tracker": "live tensor bytes under torch's memory tracker (MemTracker / FSDPMemTracker) over one "
    "untimed step: torch's own count of its tensors' sizes",
    "cuda_max_memory_allocated": "torch.cuda.max_memory_allocated over the training steps: the CUDA caching "
    "allocator's bytes handed to tensors",
}
"""What the measured peak is, by `metrics.peak_mem_source`."""
SAME_INSTRUMENT = "mem_tracker"
"""The measurement the traced prediction reproduces by construction (the same tracker, on fake tensors)."""


def relative_error(predicted: pd.Series, measured: pd.Series) -> tuple[float, float]:
    """(median, largest) of |predicted - measured| / measured."""
    rel = ((predicted.astype(float) - measured.astype(float)) / measured.astype(float)).abs()
    return float(rel.median()), float(rel.max())


def _measured(ok: pd.DataFrame) -> str:
    parts = []
    for source, group in ok.groupby(ok["peak_mem_source"].fillna("unrecorded"), sort=True):
        what = MEASUREMENTS.get(source, "its source is not recorded")
        parts.append(f"{what} ({len(group)} points)")
    return "Measured peak memory per rank (the largest rank's): " + "; ".join(parts) + "."


def _traced(ok: pd.DataFrame) -> list[str]:
    traced = ok[ok["pred_traced_peak_mem_bytes"].notna()]
    same = traced["peak_mem_source"] == SAME_INSTRUMENT
    out = []
    if same.any():
        median, largest = relative_error(
            traced.loc[same, "pred_traced_peak_mem_bytes"], traced.loc[same, "peak_mem_bytes"]
        )
        out.append(
            f"Traced prediction vs the tracker on the {int(same.sum())} points the pre-screen traced: the trace "
            "runs the same model under the same tracker on fake tensors, so this compares the tracker with "
            f"itself and is not an accuracy figure: the trace reproduces the tracker to within {median:.1%} "
            f"(largest {largest:.1%})."
        )
    if (~same).any():
        median, largest = relative_error(
            traced.loc[~same, "pred_traced_peak_mem_bytes"], traced.loc[~same, "peak_mem_bytes"]
        )
        out.append(
            f"Traced prediction vs measured on {int((~same).sum())} traced points: median relative error "
            f"{median:.1%} (largest {largest:.1%})."
        )
    return out


def _rss(ok: pd.DataFrame) -> list[str]:
    both = ok[ok["peak_rss_growth_bytes"].notna() & (ok["peak_mem_bytes"] > 0)]
    if both.empty:
        return []
    ratio = both["peak_rss_growth_bytes"].astype(float) / both["peak_mem_bytes"].astype(float)
    return [
        f"Independent measure, from the OS: each rank's peak resident memory growth over its baseline after "
        f"imports (the largest rank's) is {ratio.median():.2f}× the tracked peak (median over {len(both)} points; "
        f"{ratio.min():.2f}× to {ratio.max():.2f}×). Resident memory holds more than live tensors (the "
        "allocator's free blocks, communication buffers, the interpreter), so the two are two instruments "
        "side by side, not a prediction and its check."
    ]


def _sampled(df: pd.DataFrame) -> list[str]:
    sampled = df[df["pred_sampled"].eq(True)]
    if sampled.empty:
        if (df["status"] == Status.PREDICTED_OOM).any():
            return [
                "No point predicted not to fit was run as a sample, so the pre-screen's false positives are unknown."
            ]
        return []
    status = sampled["status"].astype(str)
    n_oom, n_ok = int((status == Status.OOM).sum()), int((status == Status.OK).sum())
    other = len(sampled) - n_oom - n_ok
    return [
        f"{len(sampled)} points predicted not to fit were run anyway as a sample: {n_oom} really ran out of "
        f"memory, {n_ok} ran ok (false positives of the pre-screen)"
        + (f", {other} ended otherwise" if other else "")
        + "."
    ]


def _emulated(df: pd.DataFrame) -> list[str]:
    if not ((df["status"] == Status.OOM) & (df["memory_capacity"] == "emulated")).any():
        return []
    return [
        f"On CPU the capacity is emulated (hardware.memory_gb on the tracked tensor bytes): an OOM there is an "
        f"{EMULATED_OOM_LABEL}, not an out-of-memory the machine measured."
    ]


def memory_paragraphs(df: pd.DataFrame) -> list[str]:
    """The memory section in words: what is measured, each prediction against it, RSS, the sample, emulation."""
    ok = df[(df["status"] == Status.OK) & df["peak_mem_bytes"].notna()]
    words = [_measured(ok)] if len(ok) else []
    analytic = ok[ok["pred_analytic_peak_mem_bytes"].notna()]
    if len(analytic):
        median, largest = relative_error(analytic["pred_analytic_peak_mem_bytes"], analytic["peak_mem_bytes"])
        in_sample = int(analytic["model"].astype(str).isin(CALIBRATION_MODELS).sum())
        words.append(
            f"Analytic prediction vs measured: median relative error {median:.1%} (largest {largest:.1%}) "
            f"over {len(analytic)} ok points"
            + (
                f"; {in_sample} of them are of {' and '.join(CALIBRATION_MODELS)}, whose traced steps its "
                "activation coefficients were read off, so there the agreement is in-sample "
                "(benchmarks/bench_predictor.py reports held-out shapes apart)"
                if in_sample
                else ""
            )
            + "."
        )
    return words + _traced(ok) + _rss(ok) + _sampled(df) + _emulated(df)


def has_memory_checks(df: pd.DataFrame) -> bool:
    """Whether a sweep has anything for the memory section: an ok point with a prediction or an RSS figure,
    or a sampled predicted-OOM point."""
    ok = (df["status"] == Status.OK) & df["peak_mem_bytes"].notna()
    measured_next_to = (
        df[["pred_analytic_peak_mem_bytes", "pred_traced_peak_mem_bytes", "peak_rss_growth_bytes"]].notna().any(axis=1)
    )
    return bool((ok & measured_next_to).any() or df["pred_sampled"].eq(True).any())


@themed
def memory_figure(df: pd.DataFrame) -> Optional[Figure]:
    """Each prediction vs the measured peak (left) and, where recorded, RSS growth vs the tracked peak (right)."""
    ok = df[(df["status"] == Status.OK) & df["peak_mem_bytes"].notna()]
    series = [
        (column, label, marker)
        for column, label, marker in (
            ("pred_analytic_peak_mem_bytes", "analytic", "o"),
            ("pred_traced_peak_mem_bytes", "traced", "x"),
        )
        if ok[column].notna().any()
    ]
    rss = ok[ok["peak_rss_growth_bytes"].notna()]
    if not series and rss.empty:
        return None
    panels = int(bool(series)) + int(not rss.empty)
    fig = new_figure((6.5 * panels, 5.5))
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    measured_name = (
        "tracked peak (tensor bytes)" if set(ok["peak_mem_source"].dropna()) == {SAME_INSTRUMENT} else "measured peak"
    )
    if series:
        ax = axes.pop(0)
        pairs = [
            (ok.loc[ok[c].notna(), c], ok.loc[ok[c].notna(), "peak_mem_bytes"], label, marker)
            for c, label, marker in series
        ]
        _diagonal_scatter(ax, pairs, "predicted peak", measured_name)
        ax.set_title(f"predictions vs {measured_name}, {len(ok)} ok points", fontsize=10)
    if not rss.empty:
        ax = axes.pop(0)
        _diagonal_scatter(
            ax, [(rss["peak_mem_bytes"], rss["peak_rss_growth_bytes"], "rss", "o")], measured_name, "peak RSS growth"
        )
        ax.set_title("two instruments: OS resident memory vs the tracker", fontsize=10)
    fig.tight_layout()
    return fig


def _diagonal_scatter(ax, pairs: list[tuple[pd.Series, pd.Series, str, str]], x_name: str, y_name: str) -> None:
    """Scatter each (x, y, label, marker) in one unit with the x = y line."""
    largest = max(float(max(x.max(), y.max())) for x, y, _, _ in pairs)
    unit, size = memory_unit(largest)
    for x, y, label, marker in pairs:
        ax.scatter(x.astype(float) / size, y.astype(float) / size, marker=marker, alpha=0.8, label=label, gid=label)
    hi = 1.05 * largest / size
    ax.plot([0, hi], [0, hi], color="grey", linestyle="--", linewidth=1, label=f"{x_name} = {y_name}")
    ax.set_xlabel(f"{x_name} per rank ({unit})")
    ax.set_ylabel(f"{y_name} per rank ({unit})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
