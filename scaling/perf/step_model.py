"""A training step at dp=n with a fixed global batch: the collectives each ZeRO stage issues, and the step time.

    step_s(n) = grad_acc(n)·compute_s + params_updated(n)·optimizer_s_per_param + exposed communication(n)

`step_collectives` lists one step's collectives as the engine issues them (the single source the fit, the curve and
the comparison with a real step read); `comm_windows` and `step_time_s` cost them on a `Network` (scaling.perf.
network) and hide what the compute window of their phase covers (an overlap fraction). `Workload` is one
configuration (model shape, seq_len, mbs, stage, precision, recompute, clipping), `Point` one measured dp. What each
stage sends per step and why: docs/dp-extrapolation.md. Under pipeline stages (`Workload.pp`) a rank holds the fullest
stage's part (`stage_shape`) and `pipeline_compute_s` replaces grad_acc·compute_s with the bubble, the sends and the
costliest stage's pace. Arithmetic on numpy and the standard library.
"""

from __future__ import annotations

import functools
import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import numpy as np

from scaling.core.enums import Recompute, ZeroStage
from scaling.core.layout import Layout
from scaling.core.recompute import checkpointed_blocks, recomputed_share
from scaling.model.shape import BLOCK, ROOT, ModelShape, ParamTensor
from scaling.perf.network import Network
from scaling.perf.pipeline import bubble_fraction, send_s, stage_costs


def backward_share(recompute: str, every: int = 1, n_blocks: int = 1) -> float:
    """Share of a micro-step's compute in backward: twice the forward's FLOPs, and the share of the forward that
    recomputation runs again (scaling.core.recompute: all of it at full, a share under recompute_every, none of it
    selective, which runs no matmul twice)."""
    again = recomputed_share(recompute, every, n_blocks)
    return (2 + again) / (3 + again)


BACKWARD_SHARE = {str(r): backward_share(r) for r in Recompute}
"""`backward_share` of each `train.recompute` with every block checkpointed: 2/3, 2/3 (selective), 3/4 (full)."""
EVERY, LAST = "every_micro_step", "last_micro_step"
"""`parallel.fsdp_grad_reduce` (scaling.core.enums.FsdpGradReduce)."""
FORWARD, BACKWARD = "forward", "backward"
FIRST_MICRO, EACH_MICRO, LAST_MICRO = "the first micro-step", "every micro-step", "the last micro-step"
# what one call of a collective moves
GRAD_BUCKETS = "gradient buckets"
PARAM_TENSORS = "parameter tensors"
MODULE_PARAMS = "module parameters"
BLOCK_PARAMS = "block parameters"
MODULE_GRADS = "module gradients"
SHARD_GRADS = "gradient shards"
GRAD_NORM = "gradient norm"
ACTIVATIONS = "activations"
LOGITS = "logits"
# the ranks a collective runs over
ALL, SHARD, REPLICAS, TP = "all", "shard", "replicas", "tp"
"""Every dp rank; one shard group (dp_shard consecutive dp ranks: all of them under full sharding); the replicas of
one shard (dp / dp_shard ranks, a shard group apart), which all-reduce their gradient shards under hybrid sharding;
a tensor-parallel group (tp consecutive ranks, within a node). A dp rank's tp ranks sit side by side, so a group of
dp ranks is a ring of ranks tp apart."""


GRAD_BYTES = 4
"""Gradients are reduced in fp32 at every stage: DDP's parameters (and so gradients) stay fp32 under autocast,
and FSDP2's MixedPrecisionPolicy reduces in fp32."""


@functools.lru_cache(maxsize=256)
def ddp_buckets(shape: ModelShape, bucket_bytes: int) -> tuple[int, ...]:
    # DDP's Reducer, once it has rebuilt its buckets after the first step: gradients in the order backward makes
    # them (the reverse of the parameters'), each bucket closed once it holds bucket_bytes or more
    buckets, size = [], 0
    for t in reversed(shape.tensors):
        size += GRAD_BYTES * t.numel
        if size >= bucket_bytes:
            buckets.append(size)
            size = 0
    return tuple(buckets + ([size] if size else []))


@functools.lru_cache(maxsize=4096)
def zero1_busiest(shape: ModelShape, n: int) -> int:
    # ZeroRedundancyOptimizer's partition: largest tensor first, each to the rank with the fewest elements so far
    ranks = [(0, r) for r in range(n)]
    for numel in sorted((t.numel for t in shape.tensors), reverse=True):
        size, r = heapq.heappop(ranks)
        heapq.heappush(ranks, (size + numel, r))
    return max(size for size, _ in ranks)


HOST_BLOCKING_BACKENDS = ("gloo",)
"""Collective backends whose call made without async_op returns once it is done (gloo runs it on the host; NCCL
enqueues it on a stream and returns)."""


def host_blocking_backend(backend: str) -> bool:
    """True where `backend` holds the calling thread through a call issued without async_op."""
    return backend in HOST_BLOCKING_BACKENDS


@dataclass(frozen=True)
class Window:
    """Compute a collective can hide behind: the forward or the backward of the first, every or the last micro-step."""

    phase: str
    """FORWARD or BACKWARD."""
    micro_steps: str
    """FIRST_MICRO, EACH_MICRO or LAST_MICRO."""


@dataclass(frozen=True)
class Collective:
    """One collective a stage issues: what each call moves and the compute it runs beside (None: exposed, once per
    step outside the micro-steps)."""

    op: str
    moves: str
    window: Optional[Window]
    group: str = ALL
    """The ranks it runs over: ALL, SHARD or REPLICAS."""
    issued_async: bool = False
    """Issued with async_op (DDP's Reducer: each bucket's all-reduce returns a Work the backward runs beside). FSDP2
    issues its gathers, reduce-scatters and replica all-reduces without it (no prefetch set: `unshard_async_op`
    False), ordered by streams: on a backend whose call blocks the host until done (`Workload.host_blocking`, gloo)
    they run exposed whatever their window."""


_DDP_REDUCE = Collective("all_reduce", GRAD_BUCKETS, Window(BACKWARD, LAST_MICRO), issued_async=True)
_GATHER_ONCE = Collective("all_gather", MODULE_PARAMS, Window(FORWARD, FIRST_MICRO), SHARD)
_GATHER_FORWARD = Collective("all_gather", MODULE_PARAMS, Window(FORWARD, EACH_MICRO), SHARD)
_GATHER_BACKWARD = Collective("all_gather", BLOCK_PARAMS, Window(BACKWARD, EACH_MICRO), SHARD)
_SCATTER_EACH = Collective("reduce_scatter", MODULE_GRADS, Window(BACKWARD, EACH_MICRO), SHARD)
_SCATTER_LAST = Collective("reduce_scatter", MODULE_GRADS, Window(BACKWARD, LAST_MICRO), SHARD)
# hybrid sharding: each reduce-scattered shard all-reduced across its replicas, in the same backward
_REPLICAS_EACH = Collective("all_reduce", SHARD_GRADS, Window(BACKWARD, EACH_MICRO), REPLICAS)
_REPLICAS_LAST = Collective("all_reduce", SHARD_GRADS, Window(BACKWARD, LAST_MICRO), REPLICAS)
STAGE_COLLECTIVES: dict[tuple[int, str], tuple[Collective, ...]] = {
    (0, EVERY): (_DDP_REDUCE,),
    (1, EVERY): (_DDP_REDUCE, Collective("broadcast", PARAM_TENSORS, None, SHARD)),
    (2, EVERY): (_GATHER_ONCE, _SCATTER_EACH, _REPLICAS_EACH),
    (2, LAST): (_GATHER_ONCE, _SCATTER_LAST, _REPLICAS_LAST),
    (3, EVERY): (_GATHER_FORWARD, _GATHER_BACKWARD, _SCATTER_EACH, _REPLICAS_EACH),
    (3, LAST): (_GATHER_FORWARD, _GATHER_BACKWARD, _SCATTER_LAST, _REPLICAS_LAST),
}
"""What each (ZeRO stage, parallel.fsdp_grad_reduce) issues; stages 0-1 do not read the latter."""
CLIP_REDUCE = Collective("all_reduce", GRAD_NORM, None, SHARD)
"""clip_grad_norm_ over DTensor gradient shards (ZeRO-2/3): `_foreach_norm` gives each gradient's norm as a partial
(p-norm) DTensor, `torch.stack` keeps them partial, and `vector_norm`, whose reduction differs from the partials'
sum, makes the stacked vector whole first: one all-reduce of one fp32 norm per parameter tensor."""


@dataclass(frozen=True)
class Call:
    """Collectives of one optimizer step that are alike: the op, how many calls, the bytes of each (the whole
    buffer: the all-reduced tensor, the gathered output, the reduce-scatter's input, the broadcast tensor) and the
    compute they run beside (None: exposed)."""

    op: str
    count: int
    bytes_per_call: float
    window: Optional[Window]
    group: str = ALL
    """The ranks it runs over (`Workload.ring` says how many, and how many of them share a node)."""
    moves: str = ""
    """What each call moves (GRAD_BUCKETS, MODULE_PARAMS, ...; "" for tensor parallelism's): a sharded module's
    call does host work of its own besides the process group's (scaling.perf.call_cost)."""


@dataclass(frozen=True)
class Workload:
    """The fixed part of one configuration: what it communicates and updates, how its global batch splits over dp."""

    zero_stage: int
    model: ModelShape
    """The model's parameter tensors and blocks, as its family gives them (scaling.model.spec.Family.shape) or its
    record keeps them: decide the buckets and FSDP2 modules."""
    precision: str
    mbs: int
    seq_len: int
    gbs: Optional[int]
    """Global batch in samples, fixed across dp; None when the sweep fixed grad_acc instead."""
    grad_acc: int = 1
    """grad_acc at every dp when gbs is None."""
    fsdp_grad_reduce: str = EVERY
    """Stages 2-3: reduce-scatter on every micro-step or only the last (`parallel.fsdp_grad_reduce`)."""
    recompute: str = "none"
    """`train.recompute`: none, selective (no matmul runs twice) or full (the forward runs again in backward)."""
    grad_clip: float = 0.0
    """`train.grad_clip`: the gradient norm clipped to it, 0 for no clipping."""
    bucket_mb: float = 25.0
    """`parallel.bucket_mb`: DDP's gradient bucket (stages 0-1), in MiB."""
    dp_shard: Optional[int] = None
    """`parallel.dp_shard`: the ranks each ZeRO-1/2/3 shard spans at every dp it divides (hybrid sharding), None:
    every rank (full sharding)."""
    tp: int = 1
    """`parallel.tp`: tensor parallelism, each block's matmuls (and the embedding and output) split over tp ranks;
    n counts dp ranks, the world is n × tp."""
    recompute_every: int = 1
    """`train.recompute_every`: every k-th block checkpointed."""
    pp: int = 1
    """`parallel.pp`: pipeline stages (across nodes); a rank holds and communicates its stage's part, n counts dp
    ranks, the world is n × tp × pp; the step pays the bubble and the sends between stages (`pipeline_compute_s`)."""
    pp_schedule: str = "one_f_one_b"
    """`parallel.pp_schedule` (read where pp > 1)."""
    pp_virtual: int = 1
    """`parallel.pp_virtual`: model chunks per pipeline rank of an interleaved schedule."""
    host_blocking: bool = False
    """The collective backend holds the calling thread until a call made without async_op is done (gloo; NCCL only
    enqueues it on a stream): only the calls issued async (`Collective.issued_async`) can run behind compute
    (`host_blocking_backend`)."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage}: valid stages are 0, 1, 2, 3")
        if self.fsdp_grad_reduce not in (EVERY, LAST):
            raise ValueError(f"fsdp_grad_reduce={self.fsdp_grad_reduce!r}: valid are {EVERY}, {LAST}")
        if self.recompute not in BACKWARD_SHARE:
            raise ValueError(f"recompute={self.recompute!r}: valid are {', '.join(BACKWARD_SHARE)}")

    @property
    def shape(self) -> ModelShape:
        """The model's parameter tensors and blocks."""
        return self.model

    @property
    def n_params(self) -> int:
        """Parameters of the model (Ψ)."""
        return sum(t.numel for t in self.shape.tensors)

    def collectives(self) -> tuple[Collective, ...]:
        """The collectives this configuration issues (STAGE_COLLECTIVES, and clipping's norm at ZeRO-2/3)."""
        stage = STAGE_COLLECTIVES[
            self.zero_stage, EVERY if self.zero_stage < ZeroStage.GRADIENTS else self.fsdp_grad_reduce
        ]
        return stage + ((CLIP_REDUCE,) if self.zero_stage >= ZeroStage.GRADIENTS and self.grad_clip > 0 else ())

    def window_share(self, phase: str) -> float:
        """Share of a micro-step's compute in the forward or the backward."""
        backward = backward_share(self.recompute, self.recompute_every, self.shape.n_blocks)
        return backward if phase == BACKWARD else 1 - backward

    def layout_at(self, n: int) -> Layout:
        """The parallel layout at dp=n (scaling.core.layout): its shard group where dp_shard divides n."""
        return _layout_at(self.zero_stage, n, self.tp, self.pp, self.dp_shard)

    def shard_size(self, n: int) -> int:
        """Ranks a shard spans at dp=n: dp_shard where it is a proper divisor of n, else n."""
        return self.layout_at(n).shard_size

    def ring(self, group: str, n: int, devices_per_node: Optional[int]) -> tuple[int, Optional[int]]:
        """(ranks, ranks of them on one node) of a collective over `group` at dp=n: a tensor-parallel group is tp
        consecutive ranks, dp ranks lie tp apart, a shard group is consecutive dp ranks, the replicas of one shard
        lie a shard group apart."""
        if group == TP:
            return self.tp, devices_per_node
        layout = self.layout_at(n)
        k = layout.shard_size
        per_node = (
            None if devices_per_node is None else max(1, devices_per_node // layout.model_parallel)
        )  # one dp rank's
        if group == ALL:
            return n, per_node
        if group == SHARD:
            return k, per_node
        return n // k, None if per_node is None else max(1, per_node // k)

    def rings_at_once(self, group: str, n: int, devices_per_node: Optional[int]) -> int:
        """Rings of one call over `group` at dp=n that run at once on a node: the node's ranks of the point over the
        ring's ranks there (a dp ring's copy per tensor-parallel rank, hybrid sharding's replica ring per shard
        index); 1 on one node."""
        ranks, per_node = self.ring(group, n, devices_per_node)
        if devices_per_node is None or per_node is None or group == TP:
            return 1
        on_node = min(devices_per_node, self.layout_at(n).world_size)
        return max(1, on_node // per_node) if ranks > per_node else 1

    def calls_of(self, moves: str, n: int) -> list[tuple[float, int]]:
        """(bytes per call, calls) of one round of a collective at dp=n: one call per bucket, tensor or module
        (n: the ranks of its ring)."""
        shape = self.local_shape
        if moves == GRAD_BUCKETS:
            sizes = ddp_buckets(shape, int(self.bucket_mb * 2**20))
        elif moves == PARAM_TENSORS:
            sizes = tuple(4 * t.numel for t in shape.tensors)  # DDP keeps fp32 parameters
        elif moves == GRAD_NORM and self.tp > 1:  # a norm per mesh: the split matrices', then the whole vectors'
            split = sum(1 for t in shape.tensors if t.cols > 1)
            sizes = (4 * split, 4 * (len(shape.tensors) - split))
        elif moves == GRAD_NORM:
            sizes = (4 * len(shape.tensors),)  # the stacked fp32 partial norms of the gradient shards
        elif moves == SHARD_GRADS:  # one module's fp32 gradient shard: the reduce-scatter's output (n: its shards)
            block = GRAD_BYTES * sum(t.shard_numel(n) for t in shape.tensors if t.module == BLOCK) // shape.n_blocks
            root = GRAD_BYTES * sum(t.shard_numel(n) for t in shape.tensors if t.module == ROOT)
            return [(block, shape.n_blocks)] + ([(root, 1)] if root else [])
        else:  # FSDP2 gathers and scatters whole modules, each parameter's dim 0 padded to a multiple of n
            width = GRAD_BYTES if moves == MODULE_GRADS else (2 if self.precision == "bf16" else 4)
            block = n * width * sum(t.shard_numel(n) for t in shape.tensors if t.module == BLOCK) // shape.n_blocks
            root = n * width * sum(t.shard_numel(n) for t in shape.tensors if t.module == ROOT)
            return [(block, shape.n_blocks)] + ([] if moves == BLOCK_PARAMS or not root else [(root, 1)])
        return sorted(Counter(sizes).items())

    @property
    def local_shape(self) -> ModelShape:
        """The parameter tensors one tensor-parallel rank holds (the model's own without tensor parallelism), of the
        fullest pipeline stage under pp (`stage_shape`)."""
        return tp_shape(stage_shape(self.shape, self.pp, self.seq_len), self.tp)

    def params_updated(self, n: int) -> int:
        """Parameters the busiest rank updates at dp=n: all at ZeRO-0, ZeroRedundancyOptimizer's largest share at
        ZeRO-1 (whole tensors), the largest FSDP2 shards at ZeRO-2/3."""
        return _params_updated(self, n)

    def grad_acc_at(self, n: int) -> Optional[int]:
        """grad_acc at dp=n, or None when the fixed global batch does not split into whole micro-steps."""
        if self.gbs is None:
            return self.grad_acc
        ga, rest = divmod(self.gbs, self.mbs * n)
        return ga if ga >= 1 and rest == 0 else None

    def batch(self) -> str:
        """How the global batch splits over dp, in words."""
        if self.gbs is None:
            return (
                f"the sweep does not fix the global batch across dp: extrapolated at grad_acc={self.grad_acc} "
                "(that of the largest measured dp), the global batch growing with dp"
            )
        return f"global batch fixed at {self.gbs} samples: grad_acc = {self.gbs} / ({self.mbs} × dp)"

    def tokens_per_rank(self, n: int) -> float:
        """Tokens per optimizer step of one rank (one GPU) at dp=n: a dp rank's, shared by its tp ranks."""
        return self.layout_at(n).per_gpu(float(self.mbs * self.seq_len * (self.grad_acc_at(n) or np.nan)))


@functools.lru_cache(maxsize=4096)
def _layout_at(zero_stage: int, n: int, tp: int, pp: int, dp_shard: Optional[int]) -> Layout:
    # kept: a band's draws ask for the same few layouts hundreds of thousands of times (a Layout is frozen)
    return Layout(zero_stage, n, tp=tp, pp=pp).with_shard_group(dp_shard)


@functools.lru_cache(maxsize=4096)
def _params_updated(w: Workload, n: int) -> int:
    if w.zero_stage == ZeroStage.NONE:
        return w.n_params
    if w.zero_stage == ZeroStage.OPTIMIZER:
        return zero1_busiest(w.shape, w.shard_size(n))
    return sum(t.shard_numel(w.shard_size(n)) for t in w.local_shape.tensors)


def step_collectives(w: Workload, n: int, grad_acc: int) -> tuple[Call, ...]:
    """The collectives of one optimizer step at dp=n and grad_acc micro-steps, as the engine issues them."""
    return _step_collectives(w, n, grad_acc)


@functools.lru_cache(maxsize=4096)
def _step_collectives(w: Workload, n: int, grad_acc: int) -> tuple[Call, ...]:
    # kept: a band's hundreds of draws ask for the same few
    calls, k = [], w.shard_size(n)
    for c in w.collectives():
        if c.group == REPLICAS and k == n:  # full sharding: no replicas to reduce across
            continue
        rounds = grad_acc if c.window is not None and c.window.micro_steps == EACH_MICRO else 1
        ranks = n if c.group == ALL else k  # a shard's size is that of its group's (SHARD_GRADS: the shard's)
        window = c.window if c.issued_async or not w.host_blocking else None  # its rounds stay the window's
        calls += [
            Call(c.op, count * rounds, size, window, c.group, c.moves) for size, count in w.calls_of(c.moves, ranks)
        ]
    return tuple(calls) + (tp_calls(w, grad_acc) if w.tp > 1 else ())


COLWISE_PER_BLOCK, ROWWISE_PER_BLOCK = 5, 2
"""The built-in decoder's plan per block: q, k, v, gate and up split by columns (each one's input gradient
all-reduced in backward), attention output and down by rows (each one's output all-reduced in forward)."""


def tp_calls(w: Workload, grad_acc: int) -> tuple[Call, ...]:
    """Tensor parallelism's collectives of one step (the built-in decoder's plan, without sequence parallelism),
    exposed: per micro-step, forward: an all-reduce of each block's attention and MLP outputs and of the
    embedding's, the logits gathered; backward: an all-reduce of the input gradient of each column-split matmul and
    of the head (with recompute, the forward's again); with clipping at the step's end, the split matrices' norms
    reduced over the tp ranks too."""
    hidden, vocab = widths(w.shape)
    width = 2 if w.precision == "bf16" else 4
    act, logits = width * w.mbs * w.seq_len * hidden, width * w.mbs * w.seq_len * vocab
    blocks = stage_shape(w.shape, w.pp, w.seq_len).n_blocks  # a pipeline stage's blocks (the fullest stage's)
    forward = ROWWISE_PER_BLOCK * blocks + 1
    again = (
        checkpointed_blocks(blocks, w.recompute_every) if w.recompute == Recompute.full else 0
    )  # selective keeps them
    reduces = forward + COLWISE_PER_BLOCK * blocks + 1 + ROWWISE_PER_BLOCK * again
    calls = [
        Call("all_reduce", reduces * grad_acc, float(act), None, TP),
        Call("all_gather", grad_acc, float(logits), None, TP),
    ]
    if w.grad_clip > 0 and w.zero_stage >= ZeroStage.GRADIENTS:
        calls.append(Call("all_reduce", 1, float(4 * sum(1 for t in w.shape.tensors if t.cols > 1)), None, TP))
    return tuple(calls)


def widths(shape: ModelShape) -> tuple[int, int]:
    """(hidden, vocabulary) of a model: the widest root matrix is the embedding or the head, (vocabulary, hidden)."""
    head = max((t for t in shape.tensors if t.module == ROOT), key=lambda t: t.numel)
    return head.cols, head.rows


@functools.lru_cache(maxsize=256)
def tp_shape(shape: ModelShape, tp: int) -> ModelShape:
    """What one of tp ranks holds of each tensor: every matrix split by tp (the plan's colwise along dim 0, rowwise
    along dim 1: alike in numel), the vectors (norms) whole."""
    if tp == 1:
        return shape
    tensors = tuple(
        t
        if t.cols == 1
        else ParamTensor(
            t.name,
            t.module,
            -(-t.rows // tp) if t.rows % tp == 0 else t.rows,
            t.cols if t.rows % tp == 0 else -(-t.cols // tp),
        )
        for t in shape.tensors
    )
    return ModelShape(shape.name, tensors, shape.n_blocks)


@functools.lru_cache(maxsize=256)
def stage_shape(shape: ModelShape, pp: int, seq_len: int) -> ModelShape:
    """What the fullest of pp pipeline stages holds (by parameters): its blocks of the engine's split by FLOPs
    (scaling.perf.pipeline.stage_costs), the embedding with the first stage, the final norm and head with the last;
    the model itself at pp 1."""
    if pp == 1:
        return shape
    hidden, vocab = widths(shape)
    sizes = [len(r) for r in stage_costs(shape.n_blocks, block_flops(shape, seq_len), 6.0 * hidden * vocab, pp)[0]]
    block = [t for t in shape.tensors if t.module == BLOCK]
    per_block = len(block) // shape.n_blocks
    roots = [t for t in shape.tensors if t.module == ROOT]
    first, last = roots[:1], roots[1:]  # the embedding; the norm and head (a tied head: the first's matrix again)
    last = last if any(t.cols > 1 for t in last) else [*last, *first]

    def held(stage: int) -> list[ParamTensor]:
        ends = (first if stage == 0 else []) + (last if stage == pp - 1 else [])
        return block[: per_block * sizes[stage]] + ends

    fullest = max(range(pp), key=lambda k: sum(t.numel for t in held(k)))
    return ModelShape(f"{shape.name} stage {fullest}/{pp}", tuple(held(fullest)), sizes[fullest])


@functools.lru_cache(maxsize=1024)
def block_flops(shape: ModelShape, seq_len: int) -> float:
    """FLOPs per token of one block: 6 × its matrices' parameters + 12 × hidden × seq_len (attention)."""
    hidden, _ = widths(shape)
    matrices = sum(t.numel for t in shape.tensors if t.module == BLOCK and t.cols > 1)
    return 6.0 * matrices / shape.n_blocks + 12.0 * hidden * seq_len


@functools.lru_cache(maxsize=1024)
def _imbalance(shape: ModelShape, seq_len: int, pp: int, virtual: int) -> tuple[int, float]:
    # (hidden, the costliest rank's FLOPs over the mean's), kept: a band's hundreds of draws ask for the same few. A
    # rank of an interleaved schedule runs every pp-th chunk: its chunks' sum sets its pace
    hidden, vocab = widths(shape)
    block, head = block_flops(shape, seq_len), 6.0 * hidden * vocab
    chunks, _ = stage_costs(shape.n_blocks, block, head, pp * virtual)
    cost = [len(r) * block + (head if k == len(chunks) - 1 else 0.0) for k, r in enumerate(chunks)]
    ranks = [sum(cost[r::pp]) for r in range(pp)]
    return hidden, max(ranks) * pp / sum(ranks)


def pipeline_compute_s(w: Workload, net: Network, n: int, grad_acc: int, compute_s: float) -> float:
    """The compute of one step under pp stages, with `compute_s` a micro-step's compute on one GPU (the model's
    FLOPs shared by its dp rank's tp × pp GPUs): grad_acc micro-batches through the costliest stage (its share of
    the FLOPs over the mean's: `stage_costs`), each sending its activations forward and their gradient back on every
    chunk's boundary (mbs × seq × hidden at the compute's width, on the tier the stages cross: `send_s`), stretched
    by the schedule's bubble (scaling.perf.pipeline.bubble_fraction): m·(imbalance·compute + 2·v·send) / (1 − b).
    Sends are charged whole (torch's schedules wait for each receive before the compute that needs it)."""
    virtual = w.pp_virtual if w.pp_schedule in ("interleaved_1f1b", "zero_bubble") else 1
    hidden, imbalance = _imbalance(w.shape, w.seq_len, w.pp, virtual)
    width = 2 if w.precision == "bf16" else 4
    send = send_s(net, w.layout_at(n), width * w.mbs * w.seq_len * hidden)
    bubble = bubble_fraction(w.pp_schedule, w.pp, grad_acc, virtual)
    return grad_acc * (imbalance * compute_s + 2 * virtual * send) / (1.0 - bubble)


def _micro_step_kinds(grad_acc: int) -> list[tuple[int, set[str]]]:
    """(how many, which selectors apply) for the micro-steps of a step: the first, the middle ones, the last."""
    if grad_acc == 1:
        return [(1, {FIRST_MICRO, EACH_MICRO, LAST_MICRO})]
    kinds = [(1, {FIRST_MICRO, EACH_MICRO}), (grad_acc - 2, {EACH_MICRO}), (1, {EACH_MICRO, LAST_MICRO})]
    return [k for k in kinds if k[0] > 0]


@functools.lru_cache(maxsize=4096)
def _ring_calls(
    w: Workload, n: int, grad_acc: int, devices_per_node: Optional[int]
) -> tuple[tuple[Optional[Window], str, float, int, Optional[int], float, int], ...]:
    """(window, op, calls per round of the window, ranks, ranks of them per node, bytes per call, rings of the call
    at once on a node) of each collective of a step: what `comm_windows` prices, kept (a band's draws price the same
    few steps on hundreds of networks)."""
    out = []
    for call in step_collectives(w, n, grad_acc):
        rounds = grad_acc if call.window is not None and call.window.micro_steps == EACH_MICRO else 1
        ranks, per_node = w.ring(call.group, n, devices_per_node)
        at_once = w.rings_at_once(call.group, n, devices_per_node)
        out.append((call.window, call.op, call.count / rounds, ranks, per_node, call.bytes_per_call, at_once))
    return tuple(out)


def comm_windows(w: Workload, net: Network, n: int, grad_acc: int) -> list[tuple[int, float, float]]:
    """The communication of one step at dp=n by window: (how many such windows the step has, seconds of
    communication in each, the share of a micro-step's compute it can hide behind; 0 for exposed); none on one rank
    (a dp rank's tp ranks communicate at dp=1 too)."""
    if w.layout_at(n).world_size < 2:
        return []
    per_window: dict[Optional[Window], float] = {}
    for window, op, per_round, ranks, per_node, size, at_once in _ring_calls(w, n, grad_acc, net.devices_per_node):
        per_window[window] = per_window.get(window, 0.0) + per_round * net.on_ring(per_node).time_s(
            op, ranks, size, at_once
        )
    out = [(1, per_window[None], 0.0)] if None in per_window else []
    for times, selectors in _micro_step_kinds(grad_acc):
        for phase in (FORWARD, BACKWARD):
            seconds = sum(
                s
                for win, s in per_window.items()
                if win is not None and win.phase == phase and win.micro_steps in selectors
            )
            if seconds > 0:
                out.append((times, seconds, w.window_share(phase)))
    return out


def scheduled_overlap(w: Workload, n: int, grad_acc: int) -> float:
    """The share of a step's hidden-window communication the engine's schedule can run behind compute: all of it
    but, in each window, its largest call, which no compute precedes (a forward's first gather: FSDP2 prefetches
    each next module behind the current one's compute) or none follows (a backward's last reduce-scatter or DDP
    bucket); 1 when the step communicates nothing."""
    total, largest = 0.0, {}
    for call in step_collectives(w, n, grad_acc) if w.layout_at(n).world_size > 1 else ():
        if call.window is None:
            continue
        total += call.count * call.bytes_per_call
        times = grad_acc if call.window.micro_steps == EACH_MICRO else 1
        largest[call.window] = max(largest.get(call.window, 0.0), times * call.bytes_per_call)
    return 1.0 - sum(largest.values()) / total if total > 0 else 1.0


def step_time_s(
    w: Workload,
    net: Network,
    n: int,
    compute_s: float,
    overlap: float,
    optimizer_s_per_param: float = 0.0,
    grad_acc: Optional[int] = None,
) -> float:
    """Seconds of one optimizer step at dp=n: grad_acc micro-steps of compute, the optimizer, exposed communication."""
    ga = grad_acc if grad_acc is not None else w.grad_acc_at(n)
    if ga is None:
        raise ValueError(f"dp={n}: gbs={w.gbs} does not split into whole micro-steps of mbs={w.mbs}")
    compute = ga * compute_s if w.pp == 1 else pipeline_compute_s(w, net, n, ga, compute_s)
    total = compute + w.params_updated(n) * optimizer_s_per_param
    for times, seconds, share in comm_windows(w, net, n, ga):
        total += times * (seconds - min(overlap * seconds, share * compute_s))
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
