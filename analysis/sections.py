"""What the sweep report says, section by section: status counts, the top configurations (ties within noise of
the best marked), the noise, the heatmaps, DP scaling and its extrapolation, the memory checks, the failures, the
device time and the records left out. `analysis.report_writer` writes them as Markdown, HTML and W&B."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pandas as pd
from matplotlib.figure import Figure

from analysis import dp_extrapolation, dp_scaling, facets, heatmaps, memory
from analysis.collect import STATUS_ORDER
from analysis.figures import FigureSpec
from analysis.sweep_data import SweepData
from analysis.usable import LeftOut
from scaling.core.enums import Status
from scaling.core.noise import NOISE_BAND_KEY, within_noise
from scaling.core.units import format_bytes
from scaling.store import device_time

FORMATS: dict[str, Callable[[Any], str]] = {
    "tokens_per_s_per_gpu": "{:,.0f}".format,
    "mfu": "{:.1%}".format,
    "hfu": "{:.1%}".format,
    "peak_mem_bytes": format_bytes,
    NOISE_BAND_KEY: "±{:.1%}".format,
}

KNEES_IN_WORDS = 8
"""Knees stated in sentences (and drawn): those of the fastest configurations; the table lists all."""


TOP_LEAD = ("model", "seq_len", "mbs", "grad_acc", "dp", "zero_stage", "precision", "recompute")
"""The top table's first columns: the axes every reader looks for."""
TOP_FIGURES = ("tokens_per_s_per_gpu", NOISE_BAND_KEY, "repeats_ok", "vs best", "mfu", "peak_mem_bytes")
TOP_HEADERS = {
    "zero_stage": "ZeRO",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
    NOISE_BAND_KEY: "noise band",
    "repeats_ok": "launches",
    "peak_mem_bytes": "peak memory",
}
"""The top table's headers as the report prints them (short enough that the table fits a 1400-pixel window)."""


def top_columns(ok: pd.DataFrame) -> list[str]:
    """The top table's columns: TOP_LEAD, then every other configuration axis (dp_scaling.GROUP_KEYS, from the
    schema) that tells these points apart, then the figures; HFU beside MFU where a point recomputes matmuls (full
    recomputation: its hardware FLOPs exceed its model FLOPs)."""
    named = dp_scaling.naming_keys(ok, [k for k in dp_scaling.GROUP_KEYS if k in ok.columns])
    figures = list(TOP_FIGURES)
    if "hfu" in ok.columns and "mfu" in ok.columns and bool((ok["hfu"] > ok["mfu"]).any()):
        figures.insert(figures.index("mfu") + 1, "hfu")
    return [*TOP_LEAD, *(k for k in named if k not in TOP_LEAD), *figures]


@dataclass
class Section:
    """One part of the report: a heading, paragraphs, tables and figures (name -> Figure, or how to draw it), and
    what a reader opens only when they want it (folded under `details_title`: how it was found, the caveats)."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[pd.DataFrame] = field(default_factory=list)
    figures: dict[str, Figure | FigureSpec] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    detail_tables: list[pd.DataFrame] = field(default_factory=list)
    details_title: str = "Details"
    code: list[str] = field(default_factory=list)
    """Command lines, shown as a code block after the paragraphs."""


def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    out = df.astype(object).where(df.notna(), "")
    for column, fmt in FORMATS.items():
        if column in out:
            out[column] = [fmt(v) if v != "" else "" for v in out[column]]
    return out


def top_configurations(df: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The n ok points with the most tokens/s per GPU; `vs best` marks the best and the ties within its noise."""
    every_ok = df[df["status"] == Status.OK]
    ok = every_ok.nlargest(n, "tokens_per_s_per_gpu")
    if len(ok):
        band = ok[NOISE_BAND_KEY].fillna(0.0)
        best, best_band = ok["tokens_per_s_per_gpu"].iloc[0], band.iloc[0]
        tied = [within_noise(v, b, best, best_band) for v, b in zip(ok["tokens_per_s_per_gpu"], band)]
        ok = ok.assign(
            **{
                "vs best": [
                    "★ best" if i == 0 else f"{heatmaps.TIE} within noise" if t else "" for i, t in enumerate(tied)
                ]
            }
        )
    return ok.reindex(columns=top_columns(every_ok)).reset_index(drop=True)


def noise_paragraphs(df: pd.DataFrame) -> list[str]:
    """How noisy the sweep's throughput figures are, in the report's one statistic."""
    ok = df[(df["status"] == Status.OK) & df[NOISE_BAND_KEY].notna()]
    if ok.empty:
        return ["No ok point states its noise band (records written before bands were kept)."]
    words = [
        "Every throughput figure is a median with its noise band: the relative half-range (max − min) / "
        "(2 · median) of a launch's timed steps (within a run) and of a point's launches' tokens/s (across "
        "repeats, launch.repeats), the larger of the two. Two figures tie when either lies within the other's "
        f"band: the report does not rank them. Over {len(ok)} ok points the band is ±{ok[NOISE_BAND_KEY].median():.1%} at the "
        f"median (largest ±{ok[NOISE_BAND_KEY].max():.1%}); within a run ±{ok['step_time_spread_frac'].median():.1%}."
    ]
    repeated = ok[ok["repeats_ok"].fillna(1) > 1]
    if len(repeated):
        words.append(
            f"{len(repeated)} points were launched {int(repeated['repeats_ok'].min())} to "
            f"{int(repeated['repeats_ok'].max())} times: their repeat-to-repeat spread is "
            f"±{repeated['repeat_spread_frac'].median():.1%} at the median (largest "
            f"±{repeated['repeat_spread_frac'].max():.1%})."
        )
    else:
        words.append(
            "No point was launched more than once: the bands are within-run spreads, which leave out the "
            "launch-to-launch noise (often larger); launch.repeats=k measures it."
        )
    return words


def _mfu_words(df: pd.DataFrame) -> list[str]:
    if not heatmaps.measured_peak(df):
        return []
    ok = df[(df["status"] == Status.OK) & df["peak_flops_source"].isin(["measured", "cache"])]
    when = sorted(ok["peak_flops_measured_at"].dropna().unique())
    span = ""
    if when:
        span = f" (measured {when[0]})" if len(when) == 1 else f" (measured {when[0]} to {when[-1]})"
    return [
        f"MFU of {len(ok)} points is against a measured matmul peak{span}: a square matmul timed on this host at "
        "the run's dtype and threads per device, not a datasheet peak, so it is not comparable with a GPU's MFU."
    ]


def knee_table(found: list[dp_scaling.Knee]) -> pd.DataFrame:
    """Every configuration's knee: where DP stops paying off (the first dp below the threshold, the recipe's
    definition), its efficiency, the last dp that pays and the dps the knee may lie at within noise."""
    rows = []
    for k in found:
        eff = dict(zip(k.dps, k.efficiency))
        rows.append(
            {
                "configuration": k.config,
                "dp measured": ", ".join(map(str, k.dps)),
                "stops paying off at dp": k.next_dp if k.next_dp is not None else "none below threshold",
                "efficiency there": f"{eff[k.next_dp]:.0%}" if k.next_dp is not None else "",
                "last dp that pays": k.knee_dp,
                "efficiency at it": f"{eff[k.knee_dp]:.0%}",
                "within noise": ", ".join(map(str, k.within_noise)),
            }
        )
    return pd.DataFrame(rows)


def dp_sections(data: SweepData, threshold: float) -> list[Section]:
    """The DP knees in words, their table and curve; the extrapolation beyond the measured dp."""
    df = data.df
    found = dp_scaling.knees(df, threshold)
    if not found:
        return [Section("Data-parallel scaling", ["No configuration was measured ok at two or more dp."])]
    table = dp_scaling.scaling_table(df)
    fastest = table.groupby("config")["tokens_per_s_per_gpu"].max().nlargest(KNEES_IN_WORDS).index
    words = [k.sentence[0].upper() + k.sentence[1:] + "." for k in found if k.config in fastest]
    if len(found) > len(words):
        words.append(f"Those are the {len(words)} fastest configurations; the table has the knees of all {len(found)}.")
    shared = table[table["oversubscribed"].eq(True) & table["config"].isin({k.config for k in found})]
    if len(shared):
        where = "; ".join(
            f"{config} at dp={', '.join(str(int(d)) for d in group['dp'])}"
            for config, group in shared.groupby("config", sort=False)
        )
        words.append(
            f"Oversubscribed (hardware.oversubscribe=true, ranks sharing cores): {where}. There the curve "
            "measures the sharing of cores as well as communication."
        )
    sections = [
        Section(
            "Data-parallel scaling",
            words,
            [knee_table(found)],
            {"dp_scaling": dp_scaling.plot_dp_scaling(df, threshold, max_configs=KNEES_IN_WORDS)},
        )
    ]
    sections.append(extrapolation_section(data, table, threshold))
    return sections


def extrapolation_section(data: SweepData, table: pd.DataFrame, threshold: float) -> Section:
    """Beyond the measured dp: per configuration, where DP stops paying off under the best-informed parameter
    source, in a sentence each; the sources, the parameters and the caveats folded below."""
    found, notes = dp_extrapolation.sweep_extrapolations(data, table, threshold)
    intro = (
        f"The fastest configurations measured at two or more dp (at most {dp_extrapolation.EXTRAPOLATED_CONFIGS}), "
        "extrapolated at their global batch "
        "with the step model of docs/dp-extrapolation.md (grad_acc × compute per micro-step + the exposed communication of "
        "their ZeRO stage, α-β per network tier, an overlap fraction), under each source of parameters: "
        "(a) fitted to this sweep's DP curve alone, (b) the network profile measured by `scaling collectives`, "
        "(c) the hardware's published network figures. Compute per micro-step (and the overlap, for b and c) "
        "is always fitted to the measured points. Bands span the 2.5th-97.5th percentile of bootstrap draws "
        "(95%)."
    )
    curves = dp_extrapolation.curve_table(found)
    return Section(
        "DP extrapolation beyond the measured dp",
        dp_extrapolation.summary_words(found),
        [curves] if len(curves) else [],
        figures={f"dp_extrapolation_{i}": dp_extrapolation.plot(results) for i, results in enumerate(found.values())},
        details=[intro, *notes, *dp_extrapolation.report_text(found)],
        detail_tables=[dp_extrapolation.summary_table(found)],
        details_title="How: the sources, each one's knee and parameters, the caveats",
    )


def device_time_section(data: SweepData) -> Optional[Section]:
    """Device-hours the records held and their shares (timed steps, warm-up, start-up, launches not ok); for a
    search, the device-hours spent until its best point was recorded. None when no record ran torchrun."""
    df = data.df
    columns = ["torchrun_wall_s", "device_s", *device_time.SPLIT]
    spent = device_time.total(df[columns].astype(object).where(df[columns].notna(), None).to_dict("records"))
    if not spent.records:
        return (
            Section("Device time", [f"{spent.unknown} points were recorded before device time was kept."])
            if spent.unknown
            else None
        )
    words = [
        f"The launches of {spent.records} points held {device_time.device_hours(spent.device_s)} (torchrun's wall "
        f"time × the devices of each launch): {spent.shares()}. Start-up covers the interpreter and torch "
        "imports, the process group, the model build and teardown; launches not ok ran out of memory, timed out "
        "or failed."
    ]
    if spent.unknown:
        words.append(f"{spent.unknown} points recorded before device time was kept are not counted.")
    best = data.search_best_key
    if best is not None and best in set(df["job_key"]):
        ordered = df.sort_values(["started_at", "launched_at"], na_position="last", kind="stable")
        until = ordered["device_s"].iloc[: list(ordered["job_key"]).index(best) + 1].sum()
        words.append(
            f"The search recorded its best point ({best}) after {device_time.device_hours(until)}, "
            f"{spent.frac(until) or 0:.0%} of the device time held (records in the order they started)."
        )
    return Section("Device time", words)


def build_sections(data: SweepData, threshold: float) -> list[Section]:
    """Everything the report shows, in order: small figures drawn, the heatmaps still to be drawn."""
    df = data.df
    counts = df["status"].value_counts().reindex(STATUS_ORDER, fill_value=0)
    sections = [Section("Status counts", tables=[counts.rename_axis("status").reset_index(name="records")])]
    if data.left_out:
        sections.append(left_out_section(data.left_out))
    if df.empty:
        sections[-1].paragraphs.append("No records yet.")
        return sections
    top = top_configurations(df)
    sections.append(
        Section(
            "Top configurations",
            [f"By tokens/s per GPU, ok points only; ★ best and {heatmaps.TIE} within its noise band (a tie)."]
            + _mfu_words(df)
            if len(top)
            else ["No point finished ok."],
            tables=[_fmt(top).rename(columns=TOP_HEADERS)] if len(top) else [],
        )
    )
    if len(top):
        sections.append(Section("Noise", noise_paragraphs(df)))
    layout = facets.default_layout(df)
    oom = (
        f"OOM = {heatmaps.EMULATED_OOM_LABEL}: the tracked tensor bytes passed hardware.memory_gb"
        if heatmaps.emulated_oom(df)
        else "OOM = measured out of memory"
    )
    sections.append(
        Section(
            "Heatmaps",
            [
                f"Axes: {layout['y']} × {layout['x']}"
                + (
                    f", faceted by {' × '.join(k for k in (layout['row'], layout['col']) if k)}"
                    if layout["row"]
                    else ""
                )
                + f". {oom}, pred OOM = skipped by the memory predictor, blank = never run, ★ = best cell of its facet, "
                f"{heatmaps.TIE} = within noise of it (a tie), {heatmaps.OVERSUBSCRIBED} = oversubscribed."
            ],
            figures=facets.figure_specs(df),
        )
    )
    if df.loc[df["status"] == Status.OK, "dp"].nunique() > 1:
        sections += dp_sections(data, threshold)
    if memory.has_memory_checks(df):
        fig = memory.memory_figure(df)
        sections.append(
            Section(
                "Predicted vs measured memory",
                memory.memory_paragraphs(df),
                figures={"memory_prediction": fig} if fig is not None else {},
            )
        )
    failures = df[df["status"].isin([Status.FAILED, Status.TIMEOUT])]
    if len(failures):
        cols = ["status", "model", "seq_len", "mbs", "grad_acc", "dp", "zero_stage", "error"]
        sections.append(
            Section(
                "Failures",
                [f"{len(failures)} points failed or timed out (first 20 shown)."],
                tables=[_fmt(failures[cols].head(20).reset_index(drop=True))],
            )
        )
    spent = device_time_section(data)
    if spent is not None:
        sections.append(spent)
    return sections


def left_out_section(left_out: list[LeftOut]) -> Section:
    """The records the analysis could not use, each with its job key and why."""
    return Section(
        "Records left out",
        [
            f"{len(left_out)} record(s) in the store could not be used and are left out of every table and figure "
            "(counts included): fix or remove them, or re-run their points."
        ],
        tables=[pd.DataFrame([{"job_key": one.job_key, "why": one.why} for one in left_out])],
    )
