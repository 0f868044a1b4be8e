"""Where data parallelism stops paying off: tokens/s per GPU and efficiency vs dp, and the knee.

A configuration is everything but dp and grad_acc (and the global batch they imply, unless fixed); within one,
efficiency at dp is tokens/s per GPU at dp over tokens/s per GPU at the smallest measured dp.
The knee is the largest dp up to which efficiency stays at or above a threshold (0.8 unless
told), said in a sentence and marked on the curve. When one dp holds several ok records of a
configuration (grad_acc swept too), the best tokens/s per GPU stands for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from analysis.figures import new_figure
from analysis.heatmaps import facet_label
from scaling.record import OK

GROUP_KEYS = ("model", "seq_len", "mbs", "zero_stage", "precision", "recompute", "hardware", "memory_gb",
              "bucket_mb", "fsdp_grad_reduce", "compile", "target_gbs", "target_gbs_tokens")
"""What makes a configuration for DP scaling: the config axes except dp and grad_acc (and the global batch
they give, unless the sweep fixed it: then each fixed batch is its own configuration)."""
ALWAYS_NAMED = ("model", "seq_len", "zero_stage")
DEFAULT_THRESHOLD = 0.8


def scaling_table(df: pd.DataFrame) -> pd.DataFrame:
    """Ok records -> one row per (configuration, dp): best tokens/s per GPU, efficiency vs smallest dp."""
    keys = [k for k in GROUP_KEYS if k in df.columns]
    ok = df[(df["status"] == OK) & df["tokens_per_s_per_gpu"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "dp", "tokens_per_s_per_gpu", "efficiency", "config"])
    best = ok.loc[ok.groupby([*keys, "dp"], dropna=False, observed=True)["tokens_per_s_per_gpu"].idxmax()]
    best = best.sort_values([*keys, "dp"]).reset_index(drop=True)
    base = best.groupby(keys, dropna=False, observed=True)["tokens_per_s_per_gpu"].transform("first")
    best["efficiency"] = best["tokens_per_s_per_gpu"] / base
    named = [k for k in keys if k in ALWAYS_NAMED or best[k].nunique(dropna=True) > 1]
    best["config"] = [", ".join(_describe(k, row[k]) for k in named if pd.notna(row[k]))
                      for _, row in best[named].iterrows()]
    return best


def _describe(key: str, value: Any) -> str:
    if key == "model":
        return str(value)
    return facet_label(key, value)


def find_knee(dps: Sequence[int], efficiency: Sequence[float], threshold: float = DEFAULT_THRESHOLD
              ) -> tuple[int, Optional[int]]:
    """(knee dp, first dp below threshold or None): the knee is the largest dp before efficiency first drops."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold={threshold}: an efficiency threshold lies in (0, 1]")
    if len(dps) != len(efficiency) or not dps:
        raise ValueError(f"dps ({len(dps)}) and efficiency ({len(efficiency)}) must be non-empty and of one length")
    if any(b <= a for a, b in zip(dps, dps[1:])):
        raise ValueError(f"dps={list(dps)} must be strictly increasing")
    knee = dps[0]
    for dp, eff in zip(dps, efficiency):
        if eff < threshold:
            return knee, dp
        knee = dp
    return knee, None


@dataclass(frozen=True)
class Knee:
    """The knee of one configuration's DP curve, and the sentence that states it."""

    config: str
    dps: tuple[int, ...]
    efficiency: tuple[float, ...]
    threshold: float
    knee_dp: int
    next_dp: Optional[int]
    sentence: str = field(default="")


def knee_sentence(config: str, dps: Sequence[int], efficiency: Sequence[float], knee_dp: int,
                  next_dp: Optional[int], threshold: float) -> str:
    """The knee in words, e.g. 'for llama_1b, seq 4096, ZeRO-1: DP stops paying off after dp=8; ...'."""
    eff = dict(zip(dps, efficiency))
    ref = f"relative to dp={dps[0]}"
    if next_dp is None:
        return (f"for {config}: DP keeps paying off up to dp={dps[-1]}, the largest measured; efficiency stays "
                f"≥ {threshold:.0%} ({eff[dps[-1]]:.0%} at dp={dps[-1]}, {ref})")
    return (f"for {config}: DP stops paying off after dp={knee_dp}; efficiency falls from {eff[knee_dp]:.0%} "
            f"(dp={knee_dp}) to {eff[next_dp]:.0%} (dp={next_dp}), {ref}, below the {threshold:.0%} threshold")


def knees(df: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> list[Knee]:
    """The knee of every configuration measured at two or more dp."""
    table = scaling_table(df)
    out = []
    for config, group in table.groupby("config", sort=False):  # table is in numeric key order
        if len(group) < 2:
            continue
        dps = tuple(int(d) for d in group["dp"])
        eff = tuple(float(e) for e in group["efficiency"])
        knee_dp, next_dp = find_knee(dps, eff, threshold)
        out.append(Knee(config, dps, eff, threshold, knee_dp, next_dp,
                        knee_sentence(config, dps, eff, knee_dp, next_dp, threshold)))
    return out


def dp_axis(ax: Axes, dps: pd.Series) -> None:
    """A log-2 dp axis with a plain tick at every dp given."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({int(d) for d in dps}))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("dp")
    ax.grid(True, alpha=0.3)


def plot_dp_scaling(df: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD, max_configs: int = 8) -> Figure:
    """Tokens/s per GPU and efficiency vs dp, one line per configuration, knees starred."""
    table = scaling_table(df)
    found = {k.config: k for k in knees(df, threshold)}
    ranked = (table[table["config"].isin(found)].groupby("config")["tokens_per_s_per_gpu"].max()
              .sort_values(ascending=False))
    shown = list(ranked.index[:max_configs])
    fig = new_figure((13, 5.2))
    ax_tps, ax_eff = fig.subplots(1, 2)
    for config in shown:
        group = table[table["config"] == config]
        knee = found[config]
        (line,) = ax_tps.plot(group["dp"], group["tokens_per_s_per_gpu"], marker="o", label=config)
        ax_eff.plot(group["dp"], group["efficiency"], marker="o", color=line.get_color())
        at = group[group["dp"] == knee.knee_dp]
        ax_eff.plot(at["dp"], at["efficiency"], marker="*", markersize=18, color=line.get_color(),
                    markeredgecolor="black", linestyle="none", gid=f"knee:{config}")
        ax_tps.plot(at["dp"], at["tokens_per_s_per_gpu"], marker="*", markersize=18, color=line.get_color(),
                    markeredgecolor="black", linestyle="none")
    ax_eff.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:.0%}")
    for ax, label in ((ax_tps, "tokens/s per GPU"), (ax_eff, "efficiency vs smallest dp")):
        dp_axis(ax, table.loc[table["config"].isin(shown), "dp"])
        ax.set_ylabel(label)
    ax_eff.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    ax_eff.legend(loc="lower left", fontsize=8)
    if shown:
        ax_tps.legend(loc="best", fontsize=7)
    title = "DP scaling (★ = knee: last dp with efficiency ≥ threshold)"
    if len(found) > len(shown):
        title += f"; the {len(shown)} fastest of {len(found)} configurations"
    if not shown:
        title += ": no configuration measured at two or more dp"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
