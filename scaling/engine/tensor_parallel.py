"""Tensor parallelism on torch's DTensor plans, and the device mesh every parallel layout of a point runs on.

`point_mesh` lays the ranks out as (replicate, shard, tp): tp consecutive ranks split each block's matmuls (within a
node), the rest is data parallelism, sharded over `dp_shard` consecutive groups and replicated across them (hybrid
sharding) or sharded over all of them. `apply_plan` shards a module's matmuls by a family's plan (scaling.model:
module-name patterns -> colwise | rowwise | colwise_rep | rowwise_rep | embedding) before FSDP2 shards over dp, in
torchtitan's order. torch and the standard library only: this runs inside the worker.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from scaling.core.layout import Layout
from scaling.core.model_group import TP_STYLES


@dataclass
class PointMesh:
    """The device mesh of one point and the parts each layout takes from it."""

    mesh: Any
    dp: Any
    """What FSDP2 shards over: the `shard` dim, or (`replicate`, `shard`) under hybrid sharding; None: every rank."""
    tp: Any
    """The `tp` dim, or None without tensor parallelism."""
    pp: Any = None
    """The `pp` dim (the outermost: a rank's peers at the other pipeline stages), or None without pipeline stages."""

    @property
    def shard_group(self) -> Any:
        """The process group of one shard group (ZeroRedundancyOptimizer's, under hybrid sharding or pipeline stages),
        else None (every rank)."""
        names = self.mesh.mesh_dim_names if self.mesh is not None else ()
        return self.mesh["shard"].get_group() if "replicate" in names or "pp" in names else None

    @property
    def dp_group(self) -> Any:
        """DDP's process group: the dp ranks of this rank's pipeline stage; None (every rank) without stages."""
        return self.mesh["shard"].get_group() if self.pp is not None else None

    @property
    def pp_group(self) -> Any:
        """The process group of this rank's pipeline: one rank per stage (None without stages)."""
        return self.pp.get_group() if self.pp is not None else None


def point_mesh(layout: Layout, device: torch.device) -> PointMesh:
    """The mesh of a point (None parts where every rank forms one group: FSDP2's default). Dims in the layout's rank
    order: pp outermost, then dp (replicate, shard), then tp."""
    hybrid, tp, pp = layout.hybrid, layout.tp > 1, layout.pp > 1
    if not hybrid and not tp and not pp:
        return PointMesh(None, None, None)
    from torch.distributed.device_mesh import init_device_mesh

    dims = [("pp", layout.pp)] if pp else []
    dims += [("replicate", layout.replicas)] if hybrid else []
    dims += [("shard", layout.shard_size)] + ([("tp", layout.tp)] if tp else [])
    mesh = init_device_mesh(device.type, tuple(n for _, n in dims), mesh_dim_names=tuple(name for name, _ in dims))
    dp = mesh["replicate", "shard"] if hybrid else mesh["shard"]
    return PointMesh(mesh, dp, mesh["tp"] if tp else None, mesh["pp"] if pp else None)


def _sum_gradients() -> Any:
    """The `replicate_sum_grad` style: the module's parameters stay whole on every rank, and each gradient that
    reaches one is summed over the tp ranks before it is accumulated (a norm over a head's width sees this rank's
    heads only, so its gradient is this rank's part of the sum). Summed as it arrives, not once accumulated: gradients
    accumulated over micro-steps (`parallel.fsdp_grad_reduce=last_micro_step`) are summed once. Hooked in each
    forward on the parameters the module holds then: FSDP2 puts its unsharded ones in place for the forward.
    Made here, not at import: torch's DTensor package, which its base class is part of, costs a rank without tensor
    parallelism a second of CPU to import."""
    import torch.distributed as dist
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class SumGradients(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            group, hooked = device_mesh.get_group(), {}

            def summed(grad: torch.Tensor) -> torch.Tensor:
                grad = grad.clone()  # the gradient autograd hands over may be another op's buffer
                dist.all_reduce(grad, group=group)
                return grad

            def hook(mod: nn.Module, args: Any) -> None:
                if torch.is_grad_enabled():
                    for name, param in mod.named_parameters(recurse=False):
                        if param.requires_grad and hooked.get(name) is not param:
                            param.register_hook(summed)
                            hooked[name] = param

            module.register_forward_pre_hook(hook)
            return module

    return SumGradients()


def _owning(style: type) -> type:
    """`style` (torch's RowwiseParallel) whose local output is a tensor of its own, not the view of the DTensor's
    local tensor that `to_local()` gives: that view is made inside an autograd Function, so an in-place op on it
    fails the first step ("Output 0 of _ToTorchTensor is a view and is being modified inplace"), and a model one
    brings may add to a block's output in place (Falcon: `mlp_output += attention_output`). The copy holds the
    output's bytes once more until the view it replaces is freed, right after."""

    class Owning(style):  # type: ignore[misc, valid-type]
        @staticmethod
        def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: Any, outputs: Any, mesh: Any) -> Any:
            out = style._prepare_output_fn(output_layouts, use_local_output, mod, outputs, mesh)
            return out.clone() if isinstance(out, torch.Tensor) and out._base is not None else out

    Owning.__name__ = f"Owning{style.__name__}"
    return Owning


def _style(word: str, owned_outputs: bool) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    rowwise = _owning(RowwiseParallel) if owned_outputs else RowwiseParallel
    return {
        "colwise": ColwiseParallel(),
        "rowwise": rowwise(),
        "colwise_rep": ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": rowwise(),
        "embedding": RowwiseParallel(input_layouts=Replicate()),
        "replicate_sum_grad": _sum_gradients(),
    }[word]


def apply_plan(model: nn.Module, plan: Mapping[str, str], tp_mesh: Any, owned_outputs: bool = False) -> list[str]:
    """Shard each submodule whose name matches a pattern of `plan` (fnmatch: `layers.*.attention.wq`) by its style;
    the names sharded, in module order. With `owned_outputs` (a model one brings, whose forward may add to a block's
    output in place) a rowwise output is a tensor of its own (`_owning`). ValueError for a word outside TP_STYLES or
    a plan that matches nothing."""
    from torch.distributed.tensor.parallel import parallelize_module

    bad = sorted({w for w in plan.values() if w not in TP_STYLES})
    if bad:
        raise ValueError(f"tp_plan styles {bad} are not among {', '.join(TP_STYLES)}")
    chosen: dict[str, Any] = {}
    for name, _ in model.named_modules():
        word = next((w for pattern, w in plan.items() if name and fnmatch.fnmatchcase(name, pattern)), None)
        if word is not None:
            chosen[name] = _style(word, owned_outputs)
    if not chosen:
        raise ValueError(f"tp_plan {dict(plan)} matches no submodule of the model")
    parallelize_module(model, tp_mesh, chosen)
    return list(chosen)
