"""The record's throughput and efficiency figures, from what rank 0 measured.

tokens_per_s = gbs_tokens / median step time (timed steps only); tokens_per_s_per_gpu =
tokens_per_s / world_size; mfu and hfu through scaling.engine.flops. Every key carries its unit.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from scaling.engine import flops


def throughput_metrics(
    worker: Mapping[str, Any],
    derived: Mapping[str, Any],
    peak_flops_per_s: float,
    flops_per_token: float,
    hw_flops_per_token: float,
) -> dict[str, Any]:
    """The record's `metrics` block for a run that finished."""
    step_times = list(worker["step_times_s"])
    step_time_s = statistics.median(step_times)
    tokens_per_s = derived["gbs_tokens"] / step_time_s
    per_gpu = tokens_per_s / derived["world_size"]
    per_rank = list(worker["peak_mem_bytes_per_rank"])
    reserved = worker.get("peak_mem_reserved_bytes_per_rank")
    return {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": per_gpu,
        "mfu": flops.mfu(flops_per_token, per_gpu, peak_flops_per_s),
        "hfu": flops.hfu(hw_flops_per_token, per_gpu, peak_flops_per_s),
        "peak_flops_per_s": peak_flops_per_s,
        "step_time_s": step_time_s,
        "step_times_s": step_times,
        "measured_window_s": worker["measured_window_s"],
        "peak_mem_bytes": max(per_rank),
        "peak_mem_bytes_per_rank": per_rank,
        "peak_mem_reserved_bytes": max(reserved) if reserved else None,
        "peak_mem_reserved_bytes_per_rank": reserved,
        "num_ooms": worker.get("num_ooms", 0),
        "num_alloc_retries": worker.get("num_alloc_retries", 0),
        "peak_mem_breakdown_rank0": worker.get("peak_mem_breakdown_rank0"),
        "losses": list(worker["losses"]),
        "final_param_norm": worker["final_param_norm"],
    }
