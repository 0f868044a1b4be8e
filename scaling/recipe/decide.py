"""The batch-size recipe's answer: per GPU count, the configuration to run at a fixed global batch, how fast it
goes (with its band, measured or extrapolated), where data parallelism stops paying off and the most GPUs the
batch can use.

The lecture notes' recipe: (1) fix the global batch in tokens, (2) fix seq_len, (3) find the largest micro-batch
that fits one device, (4) take the GPUs you have: grad_acc = gbs / (mbs × dp); when that falls below 1 there are
more GPUs than the batch can use. Each `Candidate` (a ZeRO stage and a recompute setting with its largest mbs) is
fitted on its measured records (scaling.perf.extrapolation, under the network source the sweep directory has), and each GPU
count gets the candidate with the most tokens/s per GPU; candidates whose band reaches the winner's are its ties,
listed, not ranked. This module decides (inputs in, rows out); scaling.recipe.estimate says where each figure
comes from, scaling.recipe.render writes it out, and scaling.recipe.measure measures what is missing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from scaling.core.batch import plan
from scaling.perf.extrapolation import BAND
from scaling.perf.knee import DEFAULT_THRESHOLD

MEASURED, EXTRAPOLATED, PREDICTED, BEYOND_HORIZON = "measured", "extrapolated", "predicted", "beyond_horizon"
RECIPE_MD, RECIPE_JSON = "recipe.md", "recipe.json"
"""The recipe's files in the sweep directory (`scaling report` opens with the first)."""


@dataclass(frozen=True)
class Candidate:
    """One way to train the model: a ZeRO stage and a recompute setting, with the largest mbs that fits per rank at
    the GPU counts it runs at (sharding makes room as they grow: ZeRO-3 fits a model no one device holds)."""

    zero_stage: int
    recompute: str
    mbs_max: int
    """The largest mbs at the fewest GPUs it fits on (`fit_gpus`)."""
    fits: str
    """How mbs_max is known, in words: confirmed by runs, or predicted (and by what)."""
    mbs_at: tuple[tuple[int, int], ...] = ()
    """(GPUs, the largest mbs that fits per rank there; 0: not even mbs=1) at the counts it was judged at, in order;
    empty: mbs_max at every count."""
    dp_shard: Optional[int] = None
    """Hybrid sharding: the ranks each shard spans wherever it divides the GPU count (None: full sharding)."""

    @property
    def name(self) -> str:
        """`ZeRO-2, recompute none` (`, sharded over 8` under hybrid sharding)."""
        hybrid = f", sharded over {self.dp_shard}" if self.dp_shard else ""
        return f"ZeRO-{self.zero_stage}, recompute {self.recompute}{hybrid}"

    def shard_at(self, gpus: int) -> Optional[int]:
        """parallel.dp_shard at `gpus` GPUs: dp_shard where it is a proper divisor, else None (full sharding)."""
        k = self.dp_shard
        return k if k and k < gpus and gpus % k == 0 else None

    def mbs_for(self, gpus: int) -> int:
        """The largest mbs that fits per rank at `gpus` GPUs: that of the largest count judged at or below it (memory
        per rank does not grow with the count), 0 where none fits."""
        if not self.mbs_at:
            return self.mbs_max
        return max((m for n, m in self.mbs_at if n <= gpus), default=0)

    @property
    def fit_gpus(self) -> Optional[int]:
        """The fewest GPUs (of those judged) at which mbs=1 fits per rank; None: none of them."""
        return next((n for n, m in self.mbs_at if m >= 1), None) if self.mbs_at else 1


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
    """MEASURED (a record at exactly this split), EXTRAPOLATED (the step model fitted on the measured points) or
    PREDICTED (nothing measured: the step model with the compute from FLOPs and a measured MFU, scaling.recipe.predicted)."""
    detail: str
    """What measured it, or which network source the extrapolation used and from which measured dp."""
    peak_mem_bytes: Optional[int] = None
    """Measured peak per rank (None: not measured at this split)."""


@dataclass(frozen=True)
class Beyond:
    """No figure: the split's GPU count lies past the horizon of the candidate's extrapolation (scaling.perf.extrapolation)."""

    reason: str


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
    dp_shard: Optional[int] = None
    """Hybrid sharding: the ranks each shard spans (None: full sharding, or a stage that does not shard)."""
    versus_full: Optional[dict[str, Any]] = None
    """Where hybrid sharding is run: the best full-sharding option beside it (its tokens/s per GPU and band, and the
    peak memory per rank of both), so the row says by how much hybrid wins and at what memory cost."""


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
    baseline_gpus: Optional[int] = 1
    dp_stops_paying_off_full: Optional[int] = None
    """With hybrid sharding among the candidates: where DP stops paying off with full sharding alone (None: the
    same, or not at any count the batch can use)."""
    next_measurement: Optional[dict[str, Any]] = None
    """The point whose measurement would narrow the least certain row most (scaling.recipe.next_point), or None."""
    """The GPU count efficiency is relative to: where the best configuration goes fastest per GPU (1 GPU, but for a
    model that only sharding, or recompute, fits on few)."""

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
            "baseline_gpus": self.baseline_gpus,
            "dp_stops_paying_off_full": self.dp_stops_paying_off_full,
            "next_measurement": self.next_measurement,
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
            candidates=[_candidate({k: v for k, v in c.items() if k in names}) for c in doc["candidates"]],
            network=doc["network"],
            rows=[Row(**r) for r in doc["rows"]],
            dp_stops_paying_off_at=doc["dp_stops_paying_off_at"],
            dp_stops_paying_off_range=tuple(doc["dp_stops_paying_off_range"]),
            max_useful_gpus=doc["max_useful_gpus"],
            baseline_tokens_per_s_per_gpu=doc.get("baseline_tokens_per_s_per_gpu"),
            notes=list(doc.get("notes") or []),
            baseline_gpus=doc.get("baseline_gpus", 1),
            dp_stops_paying_off_full=doc.get("dp_stops_paying_off_full"),
            next_measurement=doc.get("next_measurement"),
        )

    def command_lines(self) -> list[str]:
        """Each row's `scaling run` command, with the GPU count it answers for."""
        return [f"{r.command}  # {r.gpus} GPU{'s' if r.gpus != 1 else ''}" for r in self.rows if r.command]

    def predicted_from(self) -> list[str]:
        """Where the `predicted` rows' figures come from (their MFU and network), one line per source, with the GPU
        counts it answers for: a plan made before any point ran says on what it rests."""
        by_source: dict[str, list[int]] = {}
        for r in self.rows:
            if r.source == PREDICTED:
                by_source.setdefault(r.source_detail or "no source recorded", []).append(r.gpus)
        return [
            f"Predicted ({', '.join(map(str, gpus))} GPU{'s' if gpus != [1] else ''}): {source}."
            for source, gpus in by_source.items()
        ]

    def caveats(self) -> list[str]:
        """How the answer was found: the network, the candidates and how their mbs is known, the bands, where the
        predicted rows come from, notes."""
        return [
            *self.predicted_from(),
            f"Network: {self.network}.",
            "Candidates (the largest mbs that fits per rank at the fewest GPUs it fits on): "
            + "; ".join(f"{c.name}: mbs {c.mbs_max}{_from(c)} ({c.fits})" for c in self.candidates)
            + ".",
            f"Efficiency is tokens/s per GPU against the best configuration on {_gpus(self.baseline_gpus)}. Bands: "
            "measured rows carry their "
            f"record's noise band, extrapolated ones the {BAND[0]:g}-{BAND[1]:g}% percentiles of the step model's "
            "bootstrap draws (fitted on each candidate's measured points at that mbs, under the network above, with "
            "the run-to-run spread and the model-form terms past the measured dp: docs/dp-extrapolation.md); past "
            "the horizon a row gives no figure and says why (beyond_horizon). "
            "Ties are configurations whose band reaches the recommended one's figure: equally good within the noise.",
            *self.notes,
        ]


def _gpus(n: Optional[int]) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _from(c: Candidate) -> str:
    """`` at 1 GPU, ` from 8 GPUs` where it fits only when sharded over more."""
    return "" if c.fit_gpus in (None, 1) else f" from {_gpus(c.fit_gpus)}"


def _candidate(fields: dict[str, Any]) -> Candidate:
    """A candidate as recipe.json holds it (its pairs as lists)."""
    return Candidate(**{**fields, "mbs_at": tuple(tuple(p) for p in fields.get("mbs_at") or ())})


Estimator = Callable[[Candidate, Split], "Optional[Estimate | Beyond]"]
"""A candidate's estimate at a split: the record at that split if there is one, else its fitted model's (Beyond
past the model's horizon)."""


def best_option(
    candidates: Sequence[Candidate], gbs_samples: int, seq_len: int, gpus: int, estimate: Estimator
) -> tuple[Optional[Option], list[Option], list[str], Optional[str]]:
    """The fastest candidate at `gpus` (most tokens/s per GPU, nominal), the others whose band reaches its nominal
    figure or whose nominal figure lies in its band (ties), why each other candidate has no figure, and the reason
    of the horizon where a candidate's figure lies past it."""
    options, why, seen = [], [], set()
    beyond: Optional[str] = None
    for c in candidates:
        same = (c.zero_stage, c.recompute, c.shard_at(gpus), c.mbs_for(gpus))
        if same in seen:  # a hybrid candidate whose groups span every rank at this count is its full sharding
            continue
        seen.add(same)
        if c.mbs_for(gpus) < 1:
            why.append(f"ZeRO-{c.zero_stage} {c.recompute} does not fit at {gpus} GPUs")
            continue
        s = split(gbs_samples, seq_len, gpus, c.mbs_for(gpus))
        if s is None:
            continue
        e = estimate(c, s)
        if isinstance(e, Beyond):
            beyond = beyond or e.reason
            why.append(f"ZeRO-{c.zero_stage} {c.recompute} past its horizon")
            continue
        if e is None:
            why.append(f"ZeRO-{c.zero_stage} {c.recompute}")
            continue
        options.append(Option(c, s, e))
    if not options:
        return None, [], why, beyond
    best = max(options, key=lambda o: o.estimate.tokens_per_s_per_gpu)
    b = best.estimate
    ties = [
        o
        for o in options
        if o is not best and (o.estimate.high >= b.tokens_per_s_per_gpu or b.low <= o.estimate.tokens_per_s_per_gpu)
    ]
    return best, ties, why, beyond


def knee(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    counts: Sequence[int],
    estimate: Estimator,
    baseline: float,
    threshold: float,
) -> tuple[Optional[int], tuple[Optional[int], Optional[int]]]:
    """The first GPU count whose best configuration's efficiency (against `baseline`, the most per GPU) is below
    `threshold`, and its range: the first count whose band's high end is below it, and whose low end is."""
    first = earliest = latest = None
    for n in sorted(counts):
        best, _, _, _ = best_option(candidates, gbs_samples, seq_len, n, estimate)
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
) -> tuple[list[Row], Optional[int], tuple[Optional[int], Optional[int]], Optional[float], Optional[int]]:
    """The rows for the requested GPU counts, the first GPU count past the baseline below `threshold` with its range,
    the baseline (the most tokens/s per GPU at any count: 1 GPU but for a model that only sharding, or recompute,
    fits on few) and its count. Pure: every figure comes from `estimate`."""
    top = max_useful_gpus(gbs_samples)
    counts = sorted({*(2**k for k in range(top.bit_length()) if 2**k <= top), *(n for n in gpus if n <= top)})
    baseline = baseline_gpus = None
    for n in counts:  # the most tokens/s per GPU at any count: one device, unless only sharding or recompute fits it
        base, _, _, _ = best_option(candidates, gbs_samples, seq_len, n, estimate)
        if base is not None and (baseline is None or base.estimate.tokens_per_s_per_gpu > baseline):
            baseline, baseline_gpus = base.estimate.tokens_per_s_per_gpu, n
    rows = []
    for n in gpus:
        row = Row(gpus=n)
        best, ties, why, beyond = best_option(candidates, gbs_samples, seq_len, n, estimate)
        if n > top:
            row.reason = (
                f"more GPUs than the batch can use: {gbs_samples} samples split over at most {top} GPUs "
                f"(mbs=1, grad_acc=1); use at most {top} GPUs, a larger global batch (at least {n * seq_len:,} "
                "tokens), or tensor or pipeline parallelism to use the rest"
            )
        elif best is None and candidates and all(c.mbs_for(n) < 1 for c in candidates):
            starts = sorted((c.fit_gpus, c.name) for c in candidates if c.fit_gpus is not None)
            row.reason = f"no configuration fits per rank at {n} GPUs: " + "; ".join(
                f"{name} fits from {fit} GPUs" for fit, name in starts
            )
        elif best is None and beyond is not None:
            row.source, row.reason = BEYOND_HORIZON, beyond
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
        row.dp_shard = c.shard_at(n)
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
                "dp_shard": o.candidate.shard_at(n),
                "mbs": o.split.mbs,
                "grad_acc": o.split.grad_acc,
                "tokens_per_s_per_gpu": o.estimate.tokens_per_s_per_gpu,
                "source": o.estimate.source,
            }
            for o in ties
        ]
        row.command = command(c, s) if command else None
        if row.dp_shard is not None:
            row.versus_full = _versus_full(candidates, gbs_samples, seq_len, n, estimate, predicted_peak)
        rows.append(row)
    first, band = (
        knee(candidates, gbs_samples, seq_len, [n for n in counts if n >= baseline_gpus], estimate, baseline, threshold)
        if baseline
        else (
            None,
            (None, None),
        )
    )
    return rows, first, band, baseline, baseline_gpus


def full_sharding(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates that shard over every rank (none of hybrid sharding)."""
    return [c for c in candidates if c.dp_shard is None]


def _versus_full(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    gpus: int,
    estimate: Estimator,
    predicted_peak: Optional[Callable[[Candidate, Split], Optional[int]]],
) -> Optional[dict[str, Any]]:
    """The best full-sharding option at `gpus` (name, tokens/s per GPU with its band, peak memory per rank)."""
    best, _, _, _ = best_option(full_sharding(candidates), gbs_samples, seq_len, gpus, estimate)
    if best is None:
        return None
    e = best.estimate
    peak = (
        e.peak_mem_bytes
        if e.peak_mem_bytes is not None
        else (predicted_peak(best.candidate, best.split) if predicted_peak else None)
    )
    return {
        "run": best.candidate.name,
        "mbs": best.split.mbs,
        "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
        "low": e.low,
        "high": e.high,
        "peak_mem_bytes": peak,
    }


def knee_of_full_sharding(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    estimate: Estimator,
    baseline: Optional[float],
    baseline_gpus: Optional[int],
    threshold: float,
) -> Optional[int]:
    """Where DP stops paying off with full sharding alone, when hybrid sharding is among the candidates (None
    otherwise, or when it stays above the threshold): what hybrid sharding moves."""
    full = full_sharding(candidates)
    if len(full) == len(candidates) or not full or not baseline or baseline_gpus is None:
        return None
    top = max_useful_gpus(gbs_samples)
    counts = [2**k for k in range(top.bit_length()) if baseline_gpus <= 2**k <= top]
    return knee(full, gbs_samples, seq_len, counts, estimate, baseline, threshold)[0]
