"""A model the user brings, counted: one forward and backward of a sequence on fake tensors under torch's
FlopCounterMode gives its parameters, FLOPs per token and parameter tensors, and checks its contract on the way
(it imports, builds, has blocks and maps (1, T) ids to (1, T, vocab) logits). Operators that look like compute but
have no formula in the counter are named, so a low MFU says why. torch and the standard library only.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import torch
from torch import nn

from scaling.core.model_group import CustomModel
from scaling.model.custom.build import ModelError, blocks, build, logits_of
from scaling.model.shape import Counted

COMPUTE_OP_WORDS = ("mm", "conv", "attention", "einsum", "matmul", "linear", "bmm", "flash", "efficient")
"""Substrings of an aten operator's name that say it multiplies matrices: one of them that FlopCounterMode has no
formula for is named in the record (its FLOPs are not in the MFU)."""


class _OpsSeen(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


@functools.lru_cache(maxsize=64)
def _count(model_json: str, seq_len: int) -> Counted:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    model = CustomModel.from_dict(json.loads(model_json))
    # Fake tensors, not meta ones: a model may branch on its inputs' values where it is not being traced, and
    # libraries skip such checks for fake tensors (transformers' masks do). The math kernel of SDPA runs attention as
    # the matmuls the counter has formulas for (the fused CPU kernel has none): the PaLM convention, as the closed form.
    with FakeTensorMode(), sdpa_kernel(SDPBackend.MATH):
        module = build(model, "cpu")
        found = blocks(model, module)
        vocab = model.vocab_size
        ids = torch.zeros((1, seq_len), dtype=torch.long)
        seen = _OpsSeen()
        with FlopCounterMode(display=False) as counter, seen:
            try:
                out = logits_of(module(ids))
            except Exception as e:
                raise ModelError(
                    f"model {model.name!r} ({model.source}): forward(input_ids) on a (1, {seq_len}) LongTensor raised "
                    f"{type(e).__name__}: {e}".splitlines()[0]
                ) from e
            if tuple(out.shape) != (1, seq_len, vocab):
                raise ModelError(
                    f"model {model.name!r} ({model.source}): forward(input_ids) of shape (1, {seq_len}) returned "
                    f"{tuple(out.shape)}; logits of shape (B, T, vocab_size) = (1, {seq_len}, {vocab}) are expected"
                )
            forward = counter.get_total_flops()
            out.float().sum().backward()
        total = counter.get_total_flops()
        n_params = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
        tensors = _param_shapes(module, found)
    known = {getattr(op, "overloadpacket", op) for op in flop_registry}
    uncounted = sorted(
        str(op)
        for op in seen.ops
        if op not in known and any(word in str(op).split(".")[-1] for word in COMPUTE_OP_WORDS)
    )
    return Counted(
        n_params=n_params,
        flops_per_token=total / seq_len,
        recomputed_flops_per_token=forward / seq_len,  # full recompute runs each block's forward once more
        uncounted_ops=tuple(uncounted),
        block=type(found[0]).__name__,
        n_blocks=len(found),
        tensors=tensors,
        source="counted",
    )


def _param_shapes(module: nn.Module, found: list[nn.Module]) -> tuple[tuple[str, bool, int, int], ...]:
    """(name, in a block, rows, cols) of each distinct parameter in `parameters()` order: what DDP buckets (in reverse),
    ZeroRedundancyOptimizer assigns whole and FSDP2 shards along dim 0, per block and the rest at the root."""
    in_block = {id(p) for b in found for p in b.parameters()}
    return tuple(
        (name, id(p) in in_block, int(p.shape[0]) if p.dim() else 1, math.prod(p.shape[1:]))
        for name, p in module.named_parameters()
    )


def count(model: CustomModel, seq_len: int) -> Counted:
    """Parameters and FLOPs of a user's model at one sequence length, counted once per process (cached), and the
    checks of the contract on the way: it imports, builds, has blocks and maps (1, T) ids to (1, T, vocab) logits.
    Raises ModelError naming what is wrong."""
    return _count(json.dumps(model.to_dict(), sort_keys=True, default=str), int(seq_len))
