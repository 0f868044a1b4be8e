"""Where data parallelism stops paying off: tokens/s per GPU and efficiency vs dp, and the knee.

A configuration is everything but dp and grad_acc (and the global batch they imply, unless fixed); the
CPU device (threads per device, oversubscription) is part of it, so points of different thread counts
never share a curve. Within one, efficiency at dp is tokens/s per GPU at dp over tokens/s per GPU at
the smallest measured dp. The knee is the largest dp up to which efficiency stays at or above a
threshold (0.8 unless told), said in a sentence and marked on the curve. When one dp holds several ok
records of a configuration (grad_acc swept too), the best tokens/s per GPU stands for it.

Each efficiency has a noise band, the two points' bands added (`metrics.noise_band_frac` of the dp
and of the smallest dp); the knee is stated with the dps it could also be within that band
(`knee_range`: the knee of the efficiencies pushed down, and pushed up, by their bands).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from analysis.collect import CONFIG_FIELDS
from analysis.figures import new_figure, themed
from analysis.heatmaps import facet_label
from scaling.core.enums import Status
from scaling.core.noise import NOISE_BAND_KEY
from scaling.core.schema import BATCH_SPLIT
from scaling.perf.knee import DEFAULT_THRESHOLD, find_knee, knee_range, stops_paying_off

NAME_FIRST = ("model", "seq_len", "mbs", "zero_stage")
"""The keys a configuration's name states first, in this order; the others follow in the schema's order."""
GROUP_KEYS = (
    *NAME_FIRST,
    *(c.column for c in CONFIG_FIELDS if c.axis and c.column not in (*BATCH_SPLIT, *NAME_FIRST)),
)
"""What makes a configuration for DP scaling: every axis of the schema except dp and grad_acc (the global batch they
give is not one, unless the sweep fixed it: then each fixed batch, target_gbs*, is its own configuration)."""
ALWAYS_NAMED = ("model", "seq_len", "zero_stage")


def scaling_table(df: pd.DataFrame) -> pd.DataFrame:
    """Ok records -> one row per (configuration, dp): best tokens/s per GPU, efficiency vs smallest dp and
    its noise band (`efficiency_noise_frac`)."""
    keys = [k for k in GROUP_KEYS if k in df.columns]
    ok = df[(df["status"] == Status.OK) & df["tokens_per_s_per_gpu"].notna()]
    if ok.empty:
        return pd.DataFrame(
            columns=[*keys, "dp", "tokens_per_s_per_gpu", "efficiency", "efficiency_noise_frac", "config"]
        )
    best = ok.loc[ok.groupby([*keys, "dp"], dropna=False, observed=True)["tokens_per_s_per_gpu"].idxmax()]
    best = best.sort_values([*keys, "dp"]).reset_index(drop=True)
    groups = best.groupby(keys, dropna=False, observed=True)
    best["efficiency"] = best["tokens_per_s_per_gpu"] / groups["tokens_per_s_per_gpu"].transform("first")
    band = (best[NOISE_BAND_KEY] if NOISE_BAND_KEY in best else pd.Series(0.0, index=best.index)).fillna(0.0)
    base_band = band.groupby([best[k] for k in keys], dropna=False, observed=True).transform("first")
    first = groups.cumcount() == 0  # the smallest dp is its own reference: efficiency 1, exactly
    best["efficiency_noise_frac"] = (band + base_band).where(~first, 0.0)
    named = naming_keys(best, keys)
    best["config"] = [
        ", ".join(d for k in named if pd.notna(row[k]) and (d := _describe(k, row[k])))
        for _, row in best[named].iterrows()
    ]
    return best


FOLLOWS_A_NAME = {
    c.column: c.path[0] for c in CONFIG_FIELDS if c.path[0] in ("model", "hardware") and c.column != c.path[0]
}
"""The fields a model's or a hardware profile's name already says (its shapes, its device's figures), by group."""


def naming_keys(best: pd.DataFrame, keys: list[str]) -> list[str]:
    """The keys a configuration's name states, in `keys` order: ALWAYS_NAMED, each other key that takes several
    values, but of a model's or a hardware profile's fields (FOLLOWS_A_NAME) only those that tell configurations
    apart beyond the names (a model's shapes follow its name, a model's max_seq_len may follow seq_len: then the name
    already says them). A tp 2 point among ZeRO-0 points of tp 1 is named tp 2, though no ZeRO-3 point differs from
    it in tp."""
    always = [k for k in keys if k in ALWAYS_NAMED]
    named_by = [*always, *(g for g in ("hardware",) if g in keys)]
    groups = best.groupby(named_by, dropna=False, observed=True)

    def tells_apart(k: str) -> bool:
        if k in FOLLOWS_A_NAME:
            return bool((groups[k].nunique(dropna=False) > 1).any())
        return best[k].nunique(dropna=False) > 1

    return [k for k in keys if k in always or tells_apart(k)]


def _describe(key: str, value: Any) -> str:
    """How a configuration key reads in its name; one that does not allow oversubscription says nothing of it."""
    if key == "model":
        return str(value)
    if key == "oversubscribe" and not value:
        return ""
    return facet_label(key, value)


@dataclass(frozen=True)
class Knee:
    """The knee of one configuration's DP curve, the dps it may lie at within noise, and the sentence."""

    config: str
    dps: tuple[int, ...]
    efficiency: tuple[float, ...]
    threshold: float
    knee_dp: int
    next_dp: Optional[int]
    sentence: str = field(default="")
    noise_frac: tuple[float, ...] = ()
    """Each efficiency's band (0 at the smallest dp)."""
    within_noise: tuple[int, ...] = ()
    """Other measured dps the knee may lie at within noise (empty when the noise decides nothing)."""


def knee_sentence(
    config: str,
    dps: Sequence[int],
    efficiency: Sequence[float],
    knee_dp: int,
    next_dp: Optional[int],
    threshold: float,
    within_noise: Sequence[int] = (),
    noise_frac: Sequence[float] = (),
) -> str:
    """Where DP stops paying off in words (scaling.perf.knee.stops_paying_off, the recipe's sentence), e.g. 'for
    llama_1b, seq 4096, ZeRO-1: DP stops paying off at dp=16: the first count whose efficiency falls below 80% of
    dp=1 (the last that pays: dp=8, or dp=4 within noise); ...'."""
    eff = dict(zip(dps, efficiency))
    band = dict(zip(dps, noise_frac))

    def pct(dp: int) -> str:  # the band in percentage points of efficiency
        return f"{eff[dp]:.0%}" + (f" ± {100 * eff[dp] * band[dp]:.0f} pts" if band.get(dp) else "")

    noise = f", or {', '.join(f'dp={d}' for d in within_noise)} within noise" if within_noise else ""
    head = stops_paying_off(next_dp, threshold, f"dp={dps[0]}", dps[-1], lambda d: f"dp={d}")
    if next_dp is None:
        return f"for {config}: {head}, the largest measured ({pct(dps[-1])} at dp={dps[-1]}{noise})"
    return (
        f"for {config}: {head} (the last that pays: dp={knee_dp}{noise}); efficiency falls from {pct(knee_dp)} "
        f"(dp={knee_dp}) to {pct(next_dp)} (dp={next_dp})"
    )


def knees(df: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> list[Knee]:
    """The knee of every configuration measured at two or more dp, with the dps it may lie at within noise."""
    table = scaling_table(df)
    out = []
    for config, group in table.groupby("config", sort=False):  # table is in numeric key order
        if len(group) < 2:
            continue
        dps = tuple(int(d) for d in group["dp"])
        eff = tuple(float(e) for e in group["efficiency"])
        noise = tuple(float(n) for n in group["efficiency_noise_frac"])
        knee_dp, next_dp = find_knee(dps, eff, threshold)
        low, high = knee_range(dps, eff, noise, threshold)
        within = tuple(d for d in dps if low <= d <= high and d != knee_dp)
        out.append(
            Knee(
                config,
                dps,
                eff,
                threshold,
                knee_dp,
                next_dp,
                knee_sentence(config, dps, eff, knee_dp, next_dp, threshold, within, noise),
                noise,
                within,
            )
        )
    return out


def dp_axis(ax: Axes, dps: pd.Series) -> None:
    """A log-2 dp axis with a plain tick at every dp given."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({int(d) for d in dps}))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("dp")
    ax.grid(True, alpha=0.3)


@themed
def plot_dp_scaling(df: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD, max_configs: int = 8) -> Figure:
    """Tokens/s per GPU and efficiency vs dp, one line per configuration, knees starred."""
    table = scaling_table(df)
    found = {k.config: k for k in knees(df, threshold)}
    ranked = (
        table[table["config"].isin(found)].groupby("config")["tokens_per_s_per_gpu"].max().sort_values(ascending=False)
    )
    shown = list(ranked.index[:max_configs])
    fig = new_figure((13, 5.2))
    ax_tps, ax_eff = fig.subplots(1, 2)
    for config in shown:
        group = table[table["config"] == config]
        knee = found[config]
        band = group[NOISE_BAND_KEY].fillna(0.0) if NOISE_BAND_KEY in group else 0.0
        bars = ax_tps.errorbar(
            group["dp"],
            group["tokens_per_s_per_gpu"],
            yerr=group["tokens_per_s_per_gpu"] * band,
            marker="o",
            capsize=3,
            label=config,
        )
        line = bars.lines[0]
        ax_eff.errorbar(
            group["dp"],
            group["efficiency"],
            yerr=group["efficiency"] * group["efficiency_noise_frac"],
            marker="o",
            capsize=3,
            color=line.get_color(),
        )
        at = group[group["dp"] == knee.knee_dp]
        ax_eff.plot(
            at["dp"],
            at["efficiency"],
            marker="*",
            markersize=18,
            color=line.get_color(),
            markeredgecolor="black",
            linestyle="none",
            gid=f"knee:{config}",
        )
        ax_tps.plot(
            at["dp"],
            at["tokens_per_s_per_gpu"],
            marker="*",
            markersize=18,
            color=line.get_color(),
            markeredgecolor="black",
            linestyle="none",
        )
    ax_eff.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:.0%}")
    for ax, label in ((ax_tps, "tokens/s per GPU"), (ax_eff, "efficiency vs smallest dp")):
        dp_axis(ax, table.loc[table["config"].isin(shown), "dp"])
        ax.set_ylabel(label)
    ax_eff.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    ax_eff.legend(loc="lower left", fontsize=8)
    if shown:
        ax_tps.legend(loc="best", fontsize=7)
    title = "DP scaling (★ = knee: last dp with efficiency ≥ threshold; bars = noise band)"
    if len(found) > len(shown):
        title += f"; the {len(shown)} fastest of {len(found)} configurations"
    if not shown:
        title += ": no configuration measured at two or more dp"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
