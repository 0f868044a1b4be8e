"""A recipe's choices: a `Candidate` (a parallel layout and a recompute setting, with the largest mbs that fits per
rank at each GPU count), how a dp count splits the global batch (`split`, `scaling plan`'s rule), and
a candidate's figure at a split (`Estimate`: measured, extrapolated or predicted, with its band; `Beyond`: past the
horizon). scaling.recipe.decide picks among them; scaling.recipe.answer holds what it picked."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from scaling.core.batch import plan
from scaling.core.enums import ZeroStage
from scaling.core.layout import Layout, configuration_name

MEASURED, EXTRAPOLATED, PREDICTED, BEYOND_HORIZON = "measured", "extrapolated", "predicted", "beyond_horizon"
TIE_RULE = (
    "a tie (either figure within the other's band) goes to less: fewer parallel axes, full sharding over hybrid, "
    "less recomputation, then less memory per rank (more headroom), then the faster"
)
"""How the recipe picks among options tied at a GPU count (scaling.recipe.decide.best_option)."""


@dataclass(frozen=True)
class Candidate:
    """One way to train the model: a parallel layout and a recompute setting, with the largest mbs that fits per rank
    at the GPU counts it runs at (sharding makes room as they grow: ZeRO-3 fits a model no one device holds)."""

    layout: Layout
    """Its layout at the fewest GPUs it names (scaling.core.layout): the ZeRO stage, tp, and the shard group of
    hybrid sharding; `at` spreads it over any count."""
    recompute: str
    mbs_max: int
    """The largest mbs at the fewest GPUs it fits on (`fit_gpus`)."""
    fits: str
    """How mbs_max is known, in words: confirmed by runs, or predicted (and by what)."""
    mbs_at: tuple[tuple[int, int], ...] = ()
    """(GPUs, the largest mbs that fits per rank there; 0: not even mbs=1) at the counts it was judged at, in order;
    empty: mbs_max at every count."""

    @property
    def name(self) -> str:
        """`ZeRO-2 (shard over 8), tp 2, recompute none`: its layout's axes and its recompute setting."""
        return f"{self.layout.kind}, recompute {self.recompute}"

    def at(self, gpus: int) -> Optional[Layout]:
        """Its layout over `gpus` GPUs (None where its model-parallel degrees do not divide them)."""
        return self.layout.at(gpus)

    def runs(self, layout: Layout, recompute: str) -> bool:
        """Whether a point of this layout and recompute setting is this candidate's (the one identity the estimator's
        cache, record matching and the next measurement use)."""
        return recompute == self.recompute and self.at(layout.world_size) == layout

    def split_at(self, gbs_samples: int, seq_len: int, gpus: int) -> Optional[Split]:
        """How the batch splits at `gpus` GPUs over its dp ranks (`split`), at the largest mbs that fits there; None
        where nothing fits or its layout does not divide the count."""
        layout, mbs = self.at(gpus), self.mbs_for(gpus)
        return split(gbs_samples, seq_len, layout.dp, mbs) if layout is not None and mbs >= 1 else None

    def mbs_for(self, gpus: int) -> int:
        """The largest mbs that fits per rank at `gpus` GPUs: that of the largest count judged at or below it (memory
        per rank does not grow with the count), 0 where none fits."""
        if not self.mbs_at:
            return self.mbs_max
        return max((m for n, m in self.mbs_at if n <= gpus), default=0)

    def without(self, mbs: int, gpus: int, why: str) -> Candidate:
        """This candidate with `mbs` and larger ruled out where a run of it on `gpus` GPUs (`why`: its split) ran out
        of memory: there and at fewer GPUs (memory per rank does not shrink with fewer GPUs, nor with more micro-steps:
        past the first, the accumulated gradients are held whatever their number), and at every count when nothing is
        sharded over dp (ZeRO-0: a rank holds the same at any count)."""
        everywhere = self.layout.zero_stage == ZeroStage.NONE
        judged = self.mbs_at or ((1, self.mbs_max), (gpus + 1, self.mbs_max))
        capped = tuple((n, min(m, mbs - 1) if everywhere or n <= gpus else m) for n, m in judged)
        fewest = next((n for n, m in capped if m >= 1), None)
        return Candidate(
            self.layout,
            self.recompute,
            dict(capped).get(fewest, 0) if fewest is not None else 0,
            f"{self.fits}; mbs={mbs} ran out of memory on {gpus} GPU(s) ({why}): at most {mbs - 1} there",
            capped,
        )

    @property
    def fit_gpus(self) -> Optional[int]:
        """The fewest GPUs (of those judged) at which mbs=1 fits per rank; None: none of them."""
        return next((n for n, m in self.mbs_at if m >= 1), None) if self.mbs_at else 1


@dataclass(frozen=True)
class Split:
    """How `dp` data-parallel ranks split the global batch: gbs = mbs × grad_acc × dp samples (each dp rank is the
    layout's model-parallel GPUs)."""

    dp: int
    mbs: int
    grad_acc: int
    gbs_tokens: int
    """The effective global batch in tokens (the target's when `exact`)."""
    exact: bool


def split(gbs_samples: int, seq_len: int, dp: int, mbs_max: int) -> Optional[Split]:
    """The recipe's split over `dp` ranks: the largest mbs ≤ mbs_max that leaves grad_acc ≥ 1, grad_acc = gbs /
    (mbs × dp) (`scaling plan`'s rule). An mbs down to half of that which splits the batch exactly is preferred
    (mbs 16 × grad_acc 2 over mbs 18 × grad_acc 1.8); otherwise grad_acc is the whole number ≥ 1 whose batch is
    nearest the target, and the split says the batch it makes. None when even mbs=1 leaves grad_acc below 1."""
    top = min(mbs_max, gbs_samples // dp)
    if top < 1:
        return None
    mbs = next((m for m in range(top, (top - 1) // 2, -1) if gbs_samples % (m * dp) == 0), top)
    p = plan(gbs_samples * seq_len, seq_len, mbs, dp)
    if p.grad_acc is not None:
        return Split(dp, mbs, p.grad_acc, gbs_samples * seq_len, True)
    ga = min(
        {max(1, math.floor(p.grad_acc_exact)), max(1, math.ceil(p.grad_acc_exact))},
        key=lambda g: (abs(g * mbs * dp - gbs_samples), g),
    )
    return Split(dp, mbs, ga, ga * mbs * dp * seq_len, False)


def max_useful_gpus(gbs_samples: int, candidates: Sequence[Candidate] = ()) -> int:
    """The most GPUs the batch can use at all: one sample per dp rank (mbs 1, grad_acc 1), each dp rank as many GPUs
    as the widest model-parallel layout among the candidates."""
    return gbs_samples * max((c.layout.model_parallel for c in candidates), default=1)


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
    why_wide: Optional[Callable[[], str]] = field(default=None, compare=False, repr=False)
    """What `described` adds to `detail` for a band wider than scaling.perf.extrapolation.WIDE: which unknown makes it
    so, worked out when asked (three more bands of draws, which no decision between figures needs)."""

    def described(self) -> str:
        """`detail` in full, as a row says it: with why a wide band is wide."""
        return self.detail + (self.why_wide() if self.why_wide is not None else "")


@dataclass(frozen=True)
class Beyond:
    """No figure: the split's GPU count lies past the horizon of the candidate's extrapolation (scaling.perf.extrapolation)."""

    reason: str


@dataclass
class Option:
    """One candidate at one GPU count: its layout there, its split and estimate."""

    candidate: Candidate
    split: Split
    estimate: Estimate

    @property
    def layout(self) -> Layout:
        """The candidate's layout at the split's dp."""
        return self.candidate.layout.with_dp(self.split.dp)

    @property
    def name(self) -> str:
        """The configuration's one name (scaling.core.layout.configuration_name)."""
        return configuration_name(self.layout, self.candidate.recompute, self.split.mbs, self.split.grad_acc)


Estimator = Callable[[Candidate, Split], "Optional[Estimate | Beyond]"]
"""A candidate's estimate at a split: the record at that split if there is one, else its fitted model's (Beyond
past the model's horizon)."""
