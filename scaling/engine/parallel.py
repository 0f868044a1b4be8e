"""ZeRO stages 0-3 on torch's own machinery, behind one small interface.

| stage | sharded                        | implementation                                        |
|-------|--------------------------------|-------------------------------------------------------|
| 0     | nothing                        | DistributedDataParallel (bucketed, overlapped)        |
| 1     | optimizer states               | DDP + ZeroRedundancyOptimizer                         |
| 2     | optimizer states + gradients   | FSDP2 fully_shard(reshard_after_forward=False)        |
| 3     | + parameters                   | FSDP2 fully_shard(reshard_after_forward=True)         |

Gradient accumulation skips gradient synchronisation on all but the last micro-step. bf16 mixed
precision keeps fp32 master weights and optimizer states: autocast under DDP, FSDP2's
MixedPrecisionPolicy (bf16 params and compute, fp32 gradient reduction) under fully_shard.
torch and the standard library only: this runs inside the worker.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from scaling.engine.model import Transformer


@dataclass
class Parallelized:
    """A model wrapped for its ZeRO stage, with its optimizer and precision handling."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    zero_stage: int
    autocast_dtype: torch.dtype | None
    device: torch.device

    def sync_gradients(self, enabled: bool) -> ContextManager[None]:
        """Context for one micro-step: gradients are reduced across ranks only when `enabled`."""
        if self.zero_stage >= 2:
            self.model.set_requires_gradient_sync(enabled)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if enabled else self.model.no_sync()

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


def _adamw(params: Iterator[nn.Parameter] | list[nn.Parameter], lr: float, weight_decay: float, device: torch.device):
    """AdamW with the fastest implementation the device has."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=device.type == "cuda")


def parallelize(
    model: Transformer,
    zero_stage: int,
    device: torch.device,
    *,
    precision: str,
    bucket_mb: float,
    lr: float,
    weight_decay: float,
) -> Parallelized:
    """Wrap `model` (already on `device`, weights initialised identically on every rank) for its stage."""
    bf16 = precision == "bf16"
    if zero_stage <= 1:
        ddp = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy
        )
        if zero_stage == 0:
            optimizer = _adamw(ddp.parameters(), lr, weight_decay, device)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(
                ddp.parameters(),
                optimizer_class=torch.optim.AdamW,
                lr=lr,
                weight_decay=weight_decay,
                fused=device.type == "cuda",
            )
        return Parallelized(ddp, optimizer, zero_stage, torch.bfloat16 if bf16 else None, device)

    # FSDP2 (and DTensor under it) is imported only by the stages that use it: a second of start-up.
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    reshard = zero_stage == 3
    for block in model.layers:
        fully_shard(block, reshard_after_forward=reshard, mp_policy=mp)
    # The root keeps embedding, final norm and output projection; after forward it is needed
    # again at once by backward, so it is never resharded in between.
    fully_shard(model, reshard_after_forward=False, mp_policy=mp)
    optimizer = _adamw(model.parameters(), lr, weight_decay, device)
    return Parallelized(model, optimizer, zero_stage, None, device)
