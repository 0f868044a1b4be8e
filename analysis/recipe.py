"""The batch-size recipe's answer: per GPU count, the configuration to run at a fixed global batch, how fast it
goes (with its band, measured or extrapolated), where data parallelism stops paying off and the most GPUs the
batch can use.

The lecture notes' recipe: (1) fix the global batch in tokens, (2) fix seq_len, (3) find the largest micro-batch
that fits one device, (4) take the GPUs you have: grad_acc = gbs / (mbs × dp); when that falls below 1 there are
more GPUs than the batch can use. Each `Candidate` (a ZeRO stage and a recompute setting with its largest mbs) is
fitted on its measured records (analysis.bands, under the network source the sweep directory has), and each GPU
count gets the candidate with the most tokens/s per GPU; candidates whose band reaches the winner's are its ties,
listed, not ranked. This module decides and renders; `scaling recipe` (scaling.cli.recipe) measures what is missing.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from analysis.bands import BAND, Extrapolation, extrapolate
from analysis.dp_scaling import DEFAULT_THRESHOLD
from analysis.step_model import Point, Workload
from scaling.core.batch import plan
from scaling.core.enums import Status
from scaling.core.schema import ModelConfig
from scaling.core.units import format_bytes
from scaling.store.network import NetworkEstimate

MEASURED, EXTRAPOLATED = "measured", "extrapolated"
RECIPE_MD, RECIPE_JSON = "recipe.md", "recipe.json"
"""The recipe's files in the sweep directory (`scaling report` opens with the first)."""


@dataclass(frozen=True)
class Candidate:
    """One way to train the model: a ZeRO stage and a recompute setting, with the largest mbs that fits one device."""

    zero_stage: int
    recompute: str
    mbs_max: int
    fits: str
    """How mbs_max is known, in words: confirmed by runs, or predicted (and by what)."""

    @property
    def name(self) -> str:
        """`ZeRO-2, recompute none`."""
        return f"ZeRO-{self.zero_stage}, recompute {self.recompute}"


@dataclass(frozen=True)
class Split:
    """How `gpus` GPUs split the global batch: gbs = mbs × grad_acc × gpus samples."""

    gpus: int
    mbs: int
    grad_acc: int
    gbs_tokens: int
    """The effective global batch in tokens (the target's when `exact`)."""
    exact: bool


def split(gbs_samples: int, seq_len: int, gpus: int, mbs_max: int) -> Optional[Split]:
    """The recipe's split at `gpus` GPUs: the largest mbs ≤ mbs_max that leaves grad_acc ≥ 1, grad_acc = gbs /
    (mbs × gpus) (`scaling plan`'s rule). An mbs down to half of that which splits the batch exactly is preferred
    (mbs 16 × grad_acc 2 over mbs 18 × grad_acc 1.8); otherwise grad_acc is the whole number ≥ 1 whose batch is
    nearest the target, and the split says the batch it makes. None when even mbs=1 leaves grad_acc below 1."""
    top = min(mbs_max, gbs_samples // gpus)
    if top < 1:
        return None
    mbs = next((m for m in range(top, (top - 1) // 2, -1) if gbs_samples % (m * gpus) == 0), top)
    p = plan(gbs_samples * seq_len, seq_len, mbs, gpus)
    if p.grad_acc is not None:
        return Split(gpus, mbs, p.grad_acc, gbs_samples * seq_len, True)
    ga = min(
        {max(1, math.floor(p.grad_acc_exact)), max(1, math.ceil(p.grad_acc_exact))},
        key=lambda g: (abs(g * mbs * gpus - gbs_samples), g),
    )
    return Split(gpus, mbs, ga, ga * mbs * gpus * seq_len, False)


def max_useful_gpus(gbs_samples: int) -> int:
    """The most GPUs the batch can use at all: dp × mbs ≤ gbs at the smallest mbs, 1 (so grad_acc = 1)."""
    return gbs_samples


@dataclass(frozen=True)
class Estimate:
    """Tokens/s per GPU of one split of one candidate, with its band, and where the figure comes from."""

    tokens_per_s_per_gpu: float
    low: float
    high: float
    step_time_s: float
    source: str
    """MEASURED (a record at exactly this split) or EXTRAPOLATED (the step model fitted on the measured points)."""
    detail: str
    """What measured it, or which network source the extrapolation used and from which measured dp."""
    peak_mem_bytes: Optional[int] = None
    """Measured peak per rank (None: not measured at this split)."""


def _matches(record: Mapping[str, Any], c: Candidate, mbs: int) -> bool:
    cfg = record["config"]
    return (
        record.get("status") == Status.OK
        and cfg["parallel"]["zero_stage"] == c.zero_stage
        and cfg["train"]["recompute"] == c.recompute
        and cfg["train"]["mbs"] == mbs
    )


def measured_points(records: Sequence[Mapping[str, Any]], c: Candidate, mbs: int) -> list[Point]:
    """The ok records of a candidate at `mbs` as the step model's points (one per dp and grad_acc)."""
    points = {}
    for r in records:
        if _matches(r, c, mbs):
            m = r["metrics"]
            times = tuple(float(t) for t in (m.get("step_times_s") or [m["step_time_s"]]))
            points[r["config"]["parallel"]["dp"], r["derived"]["grad_acc"]] = Point(
                r["config"]["parallel"]["dp"], r["derived"]["grad_acc"], times
            )
    return [points[k] for k in sorted(points)]


def measured_at(records: Sequence[Mapping[str, Any]], c: Candidate, s: Split) -> Optional[Estimate]:
    """The record of a candidate at exactly this split, as an estimate (its band: the record's noise band)."""
    for r in records:
        if _matches(r, c, s.mbs) and r["config"]["parallel"]["dp"] == s.gpus and r["derived"]["grad_acc"] == s.grad_acc:
            m = r["metrics"]
            tps, band = float(m["tokens_per_s_per_gpu"]), float(m.get("noise_band_frac") or 0.0)
            return Estimate(
                tps,
                tps * (1 - band),
                tps * (1 + band),
                float(m["step_time_s"]),
                MEASURED,
                f"record {r['job_key']}",
                m.get("peak_mem_bytes"),
            )
    return None


@dataclass
class Model:
    """The step model of one candidate at one mbs, fitted on its measured points under one network source."""

    workload: Workload
    extrapolation: Optional[Extrapolation]
    source: str
    """The network source's label, or why there is no fit."""

    def estimate(self, gpus: int, grad_acc: int) -> Optional[Estimate]:
        """Tokens/s per GPU at `gpus` and `grad_acc`, nominal and its band over the fit's draws (None: the source
        has no figures for that many GPUs, or nothing was measured)."""
        ex = self.extrapolation
        if ex is None or not ex.fit.network.reaches(gpus):
            return None
        w = self.workload
        tokens = w.mbs * w.seq_len * grad_acc
        step = ex.fit.step_time_s(w, gpus, grad_acc)
        draws = [tokens / f.step_time_s(w, gpus, grad_acc) for f in ex.draws if f.network.reaches(gpus)]
        lo, hi = (float(v) for v in np.percentile(draws, BAND)) if draws else (tokens / step, tokens / step)
        measured = ", ".join(str(d) for d in sorted(ex.measured))
        return Estimate(tokens / step, lo, hi, step, EXTRAPOLATED, f"{self.source}; fitted on measured dp {measured}")


def fit_model(
    workload: Workload,
    points: Sequence[Point],
    devices_per_node: Optional[int],
    source: Optional[NetworkEstimate],
    n_draws: int,
) -> Model:
    """Fit one candidate's measured points under `source` ((a), the points alone, when None)."""
    label = source.label if source is not None else "fitted to the measured DP curve alone"
    if not points:
        return Model(workload, None, "nothing measured")
    ex = extrapolate("recipe", workload, points, devices_per_node, source, n_draws=n_draws)
    return Model(workload, ex, label)


def workload_of(model: ModelConfig, cfg: Mapping[str, Any], c: Candidate, mbs: int, gbs_samples: int) -> Workload:
    """The step model's workload of a candidate at `mbs` under the resolved config `cfg` (precision, clipping, ...)."""
    t, p = cfg["train"], cfg["parallel"]
    return Workload(
        c.zero_stage,
        model,
        str(t["precision"]),
        mbs,
        int(t["seq_len"]),
        gbs_samples,
        1,
        str(p["fsdp_grad_reduce"]),
        c.recompute,
        float(t["grad_clip"]),
        float(p["bucket_mb"]),
    )


@dataclass
class FromRecords:
    """The recipe's estimator: a candidate's record at exactly the split when the store has one, else its step model
    fitted on its records at the split's mbs (one fit per candidate and mbs, under one network source)."""

    records: Sequence[Mapping[str, Any]]
    workload: Callable[[Candidate, int], Workload]
    """The step model's workload of a candidate at an mbs."""
    devices_per_node: Optional[int]
    source: Optional[NetworkEstimate]
    n_draws: int = 200
    models: dict[tuple[int, str, int], Model] = field(default_factory=dict)

    def __call__(self, c: Candidate, s: Split) -> Optional[Estimate]:
        hit = measured_at(self.records, c, s)
        if hit is not None:
            return hit
        key = (c.zero_stage, c.recompute, s.mbs)
        if key not in self.models:
            points = measured_points(self.records, c, s.mbs)
            self.models[key] = fit_model(
                self.workload(c, s.mbs), points, self.devices_per_node, self.source, self.n_draws
            )
        return self.models[key].estimate(s.gpus, s.grad_acc)


@dataclass
class Option:
    """One candidate at one GPU count: its split and estimate."""

    candidate: Candidate
    split: Split
    estimate: Estimate


@dataclass
class Row:
    """The answer for one GPU count (null fields and a `reason` where no configuration is possible)."""

    gpus: int
    dp: Optional[int] = None
    zero_stage: Optional[int] = None
    mbs: Optional[int] = None
    grad_acc: Optional[int] = None
    recompute: Optional[str] = None
    gbs_tokens: Optional[int] = None
    gbs_exact: Optional[bool] = None
    tokens_per_s_per_gpu: Optional[float] = None
    tokens_per_s_per_gpu_low: Optional[float] = None
    tokens_per_s_per_gpu_high: Optional[float] = None
    efficiency: Optional[float] = None
    step_time_s: Optional[float] = None
    source: Optional[str] = None
    source_detail: Optional[str] = None
    train_time_s: Optional[float] = None
    gpu_hours: Optional[float] = None
    peak_mem_bytes: Optional[int] = None
    memory_headroom_frac: Optional[float] = None
    ties: list[dict[str, Any]] = field(default_factory=list)
    command: Optional[str] = None
    reason: Optional[str] = None


@dataclass
class Recipe:
    """The recipe's whole answer."""

    model: str
    seq_len: int
    gbs_tokens: int
    gbs_samples: int
    hardware: str
    threshold: float
    tokens: Optional[int]
    candidates: list[Candidate]
    network: str
    rows: list[Row]
    dp_stops_paying_off_at: Optional[int]
    dp_stops_paying_off_range: tuple[Optional[int], Optional[int]]
    max_useful_gpus: int
    baseline_tokens_per_s_per_gpu: Optional[float]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """recipe.json: `rows` (one per requested GPU count), `dp_stops_paying_off_at`, `max_useful_gpus`, ..."""
        return {
            "model": self.model,
            "seq_len": self.seq_len,
            "gbs_tokens_target": self.gbs_tokens,
            "gbs_samples_target": self.gbs_samples,
            "hardware": self.hardware,
            "threshold": self.threshold,
            "tokens": self.tokens,
            "network": self.network,
            "candidates": [{**asdict(c), "name": c.name} for c in self.candidates],
            "rows": [asdict(r) for r in self.rows],
            "dp_stops_paying_off_at": self.dp_stops_paying_off_at,
            "dp_stops_paying_off_range": list(self.dp_stops_paying_off_range),
            "max_useful_gpus": self.max_useful_gpus,
            "baseline_tokens_per_s_per_gpu": self.baseline_tokens_per_s_per_gpu,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Recipe:
        """The recipe a recipe.json holds (`to_json`'s inverse)."""
        names = set(Candidate.__dataclass_fields__)
        return cls(
            model=doc["model"],
            seq_len=doc["seq_len"],
            gbs_tokens=doc["gbs_tokens_target"],
            gbs_samples=doc["gbs_samples_target"],
            hardware=doc["hardware"],
            threshold=doc["threshold"],
            tokens=doc.get("tokens"),
            candidates=[Candidate(**{k: v for k, v in c.items() if k in names}) for c in doc["candidates"]],
            network=doc["network"],
            rows=[Row(**r) for r in doc["rows"]],
            dp_stops_paying_off_at=doc["dp_stops_paying_off_at"],
            dp_stops_paying_off_range=tuple(doc["dp_stops_paying_off_range"]),
            max_useful_gpus=doc["max_useful_gpus"],
            baseline_tokens_per_s_per_gpu=doc.get("baseline_tokens_per_s_per_gpu"),
            notes=list(doc.get("notes") or []),
        )

    def command_lines(self) -> list[str]:
        """Each row's `scaling run` command, with the GPU count it answers for."""
        return [f"{r.command}  # {r.gpus} GPU{'s' if r.gpus != 1 else ''}" for r in self.rows if r.command]

    def caveats(self) -> list[str]:
        """How the answer was found: the network, the candidates and how their mbs is known, the bands, notes."""
        return [
            f"Network: {self.network}.",
            "Candidates (the largest mbs that fits one device): "
            + "; ".join(f"{c.name}: mbs {c.mbs_max} ({c.fits})" for c in self.candidates)
            + ".",
            "Efficiency is tokens/s per GPU against the best configuration on 1 GPU. Bands: measured rows carry their "
            f"record's noise band, extrapolated ones the {BAND[0]:g}-{BAND[1]:g}% percentiles of the step model's "
            "bootstrap draws (fitted on each candidate's measured points at that mbs, under the network above). "
            "Ties are configurations whose band reaches the recommended one's figure: equally good within the noise.",
            *self.notes,
        ]


Estimator = Callable[[Candidate, Split], Optional[Estimate]]
"""A candidate's estimate at a split: the record at that split if there is one, else its fitted model's."""


def best_option(
    candidates: Sequence[Candidate], gbs_samples: int, seq_len: int, gpus: int, estimate: Estimator
) -> tuple[Optional[Option], list[Option], list[str]]:
    """The fastest candidate at `gpus` (most tokens/s per GPU, nominal), the others whose band reaches its nominal
    figure or whose nominal figure lies in its band (ties), and why each other candidate has no figure."""
    options, why = [], []
    for c in candidates:
        s = split(gbs_samples, seq_len, gpus, c.mbs_max)
        if s is None:
            continue
        e = estimate(c, s)
        if e is None:
            why.append(f"ZeRO-{c.zero_stage} {c.recompute}")
            continue
        options.append(Option(c, s, e))
    if not options:
        return None, [], why
    best = max(options, key=lambda o: o.estimate.tokens_per_s_per_gpu)
    b = best.estimate
    ties = [
        o
        for o in options
        if o is not best and (o.estimate.high >= b.tokens_per_s_per_gpu or b.low <= o.estimate.tokens_per_s_per_gpu)
    ]
    return best, ties, why


def knee(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    counts: Sequence[int],
    estimate: Estimator,
    baseline: float,
    threshold: float,
) -> tuple[Optional[int], tuple[Optional[int], Optional[int]]]:
    """The first GPU count whose best configuration's efficiency (against `baseline`, the best at 1 GPU) is below
    `threshold`, and its range: the first count whose band's high end is below it, and whose low end is."""
    first = earliest = latest = None
    for n in sorted(counts):
        best, _, _ = best_option(candidates, gbs_samples, seq_len, n, estimate)
        if best is None:
            continue
        e = best.estimate
        if first is None and e.tokens_per_s_per_gpu / baseline < threshold:
            first = n
        if earliest is None and e.low / baseline < threshold:
            earliest = n
        if latest is None and e.high / baseline < threshold:
            latest = n
    return first, (earliest, latest)


def decide(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    gpus: Sequence[int],
    estimate: Estimator,
    threshold: float = DEFAULT_THRESHOLD,
    tokens: Optional[int] = None,
    capacity_bytes: Optional[int] = None,
    predicted_peak: Optional[Callable[[Candidate, Split], Optional[int]]] = None,
    command: Optional[Callable[[Candidate, Split], str]] = None,
) -> tuple[list[Row], Optional[int], tuple[Optional[int], Optional[int]], Optional[float]]:
    """The rows for the requested GPU counts, the first GPU count below `threshold` with its range, and the baseline
    (the best tokens/s per GPU at 1 GPU). Pure: every figure comes from `estimate`."""
    top = max_useful_gpus(gbs_samples)
    base, _, _ = best_option(candidates, gbs_samples, seq_len, 1, estimate)
    baseline = base.estimate.tokens_per_s_per_gpu if base is not None else None
    rows = []
    for n in gpus:
        row = Row(gpus=n)
        best, ties, why = best_option(candidates, gbs_samples, seq_len, n, estimate)
        if n > top:
            row.reason = (
                f"more GPUs than the batch can use: {gbs_samples} samples split over at most {top} GPUs "
                f"(mbs=1, grad_acc=1); use at most {top} GPUs, a larger global batch (at least {n * seq_len:,} "
                "tokens), or tensor or pipeline parallelism to use the rest"
            )
        elif best is None:
            row.reason = (
                "no measured or extrapolated figure for this many GPUs"
                + (f" (candidates {', '.join(why)})" if why else "")
                + ": nothing measured, or a network tier with no figures (see the notes)"
            )
        if best is None:
            rows.append(row)
            continue
        c, s, e = best.candidate, best.split, best.estimate
        row.dp, row.zero_stage, row.mbs, row.grad_acc, row.recompute = n, c.zero_stage, s.mbs, s.grad_acc, c.recompute
        row.gbs_tokens, row.gbs_exact = s.gbs_tokens, s.exact
        row.tokens_per_s_per_gpu, row.tokens_per_s_per_gpu_low, row.tokens_per_s_per_gpu_high = (
            e.tokens_per_s_per_gpu,
            e.low,
            e.high,
        )
        row.efficiency = e.tokens_per_s_per_gpu / baseline if baseline else None
        row.step_time_s, row.source, row.source_detail = e.step_time_s, e.source, e.detail
        if tokens is not None:
            row.train_time_s = tokens / (e.tokens_per_s_per_gpu * n)
            row.gpu_hours = row.train_time_s * n / 3600
        peak = e.peak_mem_bytes if e.peak_mem_bytes is not None else (predicted_peak(c, s) if predicted_peak else None)
        row.peak_mem_bytes = peak
        if peak is not None and capacity_bytes:
            row.memory_headroom_frac = 1 - peak / capacity_bytes
        row.ties = [
            {
                "zero_stage": o.candidate.zero_stage,
                "recompute": o.candidate.recompute,
                "mbs": o.split.mbs,
                "grad_acc": o.split.grad_acc,
                "tokens_per_s_per_gpu": o.estimate.tokens_per_s_per_gpu,
                "source": o.estimate.source,
            }
            for o in ties
        ]
        row.command = command(c, s) if command else None
        rows.append(row)
    counts = sorted({*(2**k for k in range(top.bit_length()) if 2**k <= top), *(n for n in gpus if n <= top)})
    first, band = (
        knee(candidates, gbs_samples, seq_len, counts, estimate, baseline, threshold)
        if baseline
        else (
            None,
            (None, None),
        )
    )
    return rows, first, band, baseline


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
                [str(r.gpus), "–", "–", "–", "–", "–", "–"] + (["–", "–"] if recipe.tokens else []) + ["–", r.reason]
            )
            continue
        run = f"ZeRO-{r.zero_stage}, mbs {r.mbs}, grad_acc {r.grad_acc}, recompute {r.recompute}"
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
            else f"{r.memory_headroom_frac:.0%} ({format_bytes(r.peak_mem_bytes)})"
        )
        ties = "; ".join(
            f"ZeRO-{t['zero_stage']} mbs {t['mbs']} rc {t['recompute']}: {_fmt_rate(t['tokens_per_s_per_gpu'])}"
            for t in r.ties
        )
        cells += [headroom, ties or "none"]
        out.append(cells)
    return out


def headline(recipe: Recipe) -> list[str]:
    """The answer in a few sentences: where DP stops paying off and how far the batch reaches."""
    thr = f"{recipe.threshold:.0%}"
    lo, hi = recipe.dp_stops_paying_off_range
    if recipe.baseline_tokens_per_s_per_gpu is None:
        stops = (
            "Nothing says how fast one GPU goes (no candidate measured or extrapolated at 1 GPU), so where data "
            "parallelism stops paying off is unknown: run the recipe where devices of this hardware are at hand."
        )
    elif recipe.dp_stops_paying_off_at is None:
        stops = (
            f"Efficiency stays at or above {thr} of the best single GPU up to {recipe.max_useful_gpus} GPUs, the most "
            "this batch can use"
            + ("" if hi is None and lo is None else f" (its band dips below {thr} from {lo} GPUs)")
            + "."
        )
    else:
        rng = f"{lo if lo is not None else '?'} to {hi if hi is not None else f'beyond {recipe.max_useful_gpus}'}"
        stops = (
            f"Data parallelism stops paying off at {recipe.dp_stops_paying_off_at} GPUs: the first count whose efficiency "
            f"falls below {thr} of the best single GPU (within the band: {rng} GPUs)."
        )
    return [
        stops,
        f"The batch ({recipe.gbs_tokens:,} tokens = {recipe.gbs_samples:,} samples of {recipe.seq_len}) can use at "
        f"most {recipe.max_useful_gpus} GPUs (mbs=1, grad_acc=1). Beyond that: fewer GPUs, a larger batch, or tensor "
        "or pipeline parallelism (not measured here).",
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


def terminal(recipe: Recipe) -> str:
    """The table for a terminal, columns aligned, with the headline above it."""
    cells = table(recipe)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([*headline(recipe), "", *text])


def dumps(recipe: Recipe) -> str:
    """recipe.json's text."""
    return json.dumps(recipe.to_json(), indent=2) + "\n"
