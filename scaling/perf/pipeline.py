"""The pipeline bubble: the share of a step a pipeline stage waits, by schedule (Narayanan et al. 2021, PTD-P;
torch.distributed.pipelining's schedules)."""

from __future__ import annotations

from scaling.core.enums import PipelineSchedule


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
