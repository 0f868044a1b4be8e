"""The record's throughput, efficiency and memory figures, from what rank 0 measured.

tokens_per_s = gbs_tokens / median step time (timed steps only); tokens_per_s_per_gpu =
tokens_per_s / world_size; mfu and hfu through scaling.engine.flops, against the peak FLOP/s the
driver resolved (and the record says where that peak came from). Every key carries its unit.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Optional

from scaling.engine import flops


def tokens_per_s(gbs_tokens: float, step_time_s: float) -> float:
    """Tokens of one global batch over the time of one optimizer step."""
    return gbs_tokens / step_time_s


def _max(values: Optional[list[int]]) -> Optional[int]:
    return max(values) if values else None


def throughput_metrics(worker: Mapping[str, Any], derived: Mapping[str, Any], peak: flops.PeakFlops) -> dict[str, Any]:
    """The record's `metrics` block for a run that finished."""
    step_times = list(worker["step_times_s"])
    step_time_s = statistics.median(step_times)
    total = tokens_per_s(derived["gbs_tokens"], step_time_s)
    per_gpu = total / derived["world_size"]
    warmup = list(worker["warmup_step_times_s"])
    return {
        "tokens_per_s": total,
        "tokens_per_s_per_gpu": per_gpu,
        "mfu": flops.mfu(derived["flops_per_token"], per_gpu, peak.flops_per_s),
        "hfu": flops.hfu(derived["hw_flops_per_token"], per_gpu, peak.flops_per_s),
        "peak_flops_per_s": peak.flops_per_s,
        "peak_flops_source": peak.source,
        "peak_flops_measured_at": peak.measured_at,
        "peak_flops_spread": peak.spread,
        "step_time_s": step_time_s,
        "step_times_s": step_times,
        "warmup_step_times_s": warmup,
        # With compile the first warm-up step compiles: its excess over a timed step is the compile time.
        "compile_s": max(0.0, warmup[0] - step_time_s) if worker["compile"] and warmup else None,
        "recompiles_after_warmup": worker["recompiles_after_warmup"],
        "measured_window_s": worker["measured_window_s"],
        "peak_mem_bytes": max(worker["peak_mem_bytes_per_rank"]),
        "peak_mem_bytes_per_rank": list(worker["peak_mem_bytes_per_rank"]),
        "peak_mem_source": worker["peak_mem_source"],
        "peak_mem_reserved_bytes": _max(worker["peak_mem_reserved_bytes_per_rank"]),
        "peak_mem_reserved_bytes_per_rank": worker["peak_mem_reserved_bytes_per_rank"],
        "device_used_bytes": _max(worker["device_used_bytes_per_rank"]),
        "device_used_bytes_per_rank": worker["device_used_bytes_per_rank"],
        "build_peak_mem_bytes": _max(worker["build_peak_mem_bytes_per_rank"]),
        "build_peak_mem_bytes_per_rank": worker["build_peak_mem_bytes_per_rank"],
        "peak_rss_growth_bytes": _max(worker["peak_rss_growth_bytes_per_rank"]),
        "peak_rss_growth_bytes_per_rank": worker["peak_rss_growth_bytes_per_rank"],
        "optimizer_state_bytes_per_rank": worker["optimizer_state_bytes_per_rank"],
        "num_ooms": worker["num_ooms"],
        "num_alloc_retries": worker["num_alloc_retries"],
        "peak_mem_breakdown_rank0": worker["peak_mem_breakdown_rank0"],
        "losses": list(worker["losses"]),
        "final_param_norm": worker["final_param_norm"],
    }
