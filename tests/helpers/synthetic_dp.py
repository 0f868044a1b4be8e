"""Synthetic DP curves from known step-model parameters, for the extrapolation tests and benchmark.

A `Truth` is a workload, a two-tier network, a compute time per micro-step, an optimizer time per parameter
updated and an overlap; `measure`
draws the timed steps of a point at dp=n with multiplicative Gaussian noise, as a sweep would record them,
and `profile_of` the collective timings `scaling collectives` would record of its network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import yaml

from scaling.core.schema import CONF_DIR, ModelConfig
from scaling.model.family import family_of
from scaling.model.shape import ModelShape
from scaling.perf.network import INTER, INTRA, AlphaBeta, Network, NetworkEstimate, fit_tiers
from scaling.perf.network_figures import Profile, published_estimate
from scaling.perf.step_model import Point, Workload, step_time_s


@dataclass(frozen=True)
class Truth:
    """Known parameters of a step model."""

    name: str
    workload: Workload
    network: Network
    compute_s: float
    overlap: float
    optimizer_s_per_param: float = 0.0

    def network_at(self, n: int) -> Network:
        """The network a ring of n ranks runs on."""
        return self.network

    def step_time_s(self, n: int) -> float:
        """The true (noise-free) step time at dp=n."""
        return step_time_s(self.workload, self.network, n, self.compute_s, self.overlap, self.optimizer_s_per_param)

    def tokens_per_s_per_gpu(self, n: int) -> float:
        """The true tokens/s per GPU at dp=n."""
        return self.workload.tokens_per_rank(n) / self.step_time_s(n)

    def efficiency(self, dps: Sequence[int]) -> list[float]:
        """True efficiency at each dp relative to the first."""
        return [self.tokens_per_s_per_gpu(n) / self.tokens_per_s_per_gpu(dps[0]) for n in dps]


def measure(
    truth: Truth, dps: Sequence[int], rng: np.random.Generator, steps: int = 5, noise: float = 0.02
) -> list[Point]:
    """The points a sweep would record at each dp: `steps` timed steps, each off by N(0, noise) relative."""
    return [
        Point(n, truth.workload.grad_acc_at(n), tuple(truth.step_time_s(n) * (1 + rng.normal(0, noise, steps))))
        for n in dps
    ]


def profile_of(
    truth: Truth, rng: np.random.Generator, world_sizes: Sequence[int] = (2, 4, 8, 16), noise: float = 0.05
) -> Profile:
    """What `scaling collectives` would measure of the truth's network: 5 timed calls per collective and size."""
    samples = []
    for n in world_sizes:
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            for size in (4096, 2**20, 2**24, 2**28):
                times = [truth.network_at(n).time_s(op, n, size) * (1 + e) for e in rng.normal(0, noise, 5)]
                samples.append(
                    {"op": op, "world_size": n, "size_bytes": size, "time_s": float(np.median(times)), "times_s": times}
                )
    dpn = truth.network.devices_per_node
    return Profile(f"synthetic, n={','.join(map(str, world_sizes))}", dpn, fit_tiers(samples, dpn), tuple(samples))


SYNTHETIC_NETWORK = Path(__file__).parent / "network"
"""Where the published ranges of the truths' network live (`published_estimate("synthetic", ..., SYNTHETIC_NETWORK)`)."""


def published_synthetic(n_draws: int, rng: np.random.Generator) -> NetworkEstimate:
    """Published figures that hold the truths' network (tests/helpers/network/synthetic.yaml), as source (c)."""
    est = published_estimate("synthetic", 8, n_draws, rng, SYNTHETIC_NETWORK)
    assert est is not None
    return est


def h100_network(
    inter_alpha_s: float = 12e-6, inter_beta: float = 40e9, devices_per_node: Optional[int] = 8
) -> Network:
    """NVLink-like tier within a node, InfiniBand-like between nodes."""
    return Network({INTRA: AlphaBeta(3e-6, 360e9), INTER: AlphaBeta(inter_alpha_s, inter_beta)}, devices_per_node)


def preset(name: str) -> ModelConfig:
    """A model preset of the `model` config group (conf/model/<name>.yaml)."""
    return ModelConfig(
        **{
            k: v
            for k, v in yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text()).items()
            if k != "defaults"
        }
    )


LLAMA_1B, LLAMA_8B = preset("llama_1b"), preset("llama_8b")


def shape(model: ModelConfig) -> ModelShape:
    """A built-in preset's parameter tensors and blocks, as its family gives them (the same at any seq_len)."""
    return family_of(model).shape(1)


def llama_1b(zero_stage: int, gbs: int = 512, mbs: int = 1, **settings: Any) -> Workload:
    """Llama 3.2 1B at seq 4096, bf16, a fixed global batch; `settings` the Workload's other fields."""
    return Workload(zero_stage, shape(LLAMA_1B), "bf16", mbs, 4096, gbs, **settings)


ADAMW_S_PER_PARAM = 12e-12
"""A fused AdamW step on an H100: about 28 bytes of HBM traffic per fp32 parameter (read p, g, m, v; write p, m, v)
at some 2.4 TB/s."""
TRUTHS = (
    Truth(
        "1B ZeRO-0, overlap 0.5, AdamW",
        llama_1b(0),
        h100_network(),
        compute_s=0.075,
        overlap=0.5,
        optimizer_s_per_param=ADAMW_S_PER_PARAM,
    ),
    Truth(
        "1B ZeRO-1, no overlap, a broadcast per tensor, AdamW",
        llama_1b(1),
        h100_network(),
        compute_s=0.075,
        overlap=0.0,
        optimizer_s_per_param=ADAMW_S_PER_PARAM,
    ),
    Truth(
        "1B ZeRO-2, overlap 0.5, gathered behind the first forward",
        llama_1b(2, gbs=1024, mbs=2),
        h100_network(),
        compute_s=0.15,
        overlap=0.5,
        optimizer_s_per_param=ADAMW_S_PER_PARAM,
    ),
    Truth(
        "1B ZeRO-3, overlap 0.6, clipped",
        llama_1b(3, gbs=2048, mbs=2, grad_clip=1.0),
        h100_network(),
        compute_s=0.15,
        overlap=0.6,
        optimizer_s_per_param=ADAMW_S_PER_PARAM,
    ),
    Truth(
        "1B ZeRO-3, recompute, overlap 0.6",
        llama_1b(3, gbs=2048, mbs=2, recompute="full"),
        h100_network(),
        compute_s=0.2,
        overlap=0.6,
        optimizer_s_per_param=ADAMW_S_PER_PARAM,
    ),
    Truth(
        "8B ZeRO-1, overlap 0.3",
        Workload(1, shape(LLAMA_8B), "bf16", 1, 8192, 1024),
        h100_network(),
        compute_s=0.95,
        overlap=0.3,
        optimizer_s_per_param=ADAMW_S_PER_PARAM,
    ),
)
"""Truths with a knee between dp=16 and dp=512 on 8-GPU nodes: each stage, overlap from none to most, the
optimizer step of a fused AdamW, clipping, recomputation."""


@dataclass(frozen=True)
class Mismatch(Truth):
    """A truth with effects the step model does not contain (each 0 by default)."""

    third_tier_past: Optional[int] = None
    """Rings of more ranks cross a third tier (a spine): the bandwidth between nodes halves, its latency doubles."""
    congestion: float = 0.0
    """The bandwidth between nodes falls by 1 / (1 + congestion · log2(nodes)) as the ring grows."""
    straggler: float = 0.0
    """Each rank's compute varies by this much (relative): the step waits for the slowest, √(2 ln n) of it above."""
    optimizer_per_shard_s: float = 0.0
    """Seconds the optimizer step adds per rank it is sharded over (gathering the shards' norms, a launch per
    shard): it grows with the shard count instead of shrinking."""

    def network_at(self, n: int) -> Network:
        """The two-tier network, slowed between nodes by congestion and, past `third_tier_past`, by the spine."""
        dpn = self.network.devices_per_node or n
        inter = self.network.tiers[INTER]
        nodes = -(-n // dpn)
        slow = 1 + self.congestion * math.log2(nodes) if nodes > 1 else 1.0
        if self.third_tier_past is not None and n > self.third_tier_past:
            slow *= 2
        tiers = {**self.network.tiers, INTER: AlphaBeta(inter.alpha_s * slow, inter.beta_bytes_per_s / slow)}
        return Network(tiers, self.network.devices_per_node)

    def step_time_s(self, n: int) -> float:
        """The true step time: the step model on the network at n, the slowest rank's compute, the optimizer's
        per-shard cost."""
        compute = self.compute_s * (1 + self.straggler * (math.sqrt(2 * math.log(n)) if n > 1 else 0.0))
        t = step_time_s(self.workload, self.network_at(n), n, compute, self.overlap, self.optimizer_s_per_param)
        return t + (self.optimizer_per_shard_s * n if self.workload.zero_stage >= 1 else 0.0)


MISMATCHED = (
    Mismatch(
        "1B ZeRO-0 + a third tier past 64 ranks",
        llama_1b(0),
        h100_network(),
        0.075,
        0.5,
        ADAMW_S_PER_PARAM,
        third_tier_past=64,
    ),
    Mismatch(
        "1B ZeRO-3 clipped + congestion 15% per doubling of the nodes",
        llama_1b(3, gbs=2048, mbs=2, grad_clip=1.0),
        h100_network(),
        0.15,
        0.6,
        ADAMW_S_PER_PARAM,
        congestion=0.15,
    ),
    Mismatch(
        "1B ZeRO-2 + a straggler (2% compute spread)",
        llama_1b(2, gbs=1024, mbs=2),
        h100_network(),
        0.15,
        0.5,
        ADAMW_S_PER_PARAM,
        straggler=0.02,
    ),
    Mismatch(
        "1B ZeRO-1 + an optimizer step growing 0.3 ms per shard",
        llama_1b(1),
        h100_network(),
        0.075,
        0.0,
        ADAMW_S_PER_PARAM,
        optimizer_per_shard_s=3e-4,
    ),
    Mismatch(
        "8B ZeRO-1 + all four",
        Workload(1, shape(LLAMA_8B), "bf16", 1, 8192, 1024),
        h100_network(),
        0.95,
        0.3,
        ADAMW_S_PER_PARAM,
        third_tier_past=64,
        congestion=0.1,
        straggler=0.02,
        optimizer_per_shard_s=3e-4,
    ),
)
"""Truths with effects the step model does not contain: a third network tier, congestion that grows with the ring,
a straggler rank, an optimizer step that grows with the shard count; each alone, then all four."""
