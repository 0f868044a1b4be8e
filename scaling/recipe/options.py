"""A recipe's choices: a `Candidate` (a ZeRO stage, a recompute setting and hybrid sharding, with the largest mbs
that fits per rank at each GPU count), how a GPU count splits the global batch (`split`, `scaling plan`'s rule), and
a candidate's figure at a split (`Estimate`: measured, extrapolated or predicted, with its band; `Beyond`: past the
horizon). scaling.recipe.decide picks among them; scaling.recipe.answer holds what it picked."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from scaling.core.batch import plan

MEASURED, EXTRAPOLATED, PREDICTED, BEYOND_HORIZON = "measured", "extrapolated", "predicted", "beyond_horizon"


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
    """Hybrid sharding: the dp ranks each shard spans wherever it divides their count (None: full sharding)."""
    tp: int = 1
    """Tensor parallelism: the GPUs of each dp rank (its block's matmuls split over them); GPUs = dp × tp."""

    @property
    def name(self) -> str:
        """`ZeRO-2, recompute none` (`, sharded over 8` under hybrid sharding, `, tp 2` under tensor parallelism)."""
        hybrid = f", sharded over {self.dp_shard}" if self.dp_shard else ""
        return f"ZeRO-{self.zero_stage}, recompute {self.recompute}{hybrid}" + (
            f", tp {self.tp}" if self.tp > 1 else ""
        )

    def shard_at(self, dp: int) -> Optional[int]:
        """parallel.dp_shard at `dp` ranks: dp_shard where it is a proper divisor, else None (full sharding)."""
        k = self.dp_shard
        return k if k and k < dp and dp % k == 0 else None

    def dp_at(self, gpus: int) -> Optional[int]:
        """The data-parallel ranks at `gpus` GPUs: gpus / tp, None where tp does not divide them."""
        return gpus // self.tp if gpus >= self.tp and gpus % self.tp == 0 else None

    def split_at(self, gbs_samples: int, seq_len: int, gpus: int) -> Optional[Split]:
        """How the batch splits at `gpus` GPUs over its dp ranks (`split`), at the largest mbs that fits there; None
        where nothing fits or tp does not divide the count."""
        dp, mbs = self.dp_at(gpus), self.mbs_for(gpus)
        return split(gbs_samples, seq_len, dp, mbs) if dp is not None and mbs >= 1 else None

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
    """How `gpus` data-parallel ranks split the global batch: gbs = mbs × grad_acc × gpus samples (under tensor
    parallelism each rank is tp GPUs)."""

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


Estimator = Callable[[Candidate, Split], "Optional[Estimate | Beyond]"]
"""A candidate's estimate at a split: the record at that split if there is one, else its fitted model's (Beyond
past the model's horizon)."""
