"""The decoder's shapes with their derived sizes (`ModelArgs`, of the `model` config group,
scaling.core.schema.ModelConfig) and their closed-form parameter counts.

A rank builds its model from `ModelArgs`. The counts (`param_count`, `matmul_param_count`) are
what the FLOPs and memory arithmetic build on. Standard library only: the driver and the predictor use them without
importing torch.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from scaling.core.schema import ModelConfig


class ModelArgs(ModelConfig):
    """Shapes of the decoder: the `model` config group (checked by scaling.core.validate) plus derived sizes (its
    head width `hd` and attention width `q_dim` are the config's own)."""

    @classmethod
    def of(cls, model: ModelConfig) -> ModelArgs:
        """The shapes of a typed model config."""
        return cls(**{f.name: getattr(model, f.name) for f in dataclasses.fields(ModelConfig)})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelArgs:
        """Build from a model config mapping (dict or DictConfig); keys that are not fields are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: d[k] for k in d if k in names})


def param_shapes(model: ModelConfig) -> tuple[tuple[str, bool, int, int], ...]:
    """(name, in a block, rows, cols) of each parameter tensor in `Transformer(model).parameters()` order: the
    embedding (v, h); per block attention_norm (h,), wq (q, h), wk and wv (nkv·hd, h), wo (h, q), ffn_norm (h,),
    w1 and w3 (f, h), w2 (h, f); the final norm (h,); the output projection (v, h) unless tied. q is nh·hd (h unless
    the model gives its head_dim). Rows are dim 0 (what FSDP2 shards); a vector has one column."""
    return param_shapes_of(
        model.n_layers,
        model.hidden,
        model.n_kv_heads * model.hd,
        model.ffn_hidden,
        model.vocab_size,
        bool(model.tie_embeddings),
        model.q_dim,
    )


@functools.lru_cache(maxsize=256)
def param_shapes_of(
    n_layers: int, hidden: int, kv_dim: int, ffn_hidden: int, vocab_size: int, tied: bool, q_dim: int = 0
) -> tuple[tuple[str, bool, int, int], ...]:
    """`param_shapes` of the sizes that decide them (cached: sweeps ask for few distinct models); q_dim 0: hidden."""
    h, f, v, q = hidden, ffn_hidden, vocab_size, q_dim or hidden
    block = (
        ("attention_norm", True, h, 1),
        ("wq", True, q, h),
        ("wk", True, kv_dim, h),
        ("wv", True, kv_dim, h),
        ("wo", True, h, q),
        ("ffn_norm", True, h, 1),
        ("w1", True, f, h),
        ("w3", True, f, h),
        ("w2", True, h, f),
    )
    output = () if tied else (("output", False, v, h),)
    return (("tok_embeddings", False, v, h), *block * n_layers, ("norm", False, h, 1), *output)


def block_matmul_param_count(args: ModelArgs) -> int:
    """Matmul weights of all decoder blocks: L·(2h·q + 2·h·nkv·hd + 3·h·f) (q,o + k,v + SwiGLU w1,w2,w3), q = nh·hd
    (h unless the model gives its head_dim)."""
    h, kv_dim = args.hidden, args.n_kv_heads * args.hd
    attention = 2 * h * args.q_dim + 2 * h * kv_dim
    mlp = 3 * h * args.ffn_hidden
    return args.n_layers * (attention + mlp)


def matmul_param_count(args: ModelArgs) -> int:
    """Parameters in matmuls per token: L·(2h·q + 2·h·nkv·hd + 3·h·f) + v·h.

    The output projection (v·h) counts once whether or not it is tied to the embedding; the
    embedding lookup is a gather, not a matmul, and norms are elementwise.
    """
    return block_matmul_param_count(args) + args.vocab_size * args.hidden


def param_count(args: ModelArgs) -> int:
    """Distinct parameters: v·h·(1 if tied else 2) + L·(2h·q + 2·h·nkv·hd + 3·h·f + 2h) + h.

    Per block: q and o projections h·q each (q = nh·hd), k and v h·(nkv·hd) each, SwiGLU w1, w3 (h -> f) and
    w2 (f -> h), two RMSNorm weights of h. Plus the embedding, the output projection unless tied,
    and the final RMSNorm. Equals `sum(p.numel() for p in Transformer(args).parameters())`.
    """
    h, v = args.hidden, args.vocab_size
    embeddings = v * h * (1 if args.tie_embeddings else 2)
    return embeddings + block_matmul_param_count(args) + args.n_layers * 2 * h + h
