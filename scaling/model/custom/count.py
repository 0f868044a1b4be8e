"""A model the user brings, counted: one forward and backward of a batch on fake tensors under torch's
FlopCounterMode gives its parameters, FLOPs per token and parameter tensors, and checks its contract on the way
(it imports, builds, has blocks, maps (B, T) ids as training feeds them to (B, T, vocab) logits, and the engine's
initialisation gives every parameter and buffer a value: scaling.model.custom.init). Operators that look like
compute but have no formula in the counter are named, so a low MFU says why. torch and the standard library only.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from torch import nn

from scaling.core.model_group import ModelError
from scaling.model.custom.init import Writes, unwritten_line
from scaling.model.shape import Counted
from scaling.model.spec import Family, logits_of, raised_at

CONTRACT_BATCH = 2
"""Sequences in the batch the contract is checked on: more than one, so that a forward that folds the batch into
its sequences (a `.view` of the ids, a reshape by B) is checked as training runs it."""
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


_COUNTED: dict[tuple[str, int], Counted] = {}
"""What `count` found, by (model config, seq_len): each model is counted once per process."""


def _count(family: Family, seq_len: int) -> Counted:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    model = family.config
    # Fake tensors, not meta ones: a model may branch on its inputs' values where it is not being traced, and
    # libraries skip such checks for fake tensors (transformers' masks do). The math kernel of SDPA runs attention as
    # the matmuls the counter has formulas for (the fused CPU kernel has none): the PaLM convention, as the closed form.
    label = f"model {model.name!r} ({model.source})"
    with FakeTensorMode(), sdpa_kernel(SDPBackend.MATH), family.as_on_real_tensors():
        with Writes() as writes:
            module = family.build("cpu")
        found = family.blocks(module)
        vocab, longest = family.sizes()
        _check_sizes(family, label, vocab, longest, seq_len)
        batch = (CONTRACT_BATCH, seq_len)
        # what training feeds: contiguous (B, T) int64 ids (scaling.engine.data.to_device)
        ids = torch.zeros(batch, dtype=torch.long)
        seen = _OpsSeen()
        with FlopCounterMode(display=False) as counter, seen:
            try:
                returned = module(ids)
            except Exception as e:
                said = f"{label}: forward(input_ids) on a {batch} LongTensor raised {type(e).__name__}: {e}"
                raise ModelError(said.splitlines()[0] + raised_at(e)) from e
            try:
                out = logits_of(returned)
            except ModelError as e:
                raise ModelError(f"{label}: {e}") from None
            if tuple(out.shape) != (*batch, vocab):
                raise ModelError(
                    f"{label}: forward(input_ids) of shape {batch} returned {tuple(out.shape)}; logits of shape "
                    f"(B, T, vocab_size) = {(*batch, vocab)} are expected"
                )
            # what full recompute runs again: the blocks' forwards (the embedding and the head are not checkpointed)
            root = type(module).__name__
            blocks = {id(b) for b in found}
            in_blocks = {f"{root}.{name}" for name, m in module.named_modules() if id(m) in blocks}
            forward = sum(sum(ops.values()) for name, ops in counter.get_flop_counts().items() if name in in_blocks)
            try:
                out.float().sum().backward()
            except Exception as e:
                said = f"{label}: the backward of its logits' sum raised {type(e).__name__}: {e}"
                raise ModelError(said.splitlines()[0] + raised_at(e)) from e
        total = counter.get_total_flops()
        n_params = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
        tensors = _param_shapes(module, found)
        attention = family.attention_of(module)
        kind, unwritten = writes.unwritten_after(module, lambda m: family.initialise(m, 0))
        if unwritten:
            of = len([*module.named_parameters(), *module.named_buffers()])
            raise ModelError(unwritten_line(label, unwritten, of, kind))
    tokens = batch[0] * batch[1]
    known = {getattr(op, "overloadpacket", op) for op in flop_registry}
    uncounted = sorted(
        str(op)
        for op in seen.ops
        if op not in known and any(word in str(op).split(".")[-1] for word in COMPUTE_OP_WORDS)
    )
    return Counted(
        n_params=n_params,
        flops_per_token=total / tokens,
        recomputed_flops_per_token=forward / tokens,  # full recompute runs each block's forward once more
        uncounted_ops=tuple(uncounted),
        block=type(found[0]).__name__,
        n_blocks=len(found),
        tensors=tensors,
        source="counted",
        init=kind,
        attention=attention,
        scalars=tuple(name for name, p in module.named_parameters() if p.dim() == 0),
    )


def _check_sizes(family: Family, label: str, vocab: Any, longest: Any, seq_len: int) -> None:
    """The sizes a family reads (a Hugging Face config's by its own names), checked as the validation checks a model
    file's."""
    if not isinstance(vocab, int) or vocab < 1:
        raise ModelError(f"{label}: model.vocab_size={vocab!r} must be a positive integer")
    if isinstance(longest, int) and seq_len > longest:
        where = family.longest_name()
        raise ModelError(f"train.seq_len={seq_len} exceeds {where}={longest}: use seq_len <= {longest}")


def _param_shapes(module: nn.Module, found: list[nn.Module]) -> tuple[tuple[str, bool, int, int], ...]:
    """(name, in a block, rows, cols) of each distinct parameter in `parameters()` order: what DDP buckets (in reverse),
    ZeroRedundancyOptimizer assigns whole and FSDP2 shards along dim 0, per block and the rest at the root."""
    in_block = {id(p) for b in found for p in b.parameters()}
    return tuple(
        (name, id(p) in in_block, int(p.shape[0]) if p.dim() else 1, math.prod(p.shape[1:]))
        for name, p in module.named_parameters()
    )


def count(family: Family, seq_len: int) -> Counted:
    """Parameters and FLOPs of a family's model at one sequence length, counted once per process (cached), and the
    checks of the contract on the way (the module docstring). Raises ModelError naming what is wrong."""
    key = (json.dumps(family.config.to_dict(), sort_keys=True, default=str), int(seq_len))
    if key not in _COUNTED:
        _COUNTED[key] = _count(family, int(seq_len))
    return _COUNTED[key]
