"""Published DP tables: measured tokens/s per GPU at several GPU counts of one configuration, to check extrapolations
on. Each table says where it comes from (repository, file, table, commit), its conditions, how the step model reads
it, which GPU counts are fitted and which held out, and whether it may be used to tune the model (`tuning`).

(1) MosaicML llm-foundry, `scripts/train/benchmarking/README.md` (github.com/mosaicml/llm-foundry @ 061f2c7c), the
tables "A100 40GB with 1600 Gbps node-node interconnect (RoCE)" and "H100 80GB BF16": bf16, FSDP FULL_SHARD (ZeRO-3),
seq 2048, one micro-batch per table (rows at another micro-batch left out). MPT (GELU MLP of 4 × d_model, ALiBi,
tied embeddings, vocabulary 50,368), read as the built-in decoder of the same width, depth and heads with
ffn_hidden = 8/3 d_model (the same parameters per layer). (2)-(3) NVIDIA DGX Cloud Benchmarking recipes
(github.com/NVIDIA/dgxc-benchmarking, release v25.01 @ 143b90dd): MaxText Llama 2 70B (FSDP, JAX) and NeMo 24.09
Llama 3.1 8B (Megatron's distributed optimizer, context parallel 2), DGX H100, weak scaling (the batch grows with
the GPU count). The Ultra-Scale Playbook's DP runs are published as plots without their numbers and are not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from scaling.core.schema import ModelConfig
from scaling.model.family import family_of

SOURCE = "llm-foundry scripts/train/benchmarking/README.md @ 061f2c7c"
DGXC = "github.com/NVIDIA/dgxc-benchmarking v25.01 @ 143b90dd91f9be958fed4773ae95d941a3356a82"


@dataclass(frozen=True)
class Table:
    """One configuration's published tokens/s per GPU by GPU count (and the grad_acc each count ran at)."""

    name: str
    hardware: str
    model: ModelConfig
    mbs: int
    recompute: str
    tokens_per_s_per_gpu: dict[int, tuple[int, float]]
    """GPUs (each a data-parallel rank of the step model): (grad_acc, tokens/s per GPU)."""
    seq_len: int = 2048
    """Tokens of one micro-batch on one rank (with context parallelism, the rank's part of the sequence)."""
    zero_stage: int = 3
    fsdp_grad_reduce: str = "every_micro_step"
    fitted: tuple[int, ...] = ()
    """The GPU counts fitted; the others are held out (and checked)."""
    source: str = SOURCE
    where: str = ""
    """The file and table the figures are transcribed from."""
    conditions: str = ""
    """What the runs were, and how the step model reads them."""
    tuning: bool = True
    """Whether the model's priors may be tuned on this table (False: kept out of any tuning, a check only)."""
    not_modelled: dict[int, float] = field(default_factory=dict)
    """Published GPU counts in a layout the step model does not describe (transcribed, not checked)."""

    @property
    def held_out(self) -> list[int]:
        """The GPU counts checked: every published count not fitted."""
        return [d for d in self.tokens_per_s_per_gpu if d not in self.fitted]

    def frame(self, dps: tuple[int, ...]) -> pd.DataFrame:
        """The rows at `dps` as `analysis.dp_scaling.scaling_table` has them (one timed step: the published figure)."""
        n_params = sum(t.numel for t in family_of(self.model).shape(self.seq_len).tensors)
        rows = []
        for dp in dps:
            ga, tps = self.tokens_per_s_per_gpu[dp]
            step = self.mbs * self.seq_len * ga / tps
            rows.append(
                {
                    "config": self.name,
                    "model": self.model.name,
                    **{k: getattr(self.model, k) for k in ("n_layers", "hidden", "n_heads", "n_kv_heads")},
                    "ffn_hidden": self.model.ffn_hidden,
                    "vocab_size": self.model.vocab_size,
                    "tie_embeddings": self.model.tie_embeddings,
                    "n_params": n_params,
                    "zero_stage": self.zero_stage,
                    "precision": "bf16",
                    "mbs": self.mbs,
                    "seq_len": self.seq_len,
                    "dp": dp,
                    "grad_acc": ga,
                    "gbs": self.mbs * ga * dp,
                    "recompute": self.recompute,
                    "fsdp_grad_reduce": self.fsdp_grad_reduce,
                    "grad_clip": 1.0,
                    "bucket_mb": 25.0,
                    "hardware": self.hardware,
                    "devices_per_node": 8,
                    "step_time_s": step,
                    "step_times_s": [step],
                    "tokens_per_s_per_gpu": tps,
                }
            )
        return pd.DataFrame(rows)


def _mpt(name: str, d: int, layers: int, heads: int) -> ModelConfig:
    return ModelConfig(
        name=name,
        n_layers=layers,
        hidden=d,
        n_heads=heads,
        n_kv_heads=heads,
        ffn_hidden=round(8 * d / 3),
        vocab_size=50368,
        tie_embeddings=True,
    )


FOUNDRY_A100 = "table 'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'"
FOUNDRY_H100 = "table 'H100 80GB BF16'"
FOUNDRY = "llm-foundry (Composer, PyTorch FSDP FULL_SHARD), bf16, seq 2048"
LLM_FOUNDRY = (
    Table(
        "mpt-125m A100-40GB mbs 26",
        "a100",
        _mpt("mpt_125m", 768, 12, 12),
        26,
        "none",
        {8: (3, 136334), 16: (1, 130535), 32: (1, 127122), 64: (1, 125234), 128: (1, 123936)},
        fitted=(8, 16, 32),
        where=FOUNDRY_A100,
        conditions=FOUNDRY,
    ),
    Table(
        "mpt-350m A100-40GB mbs 18",
        "a100",
        _mpt("mpt_350m", 1024, 24, 16),
        18,
        "none",
        {16: (1, 55413), 32: (1, 53811), 64: (1, 52689), 128: (1, 51934)},
        fitted=(16, 32),
        where=FOUNDRY_A100,
        conditions=FOUNDRY,
    ),
    Table(
        "mpt-760m A100-40GB mbs 12",
        "a100",
        _mpt("mpt_760m", 1536, 24, 12),
        12,
        "none",
        {8: (4, 30173), 16: (1, 29607), 32: (1, 29648), 64: (1, 29344), 128: (1, 28940)},
        fitted=(8, 16, 32),
        where=FOUNDRY_A100,
        conditions=FOUNDRY,
    ),
    Table(
        "mpt-7b A100-40GB mbs 18, recompute",
        "a100",
        _mpt("mpt_7b", 4096, 32, 32),
        18,
        "full",
        {16: (1, 3645), 32: (1, 3725), 64: (1, 3665), 128: (1, 3623)},
        fitted=(16, 32),
        where=FOUNDRY_A100,
        conditions=FOUNDRY + ", activation checkpointing",
    ),
    Table(
        "mpt-1b H100 mbs 20",
        "h100",
        _mpt("mpt_1b", 2048, 24, 16),
        20,
        "none",
        {16: (1, 46037), 32: (1, 45130), 64: (1, 44402)},
        fitted=(16, 32),
        where=FOUNDRY_H100,
        conditions=FOUNDRY + " (amp_bf16)",
        tuning=False,
    ),
)
"""Each fitted on its GPU counts up to 32, held out above; the H100 table is kept out of any tuning."""

LLAMA2_70B = ModelConfig(
    name="llama2_70b", n_layers=80, hidden=8192, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=32000
)
LLAMA31_8B = ModelConfig(
    name="llama31_8b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab_size=128256
)
DGX_CLOUD = (
    Table(
        "llama2-70b MaxText FSDP H100 mbs 2",
        "h100",
        LLAMA2_70B,
        2,
        "none",
        # tokens/s per GPU = 4096 × 2 / the step time published (6.999, 7.072, 7.153 s)
        {64: (1, 1170.45), 128: (1, 1158.37), 256: (1, 1145.25)},
        seq_len=4096,
        fitted=(64, 128),
        source=DGXC,
        where="maxtext/README_70b.md, table 'Maxtext LLama2 70b BF16 (FSDP+DP MBS=2)'",
        conditions=(
            "JAX MaxText (ghcr.io/nvidia/jax:maxtext-2024-12-09), bf16, seq 4096, global batch 2 × GPUs, remat "
            "policy save_dot_except_mlpwi (maxtext/configure.sh: part of the MLP recomputed; read as no "
            "recomputation), synthetic data, FSDP over every GPU up to 256 (ZeRO-3 in the step model)"
        ),
        not_modelled={512: 1155.27, 1024: 1156.41, 2048: 1159.35},
    ),
    Table(
        "llama3.1-8b NeMo distributed optimizer CP2 H100",
        "h100",
        LLAMA31_8B,
        1,
        "none",
        # tokens/s per GPU = 8192 × 128 per node / the step time / 8 (12.91, 13.00, 13.05, 13.08, 13.10 s)
        {8: (32, 10152.9), 16: (32, 10082.5), 32: (32, 10043.8), 64: (32, 10020.8), 128: (32, 10005.5)},
        seq_len=4096,
        zero_stage=2,
        fsdp_grad_reduce="last_micro_step",
        fitted=(8, 16, 32),
        source=DGXC,
        where="llama3.1/README_8b.md, table 'Llama 3.1 8b 24.09 BF16 (TP=1, PP=1, CP=2, MBS=1, GA=32)'",
        conditions=(
            "NeMo 24.09 (Megatron-Core), bf16, seq 8192 split over a context-parallel pair, micro-batch 1, "
            "grad_acc 32, global batch 128 per node, distributed_fused_adam with overlap_grad_sync and "
            "overlap_param_sync (llama3.1/llama3.1_8b.yaml), no activation checkpointing; read as ZeRO-2 reducing "
            "on the last micro-step over every GPU, 4096 tokens per rank and micro-step (its gradients travel in "
            "bf16, the model's in fp32; the context-parallel exchange is in the fitted compute)"
        ),
        tuning=False,
    ),
)
"""Weak-scaling tables on H100: fitted on the smaller counts, held out above. The NeMo table is kept out of any
tuning; MaxText's counts of 512 GPUs and more shard over 128 GPUs and replicate across (hybrid sharding), a layout
the step model does not describe: transcribed, not checked."""

TABLES = (*LLM_FOUNDRY, *DGX_CLOUD)
