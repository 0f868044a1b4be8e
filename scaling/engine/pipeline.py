"""Pipeline parallelism on torch.distributed.pipelining: a rank's stages of the model and the schedule that runs a
step's micro-batches through them.

The blocks are split into pp × pp_virtual stages by the family's one split (scaling.model.spec.Family.stages,
balanced by FLOPs per token: the embedding with the first stage, the norm and head with the last); rank r of a
pipeline holds stages r, r + pp, ... (torch's loop order; one stage each unless interleaved). A step's micro-batches
are its grad_acc micro-batches of mbs samples: the schedule takes the rank's grad_acc × mbs rows and cuts them into
grad_acc chunks in order, so each micro-batch is the one a pp 1 rank trains on. Its loss is the mean of the
micro-batches' losses, and torch divides the gradients by their count (`scale_grads`), as a pp 1 step divides each
micro-step's loss by grad_acc. Data parallelism wraps each stage module before it is staged (DDP or FSDP2 over the
dp ranks of its stage); torch's stage reduces its gradients after the step's last backward. torch and the standard
library only.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from scaling.core.enums import PipelineSchedule
from scaling.core.layout import Layout
from scaling.model.spec import logits_of

SCHEDULES = {
    PipelineSchedule.gpipe: "ScheduleGPipe",
    PipelineSchedule.one_f_one_b: "Schedule1F1B",
    PipelineSchedule.interleaved_1f1b: "ScheduleInterleaved1F1B",
    PipelineSchedule.zero_bubble: "ScheduleInterleavedZeroBubble",
}
"""torch's schedule class of each `parallel.pp_schedule` (torch.distributed.pipelining.schedules); the first two run
one stage per rank, the others pp_virtual stages per rank (zero bubble: torch's interleaved ZB1P, whose backward is
split into an input and a weight part, the weight parts filling the bubble)."""
MULTI_STAGE = (PipelineSchedule.interleaved_1f1b, PipelineSchedule.zero_bubble)
"""The schedules whose ranks each hold several stages (`parallel.pp_virtual` of them)."""


def stage_indices(pp_rank: int, pp: int, virtual: int) -> list[int]:
    """The stages pipeline rank `pp_rank` holds: pp_rank, pp_rank + pp, ... (pp_virtual of them)."""
    return [pp_rank + k * pp for k in range(virtual)]


def _loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    """One micro-batch's mean cross-entropy, in fp32 (the loss a pp 1 step takes of each micro-batch)."""
    logits = logits_of(out)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@dataclass
class Pipeline:
    """One rank's part of a pipeline: its stage modules (as data parallelism wrapped them) and the schedule."""

    schedule: Any
    modules: list[nn.Module]
    indices: list[int]
    """The stages this rank holds, in the order of `modules`."""
    first: bool
    """Whether this rank holds the first stage (it is fed the tokens)."""
    last: bool
    """Whether this rank holds the last stage (it is given the targets and computes the loss)."""
    group: Any
    """The pipeline's process group: one rank per stage."""
    stages: list[Any]
    """torch's PipelineStage of each module."""
    split_backward: bool = False
    """Whether the schedule splits each backward into an input and a weight part (zero bubble)."""
    dp_group: Any = None
    """ZeRO-0/1 with dp > 1: the stage's dp ranks, over which `step` averages the gradients (None: FSDP2 reduces
    them, or there is one dp rank)."""
    bucket_bytes: int = 25 * 2**20
    """The most gradient bytes one all-reduce carries (parallel.bucket_mb)."""
    schedule_s: float = 0.0
    """Seconds inside the schedule's steps since `reset_clock` (the bubble's denominator)."""
    busy_s: float = 0.0
    """Of those, seconds this rank's stages computed: forward and backward (input and weight) of a micro-batch, the
    rest being waits on the other stages and the sends between them (the bubble, measured)."""

    def reset_clock(self) -> None:
        """Start counting `schedule_s` and `busy_s` from zero."""
        self.schedule_s = self.busy_s = 0.0

    def idle_frac(self) -> Optional[float]:
        """The share of the schedule's time this rank did not compute since `reset_clock` (None before any step)."""
        return 1.0 - self.busy_s / self.schedule_s if self.schedule_s > 0 else None

    def step(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        before_forward: Optional[Callable[[nn.Module], None]] = None,
    ) -> torch.Tensor:
        """Forward and backward of one step's micro-batches through the pipeline (this rank's part of them); the
        step's mean loss on the rank that holds the last stage, 0 on the others (0-d tensors). `before_forward` is
        called with the stage's module before each micro-batch's forward on it (the memory tracker's reset)."""
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        t0 = time.perf_counter()
        with _before_each_forward(self.stages, before_forward):
            self.schedule.step(*args, target=targets if self.last else None, losses=losses, return_outputs=False)
        self.schedule_s += time.perf_counter() - t0
        if self.dp_group is not None:
            grads = [p.grad for m in self.modules for p in m.parameters() if p.grad is not None]
            average(grads, self.dp_group, self.bucket_bytes)
        if not self.last:
            return torch.zeros((), device=inputs.device)
        return torch.stack([loss.detach() for loss in losses]).mean()


@contextlib.contextmanager
def _before_each_forward(stages: list[Any], call: Optional[Callable[[nn.Module], None]]) -> Iterator[None]:
    """While inside, `call(module)` runs before each stage's forward of a micro-batch (nothing when `call` is None)."""
    if call is None:
        yield
        return
    originals = [stage.forward_one_chunk for stage in stages]

    def hooked(stage: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        def forward_one_chunk(*args: Any, **kwargs: Any) -> Any:
            call(stage.submod)
            return original(*args, **kwargs)

        return forward_one_chunk

    for stage, original in zip(stages, originals):
        stage.forward_one_chunk = hooked(stage, original)
    try:
        yield
    finally:
        for stage, original in zip(stages, originals):
            stage.forward_one_chunk = original  # as it was (timed: `_clock`)


def average(grads: list[torch.Tensor], group: Any, bucket_bytes: int) -> None:
    """Average `grads` in place over the ranks of `group`: one all-reduce per bucket of at most `bucket_bytes` (a
    tensor larger than that alone), each bucket flattened into one buffer of its dtype."""
    import torch.distributed as dist

    size = dist.get_world_size(group)
    bucket: list[torch.Tensor] = []

    def flush() -> None:
        if not bucket:
            return
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        bucket.clear()

    for g in grads:
        held = sum(t.numel() * t.element_size() for t in bucket)
        if bucket and (held + g.numel() * g.element_size() > bucket_bytes or g.dtype != bucket[0].dtype):
            flush()
        bucket.append(g)
    flush()


def build_stages(
    family: Any, model: nn.Module, seq_len: int, layout: Layout, virtual: int, pp_rank: int
) -> tuple[list[int], list[range], list[nn.Module]]:
    """(this rank's stage indices, every stage's blocks, this rank's stage modules) of `model` (on meta)."""
    count = layout.pp * virtual
    split = family.stages(seq_len, count)
    indices = stage_indices(pp_rank, layout.pp, virtual)
    modules = [family.pipeline_stage(model, split[i], i == 0, i == count - 1) for i in indices]
    return indices, split, modules


def make_pipeline(
    modules: list[nn.Module],
    indices: list[int],
    layout: Layout,
    schedule: PipelineSchedule,
    virtual: int,
    microbatches: int,
    device: torch.device,
    group: Any,
) -> Pipeline:
    """Stage each module (wrapped for data parallelism) on the pipeline's group and make the schedule over them."""
    from torch.distributed.pipelining import PipelineStage, schedules

    count = layout.pp * virtual
    stages = [PipelineStage(m, i, count, device, group=group) for m, i in zip(modules, indices)]
    cls = getattr(schedules, SCHEDULES[PipelineSchedule(schedule)])
    target = stages if PipelineSchedule(schedule) in MULTI_STAGE else stages[0]
    made = cls(target, n_microbatches=microbatches, loss_fn=_loss, scale_grads=True)
    split = PipelineSchedule(schedule) == PipelineSchedule.zero_bubble
    pipeline = Pipeline(made, modules, indices, 0 in indices, count - 1 in indices, group, stages, split)
    for stage in stages:
        _clock(stage, pipeline)
    return pipeline


COMPUTE = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
"""The methods of torch's stage that compute a micro-batch (the rest of a schedule's time is waits and sends)."""


def _clock(stage: Any, pipeline: Pipeline) -> None:
    """Add the time of each of `stage`'s compute methods to `pipeline.busy_s` (the class's method, timed, set on the
    stage; `_before_each_forward` wraps it in turn)."""

    def timed(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                pipeline.busy_s += time.perf_counter() - t0

        return run

    for name in COMPUTE:
        setattr(stage, name, timed(getattr(stage, name)))


def across_stages(value: torch.Tensor, group: Optional[Any]) -> torch.Tensor:
    """A norm over this rank's stages made the norm over the whole pipeline: the root of the sum of the stages'
    squares (torchtitan's clip over the pp mesh)."""
    import torch.distributed as dist

    if group is None:
        return value
    square = value.double() ** 2
    dist.all_reduce(square, group=group)
    return square.sqrt().to(value.dtype)
