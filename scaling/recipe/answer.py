"""The recipe's answer: per requested GPU count a `Row` (the configuration to run, its figure and band, where it comes
from, its memory and command, or why there is none), and the `Recipe` around them (where data parallelism stops
paying off, the most GPUs the batch can use, the next measurement, notes), as recipe.json holds it. Made by
scaling.recipe.decide and scaling.recipe.measure, written by scaling.recipe.render."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from scaling.core.layout import Layout, configuration_name
from scaling.perf.extrapolation import BAND
from scaling.recipe.options import EXTRAPOLATED, PREDICTED, TIE_RULE, Candidate

RECIPE_MD, RECIPE_JSON = "recipe.md", "recipe.json"
"""The recipe's files in the sweep directory (`scaling report` opens with the first)."""


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
    margin_frac: Optional[float] = None
    """The share of the capacity its fit leaves for the predictor's measured error (scaling.predictor.margin; 0 where
    runs confirm it); at most the headroom."""
    ties: list[dict[str, Any]] = field(default_factory=list)
    command: Optional[str] = None
    reason: Optional[str] = None
    dp_shard: Optional[int] = None
    """Hybrid sharding: the ranks each shard spans (None: full sharding, or a stage that does not shard)."""
    tp: int = 1
    """Tensor parallelism: GPUs per dp rank (dp × tp = gpus)."""
    tp_why: Optional[str] = None
    """Why this row runs tensor parallelism (None without it)."""
    pp: int = 1
    """Pipeline stages: GPUs per dp rank with tp (dp × tp × pp = gpus)."""
    pp_why: Optional[str] = None
    """Where the recipe weighed pipeline stages: why this row runs them, or why not (None: not weighed)."""
    recompute_why: Optional[str] = None
    """Why this row recomputes (None without recomputation): it fits only with it, or it is faster (at a larger mbs)
    than the best option that recomputes less."""
    versus_full: Optional[dict[str, Any]] = None
    """Where hybrid sharding is run: the best full-sharding option beside it (its tokens/s per GPU and band, and the
    peak memory per rank of both), so the row says by how much hybrid wins and at what memory cost."""

    def place(self, layout: Layout) -> None:
        """Set the row's layout fields (recipe.json keeps them flat) from `layout`."""
        self.zero_stage, self.dp, self.dp_shard, self.tp = int(layout.zero_stage), layout.dp, layout.dp_shard, layout.tp
        self.pp = layout.pp

    @property
    def layout(self) -> Optional[Layout]:
        """The layout the row runs (None where it has none)."""
        return None if self.dp is None else Layout(self.zero_stage or 0, self.dp, self.dp_shard, self.tp, self.pp)

    @property
    def run(self) -> Optional[str]:
        """The configuration's one name (scaling.core.layout.configuration_name)."""
        layout = self.layout
        return None if layout is None else configuration_name(layout, self.recompute, self.mbs, self.grad_acc)


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
    """The GPU count efficiency is relative to: where the best configuration goes fastest per GPU (1 GPU, but for a
    model that only sharding, or recompute, fits on few)."""
    dp_stops_paying_off_full: Optional[int] = None
    """With hybrid sharding among the candidates: where DP stops paying off with full sharding alone (None: the
    same, or not at any count the batch can use)."""
    baseline_run: Optional[str] = None
    """The configuration efficiency is relative to (at baseline_gpus), by its name."""
    pipeline: Optional[str] = None
    """Whether the recipe weighed pipeline stages, and why (scaling.recipe.candidates.pipeline_decision)."""
    next_measurement: Optional[dict[str, Any]] = None
    """The point whose measurement would narrow the least certain row most (scaling.recipe.next_point), or None."""
    dp_judged_gpus: Optional[int] = None
    """The largest GPU count the knee had a figure for (past it: beyond the horizon); None: none, or an older file."""

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
            "baseline_run": self.baseline_run,
            "dp_stops_paying_off_full": self.dp_stops_paying_off_full,
            "dp_judged_gpus": self.dp_judged_gpus,
            "next_measurement": self.next_measurement,
            "pipeline": self.pipeline,
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
            baseline_run=doc.get("baseline_run"),
            dp_stops_paying_off_full=doc.get("dp_stops_paying_off_full"),
            dp_judged_gpus=doc.get("dp_judged_gpus"),
            next_measurement=doc.get("next_measurement"),
            pipeline=doc.get("pipeline"),
        )

    def command_lines(self) -> list[str]:
        """Each row's `scaling run` command, with the GPU count it answers for."""
        return [f"{r.command}  # {gpus_said(r.gpus)}" for r in self.rows if r.command]

    def predicted_from(self) -> list[str]:
        """Where the `predicted` rows' figures come from (their MFU and network), then the `extrapolated` ones' (the
        network, the measured dp they were fitted on, a misfit and a bound), one line per source, with the GPU counts
        it answers for: a plan made before any point ran says on what it rests, and a figure not measured whence."""
        by_source: dict[tuple[str, str], list[int]] = {}
        for r in self.rows:
            if r.source in (PREDICTED, EXTRAPOLATED):
                by_source.setdefault((r.source, r.source_detail or "no source recorded"), []).append(r.gpus)
        return [
            f"{kind.capitalize()} ({', '.join(map(str, gpus))} GPU{'s' if gpus != [1] else ''}): {source}."
            for (kind, source), gpus in sorted(by_source.items(), key=lambda kv: kv[0][0] != PREDICTED)
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
            f"Efficiency is tokens/s per GPU against the best configuration on {gpus_said(self.baseline_gpus)}. Bands: "
            "measured rows carry their "
            f"record's noise band, extrapolated ones the {BAND[0]:g}-{BAND[1]:g}% percentiles of the step model's "
            "bootstrap draws (fitted on each candidate's measured points at that mbs, under the network above, with "
            "the run-to-run spread and the model-form terms past the measured dp: docs/dp-extrapolation.md); past "
            "the horizon a row gives no figure and says why (beyond_horizon). "
            "Ties are configurations whose figure lies within the recommended one's band, or whose band holds its "
            f"figure (scaling.core.noise.tied): equally good within the noise; {TIE_RULE}.",
            *self.notes,
        ]


def gpus_said(n: Optional[int]) -> str:
    """`1 GPU`, `8 GPUs`: a count of GPUs in the recipe's words."""
    return f"{n} GPU{'s' if n != 1 else ''}"


def _from(c: Candidate) -> str:
    """`` at 1 GPU, ` from 8 GPUs` where it fits only when sharded over more."""
    return "" if c.fit_gpus in (None, 1) else f" from {gpus_said(c.fit_gpus)}"


def _candidate(fields: dict[str, Any]) -> Candidate:
    """A candidate as recipe.json holds it (its layout a dict, its pairs as lists)."""
    return Candidate(
        **{
            **fields,
            "layout": Layout(**fields["layout"]),
            "mbs_at": tuple(tuple(p) for p in fields.get("mbs_at") or ()),
        }
    )
