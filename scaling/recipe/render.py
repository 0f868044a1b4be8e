"""The recipe's answer as text (the terminal table, recipe.md and recipe.json), as a figure, and as the first
section of the sweep directory's report (`scaling report` puts it there)."""

from __future__ import annotations

import json
import os
import textwrap
from functools import partial
from pathlib import Path
from typing import Optional

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from analysis.dp_scaling import dp_axis
from analysis.figures import PALETTE, new_figure, themed
from analysis.sections import Section
from scaling.core.files import write_json_atomic
from scaling.core.noise import tied
from scaling.core.units import format_bytes
from scaling.perf.knee import stops_paying_off
from scaling.recipe.answer import RECIPE_JSON, RECIPE_MD, Recipe, gpus_said
from scaling.recipe.next_point import NextMeasurement
from scaling.recipe.options import EXTRAPOLATED, MEASURED


def _fmt_rate(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _fmt_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "–"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def table(recipe: Recipe) -> list[list[str]]:
    """The rows as text cells, header first (the terminal table and recipe.md's)."""
    head = ["GPUs", "run", "tokens/s per GPU [band]", "source", "efficiency", "step", "global batch"]
    if recipe.tokens:
        head += ["time to train", "GPU-hours"]
    head += ["memory headroom", "ties within the band"]
    out = [head]
    for r in recipe.rows:
        if r.reason is not None and r.dp is None:
            out.append(
                [str(r.gpus), "–", "–", r.source or "–", "–", "–", "–"]
                + (["–", "–"] if recipe.tokens else [])
                + ["–", r.reason]
            )
            continue
        run = r.run or "–"
        band = f"{_fmt_rate(r.tokens_per_s_per_gpu)} [{_fmt_rate(r.tokens_per_s_per_gpu_low)}, {_fmt_rate(r.tokens_per_s_per_gpu_high)}]"
        batch = f"{r.gbs_tokens:,}" + (
            "" if r.gbs_exact else f" ({100 * (r.gbs_tokens / recipe.gbs_tokens - 1):+.1f}%)"
        )
        cells = [
            str(r.gpus),
            run,
            band,
            r.source or "–",
            "–" if r.efficiency is None else f"{r.efficiency:.0%}",
            _fmt_duration(r.step_time_s),
            batch,
        ]
        if recipe.tokens:
            cells += [_fmt_duration(r.train_time_s), "–" if r.gpu_hours is None else f"{r.gpu_hours:,.3g}"]
        headroom = (
            "–"
            if r.memory_headroom_frac is None
            else f"{r.memory_headroom_frac:.0%} (peak {format_bytes(r.peak_mem_bytes)})"
            + (f", margin {r.margin_frac:.1%}" if r.margin_frac else "")
        )
        ties = "; ".join(f"{t['run']}: {_fmt_rate(t['tokens_per_s_per_gpu'])}" for t in r.ties)
        cells += [headroom, ties or "none"]
        out.append(cells)
    return out


def headline(recipe: Recipe) -> list[str]:
    """The answer in a few sentences: where DP stops paying off and how far the batch reaches."""
    lo, hi = recipe.dp_stops_paying_off_range
    base = "the best single GPU" if recipe.baseline_gpus in (None, 1) else f"the best on {recipe.baseline_gpus} GPUs"
    if recipe.baseline_run and recipe.baseline_tokens_per_s_per_gpu:  # named with its figure: it may be no row
        base += f" ({recipe.baseline_run}: {_fmt_rate(recipe.baseline_tokens_per_s_per_gpu)} tokens/s per GPU)"
    if recipe.baseline_tokens_per_s_per_gpu is None:
        stops = (
            "Nothing says how fast the fewest GPUs go (no candidate measured, extrapolated or predicted there), so "
            "where data parallelism stops paying off is unknown: run the recipe where devices of this hardware are "
            "at hand, or pass --assume-mfu."
        )
    else:
        first, last = recipe.dp_stops_paying_off_at, recipe.dp_judged_gpus or recipe.max_useful_gpus
        stops = stops_paying_off(first, recipe.threshold, base, last, gpus_said)
        if first is None:
            stops += (
                ", the most this batch can use"
                if last >= recipe.max_useful_gpus
                else f"; past {last} GPUs nothing here gives a figure (the batch could use {recipe.max_useful_gpus})"
            ) + ("" if lo is None else f" (its band dips below from {lo} GPUs)")
        else:
            start = lo if lo is not None else "?"
            if hi is not None:
                stops += f" (within the band: {gpus_said(hi) if start == hi else f'{start} to {hi} GPUs'})"
            elif lo is None or last > lo:
                stops += f" (within the band: {start} to beyond {last} GPUs)"
            else:  # the band's high end stays above at every count with a figure, the last being where it dips
                stops += f" (within the band: from {start} GPUs; past {last} GPUs nothing here gives a figure)"
        stops += "."
    nxt = recipe.next_measurement
    full = recipe.dp_stops_paying_off_full
    if full is not None and full != recipe.dp_stops_paying_off_at:
        moved = recipe.dp_stops_paying_off_at
        stops += f" With full sharding alone it stops at {full} GPUs: hybrid sharding moves it to " + (
            f"{moved} GPUs." if moved is not None else f"beyond {recipe.max_useful_gpus}."
        )
    return [
        stops,
        *hybrid_lines(recipe),
        *([NextMeasurement(**nxt).sentence()] if nxt else []),
        f"The batch ({recipe.gbs_tokens:,} tokens = {recipe.gbs_samples:,} samples of {recipe.seq_len}) splits over "
        f"at most {recipe.gbs_samples} data-parallel ranks (mbs=1, grad_acc=1)"
        + (
            f"; tensor parallelism within a node and pipeline stages take it to {recipe.max_useful_gpus} GPUs. Beyond "
            "that: fewer GPUs or a larger batch."
            if any(c.layout.pp > 1 for c in recipe.candidates)
            else f"; tensor parallelism within a node takes it to {recipe.max_useful_gpus} GPUs. Beyond that: fewer "
            "GPUs, a larger batch, or pipeline parallelism (--pp)."
            if recipe.max_useful_gpus > recipe.gbs_samples
            else f". Beyond {recipe.max_useful_gpus} GPUs: fewer GPUs, a larger batch, or tensor or pipeline "
            "parallelism (--pp)."
        ),
        *([f"{recipe.pipeline[0].upper()}{recipe.pipeline[1:]}."] if recipe.pipeline else []),
        *[f"{gpus_said(r.gpus)} run tp {r.tp}: {r.tp_why}." for r in recipe.rows if r.tp > 1 and r.tp_why],
        *[
            gpus_said(r.gpus) + (f" run pp {r.pp}: " if r.pp > 1 else ": ") + f"{r.pp_why}."
            for r in recipe.rows
            if r.pp_why
        ],
        *[
            f"{gpus_said(r.gpus)} run recompute {r.recompute}: {r.recompute_why}."
            for r in recipe.rows
            if r.recompute_why
        ],
    ]


def markdown(recipe: Recipe) -> str:
    """recipe.md: the headline, the table, the commands, then the caveats."""
    cells = table(recipe)
    lines = [
        f"# Recipe: {recipe.model} at seq_len {recipe.seq_len}, global batch {recipe.gbs_tokens:,} tokens, "
        f"on {recipe.hardware}",
        "",
        *headline(recipe),
        "",
        "| " + " | ".join(cells[0]) + " |",
        "|" + "---|" * len(cells[0]),
        *("| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in cells[1:]),
        "",
        "Reproduce or measure a row:",
        "",
        "```bash",
        *recipe.command_lines(),
        "```",
        "",
        *(f"- {c}" for c in recipe.caveats()),
    ]
    return "\n".join(lines) + "\n"


TERMINAL_COLUMNS = 120
"""The widest line of the terminal's table."""
TERMINAL_TIES = 2
"""Ties the terminal shows per row, the nearest first (recipe.md lists them all)."""


def terminal(recipe: Recipe) -> str:
    """The answer for a terminal, the headline above the table: per row a line of its GPUs, configuration and figure
    (columns aligned), then its source, efficiency, step, batch and headroom, then its nearest ties; every line of
    the table within TERMINAL_COLUMNS."""
    cells = table(recipe)
    main = [[row[0], row[1], row[2]] for row in cells]
    widths = [max(len(row[i]) for row in main) for i in range(3)]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(main[0], widths)).rstrip()]
    indent = " " * (widths[0] + 2)
    wrap = partial(textwrap.fill, width=TERMINAL_COLUMNS, initial_indent=indent, subsequent_indent=indent + "  ")
    for r, row, first in zip(recipe.rows, cells[1:], main[1:]):
        if r.reason is not None and r.dp is None:
            text.append(row[0].ljust(widths[0]) + "  " + "–")
            text.append(wrap(f"{r.source + ': ' if r.source else ''}{r.reason}"))
            continue
        text.append("  ".join(cell.ljust(w) for cell, w in zip(first, widths)).rstrip())
        details = dict(zip(cells[0][3:-1], row[3:-1]))
        text.append(wrap(", ".join(f"{name} {value}" for name, value in details.items())))
        near = sorted(r.ties, key=lambda t: abs(t["tokens_per_s_per_gpu"] - (r.tokens_per_s_per_gpu or 0)))
        shown = "; ".join(f"{t['run']}: {_fmt_rate(t['tokens_per_s_per_gpu'])}" for t in near[:TERMINAL_TIES])
        more = f" (+{len(near) - TERMINAL_TIES} more in recipe.md)" if len(near) > TERMINAL_TIES else ""
        text.append(wrap(f"ties: {shown}{more}" if near else "ties: none"))
    sources = recipe.predicted_from()  # a plan before any point ran says on what it rests, under its table
    return "\n".join([*headline(recipe), "", *text, *(["", *sources] if sources else [])])


def dumps(recipe: Recipe) -> str:
    """recipe.json's text."""
    return json.dumps(recipe.to_json(), indent=2) + "\n"


@themed
def figure(recipe: Recipe) -> Optional[Figure]:
    """Tokens/s per GPU (its band shaded) and efficiency against GPU count: measured rows filled, extrapolated ones
    hollow, the count where DP stops paying off and the most GPUs the batch can use drawn. None when
    no row has a figure."""
    rows = [r for r in recipe.rows if r.tokens_per_s_per_gpu is not None]
    if not rows:
        return None
    gpus = [r.gpus for r in rows]
    fig = new_figure((10.0, 4.2))
    fig.set_layout_engine("constrained")  # the right panel's axis label clear of the left panel
    speed, eff = fig.subplots(1, 2)
    speed.fill_between(
        gpus,
        [r.tokens_per_s_per_gpu_low for r in rows],
        [r.tokens_per_s_per_gpu_high for r in rows],
        color=PALETTE[0],
        alpha=0.2,
        label="band",
    )
    speed.plot(gpus, [r.tokens_per_s_per_gpu for r in rows], color=PALETTE[0], lw=1.5)
    eff.plot(gpus, [r.efficiency for r in rows], color=PALETTE[0], lw=1.5)
    for ax, values in ((speed, [r.tokens_per_s_per_gpu for r in rows]), (eff, [r.efficiency for r in rows])):
        for source in (MEASURED, EXTRAPOLATED):
            at = [(g, v) for g, v, r in zip(gpus, values, rows) if r.source == source]
            if at:
                ax.scatter(
                    *zip(*at),
                    s=36,
                    zorder=3,
                    facecolor=PALETTE[0] if source == MEASURED else "white",
                    edgecolor=PALETTE[0],
                    label=source,
                )
        if recipe.dp_stops_paying_off_at is not None:
            ax.axvline(recipe.dp_stops_paying_off_at, color=PALETTE[3], ls="--", lw=1, label="DP stops paying off")
        if recipe.max_useful_gpus <= 2 * max(gpus):
            ax.axvline(recipe.max_useful_gpus, color="0.3", ls=":", lw=1, label="most GPUs the batch can use")
        dp_axis(ax, pd.Series(sorted({*gpus, *(r.gpus for r in recipe.rows)})))
        ax.set_xlabel("GPUs")
    eff.axhline(recipe.threshold, color="0.5", lw=0.8)
    eff.yaxis.set_major_formatter(PercentFormatter(1.0))
    speed.set_ylabel("tokens/s per GPU")
    eff.set_ylabel("efficiency vs the best single GPU")
    speed.legend(fontsize=8, loc="best")
    fig.suptitle(f"Recipe: {recipe.model} at seq_len {recipe.seq_len}, {recipe.gbs_tokens:,}-token batch")
    return fig


def read(sweep_dir: Path) -> tuple[Optional[Recipe], Optional[str]]:
    """The directory's recipe.json, or None and why it cannot be read (None: there is none)."""
    try:
        return Recipe.from_json(json.loads((sweep_dir / RECIPE_JSON).read_text())), None
    except FileNotFoundError:
        return None, None
    except (ValueError, KeyError, TypeError) as e:
        return None, str(e)


def report_section(sweep_dir: str | os.PathLike) -> Optional[Section]:
    """The directory's `scaling recipe` answer as the report's first section; None when it has none."""
    recipe, problem = read(Path(sweep_dir))
    if problem is not None:
        return Section("Recipe", [f"{RECIPE_JSON} could not be read ({problem}): run `scaling recipe` again."])
    if recipe is None:
        return None
    cells = table(recipe)
    fig = figure(recipe)
    return Section(
        f"Recipe: {recipe.model} at seq_len {recipe.seq_len}, global batch {recipe.gbs_tokens:,} tokens, on "
        f"{recipe.hardware}",
        headline(recipe),
        [pd.DataFrame(cells[1:], columns=cells[0])],
        code=recipe.command_lines(),
        figures={"recipe": fig} if fig is not None else {},
        details=recipe.caveats(),
        details_title="How the recipe was found",
    )


def write(recipe: Recipe, sweep_dir: Path) -> list[Path]:
    """Write recipe.json and recipe.md into the sweep directory; their paths."""
    json_path, md_path = sweep_dir / RECIPE_JSON, sweep_dir / RECIPE_MD
    write_json_atomic(json_path, recipe.to_json())
    md_path.write_text(markdown(recipe))
    return [md_path, json_path]


def hybrid_lines(recipe: Recipe) -> list[str]:
    """Per row that runs hybrid sharding: by how much it beats full sharding's best there, and at what memory cost."""
    out = []
    for r in recipe.rows:
        v = r.versus_full
        if not r.dp_shard or not v:
            continue
        gain = r.tokens_per_s_per_gpu / v["tokens_per_s_per_gpu"] - 1
        lo, hi = r.tokens_per_s_per_gpu_low / v["high"] - 1, r.tokens_per_s_per_gpu_high / v["low"] - 1
        memory = ""
        if r.peak_mem_bytes is not None and v["peak_mem_bytes"] is not None:
            more = r.peak_mem_bytes - v["peak_mem_bytes"]
            memory = f", at {'+' if more >= 0 else '-'}{format_bytes(abs(more))} per rank"
        even = tied(
            r.tokens_per_s_per_gpu,
            r.tokens_per_s_per_gpu_low,
            r.tokens_per_s_per_gpu_high,
            v["tokens_per_s_per_gpu"],
            v["low"],
            v["high"],
        )
        verdict = f"ties with it ({gain:+.1%}, within the bands)" if even else f"beats it by {gain:+.0%}"
        out.append(
            f"{gpus_said(r.gpus)}: hybrid sharding over {r.dp_shard} against full sharding's best there ({v['run']}: "
            f"{_fmt_rate(v['tokens_per_s_per_gpu'])}): {verdict} (bands: {lo:+.0%} to {hi:+.0%}){memory}."
        )
    return out
