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

    @property
    def shard_group(self) -> Any:
        """The process group of one shard group (ZeroRedundancyOptimizer's, under hybrid sharding), else None."""
        return (
            self.mesh["shard"].get_group()
            if self.mesh is not None and "replicate" in self.mesh.mesh_dim_names
            else None
        )


def point_mesh(layout: Layout, device: torch.device) -> PointMesh:
    """The mesh of a point (None parts where every rank forms one group: FSDP2's default)."""
    hybrid, tp = layout.hybrid, layout.tp > 1
    if not hybrid and not tp:
        return PointMesh(None, None, None)
    from torch.distributed.device_mesh import init_device_mesh

    dims = [("replicate", layout.replicas)] if hybrid else []
    dims += [("shard", layout.shard_size)] + ([("tp", layout.tp)] if tp else [])
    mesh = init_device_mesh(device.type, tuple(n for _, n in dims), mesh_dim_names=tuple(name for name, _ in dims))
    dp = mesh["replicate", "shard"] if hybrid else mesh["shard"]
    return PointMesh(mesh, dp, mesh["tp"] if tp else None)


def _style(word: str) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "colwise": ColwiseParallel(),
        "rowwise": RowwiseParallel(),
        "colwise_rep": ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": RowwiseParallel(),
        "embedding": RowwiseParallel(input_layouts=Replicate()),
    }[word]


def apply_plan(model: nn.Module, plan: Mapping[str, str], tp_mesh: Any) -> list[str]:
    """Shard each submodule whose name matches a pattern of `plan` (fnmatch: `layers.*.attention.wq`) by its style;
    the names sharded, in module order. ValueError for a word outside TP_STYLES or a plan that matches nothing."""
    from torch.distributed.tensor.parallel import parallelize_module

    bad = sorted({w for w in plan.values() if w not in TP_STYLES})
    if bad:
        raise ValueError(f"tp_plan styles {bad} are not among {', '.join(TP_STYLES)}")
    chosen: dict[str, Any] = {}
    for name, _ in model.named_modules():
        word = next((w for pattern, w in plan.items() if name and fnmatch.fnmatchcase(name, pattern)), None)
        if word is not None:
            chosen[name] = _style(word)
    if not chosen:
        raise ValueError(f"tp_plan {dict(plan)} matches no submodule of the model")
    parallelize_module(model, tp_mesh, chosen)
    return list(chosen)
