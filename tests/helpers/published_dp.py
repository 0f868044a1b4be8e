"""Published DP tables: measured tokens/s per GPU at several dp of one configuration, to check extrapolations on.

Source: MosaicML llm-foundry, `scripts/train/benchmarking/README.md` (github.com/mosaicml/llm-foundry, read at commit
061f2c7ce64e655100286584a7629e2a09f827ba), the tables "A100 40GB with 1600 Gbps node-node interconnect (RoCE)"
(bf16, FSDP FULL_SHARD, i.e. ZeRO-3) and "H100 80GB BF16" (amp_bf16, FULL_SHARD). One row of those tables per
(model, GPUs); each configuration below keeps the rows of one model at seq_len 2048 with the same micro-batch
(the dp whose run used another micro-batch is left out), so the points differ in dp and grad_acc only. The
models are MPT (GELU MLP of 4 × d_model, ALiBi, tied embeddings, vocabulary 50,368); the step model takes them
as the built-in decoder of the same width, depth and heads, its three MLP matrices ffn_hidden = 8/3 d_model wide
(the same parameters per layer). The Ultra-Scale Playbook's DP runs are not included: its figures are published
as plots without their numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from scaling.core.schema import ModelConfig
from scaling.model.shape import param_tensors

SOURCE = "llm-foundry scripts/train/benchmarking/README.md @ 061f2c7c"


@dataclass(frozen=True)
class Table:
    """One configuration's published tokens/s per GPU by dp (and the grad_acc each dp ran at)."""

    name: str
    hardware: str
    model: ModelConfig
    mbs: int
    recompute: str
    tokens_per_s_per_gpu: dict[int, tuple[int, float]]
    """dp: (grad_acc, tokens/s per GPU)."""

    def frame(self, dps: tuple[int, ...]) -> pd.DataFrame:
        """The rows at `dps` as `analysis.dp_scaling.scaling_table` has them (one timed step: the published figure)."""
        n_params = sum(t.numel for t in param_tensors(self.model))
        rows = []
        for dp in dps:
            ga, tps = self.tokens_per_s_per_gpu[dp]
            step = self.mbs * 2048 * ga / tps
            rows.append(
                {
                    "config": self.name,
                    "model": self.model.name,
                    **{k: getattr(self.model, k) for k in ("n_layers", "hidden", "n_heads", "n_kv_heads")},
                    "ffn_hidden": self.model.ffn_hidden,
                    "vocab_size": self.model.vocab_size,
                    "tie_embeddings": True,
                    "n_params": n_params,
                    "zero_stage": 3,
                    "precision": "bf16",
                    "mbs": self.mbs,
                    "seq_len": 2048,
                    "dp": dp,
                    "grad_acc": ga,
                    "gbs": self.mbs * ga * dp,
                    "recompute": self.recompute,
                    "fsdp_grad_reduce": "every_micro_step",
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


TABLES = (
    Table(
        "mpt-125m A100-40GB mbs 26",
        "a100",
        _mpt("mpt_125m", 768, 12, 12),
        26,
        "none",
        {8: (3, 136334), 16: (1, 130535), 32: (1, 127122), 64: (1, 125234), 128: (1, 123936)},
    ),
    Table(
        "mpt-350m A100-40GB mbs 18",
        "a100",
        _mpt("mpt_350m", 1024, 24, 16),
        18,
        "none",
        {16: (1, 55413), 32: (1, 53811), 64: (1, 52689), 128: (1, 51934)},
    ),
    Table(
        "mpt-760m A100-40GB mbs 12",
        "a100",
        _mpt("mpt_760m", 1536, 24, 12),
        12,
        "none",
        {8: (4, 30173), 16: (1, 29607), 32: (1, 29648), 64: (1, 29344), 128: (1, 28940)},
    ),
    Table(
        "mpt-7b A100-40GB mbs 18, recompute",
        "a100",
        _mpt("mpt_7b", 4096, 32, 32),
        18,
        "full",
        {16: (1, 3645), 32: (1, 3725), 64: (1, 3665), 128: (1, 3623)},
    ),
    Table(
        "mpt-1b H100 mbs 20",
        "h100",
        _mpt("mpt_1b", 2048, 24, 16),
        20,
        "none",
        {16: (1, 46037), 32: (1, 45130), 64: (1, 44402)},
    ),
)
"""Each fitted on its dp up to 32, held out above."""
