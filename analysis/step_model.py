"""A training step at dp=n with a fixed global batch: what each ZeRO stage communicates, and how long the step takes.

One configuration (model, seq_len, mbs, ZeRO stage, precision; dp varies) takes per optimizer step

    grad_acc(n) = gbs / (mbs·n)        (a fixed global batch; a sweep that fixed grad_acc instead keeps it)
    step_s(n)   = grad_acc(n)·compute_s + exposed communication(n)

so as dp grows, grad_acc falls and communication is amortised over fewer micro-steps. Communication per
stage, as the engine issues it (bytes from the parameter count; gradients are reduced in fp32, parameters
travel in bf16 only under FSDP2's mixed precision, DDP's parameters are fp32):

  ZeRO-0  one all-reduce of the gradients per step, bucketed and overlapped with the last backward
  ZeRO-1  the same, plus an all-gather of the updated parameter shards after the optimizer (exposed)
  ZeRO-2  a reduce-scatter of the gradients every micro-step, overlapped with its backward, and the
          parameters all-gathered once per step, prefetched beside the forward
  ZeRO-3  a reduce-scatter every micro-step and parameter all-gathers in its forward and again in its
          backward, overlapped with that micro-step's compute
  (with parallel.fsdp_grad_reduce=last_micro_step, ZeRO-2/3 reduce-scatter once, in the last backward, and
  gather the parameters on every micro-step; records without the setting did that)

An overlap fraction o hides o of the overlappable communication, at most the compute it runs beside:
hidden = min(o·comm, window), the window being the backward (BACKWARD_SHARE of a micro-step's compute) or,
for ZeRO-3, the whole micro-step. Each collective costs what `scaling.core.network` says at its tier.
Pure arithmetic: numpy and the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from scaling.core.network import Network, tier_of

BACKWARD_SHARE = 2 / 3
"""Share of a micro-step's compute in backward: twice the forward's FLOPs (no recomputation)."""
GRAD_BYTES = 4
"""Gradients are reduced in fp32 at every stage: DDP's parameters (and so gradients) stay fp32 under autocast,
and FSDP2's MixedPrecisionPolicy reduces in fp32."""
MICRO, STEP = "micro-step", "step"
EVERY, LAST = "every_micro_step", "last_micro_step"
"""`parallel.fsdp_grad_reduce` (scaling.core.validate.FSDP_GRAD_REDUCE)."""
BACKWARD, WHOLE = "backward", "micro-step"


@dataclass(frozen=True)
class Collective:
    """One collective of a stage: what it moves, how often, and what compute it can hide behind (None: none)."""

    op: str
    moves: str
    """`grad` or `param`."""
    per: str
    """MICRO (every micro-step) or STEP (once per optimizer step)."""
    window: Optional[str]
    """BACKWARD, WHOLE (the micro-step's forward and backward) or None (exposed)."""


STAGE_COLLECTIVES: dict[tuple[int, str], tuple[Collective, ...]] = {
    # DDP: one bucketed all-reduce in the last backward; ZeroRedundancyOptimizer gathers the updated shards in step()
    (0, EVERY): (Collective("all_reduce", "grad", STEP, BACKWARD),),
    (1, EVERY): (Collective("all_reduce", "grad", STEP, BACKWARD), Collective("all_gather", "param", STEP, None)),
    # FSDP2: gathers prefetched beside the forward; ZeRO-2 keeps its parameters gathered between micro-steps
    (2, EVERY): (Collective("reduce_scatter", "grad", MICRO, BACKWARD), Collective("all_gather", "param", STEP, WHOLE)),
    (3, EVERY): (Collective("reduce_scatter", "grad", MICRO, WHOLE), Collective("all_gather", "param", MICRO, WHOLE),
                 Collective("all_gather", "param", MICRO, WHOLE)),
    # parallel.fsdp_grad_reduce=last_micro_step: one reduce-scatter in the last backward; parameters resharded
    # after every backward, so gathered again on every micro-step
    (2, LAST): (Collective("reduce_scatter", "grad", STEP, BACKWARD), Collective("all_gather", "param", MICRO, WHOLE)),
    (3, LAST): (Collective("reduce_scatter", "grad", STEP, BACKWARD), Collective("all_gather", "param", MICRO, WHOLE),
                Collective("all_gather", "param", MICRO, WHOLE)),
}
"""What each (ZeRO stage, parallel.fsdp_grad_reduce) communicates; stages 0-1 do not read the latter."""
WINDOW_SHARE = {BACKWARD: BACKWARD_SHARE, WHOLE: 1.0}


@dataclass(frozen=True)
class Workload:
    """The fixed part of one configuration: what it communicates and how its global batch splits over dp."""

    zero_stage: int
    n_params: int
    precision: str
    mbs: int
    seq_len: int
    gbs: Optional[int]
    """Global batch in samples, fixed across dp; None when the sweep fixed grad_acc instead."""
    grad_acc: int = 1
    """grad_acc at every dp when gbs is None."""
    fsdp_grad_reduce: str = EVERY
    """Stages 2-3: reduce-scatter on every micro-step or only the last (`parallel.fsdp_grad_reduce`)."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage}: valid stages are 0, 1, 2, 3")
        if self.fsdp_grad_reduce not in (EVERY, LAST):
            raise ValueError(f"fsdp_grad_reduce={self.fsdp_grad_reduce!r}: valid are {EVERY}, {LAST}")

    def collectives(self) -> tuple[Collective, ...]:
        """The collectives this configuration issues (STAGE_COLLECTIVES)."""
        return STAGE_COLLECTIVES[self.zero_stage, EVERY if self.zero_stage <= 1 else self.fsdp_grad_reduce]

    def grad_acc_at(self, n: int) -> Optional[int]:
        """grad_acc at dp=n, or None when the fixed global batch does not split into whole micro-steps."""
        if self.gbs is None:
            return self.grad_acc
        ga, rest = divmod(self.gbs, self.mbs * n)
        return ga if ga >= 1 and rest == 0 else None

    def bytes_of(self, moves: str) -> float:
        """Bytes one collective of this kind moves (the whole buffer)."""
        if moves == "grad":
            return self.n_params * GRAD_BYTES
        return self.n_params * (2 if self.zero_stage >= 2 and self.precision == "bf16" else 4)

    def batch(self) -> str:
        """How the global batch splits over dp, in words."""
        if self.gbs is None:
            return (f"the sweep does not fix the global batch across dp: extrapolated at grad_acc={self.grad_acc} "
                    "(that of the largest measured dp), the global batch growing with dp")
        return f"global batch fixed at {self.gbs} samples: grad_acc = {self.gbs} / ({self.mbs} × dp)"

    def tokens_per_rank(self, n: int) -> float:
        """Tokens one rank processes per optimizer step at dp=n."""
        return float(self.mbs * self.seq_len * (self.grad_acc_at(n) or np.nan))


def comm_groups(w: Workload, net: Network, n: int) -> dict[tuple[str, Optional[str]], float]:
    """Seconds of communication per (how often, window), summed over the stage's collectives at dp=n."""
    groups: dict[tuple[str, Optional[str]], float] = {}
    if n < 2:
        return groups
    tier = net.tier(n)
    if tier is None:
        raise ValueError(f"dp={n}: the network has no figures for its tier ({tier_of(n, net.devices_per_node)})")
    for c in w.collectives():
        key = (c.per, c.window)
        groups[key] = groups.get(key, 0.0) + tier.time_s(c.op, n, w.bytes_of(c.moves))
    return groups


def step_time_s(w: Workload, net: Network, n: int, compute_s: float, overlap: float,
                grad_acc: Optional[int] = None) -> float:
    """Seconds of one optimizer step at dp=n: grad_acc micro-steps of compute plus exposed communication."""
    ga = grad_acc if grad_acc is not None else w.grad_acc_at(n)
    if ga is None:
        raise ValueError(f"dp={n}: gbs={w.gbs} does not split into whole micro-steps of mbs={w.mbs}")
    total = ga * compute_s
    for (per, window), comm_s in comm_groups(w, net, n).items():
        hidden = 0.0 if window is None else min(overlap * comm_s, WINDOW_SHARE[window] * compute_s)
        total += (comm_s - hidden) * (ga if per == MICRO else 1)
    return total


@dataclass(frozen=True)
class Point:
    """One measured dp of a configuration: its grad_acc and the timed steps (their median is the step time)."""

    dp: int
    grad_acc: int
    step_times_s: tuple[float, ...]

    @property
    def step_time_s(self) -> float:
        """Median of the timed steps."""
        return float(np.median(self.step_times_s))
