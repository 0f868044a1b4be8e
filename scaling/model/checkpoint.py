"""Selective activation checkpointing: the per-op policy of `train.recompute=selective` (torchtitan's "op" mode) and
the checkpoint of one block under any setting. torch and the standard library only (the engine runs it).

The policy saves (MUST_SAVE) the outputs of what is expensive to run again: matmuls (`aten.mm`, `addmm`, `bmm`,
`baddbmm`: the step's FLOPs), fused attention (`aten._scaled_dot_product_*_attention`, the CPU's `..._for_cpu`: its
output and log-sum-exp) and tensor parallelism's collectives (`_c10d_functional.all_reduce`, `reduce_scatter_tensor`:
run again they would communicate twice). Everything between them (norms, RoPE, SiLU, the SwiGLU product, residual
adds, autocast's casts) is recomputed in backward. Unlike torchtitan, which also recomputes every second `mm`, every
matmul output is kept: no matmul runs twice (scaling.core.recompute counts 0 recomputed FLOPs). docs/memory.md
("Activation recomputation") has the bytes each setting keeps.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


@functools.cache
def saved_ops() -> frozenset[Any]:
    """The ops whose outputs selective checkpointing keeps (see the module docstring); those this build has."""
    aten = torch.ops.aten
    names = [
        (aten, "mm"),
        (aten, "addmm"),
        (aten, "bmm"),
        (aten, "baddbmm"),
        (aten, "_scaled_dot_product_flash_attention"),
        (aten, "_scaled_dot_product_efficient_attention"),
        (aten, "_scaled_dot_product_cudnn_attention"),
        (aten, "_scaled_dot_product_flash_attention_for_cpu"),
        (torch.ops._c10d_functional, "all_reduce"),
        (torch.ops._c10d_functional, "reduce_scatter_tensor"),
    ]
    return frozenset(getattr(ns, name).default for ns, name in names if hasattr(ns, name))


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts() -> Any:
    """The (forward, recompute) contexts of `torch.utils.checkpoint`'s `context_fn` for the selective policy."""
    return create_selective_checkpoint_contexts(_policy)


def checkpoint_kwargs(recompute: str) -> dict[str, Any]:
    """Keyword arguments of `torch.utils.checkpoint.checkpoint` (non-reentrant) for a checkpointed block under
    `recompute` (`selective` or `full`)."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if recompute == "selective":
        kwargs["context_fn"] = selective_contexts
    return kwargs


def run_checkpointed(fn: Callable[..., Any], recompute: str, *args: Any) -> Any:
    """`fn(*args)` under the checkpoint of `recompute` (`selective` or `full`)."""
    return checkpoint(fn, *args, **checkpoint_kwargs(recompute))
