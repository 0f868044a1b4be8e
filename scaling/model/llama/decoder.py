"""The Llama-style decoder that every experiment trains.

Owns the architecture (token embedding, decoder `Block`s of RMSNorm -> grouped-query attention
with RoPE -> RMSNorm -> SwiGLU MLP, final RMSNorm, output projection), its seeded weight
initialisation and activation recomputation per block. Its shapes and their closed-form parameter counts
(`ModelArgs`, `param_count`, `matmul_param_count`) are in scaling.model.llama.args, which costs no torch.

Imports torch and the standard library only: it runs inside torchrun workers on bare GPU boxes.
Shapes in comments: B batch, T sequence, C hidden, nh query heads, nkv key/value heads,
hd head_dim, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from scaling.core.recompute import checkpointed
from scaling.model.checkpoint import run_checkpointed
from scaling.model.llama.args import ModelArgs

Device = Optional[Union[torch.device, str]]
"""Where layers are created; "meta" for shapes only."""

TP_PLAN = {
    "tok_embeddings": "embedding",
    "layers.*.attention.wq": "colwise",
    "layers.*.attention.wk": "colwise",
    "layers.*.attention.wv": "colwise",
    "layers.*.attention.wo": "rowwise",
    "layers.*.feed_forward.w1": "colwise",
    "layers.*.feed_forward.w3": "colwise",
    "layers.*.feed_forward.w2": "rowwise",
    "output": "colwise_rep",
}
"""Tensor parallelism as torchtitan shards this decoder (without sequence parallelism): each rank holds nh/tp query
and nkv/tp key/value heads and f/tp of the MLP; the embedding split by vocabulary, the head's logits gathered; the
norms replicated. A block all-reduces its attention output and its MLP output (forward), its two inputs (backward)."""
INIT_STD = 0.02
"""Standard deviation of the normal init of every matmul weight and the embedding."""


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE rotation tables for positions 0..seq_len-1, each (T, hd/2) in float32."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + hd/2) of x (B, heads, T, hd) by position-dependent angles."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, heads, T, hd/2) each
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.type_as(x)


class Attention(nn.Module):
    """Causal grouped-query self-attention: nh query heads share nkv key/value heads."""

    def __init__(self, args: ModelArgs, device: Device = None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.hd
        kv_dim = args.n_kv_heads * args.hd
        self.wq = nn.Linear(args.hidden, args.q_dim, bias=False, device=device)
        self.wk = nn.Linear(args.hidden, kv_dim, bias=False, device=device)
        self.wv = nn.Linear(args.hidden, kv_dim, bias=False, device=device)
        self.wo = nn.Linear(args.q_dim, args.hidden, bias=False, device=device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: under tensor parallelism a rank holds nh/tp query and nkv/tp key/value heads
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa lets the kernel broadcast each kv head to its nh/nkv query heads, so the
        # expanded (B, nh, T, hd) keys and values are never materialised.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, nh·hd) (a tp-th under tensor parallelism)
        return self.wo(y)


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, args: ModelArgs, device: Device = None):
        super().__init__()
        self.w1 = nn.Linear(args.hidden, args.ffn_hidden, bias=False, device=device)  # gate
        self.w3 = nn.Linear(args.hidden, args.ffn_hidden, bias=False, device=device)  # up
        self.w2 = nn.Linear(args.ffn_hidden, args.hidden, bias=False, device=device)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, f) inside, (B, T, C) out


class Block(nn.Module):
    """One pre-norm decoder block: the unit that activation checkpointing wraps, compile compiles and FSDP2 shards.

    With `recompute` set (`full` or `selective`) the block runs under `torch.utils.checkpoint`: `full` keeps only
    its inputs for backward and runs its forward again during backward, `selective` keeps its matmul and attention
    outputs too and runs only the ops between them again (scaling.model.checkpoint). The checkpoint sits inside the
    block's own forward, so a compiled block compiles the recomputation with it.
    """

    def __init__(self, args: ModelArgs, device: Device = None):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.hidden, eps=args.norm_eps, device=device)
        self.attention = Attention(args, device)
        self.ffn_norm = nn.RMSNorm(args.hidden, eps=args.norm_eps, device=device)
        self.feed_forward = FeedForward(args, device)
        self.recompute = "none"

    def _compute(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))  # (B, T, C)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.recompute != "none":
            return run_checkpointed(self._compute, self.recompute, x, cos, sin)
        return self._compute(x, cos, sin)


class Transformer(nn.Module):
    """Llama-style decoder: tokens (B, T) -> logits (B, T, V); `recompute` (none, selective, full) checkpoints every
    block."""

    def __init__(self, args: ModelArgs, recompute: str = "none", device: Device = None):
        # `device="meta"` builds the shapes without memory (then `to_empty` + `init_weights`); it is
        # passed to each layer rather than set with `with torch.device(...)`, whose first use
        # imports the compiler stack.
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.hidden, device=device)
        self.layers = nn.ModuleList(Block(args, device) for _ in range(args.n_layers))
        self.norm = nn.RMSNorm(args.hidden, eps=args.norm_eps, device=device)
        self.output = nn.Linear(args.hidden, args.vocab_size, bias=False, device=device)
        self._tie()
        self.set_recompute(recompute)

    def _tie(self) -> None:
        if self.args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Transformer:
        # Module._apply (to_empty, to, ...) replaces each module's parameters one by one, which
        # turns a shared parameter into two separate ones; tie them again afterwards.
        super()._apply(fn, *args, **kwargs)
        self._tie()
        return self

    def set_recompute(self, recompute: str, every: int = 1) -> None:
        """Checkpoint every `every`-th block under `recompute` (none, selective or full; scaling.core.recompute)."""
        for i, layer in enumerate(self.layers):
            layer.recompute = recompute if checkpointed(i, every) else "none"

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        # Tables for the actual length: a buffer for max_seq_len (131072 for Llama) would be waste.
        cos, sin = rope_cos_sin(T, self.args.hd, self.args.rope_theta, tokens.device)  # (T, hd/2)
        h = self.tok_embeddings(tokens)  # (B, T, C)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))  # (B, T, V)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Seeded init: N(0, 0.02) matmuls and embedding, wo/w2 scaled by 1/sqrt(2L), norms 1.

        Values are drawn from one generator on the parameters' device, parameter by parameter in
        registration order, so the same seed gives bit-identical weights in every process on that
        device type. Works after `to_empty(device=...)` on a model built on the meta device, and on
        FSDP2-sharded (DTensor) parameters: each rank draws the full tensor and keeps its shard, so
        sharded and unsharded models start from the same weights.
        """
        first = next((p for p in self.parameters() if not p.is_meta), None)
        if first is None:
            raise ValueError("init_weights: parameters are on the meta device; call model.to_empty(device=...) first")
        generator = torch.Generator(device=first.device).manual_seed(seed)
        residual_std = INIT_STD / (2 * self.args.n_layers) ** 0.5
        for name, param in self.named_parameters():
            sharded = hasattr(param, "device_mesh")  # a DTensor shard; no import of DTensor needed here
            # a parameter left on meta belongs to another pipeline stage: drawn and dropped, so that every stage's
            # own parameters get the values they get in the whole model
            skipped = param.is_meta and not sharded
            target = torch.empty(param.shape, dtype=param.dtype, device=first.device) if sharded or skipped else param
            owner = name.split(".")[-2]  # attribute name of the owning module, robust to wrapper prefixes
            if owner.endswith("norm"):
                target.fill_(1.0)
            else:
                # Outputs of wo and w2 add into the residual stream L times each: scale them down.
                target.normal_(0.0, residual_std if owner in ("wo", "w2") else INIT_STD, generator=generator)
            if skipped:
                continue
            if sharded:
                from torch.distributed.tensor import (
                    distribute_tensor,  # only sharded models pay for it
                )

                shard = distribute_tensor(target, param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())


class Stage(nn.Module):
    """One pipeline stage of a `Transformer`: a run of its blocks, with the embedding on the first stage and the final
    norm and output projection on the last. It holds the very modules of the whole model (the model, built on meta,
    materialises only what its stages hold), so the model's `init_weights` gives them the values they have at pp 1.
    Tokens (B, T) in on the first stage, hidden states (B, T, C) between stages, logits (B, T, V) out of the last."""

    def __init__(self, model: Transformer, layers: range, first: bool, last: bool):
        super().__init__()
        self.args = model.args
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})  # keys: the blocks' indices
        self.norm = model.norm if last else None
        self.output = model.output if last else None

    def set_recompute(self, recompute: str, every: int = 1) -> None:
        """As `Transformer.set_recompute`, by each block's index in the whole model."""
        for i, layer in self.layers.items():
            layer.recompute = recompute if checkpointed(int(i), every) else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x  # (B, T, C)
        cos, sin = rope_cos_sin(h.shape[1], self.args.hd, self.args.rope_theta, h.device)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.output is None:
            return h
        return self.output(self.norm(h))  # (B, T, V)


def decoder(**fields: Any) -> Transformer:
    """The built-in decoder from the model group's fields, as a model the user brings names it
    (`_target_: scaling.engine.model.decoder`): the same module through the other path."""
    return Transformer(ModelArgs(**fields))
