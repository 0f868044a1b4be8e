"""The report's DP extrapolation: a sweep's scaling table turned into workloads and measured points, the
network sources for its hardware, every source's extrapolation of its fastest configurations
(scaling.perf.extrapolation), and their table, words and figure.

The pieces, bottom to top: scaling.perf.step_model (a step at dp=n), scaling.perf.dp_fit (its fit to the measured
points under each source), scaling.perf.extrapolation (the extrapolation with its bootstrap band and knee range).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.dp_scaling import dp_axis
from analysis.figures import PALETTE, new_figure, themed
from scaling.core import model_group
from scaling.model.family import family_of
from scaling.model.shape import ModelShape
from scaling.perf.extrapolation import BAND, MAX_DP, Extrapolation, extrapolate
from scaling.perf.knee import DEFAULT_THRESHOLD
from scaling.perf.network import TIERS, NetworkEstimate
from scaling.perf.network_figures import (
    N_DRAWS,
    network_sources,
)
from scaling.perf.step_model import LAST, Point, Workload, host_blocking_backend

if TYPE_CHECKING:
    from analysis.sweep_data import SweepData

EXTRAPOLATED_CONFIGS = 3
"""Configurations the report extrapolates: the fastest measured at two or more dp."""


SHAPE = ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size")
"""The record's `config.model` columns that decide the decoder's parameter tensors."""


def has_shape(group: pd.DataFrame) -> bool:
    """Whether every record of a group says its model's parameter tensors: the built-in family's config.model
    columns, or a model the user brings's derived.model.param_tensors."""
    builtin = all(k in group and group[k].notna().all() for k in SHAPE)
    return builtin or ("param_tensors" in group and group["param_tensors"].map(_counted).all())


def _counted(value: object) -> bool:
    return isinstance(value, Mapping) and len(value.get("rows", ())) > 0


def model_of(row: pd.Series) -> ModelShape:
    """The shape of the model a record trained: a model the user brings's from its derived.model.param_tensors, the
    built-in decoder's as its family gives it from the config.model columns (a record without `tie_embeddings` has it
    read from derived.n_params, which counts a tied output projection once)."""
    if _counted(row.get("param_tensors")):
        return ModelShape.from_record(str(row["model"]), row["param_tensors"], int(row["n_blocks"]))
    columns = {"name": str(row["model"]), **{k: int(row[k]) for k in SHAPE}}
    seq_len = int(row["seq_len"])
    recorded = _setting(row, "tie_embeddings", None)
    if recorded is not None:
        return family_of(model_group.model_of({**columns, "tie_embeddings": bool(recorded)})).shape(seq_len)
    tied = family_of(model_group.model_of({**columns, "tie_embeddings": True})).shape(seq_len)
    if sum(t.numel for t in tied.tensors) == int(row["n_params"]):
        return tied
    return family_of(model_group.model_of({**columns, "tie_embeddings": False})).shape(seq_len)


def _setting(row: pd.Series, key: str, default: object) -> object:
    """A config column of the record, or `default` where the record predates the setting."""
    value = row.get(key)
    return default if value is None or (isinstance(value, float) and np.isnan(value)) else value


def _shard(value: object) -> Optional[int]:
    """A record's dp_shard (None: full sharding, as every record made before hybrid sharding)."""
    return None if value is None or pd.isna(value) else int(value)  # type: ignore[call-overload]


def workload_and_points(group: pd.DataFrame) -> tuple[Workload, list[Point]]:
    """One configuration of `dp_scaling.scaling_table` as a workload and its measured points."""
    group = group.sort_values("dp")
    last = group.iloc[-1]
    fixed_batch = group["gbs"].nunique(dropna=False) == 1
    w = Workload(
        int(last["zero_stage"]),
        model_of(last),
        str(last["precision"]),
        int(last["mbs"]),
        int(last["seq_len"]),
        int(last["gbs"]) if fixed_batch else None,
        1 if fixed_batch else int(last["grad_acc"]),
        # records from before the setting existed reduce-scattered on the last micro-step only
        str(_setting(last, "fsdp_grad_reduce", LAST)),
        str(_setting(last, "recompute", "none")),
        # records from before train.grad_clip existed were measured without clipping
        float(_setting(last, "grad_clip", 0.0)),  # type: ignore[arg-type]
        float(_setting(last, "bucket_mb", 25.0)),
        _shard(_setting(last, "dp_shard", None)),
        int(_setting(last, "tp", 1)),  # type: ignore[call-overload]  # a dp rank's GPUs: its tokens per GPU
        recompute_every=int(_setting(last, "recompute_every", 1)),  # type: ignore[arg-type]
        host_blocking=host_blocking_backend(str(_setting(last, "backend", ""))),
    )  # type: ignore[arg-type]
    points = []
    for _, row in group.iterrows():
        times = row.get("step_times_s")
        times = (
            tuple(float(x) for x in times)
            if isinstance(times, (list, tuple, np.ndarray)) and len(times)
            else (float(row["step_time_s"]),)
        )
        points.append(Point(int(row["dp"]), int(row["grad_acc"]), times))
    return w, points


def sweep_extrapolations(
    data: SweepData,
    table: pd.DataFrame,
    threshold: float = DEFAULT_THRESHOLD,
    n_configs: int = EXTRAPOLATED_CONFIGS,
    max_dp: int = MAX_DP,
    n_draws: int = N_DRAWS,
) -> tuple[dict[str, list[Extrapolation]], list[str]]:
    """Every source's extrapolation of the fastest configurations of a `dp_scaling.scaling_table` measured at two
    or more dp; and the notes of `sources`, and of records whose model disagrees with their parameter count."""
    measured = table.groupby("config")["dp"].nunique()
    fastest = (
        table[table["config"].isin(measured[measured > 1].index)]
        .groupby("config")["tokens_per_s_per_gpu"]
        .max()
        .nlargest(n_configs)
        .index
    )
    found: dict[str, list[Extrapolation]] = {}
    notes: list[str] = []
    cache: dict[tuple[str, Optional[int]], tuple[list[Optional[NetworkEstimate]], list[str]]] = {}
    for config in fastest:
        group = table[table["config"] == config]
        if not has_shape(group):
            notes.append(
                f"{config}: its records name no parameter tensors (neither config.model {', '.join(SHAPE)} nor a "
                "counted model's derived.model.param_tensors): its throughput is not extrapolated past the measured dp"
            )
            continue
        pp = int(_setting(group.iloc[-1], "pp", 1))  # type: ignore[call-overload]
        if pp > 1:
            notes.append(
                f"{config}: pipeline stages (pp {pp}): the step model that extrapolates past the measured dp has no "
                "pipeline bubble or stage sends: its throughput is not extrapolated (the measured curve stands)"
            )
            continue
        hardware = str(group["hardware"].iloc[0])
        dpn = group["devices_per_node"].iloc[0] if "devices_per_node" in group else None
        dpn = None if pd.isna(dpn) else int(dpn)
        if (hardware, dpn) not in cache:
            cache[hardware, dpn] = network_sources(
                data.profile, data.profile_problem, data.sweep_dir, hardware, dpn, n_draws
            )
            notes += [n for n in cache[hardware, dpn][1] if n not in notes]
        w, points = workload_and_points(group)
        recorded = int(group["n_params"].iloc[-1])
        if w.n_params != recorded:  # not a record the engine wrote: it derives n_params from config.model
            notes.append(
                f"{config}: its records' derived.n_params={recorded:,} is not the parameter count of their "
                f"config.model ({w.n_params:,}); the step model counts the tensors of config.model"
            )
        found[config] = [
            extrapolate(config, w, points, dpn, src, threshold, max_dp, n_draws) for src in cache[hardware, dpn][0]
        ]
    return found, notes


LETTERS = {"sweep": "(a)", "profile": "(b)", "published": "(c)"}
SOURCE_WORDS = {"sweep": "the sweep alone", "profile": "measured network", "published": "published network"}
PREFERENCE = ("sweep", "published", "profile")
"""The sources from least to best informed: the summary states the knee under the best the sweep has."""


def _interval(values: tuple[float, float, float], scale: float, unit: str) -> str:
    nominal, lo, hi = (v / scale for v in values)
    if not np.isfinite(nominal):
        return "no cost fitted"
    unit = f" {unit}" if unit else ""
    band = f" [{lo:.3g}, {hi:.3g}]" if hi - lo > 1e-3 * abs(nominal) else ""
    if band and not lo <= nominal <= hi:  # fixed in the curve (not identified), drawn from its prior in the band
        return f"{nominal:.3g}{unit} in the curve, drawn from{band} in the band"
    return f"{nominal:.3g}{unit}{band}"


def summary_table(found: dict[str, list[Extrapolation]]) -> pd.DataFrame:
    """One row per (configuration, source): reach, knee, its band, and the parameters with their intervals."""
    rows = []
    for results in found.values():
        for r in results:
            band = "–".join(f"{d}" if d is not None else f">{r.last_dp}" for d in r.next_dp_band)
            row = {
                "configuration": r.config,
                "source": f"{LETTERS[r.kind]} {r.kind}",
                "measured dp": ", ".join(map(str, r.measured)),
                "extrapolated to": r.last_dp,
                f"first dp < {r.threshold:.0%}": r.next_dp if r.next_dp is not None else f">{r.last_dp}",
                "its band": band,
                "compute per micro-step": _interval(r.params["compute_s"], 1e-3, "ms"),
                "optimizer per 10⁹ parameters updated": _interval(r.params["optimizer_s_per_param"], 1e-12, "ms"),
                "overlap": _interval(r.params["overlap"], 1, ""),
            }
            for tier in TIERS:
                if f"alpha_s {tier}" in r.params:
                    row[f"α {tier}"] = _interval(r.params[f"alpha_s {tier}"], 1e-6, "µs")
                    row[f"β {tier}"] = _interval(r.params[f"beta_bytes_per_s {tier}"], 1e9, "GB/s")
                else:
                    row[f"α {tier}"] = row[f"β {tier}"] = "unknown"
            row["misfit at measured dp"] = f"{r.misfit:.1%}"
            rows.append(row)
    return pd.DataFrame(rows)


def best_informed(results: Sequence[Extrapolation]) -> Extrapolation:
    """The result of the best-informed source: a measured profile, else published figures, else the sweep alone."""
    return max(results, key=lambda x: PREFERENCE.index(x.kind))


def curve_table(found: dict[str, list[Extrapolation]]) -> pd.DataFrame:
    """What the extrapolation plots draw, as figures: per configuration, under its best-informed source, tokens/s
    per GPU with its band and the efficiency (against the smallest measured dp) at each power of two from the
    largest measured dp to the last dp the curve reaches; a measured figure beside its dp where there is one."""
    rows = []
    for config, results in found.items():
        r = best_informed(results)
        for dp, v, lo, hi, eff in zip(r.dps, r.tokens_per_s_per_gpu, r.low, r.high, r.efficiency):
            if dp < r.max_measured_dp or dp & (dp - 1):
                continue
            row = {
                "configuration": config,
                "source": f"{LETTERS[r.kind]} {SOURCE_WORDS[r.kind]}",
                "dp": dp,
                "tokens/s per GPU": f"{v:,.0f}",
                "band": f"[{lo:,.0f}, {hi:,.0f}]",
                "efficiency": f"{eff:.0%}",
                "measured": f"{r.measured[dp]:,.0f}" if dp in r.measured else "",
            }
            if not r.within(dp):
                row.update({"tokens/s per GPU": "beyond the horizon", "band": r.horizon_reason, "efficiency": ""})
            rows.append(row)
            if not r.within(dp):
                break
    columns = ["configuration", "source", "dp", "tokens/s per GPU", "band", "efficiency", "measured"]
    return pd.DataFrame(rows, columns=columns)


def summary_words(found: dict[str, list[Extrapolation]]) -> list[str]:
    """Per configuration, one sentence: where DP stops paying off under its best-informed source (a measured
    profile, else published figures, else the sweep alone), with its band."""
    out = []
    for config, results in found.items():
        r = best_informed(results)
        out.append(f"{config} ({LETTERS[r.kind]} {r.kind}): {r.knee_sentence()}.")
    if out:
        out.append("How each source was fitted and what it could identify is folded below.")
    return out


def report_text(found: dict[str, list[Extrapolation]]) -> list[str]:
    """The knee of each configuration under each source in words, with what the source could identify."""
    out = []
    for config, results in found.items():
        out.append(f"{config}: {results[0].batch}.")
        for r in results:
            text = f"{LETTERS[r.kind]} {r.source}: {r.knee_sentence()}."
            if r.notes:
                text += " " + " ".join(n[0].upper() + n[1:] + "." for n in r.notes)
            out.append(text)
    return out


@themed
def plot(results: Sequence[Extrapolation]) -> Figure:
    """One configuration's tokens/s per GPU vs dp: measured points, each source's nominal curve, band and knee."""
    fig = new_figure((8.5, 5.2))
    ax = fig.subplots()
    colors = {"sweep": PALETTE[0], "profile": PALETTE[2], "published": PALETTE[1]}
    for r in results:
        color = colors[r.kind]
        k = sum(1 for d in r.dps if r.within(d))  # the curve stops at the horizon
        ax.fill_between(r.dps[:k], r.low[:k], r.high[:k], color=color, alpha=0.18, linewidth=0, gid=f"band:{r.kind}")
        ax.plot(
            r.dps[:k], r.tokens_per_s_per_gpu[:k], color=color, linestyle="--", label=f"{LETTERS[r.kind]} {r.source}"
        )
        at = r.dps.index(r.knee_dp)
        ax.plot(
            [r.knee_dp],
            [r.tokens_per_s_per_gpu[at]],
            marker="*",
            markersize=15,
            color=color,
            markeredgecolor="black",
            linestyle="none",
            gid=f"knee:{r.kind}",
        )
    measured = results[0].measured
    ax.plot(
        list(measured),
        list(measured.values()),
        marker="o",
        color="black",
        linestyle="none",
        label="measured",
        gid="measured",
    )
    ax.axvspan(min(measured), max(measured), color="grey", alpha=0.08, linewidth=0)
    dp_axis(ax, pd.Series(sorted({d for r in results for d in r.dps})))
    ax.set_ylabel("tokens/s per GPU")
    ax.legend(fontsize=7, loc="best")
    thr = f"{results[0].threshold:.0%}"
    ax.set_title(
        f"{results[0].config}: measured (grey span) and extrapolated up to the horizon; bands = "
        f"{BAND[0]:g}-{BAND[1]:g}% of the draws\n(fit and model form), ★ = last dp with efficiency ≥ {thr}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
