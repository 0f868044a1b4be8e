"""A model's shape as the performance model sees it: its parameter tensors in `parameters()` order and its blocks,
from which DDP's buckets, ZeroRedundancyOptimizer's partition and FSDP2's per-module messages follow.

A family gives them (scaling.model.spec.Family.shape): the built-in one from its config
(scaling.model.llama.args.param_shapes), a model the user brings counted on the fake module its FLOP count builds
(scaling.model.custom.count), and its record keeps them (derived.model.param_tensors). The standard library only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from scaling.core.recompute import recomputed_share

ROOT, BLOCK = "root", "block"
"""The FSDP2 module a parameter tensor belongs to: the root (embedding, final norm, output: what is in no block) or a
block; the words of the record's derived.model.param_tensors (`module`, `rows`: dim 0, `cols`: the rest, a list each,
one entry per tensor in `parameters()` order)."""


@dataclass(frozen=True, kw_only=True)
class Counted:
    """What a model is at one sequence length: its size, its FLOPs per token and its parameter tensors."""

    n_params: int
    """Distinct parameters (a tied weight once)."""
    flops_per_token: float
    """Model FLOPs (forward and backward) per token: the numerator of MFU."""
    recomputed_flops_per_token: float
    """What full recomputation adds per token (the numerator of HFU is their sum)."""
    attention_flops_per_token: float = 0.0
    """The attention scores' share of flops_per_token (0: not told apart from the matmuls, as counted)."""
    recomputed_attention_flops_per_token: float = 0.0
    """The attention's share of recomputed_flops_per_token (0: not told apart)."""
    uncounted_ops: tuple[str, ...] = ()
    """Operators that look like matmuls but that the counter has no formula for (their FLOPs are missing)."""
    block: str
    """The block class's name."""
    n_blocks: int
    tensors: tuple[tuple[str, bool, int, int], ...]
    """Its parameter tensors in `parameters()` order, each once: (name, in a block, rows: dim 0, the other dims'
    product), what the step model's collectives are made of."""
    source: str
    """`closed_form` (the built-in family) or `counted` (torch's FlopCounterMode on fake tensors)."""
    init: Optional[str] = None
    """How a model the user brings is initialised after materialisation (scaling.model.custom.init.init_kind)."""
    attention: Optional[str] = None
    """The attention implementation a Hugging Face model runs (transformers' name: sdpa, eager, ...)."""
    scalars: tuple[str, ...] = ()
    """Its 0-dim parameters, which FSDP2 (ZeRO-2 and 3) cannot shard."""

    def hw_flops_per_token(self, recompute: str, every: int = 1) -> float:
        """Hardware FLOPs per token under `train.recompute` and `recompute_every` (the share of full recomputation
        they run again, scaling.core.recompute): the numerator of HFU."""
        return (
            self.flops_per_token + recomputed_share(recompute, every, self.n_blocks) * self.recomputed_flops_per_token
        )


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor of a model: the FSDP2 module it belongs to and its shape (rows: dim 0)."""

    name: str
    module: str
    rows: int
    cols: int = 1

    @property
    def numel(self) -> int:
        """Elements of the whole tensor."""
        return self.rows * self.cols

    def shard_numel(self, n: int) -> int:
        """Elements of the largest of n FSDP2 shards: dim 0 cut in chunks of ceil(rows/n)."""
        return -(-self.rows // n) * self.cols


@dataclass(frozen=True, eq=False)
class ModelShape:
    """What the step model needs of a model: its parameter tensors in `parameters()` order and its blocks (FSDP2's
    modules), as its family gives them (`cached`) or its record keeps them (`from_record`). Compared by identity: one
    object per model (cached), so the caches that key on it do so cheaply."""

    name: str
    tensors: tuple[ParamTensor, ...]
    n_blocks: int

    @classmethod
    def of(cls, name: str, shapes: Sequence[tuple[str, bool, int, int]], n_blocks: int) -> ModelShape:
        """The shape of (name, in a block, rows, cols) per tensor, in `parameters()` order: the built-in family's
        `param_shapes_of`, a family's `Counted.tensors`."""
        tensors = tuple(ParamTensor(t, BLOCK if in_block else ROOT, rows, cols) for t, in_block, rows, cols in shapes)
        return cls(name, tensors, n_blocks)

    @classmethod
    def cached(cls, name: str, shapes: tuple[tuple[str, bool, int, int], ...], n_blocks: int) -> ModelShape:
        """`of`, one object per distinct model (what a family's `shape` gives: the caches keyed on it hit)."""
        return _cached_shape(name, tuple(shapes), n_blocks)

    @classmethod
    def from_record(cls, name: str, tensors: Mapping[str, Sequence[Any]], n_blocks: int) -> ModelShape:
        """The shape a record's derived.model holds: param_tensors (lists `module`, `rows`, `cols`) and n_blocks."""
        try:
            rows = list(zip(tensors["module"], tensors["rows"], tensors["cols"], strict=True))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"model {name!r}: derived.model.param_tensors must hold lists `module`, `rows` and `cols` of one "
                f"length ({type(e).__name__}: {e})"
            ) from None
        found = tuple(
            ParamTensor(f"{module}.{i}", str(module), int(r), int(c)) for i, (module, r, c) in enumerate(rows)
        )
        bad = sorted({t.module for t in found} - {ROOT, BLOCK})
        if bad or n_blocks < 1 or not any(t.module == BLOCK for t in found):
            raise ValueError(
                f"model {name!r}: derived.model.param_tensors' modules must be {ROOT!r} or {BLOCK!r}, some of them "
                f"{BLOCK!r}, and n_blocks >= 1 (got modules {bad or 'ok'}, n_blocks={n_blocks})"
            )
        return cls(name, found, int(n_blocks))


@functools.lru_cache(maxsize=64)
def _cached_shape(name: str, shapes: tuple[tuple[str, bool, int, int], ...], n_blocks: int) -> ModelShape:
    return ModelShape.of(name, shapes, n_blocks)
