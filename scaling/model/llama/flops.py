"""The built-in family's FLOPs per token in closed form (PaLM's convention), checked against torch's FlopCounterMode
in the tests. The standard library only: the driver and the predictor count without torch."""

from __future__ import annotations

from scaling.core.recompute import recomputed_share
from scaling.model.llama.args import ModelArgs, block_matmul_param_count, matmul_param_count


def flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """Model FLOPs per trained token (forward + backward): 6·N_matmul + 12·L·q·seq (q = nh·hd: h unless the model
    gives its head_dim).

    PaLM convention (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
    appendix B): 6 FLOPs per matmul parameter per token (2 forward, 4 backward) plus
    12·L·q·seq for the attention scores and their weighted sum (QKᵀ and A·V, 2·2·q·seq each in
    forward, times 3 with backward). The attention term is not halved for the causal mask; the
    embedding lookup is excluded and the output projection included (see `matmul_param_count`).
    Recomputation is not counted: these are the FLOPs the model needs, the numerator of MFU.
    """
    if seq_len < 1:
        raise ValueError(f"train.seq_len={seq_len} is invalid: it must be >= 1")
    return 6.0 * matmul_param_count(args) + attention_flops_per_token(args, seq_len)


def attention_flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """The attention scores' and weighted sum's share of `flops_per_token`: 12·L·q·seq."""
    return 12.0 * args.n_layers * args.q_dim * seq_len


def hardware_flops_per_token(args: ModelArgs, seq_len: int, recompute: str, every: int = 1) -> float:
    """FLOPs the hardware executes per token, counting recomputation: the numerator of HFU.

    Full recomputation runs each checkpointed block's forward again during backward, adding (every block)
    2·(N_blocks_matmul − L·h·f) + 4·L·q·seq per token. The output projection is outside the
    blocks and is not recomputed; neither is each block's last matmul, the SwiGLU down projection
    w2 (L·h·f parameters): torch's non-reentrant checkpoint stops recomputing as soon as the
    tensors backward needs are regenerated, and no backward needs w2's output. Without
    recomputation, and with selective recomputation (no matmul or attention runs twice), this equals
    `flops_per_token`; `recompute_every` checkpoints a share of the blocks (scaling.core.recompute).
    """
    share = recomputed_share(recompute, every, args.n_layers)
    return flops_per_token(args, seq_len) + share * recomputed_flops_per_token(args, seq_len)


def recomputed_flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """What full recomputation adds per token: 2·(N_blocks_matmul − L·h·f) + 4·L·q·seq (see above)."""
    recomputed_matmul = block_matmul_param_count(args) - args.n_layers * args.hidden * args.ffn_hidden
    return 2.0 * recomputed_matmul + recomputed_attention_flops_per_token(args, seq_len)


def recomputed_attention_flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """The attention's share of `recomputed_flops_per_token`: its forward once more, 4·L·q·seq."""
    return 4.0 * args.n_layers * args.q_dim * seq_len


def stage_costs(args: ModelArgs, seq_len: int) -> tuple[list[float], float, float]:
    """What a pipeline split weighs, FLOPs per token: each block's (its share of `flops_per_token`), the embedding's
    (0: a lookup) and the head's (6·h·V, the final norm's elementwise work not counted), which sum to
    `flops_per_token`."""
    head = 6.0 * args.hidden * args.vocab_size
    block = (flops_per_token(args, seq_len) - head) / args.n_layers
    return [block] * args.n_layers, 0.0, head
