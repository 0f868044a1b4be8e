"""ZeRO stages 0-3 on torch's own machinery: one rank's model, built in the order that lets it fit.

Stage 0 is DDP, 1 DDP + ZeroRedundancyOptimizer, 2 and 3 FSDP2's `fully_shard` (parameters kept gathered after
forward at 2, resharded at 3). `parallelize` builds in one order, torchtitan's: shapes on meta (the model's family,
scaling.model), its tensor-parallel plan, recompute, compile each block, shard (2-3), `to_empty` of what this rank
owns (ties restored, every float NaN until initialised), seeded init and its check, then DDP (0-1) and the optimizer;
so a rank never holds more than its shards plus one full parameter while it builds. `Parallelized.micro_step` says
how each micro-step's gradients are reduced. The order and gradient accumulation per stage: docs/concepts.md.
torch and the standard library only.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from scaling.core.enums import FsdpGradReduce, Precision, Recompute, ZeroStage
from scaling.core.layout import Layout
from scaling.core.model_group import ModelGroup
from scaling.core.schema import ParallelConfig, TrainConfig
from scaling.engine.pipeline import Pipeline, across_stages, build_stages, make_pipeline
from scaling.engine.tensor_parallel import PointMesh, apply_plan, point_mesh
from scaling.model.family import family_of


@dataclass
class Parallelized:
    """A model wrapped for its ZeRO stage, with its optimizer and precision handling."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    zero_stage: ZeroStage
    autocast_dtype: torch.dtype | None
    device: torch.device
    fsdp_grad_reduce: str = FsdpGradReduce.every_micro_step
    grad_clip: float = 0.0
    mesh: Optional[PointMesh] = None
    """The point's device mesh (scaling.engine.tensor_parallel): its shard group holds the whole model once under
    hybrid sharding (the replicas hold copies); with tensor parallelism the norms are taken per mesh."""
    pipeline: Optional[Pipeline] = None
    """With pipeline stages (parallel.pp > 1): this rank's stages and their schedule (`model` is then the list of
    its stage modules); norms are taken over the whole pipeline. At ZeRO-0/1 the stage modules are not wrapped in
    DDP (its reducer, prepared by torch's stage for the last micro-batch's backward only, does not average them
    right): the pipeline all-reduces their gradients after the step, in buckets of parallel.bucket_mb, not
    overlapped with the backward passes."""

    def micro_step(self, index: int, count: int) -> ContextManager[None]:
        """Context for micro-step `index` of `count`: how its gradients are reduced across ranks."""
        last = index == count - 1
        if self.zero_stage < ZeroStage.GRADIENTS:
            return contextlib.nullcontext() if last else self.model.no_sync()
        if self.fsdp_grad_reduce == FsdpGradReduce.last_micro_step:
            self.model.set_requires_gradient_sync(last)
        if self.zero_stage == ZeroStage.GRADIENTS:
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
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.pipeline is not None:  # the norm over every stage: each stage's own, then theirs
            total = across_stages(_total_norm([p.grad for p in params]), self.pipeline.group)
            for group in _by_mesh(params).values():
                torch.nn.utils.clip_grads_with_norm_(group, self.grad_clip, total)
            return total
        if self.mesh is None or self.mesh.tp is None:
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a replicated DTensor at stages 2-3
        # tensor parallelism: the matmuls' gradients on the (dp, tp) mesh, the norms' on dp alone: a norm per mesh
        total = _total_norm([p.grad for p in params])
        for group in _by_mesh(params).values():  # a foreach over one mesh at a time
            torch.nn.utils.clip_grads_with_norm_(group, self.grad_clip, total)
        return total

    def zero_grad(self) -> None:
        """Clear gradients before a step. Under DDP they are views of its buckets: zero them in place,
        since setting them to None makes no_sync micro-steps allocate a second copy outside the buckets."""
        self.optimizer.zero_grad(set_to_none=self.zero_stage >= ZeroStage.GRADIENTS)

    def autocast(self) -> ContextManager[None]:
        """bf16 autocast under DDP stages; FSDP2 casts through its MixedPrecisionPolicy instead."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def param_norm(self) -> float:
        """L2 norm of all parameters, gathered across shards (identical on every rank)."""
        if self.pipeline is not None:  # each stage's norm of what it trains (has a gradient for), then the pipeline's:
            # what every stage of a model one brings holds (its embedding, its head) is trained, and counted, once
            local = _total_norm([p.detach() for p in self.model.parameters() if p.grad is not None])
            return float(across_stages(local, self.pipeline.group))
        if self.mesh is not None and self.mesh.tp is not None:  # DTensors on two meshes: their own norms
            return float(_total_norm([p.detach() for p in self.model.parameters()]))
        sharded = (
            self.zero_stage >= ZeroStage.GRADIENTS
        )  # fully_shard on the root makes every parameter a DTensor shard
        group = self.mesh.shard_group if self.mesh is not None else None  # one shard group holds the model once
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.model.parameters():
            local = p.to_local() if sharded else p
            sq += local.detach().double().pow(2).sum()
        if sharded and dist.get_world_size(group) > 1:
            dist.all_reduce(sq, group=group)
        return float(sq.sqrt())


def _adamw(params: Iterator[nn.Parameter] | list[nn.Parameter], lr: float, weight_decay: float, fused: bool):
    """AdamW, fused (one kernel for every tensor: CUDA) or single-tensor (one tensor at a time: CPU)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


WRAPPERS: dict[str, Callable[[Layout], bool]] = {
    "torch.distributed.fsdp": lambda layout: layout.fsdp,
    "torch.distributed.optim": lambda layout: not layout.fsdp and layout.zero_stage == ZeroStage.OPTIMIZER,
    "torch.distributed.tensor.parallel": lambda layout: layout.tp > 1,
    "torch.distributed.pipelining": lambda layout: layout.pp > 1,
}
"""What a layout may wrap the model with, and which layouts do: each is imported only by the layouts that use it
(FSDP2 and DTensor cost a second of start-up in a fresh interpreter)."""


def load_wrappers(layout: Layout) -> None:
    """Import what this layout wraps the model with (`WRAPPERS`), now: the worker calls this before it takes its
    memory baseline, so that imports are not counted as building."""
    for name, used in WRAPPERS.items():
        if used(layout):
            importlib.import_module(name)


def _shard(model: nn.Module, blocks: list[nn.Module], zero_stage: ZeroStage, bf16: bool, mesh: Optional[Any]) -> None:
    """fully_shard every block, then the root (embedding, final norm, output projection), over `mesh` (hybrid
    sharding: sharded within its `shard` dim, replicated across its `replicate` dim) or every rank."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=zero_stage == ZeroStage.PARAMETERS, mp_policy=mp)
    # The root's parameters are needed again by backward right after forward: never resharded in between.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp)


def parallelize(
    args: ModelGroup,
    train: TrainConfig,
    parallel: ParallelConfig,
    device: torch.device,
    on_meta: bool = True,
    fused_optimizer: Optional[bool] = None,
    microbatches: Optional[int] = None,
) -> Parallelized:
    """Build this rank's model for its ZeRO stage in the order of the module docstring, with its optimizer.

    `args` is the `model` config group: its family (scaling.model.family) builds, splits, recomputes and initialises it. `on_meta=False` builds the shapes on `device` itself: for
    fake tensors (the traced predictor), which hold no memory anyway and cannot be moved off meta. AdamW is fused on
    CUDA and single-tensor elsewhere, unless `fused_optimizer` says otherwise (the traced predictor of a CUDA point,
    tracing on CPU). `microbatches`: a step's micro-batches, what a pipeline schedule is made for (the grad_acc the
    driver derived; train.grad_acc when not given).
    """
    fused = device.type == "cuda" if fused_optimizer is None else fused_optimizer
    layout, bf16 = parallel.layout, train.precision == Precision.bf16
    if layout.pp > 1:
        count = microbatches or (train.grad_acc if isinstance(train.grad_acc, int) else 1)
        return _pipelined(args, train, parallel, device, fused, count, on_meta)
    recompute = train.recompute != Recompute.none
    where = "meta" if on_meta else device
    family = family_of(args)
    model = family.build(where)  # 1. shapes only
    blocks = family.blocks(model)
    mesh = point_mesh(layout, device) if layout.zero_stage > ZeroStage.NONE else PointMesh(None, None, None)
    if mesh.tp is not None:  # 1b. tensor parallelism: the family's plan splits each block's matmuls over tp ranks
        apply_plan(model, family.tp_plan(), mesh.tp, owned_outputs=family.tp_outputs_owned)
    if recompute:  # 2. recompute
        blocks = family.recompute(model, blocks, str(train.recompute), train.recompute_every)
    if train.compile:  # 3. compile
        for block in blocks:
            block.compile()
    if layout.fsdp:  # 4. shard
        _shard(model, blocks, layout.zero_stage, bf16, mesh.dp)
    if on_meta:  # 5. materialise what this rank owns (ties restored, NaN until initialised), initialise, check
        family.materialise(model, device)
    family.initialise(model, train.seed)
    if on_meta:
        family.check_initialised(model)
    lr, weight_decay = train.lr, train.weight_decay
    if layout.fsdp:
        return Parallelized(
            model,
            _adamw(model.parameters(), lr, weight_decay, fused),
            layout.zero_stage,
            None,
            device,
            parallel.fsdp_grad_reduce,
            train.grad_clip,
            mesh,
        )
    ddp = DDP(  # 6. wrap
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=parallel.bucket_mb,
        gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy
    )
    if layout.zero_stage == ZeroStage.NONE:
        optimizer = _adamw(ddp.parameters(), lr, weight_decay, fused)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(  # hybrid: each group of dp_shard ranks holds one copy, partitioned
            ddp.parameters(),
            optimizer_class=torch.optim.AdamW,
            process_group=mesh.shard_group,
            lr=lr,
            weight_decay=weight_decay,
            fused=fused,
        )
    return Parallelized(
        ddp, optimizer, layout.zero_stage, torch.bfloat16 if bf16 else None, device, grad_clip=train.grad_clip
    )


def _by_mesh(tensors: list[torch.Tensor]) -> dict[Any, list[torch.Tensor]]:
    """Tensors by the device mesh of each (None: plain tensors)."""
    meshes: dict[Any, list[torch.Tensor]] = {}
    for t in tensors:
        meshes.setdefault(getattr(t, "device_mesh", None), []).append(t)
    return meshes


def _total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of tensors that are DTensors on different meshes: one norm per mesh, then theirs."""
    squares = []
    for group in _by_mesh(tensors).values():
        part = torch.nn.utils.get_total_norm(group)
        squares.append((part.full_tensor() if hasattr(part, "full_tensor") else part).double() ** 2)
    return torch.stack(squares).sum().sqrt().float()


def _pipelined(
    args: ModelGroup,
    train: TrainConfig,
    parallel: ParallelConfig,
    device: torch.device,
    fused: bool,
    microbatches: int,
    on_meta: bool = True,
) -> Parallelized:
    """`parallelize` with pipeline stages (scaling.engine.pipeline), in the same order per stage module: the whole
    model's shapes on meta (on `device` without `on_meta`), this rank's stage modules cut from it, tensor
    parallelism, recompute, compile, shard over the stage's dp ranks (2-3), materialise what the stages hold, the
    seeded init of what they hold (Family.initialise_stages), the optimizer and the schedule (at ZeRO-0/1 without
    DDP: `Parallelized.pipeline`)."""
    layout, bf16 = parallel.layout, train.precision == Precision.bf16
    family = family_of(args)
    model = family.build("meta" if on_meta else device)
    mesh = point_mesh(layout, device)
    indices, _, modules = build_stages(
        family, model, train.seq_len, layout, parallel.pp_virtual, mesh.pp.get_local_rank()
    )
    if mesh.tp is not None:
        for module in modules:
            apply_plan(family.stage_root(module), family.tp_plan(), mesh.tp, owned_outputs=family.tp_outputs_owned)
    owned = [family.stage_blocks(module) for module in modules]
    if train.recompute != Recompute.none:
        owned = [
            family.recompute(family.stage_root(m), blocks, str(train.recompute), train.recompute_every)
            for m, blocks in zip(modules, owned)
        ]
    if train.compile:
        for block in (b for blocks in owned for b in blocks):
            block.compile()
    if layout.fsdp:
        for module, blocks in zip(modules, owned):
            _shard(module, blocks, layout.zero_stage, bf16, mesh.dp)
    if on_meta:
        for module in modules:
            family.materialise(module, device)
    family.initialise_stages(model, modules, train.seed)
    for module in modules if on_meta else []:  # a stage's ranks hold the same tensors: they agree on what is unwritten
        family.check_initialised(module, mesh.dp_group)
    held = nn.ModuleList(modules)
    if layout.zero_stage == ZeroStage.OPTIMIZER:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            held.parameters(),
            optimizer_class=torch.optim.AdamW,
            process_group=mesh.shard_group,
            lr=train.lr,
            weight_decay=train.weight_decay,
            fused=fused,
        )
    else:
        optimizer = _adamw(held.parameters(), train.lr, train.weight_decay, fused)
    pipeline = make_pipeline(
        modules,
        indices,
        layout,
        parallel.pp_schedule,
        parallel.pp_virtual,
        microbatches,
        device,
        mesh.pp_group,
    )
    if not layout.fsdp and layout.dp > 1:  # ZeRO-0/1: the stage's gradients averaged over its dp ranks after the step
        pipeline.dp_group, pipeline.bucket_bytes = mesh.dp_group, int(parallel.bucket_mb * 2**20)
    return Parallelized(
        held,
        optimizer,
        layout.zero_stage,
        torch.bfloat16 if bf16 and not layout.fsdp else None,
        device,
        parallel.fsdp_grad_reduce,
        train.grad_clip,
        mesh,
        pipeline,
    )
