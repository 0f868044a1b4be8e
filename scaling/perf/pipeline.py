"""Pipeline parallelism's costs: the bubble (the share of a step a stage waits, by schedule: Narayanan et al. 2021,
PTD-P; torch.distributed.pipelining's schedules), the stages' imbalance under the engine's split and the seconds of one
send between stages on the tier it crosses. The step model (scaling.perf.step_model) adds them up."""

from __future__ import annotations

import functools

from scaling.core.enums import PipelineSchedule
from scaling.core.layout import Layout
from scaling.core.stages import split_blocks
from scaling.perf.network import INTER, INTRA, Network


def bubble_fraction(schedule: PipelineSchedule | str, pp: int, microbatches: int, virtual: int = 1) -> float:
    """The idle share of a step on `pp` stages running `microbatches` micro-batches: (pp − 1) / (m + pp − 1) for
    GPipe and 1F1B, that divided by the `virtual` stages per rank for interleaved 1F1B; zero-bubble schedules are
    charged interleaved 1F1B's (their gain, filling the bubble with weight-gradient work, is not modelled). 0 at pp 1.
    """
    if pp <= 1:
        return 0.0
    idle = (pp - 1) / (microbatches + pp - 1)
    if PipelineSchedule(schedule) in (PipelineSchedule.interleaved_1f1b, PipelineSchedule.zero_bubble):
        idle = (pp - 1) / virtual / (microbatches + (pp - 1) / virtual)
    return idle


@functools.lru_cache(maxsize=1024)
def stage_costs(n_blocks: int, block: float, head: float, stages: int) -> tuple[list[range], float]:
    """The engine's split of `n_blocks` blocks of `block` FLOPs per token over `stages` stages, the head's `head` with
    the last (scaling.core.stages.split_blocks), and its imbalance: the costliest stage's FLOPs over the mean's (1:
    balanced; the costliest stage sets the pipeline's pace)."""
    ranges = split_blocks([block] * n_blocks, stages, 0.0, head)
    costs = [len(r) * block + (head if k == stages - 1 else 0.0) for k, r in enumerate(ranges)]
    return ranges, max(costs) * stages / sum(costs)


def send_s(net: Network, layout: Layout, size_bytes: float) -> float:
    """Seconds of one send of `size_bytes` from a stage to the next: α + bytes / β of the tier between them. Ranks are
    numbered pp outermost (scaling.core.layout), so a stage's neighbour is a stage's ranks away: between nodes when a
    stage fills a node or more, else within one."""
    per_node = net.devices_per_node
    tier = INTER if per_node is not None and layout.stage_of(per_node) == 0 else INTRA  # a node holds one stage
    if tier not in net.tiers:
        raise ValueError(f"pp={layout.pp}: the network has no figures for the tier between stages ({tier})")
    ab = net.tiers[tier]
    return ab.alpha_s + size_bytes / ab.beta_bytes_per_s
