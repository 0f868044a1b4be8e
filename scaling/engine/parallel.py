"""ZeRO stages 0-3 on torch's own machinery: one rank's model, built in the order that lets it fit.

| stage | sharded                        | implementation                                        |
|-------|--------------------------------|-------------------------------------------------------|
| 0     | nothing                        | DistributedDataParallel (bucketed, overlapped)        |
| 1     | optimizer states               | DDP + ZeroRedundancyOptimizer                         |
| 2     | optimizer states + gradients   | FSDP2 fully_shard(reshard_after_forward=False)        |
| 3     | + parameters                   | FSDP2 fully_shard(reshard_after_forward=True)         |

`parallelize` builds the model in one order, written here once (torchtitan's):

1. on the meta device: shapes only, no memory;
2. recompute: activation checkpointing of every block, first, because it changes what a block
   computes in backward and both compile and sharding must see the block as it will run;
3. compile: each block, before sharding, so FSDP2's all-gathers and reduce-scatters stay hooks
   around the compiled block instead of being traced into it;
4. shard (stages 2-3): fully_shard per block, then the root, still on meta;
5. materialise: `to_empty` allocates only what this rank owns (its shards at stages 2-3; the whole
   model at stages 0-1, which DDP replicates anyway), ties found on meta are tied again, every float
   is NaN until the family's initialisation fills it from one seeded generator, each rank keeping its
   own part (the same weights for every dp and stage), and a tensor still NaN stops the point;
6. wrap (stages 0-1) in DDP, then make the optimizer.

A rank therefore never holds more than its shards plus one full parameter while it builds, so
ZeRO-3 runs models that do not fit one device.

Gradient accumulation: stages 0-1 all-reduce once, on the last micro-step (`no_sync` before).
Stages 2-3 reduce-scatter every micro-step into fp32 gradient shards, as ZeRO (DeepSpeed) and
torchtitan do, so no rank ever holds a whole accumulated gradient; stage 2 keeps its parameters
gathered between micro-steps. `parallel.fsdp_grad_reduce=last_micro_step` accumulates unsharded
gradients instead (less communication, 4Ψ more memory per rank): an explicit, recorded choice.
bf16 mixed precision keeps fp32 master weights and optimizer states: autocast under DDP, FSDP2's
MixedPrecisionPolicy (bf16 parameters and compute, fp32 gradient reduction) under fully_shard.
torch and the standard library only: this runs inside the worker.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from scaling.core.enums import FsdpGradReduce, Precision, Recompute
from scaling.core.model_group import CustomModel, ModelConfig
from scaling.core.schema import ParallelConfig, TrainConfig
from scaling.model.family import family_of


@dataclass
class Parallelized:
    """A model wrapped for its ZeRO stage, with its optimizer and precision handling."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    zero_stage: int
    autocast_dtype: torch.dtype | None
    device: torch.device
    fsdp_grad_reduce: str = FsdpGradReduce.EVERY_MICRO_STEP
    grad_clip: float = 0.0

    def micro_step(self, index: int, count: int) -> ContextManager[None]:
        """Context for micro-step `index` of `count`: how its gradients are reduced across ranks."""
        last = index == count - 1
        if self.zero_stage <= 1:
            return contextlib.nullcontext() if last else self.model.no_sync()
        if self.fsdp_grad_reduce == FsdpGradReduce.LAST_MICRO_STEP:
            self.model.set_requires_gradient_sync(last)
        if self.zero_stage == 2:
            # ZeRO-2 shards gradients, not parameters: keep them gathered until the step's last backward, so a
            # step gathers once (first forward) whichever way its gradients are reduced.
            self.model.set_reshard_after_backward(last)
        return contextlib.nullcontext()

    def clip_grad_norm(self) -> Optional[torch.Tensor]:
        """Clip the gradients' global norm to grad_clip (nothing when 0); returns the norm before clipping.
        At stages 2-3 the gradients are DTensor shards and clip_grad_norm_ all-reduces their norm; at stages 0-1
        they are whole after DDP's all-reduce, so the local norm is the global one."""
        if not self.grad_clip:
            return None
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a replicated DTensor at stages 2-3

    def zero_grad(self) -> None:
        """Clear gradients before a step. Under DDP they are views of its buckets: zero them in place,
        since setting them to None makes no_sync micro-steps allocate a second copy outside the buckets."""
        self.optimizer.zero_grad(set_to_none=self.zero_stage >= 2)

    def autocast(self) -> ContextManager[None]:
        """bf16 autocast under DDP stages; FSDP2 casts through its MixedPrecisionPolicy instead."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def param_norm(self) -> float:
        """L2 norm of all parameters, gathered across shards (identical on every rank)."""
        sharded = self.zero_stage >= 2  # fully_shard on the root makes every parameter a DTensor shard
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.model.parameters():
            local = p.to_local() if sharded else p
            sq += local.detach().double().pow(2).sum()
        if sharded and dist.get_world_size() > 1:
            dist.all_reduce(sq)
        return float(sq.sqrt())


def _adamw(params: Iterator[nn.Parameter] | list[nn.Parameter], lr: float, weight_decay: float, fused: bool):
    """AdamW, fused (one kernel for every tensor: CUDA) or single-tensor (one tensor at a time: CPU)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


def load_wrappers(zero_stage: int) -> None:
    """Import what this stage wraps the model with, now: each is imported only by the stages that use it
    (FSDP2 and DTensor cost a second of start-up), and the worker calls this before it takes its memory
    baseline, so that imports are not counted as building."""
    if zero_stage >= 2:
        import torch.distributed.fsdp
    elif zero_stage == 1:
        import torch.distributed.optim  # noqa: F401


def _shard(model: nn.Module, blocks: list[nn.Module], zero_stage: int, bf16: bool) -> None:
    """fully_shard every block, then the root (embedding, final norm, output projection)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    for block in blocks:
        fully_shard(block, reshard_after_forward=zero_stage == 3, mp_policy=mp)
    # The root's parameters are needed again by backward right after forward: never resharded in between.
    fully_shard(model, reshard_after_forward=False, mp_policy=mp)


def parallelize(
    args: ModelConfig | CustomModel,
    train: TrainConfig,
    parallel: ParallelConfig,
    device: torch.device,
    on_meta: bool = True,
    fused_optimizer: Optional[bool] = None,
) -> Parallelized:
    """Build this rank's model for its ZeRO stage in the order of the module docstring, with its optimizer.

    `args` is the `model` config group: its family (scaling.model.family) builds, splits, recomputes and initialises it. `on_meta=False` builds the shapes on `device` itself: for
    fake tensors (the traced predictor), which hold no memory anyway and cannot be moved off meta. AdamW is fused on
    CUDA and single-tensor elsewhere, unless `fused_optimizer` says otherwise (the traced predictor of a CUDA point,
    tracing on CPU).
    """
    fused = device.type == "cuda" if fused_optimizer is None else fused_optimizer
    zero_stage, bf16 = parallel.zero_stage, train.precision == Precision.BF16
    recompute = train.recompute == Recompute.FULL
    where = "meta" if on_meta else device
    family = family_of(args)
    model = family.build(where)  # 1. shapes only
    blocks = family.blocks(model)
    if recompute:  # 2. recompute
        blocks = family.recompute(model, blocks)
    if train.compile:  # 3. compile
        for block in blocks:
            block.compile()
    if zero_stage >= 2:  # 4. shard
        _shard(model, blocks, zero_stage, bf16)
    if on_meta:  # 5. materialise what this rank owns (ties restored, NaN until initialised), initialise, check
        family.materialise(model, device)
    family.initialise(model, train.seed)
    if on_meta:
        family.check_initialised(model)
    lr, weight_decay = train.lr, train.weight_decay
    if zero_stage >= 2:
        return Parallelized(
            model,
            _adamw(model.parameters(), lr, weight_decay, fused),
            zero_stage,
            None,
            device,
            parallel.fsdp_grad_reduce,
            train.grad_clip,
        )
    ddp = DDP(  # 6. wrap
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=parallel.bucket_mb,
        gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy
    )
    if zero_stage == 0:
        optimizer = _adamw(ddp.parameters(), lr, weight_decay, fused)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(
            ddp.parameters(),
            optimizer_class=torch.optim.AdamW,
            lr=lr,
            weight_decay=weight_decay,
            fused=fused,
        )
    return Parallelized(ddp, optimizer, zero_stage, torch.bfloat16 if bf16 else None, device, grad_clip=train.grad_clip)
