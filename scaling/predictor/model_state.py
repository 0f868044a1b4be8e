"""The model state a rank holds, by arithmetic: the Playbook's per-rank formulas (`model_state_bytes`), the point's
sizes (`Shapes`), FSDP2's dim-0 padded shards, ZeroRedundancyOptimizer's largest-first partition and single-tensor
AdamW's scratch. The step's peak (scaling.predictor.analytic) builds on these."""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass
from typing import Sequence

from scaling.core.enums import ZeroStage
from scaling.model.llama.args import param_shapes_of

FP32, BF16 = 4, 2


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of the model state: the Playbook's Ψ coefficients."""

    weights: int
    """The compute copy of the weights (bf16: 2, fp32: 4)."""
    grads: int
    """Gradients (bf16: 2, fp32: 4)."""
    k: int
    """fp32 master weights and AdamW m, v (mixed precision: 4 + 8 = 12; fp32 training: 8, no master)."""


PLAYBOOK_MIXED = StateBytes(weights=2, grads=2, k=12)
PLAYBOOK_FP32 = StateBytes(weights=4, grads=4, k=8)


@dataclass(frozen=True)
class ModelState:
    """Model-state bytes per rank."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        """Sum of the three."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def model_state_bytes(n_params: int, zero_stage: int, dp: int, per_param: StateBytes = PLAYBOOK_MIXED) -> ModelState:
    """The Playbook's per-rank model state: ZeRO-1 2Ψ + 2Ψ + kΨ/dp, ZeRO-2 2Ψ + (2Ψ + kΨ)/dp,
    ZeRO-3 (4Ψ + kΨ)/dp (mixed precision; PLAYBOOK_FP32 gives the fp32 version)."""
    if zero_stage not in tuple(ZeroStage):
        raise ValueError(
            f"parallel.zero_stage={zero_stage!r} is not valid: choose one of {', '.join(map(str, ZeroStage))}"
        )
    if dp < 1:
        raise ValueError(f"parallel.dp={dp!r} must be a positive integer")
    psi = float(n_params)
    return ModelState(
        params_bytes=per_param.weights * psi / (dp if zero_stage >= ZeroStage.PARAMETERS else 1),
        grads_bytes=per_param.grads * psi / (dp if zero_stage >= ZeroStage.GRADIENTS else 1),
        optimizer_bytes=per_param.k * psi / (dp if zero_stage >= ZeroStage.OPTIMIZER else 1),
    )


@dataclass(frozen=True)
class Shapes:
    """Sizes of one point that the formulas use (t = mbs x seq_len tokens per micro-step)."""

    L: int
    h: int
    kvd: int
    f: int
    nh: int
    hd: int
    V: int
    tied: bool
    T: int
    mbs: int
    tp: int = 1
    """Tensor parallelism: a rank holds 1/tp of each matmul (and of the embedding and output), the norms whole."""

    @property
    def t(self) -> int:
        return self.mbs * self.T

    @property
    def qd(self) -> int:
        """The attention's width, nh·hd: the query projection's output and the output projection's input (h unless
        the model gives its head_dim)."""
        return self.nh * self.hd

    @property
    def block_matmul(self) -> int:
        """Matmul weights of one block on one rank: (2h·qd + 2·h·kvd + 3·h·f) / tp."""
        return (2 * self.h * self.qd + 2 * self.h * self.kvd + 3 * self.h * self.f) // self.tp

    @property
    def block_params(self) -> int:
        return self.block_matmul + 2 * self.h

    @property
    def root_params(self) -> int:
        """Embedding, output projection unless tied, final norm: what FSDP2's root module holds (on one rank)."""
        return self.V * self.h * (1 if self.tied else 2) // self.tp + self.h

    @property
    def param_shapes(self) -> tuple[tuple[str, bool, int, int], ...]:
        """The parameter tensors in model order (scaling.model.llama.args.param_shapes), as one rank holds them."""
        return local_shapes(param_shapes_of(self.L, self.h, self.kvd, self.f, self.V, self.tied, self.qd), self.tp)

    @property
    def n_tensors(self) -> int:
        return len(self.param_shapes)


def shard(rows: int, cols: int, dp: int) -> int:
    """Elements of one rank's FSDP2 shard of a (rows, cols) parameter: dim 0 padded to a multiple of dp."""
    return math.ceil(rows / dp) * cols


ROWWISE = ("wo", "w2")
"""The built-in decoder's matmuls split along their inputs (dim 1) under tensor parallelism; the others along dim 0."""


def local_shapes(shapes: tuple[tuple[str, bool, int, int], ...], tp: int) -> tuple[tuple[str, bool, int, int], ...]:
    """(name, in a block, rows, cols) of each tensor as one of tp ranks holds it: the matmuls, the embedding and the
    output split (scaling.model.llama.decoder.TP_PLAN), the norms whole."""
    if tp == 1:
        return shapes
    return tuple(
        (name, block, rows, cols if cols == 1 else cols // tp)
        if name in ROWWISE
        else (name, block, rows if cols == 1 else rows // tp, cols)
        for name, block, rows, cols in shapes
    )


def sharded_params(s: Shapes, dp: int) -> tuple[int, int]:
    """Elements per rank of one block's shards and of the root's shards (FSDP2's over dp of each rank's part)."""
    shapes = s.param_shapes
    block = sum(shard(rows, cols, dp) for _, in_block, rows, cols in shapes[1 : 1 + 9] if in_block)
    root = sum(shard(rows, cols, dp) for _, in_block, rows, cols in shapes if not in_block)
    return block, root


def zero1_worst_rank(s: Shapes, dp: int) -> tuple[int, int]:
    """(elements, tensors) of AdamW state on the busiest rank of ZeroRedundancyOptimizer's partition.

    torch assigns whole parameters, largest first, each to the rank with the fewest elements so far, so
    the embedding and the output projection land on a rank each: at large dp the worst rank holds far
    more than Ψ/dp (llama_8b at dp=64: 525M elements, not 125M).
    """
    numels = max(_zero1_partition(s.L, s.h, s.kvd, s.f, s.V, s.tied, dp, s.qd), key=sum)
    return sum(numels), len(numels)


@functools.lru_cache(maxsize=4096)
def _zero1_partition(
    L: int, h: int, kvd: int, f: int, V: int, tied: bool, dp: int, qd: int = 0
) -> tuple[tuple[int, ...], ...]:
    """Per rank, the elements of each tensor ZeroRedundancyOptimizer gives it, in the order its inner optimizer
    steps them (largest first): the greedy partition of `zero1_worst_rank` (a sweep asks for few distinct ones)."""
    return zero1_partition(tuple(rows * cols for _, _, rows, cols in param_shapes_of(L, h, kvd, f, V, tied, qd)), dp)


def zero1_partition(numels: tuple[int, ...], dp: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, the elements of each tensor ZeroRedundancyOptimizer gives it (of tensors of `numels` elements):
    whole tensors, largest first, each to the rank with the fewest elements so far, the lowest such rank."""
    ranks: list[list[int]] = [[] for _ in range(dp)]
    heap = [(0, rank) for rank in range(dp)]  # (elements so far, rank): the least loaded, lowest rank first
    for numel in sorted(numels, reverse=True):
        total, rank = heapq.heappop(heap)
        ranks[rank].append(numel)
        heapq.heappush(heap, (total + numel, rank))
    return tuple(map(tuple, ranks))


@functools.lru_cache(maxsize=4096)
def zero1_step_state(L: int, h: int, kvd: int, f: int, V: int, tied: bool, dp: int, fused: bool, qd: int = 0) -> int:
    """Bytes of AdamW state and scratch while ZeroRedundancyOptimizer steps, on the rank where they are largest."""
    return max(
        2 * FP32 * sum(numels) + FP32 * len(numels) + (0 if fused else FP32 * adamw_scratch(numels))
        for numels in _zero1_partition(L, h, kvd, f, V, tied, dp, qd)
    )


@functools.lru_cache(maxsize=4096)
def model_order_scratch(L: int, h: int, kvd: int, f: int, V: int, tied: bool, dp: int, tp: int = 1, qd: int = 0) -> int:
    """`adamw_scratch` of AdamW over the model's parameters (dp 1) or its FSDP2 shards (dp > 1), in model order."""
    shapes = local_shapes(param_shapes_of(L, h, kvd, f, V, tied, qd), tp)
    return adamw_scratch([shard(rows, cols, dp) for _, _, rows, cols in shapes])


def adamw_scratch(numels: Sequence[int]) -> int:
    """Elements of single-tensor AdamW's scratch at its largest, over tensors stepped in this order: for tensor i,
    the square root of its second moment and that root's quotient by the bias correction (2·numel_i), while the
    previous tensor's denominator is still held by the loop variable it is about to replace (numel_{i-1}). Adjacent
    large tensors (ZeroRedundancyOptimizer's largest-first order puts the embedding and the output projection
    together) make it up to three times the largest tensor."""
    worst, previous = 0, 0
    for numel in numels:
        worst, previous = max(worst, previous + 2 * numel), numel
    return worst
