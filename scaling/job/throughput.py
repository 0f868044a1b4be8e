"""The record's throughput, efficiency and memory figures, from what rank 0 measured, with their noise.

tokens_per_s = gbs_tokens / median step time (timed steps only); tokens_per_s_per_gpu =
tokens_per_s / world_size; mfu and hfu through scaling.engine.peak_flops, against the peak FLOP/s the
driver resolved (and the record says where that peak came from). Every key carries its unit.

Noise is stated with scaling.core.noise's one statistic, the relative half-range. A launch states it over its
timed steps (`step_time_spread_frac`); a point launched k times (`launch.repeats=k`) states it over
the repeats' tokens/s (`repeat_spread_frac`), and its headline figures are the median over repeats.
`noise_band_frac`, the larger of the two, is the band within which two figures are not told apart. A launch whose
training is not finite publishes none of them (`not_finite`: it is `failed`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Optional, Sequence

from scaling.core.derived import Derived
from scaling.core.layout import Layout
from scaling.core.noise import relative_spread
from scaling.engine import peak_flops
from scaling.engine.jobfiles import WorkerReport
from scaling.store.record_blocks import Metrics

PEAK_KEYS = (
    "peak_mem_bytes",
    "peak_mem_reserved_bytes",
    "device_used_bytes",
    "build_peak_mem_bytes",
    "peak_rss_growth_bytes",
)
"""Memory peaks a launch reports per rank (`<key>_per_rank`) and as their max (`<key>`)."""


def tokens_per_s(derived: Derived, step_time_s: float) -> tuple[float, float]:
    """Tokens/s and tokens/s per GPU of a step of `step_time_s`: the tokens of one global batch
    (`derived.gbs_tokens`) over the time of one optimizer step, and that over `derived.world_size`."""
    total = derived.gbs_tokens / step_time_s
    return total, total / derived.world_size


def _max(values: Optional[list[int]]) -> Optional[int]:
    return max(values) if values else None


def not_finite(worker: WorkerReport) -> Optional[str]:
    """Why a launch that trained is not ok when a step's loss or gradient norm (warm-up steps included) or the final
    parameter norm is NaN or infinite, naming the first such step and its value; None when every one is finite."""
    for name, values in (("loss", worker.losses), ("gradient norm", worker.grad_norms or [])):
        for step, value in enumerate(values):
            if not math.isfinite(value):
                return (
                    f"training is not finite: the {name} of step {step} (of {len(values)}, the first "
                    f"{worker.warmup_steps_run} warm-up) is {value}: no throughput is published for it"
                )
    if not math.isfinite(worker.final_param_norm):
        return f"training is not finite: the final parameter norm is {worker.final_param_norm}"
    return None


def peak_stage(per_rank: Sequence[int], layout: Layout) -> Optional[int]:
    """The pipeline stage of the rank with the largest peak (the first such rank); None without stages."""
    if layout.pp <= 1 or not per_rank:
        return None
    return layout.stage_of(max(range(len(per_rank)), key=lambda r: per_rank[r]))


def throughput_metrics(
    worker: WorkerReport, derived: Derived, peak: peak_flops.PeakFlops, layout: Layout = Layout()
) -> dict[str, Any]:
    """The `metrics` block (scaling.store.record_blocks.Metrics) of one launch that finished, from what its rank 0
    reported; `layout` names the stage of the largest peak."""
    step_times = list(worker.step_times_s)
    step_time_s = statistics.median(step_times)
    total, per_gpu = tokens_per_s(derived, step_time_s)
    warmup = list(worker.warmup_step_times_s)
    spread = relative_spread(step_times)
    return Metrics(
        tokens_per_s=total,
        tokens_per_s_per_gpu=per_gpu,
        mfu=peak_flops.mfu(derived.flops_per_token, per_gpu, peak.flops_per_s),
        hfu=peak_flops.hfu(derived.hw_flops_per_token, per_gpu, peak.flops_per_s),
        peak_flops_per_s=peak.flops_per_s,
        peak_flops_source=peak.source,
        peak_flops_measured_at=peak.measured_at,
        peak_flops_spread=peak.spread,
        step_time_s=step_time_s,
        step_times_s=step_times,
        step_time_spread_frac=spread,
        repeat_spread_frac=None,
        noise_band_frac=spread,
        repeats_ok=1,
        tokens_per_s_per_gpu_repeats=[per_gpu],
        warmup_step_times_s=warmup,
        # With compile the first warm-up step compiles: its excess over a timed step is the compile time.
        compile_s=max(0.0, warmup[0] - step_time_s) if worker.compile and warmup else None,
        recompiles_after_warmup=worker.recompiles_after_warmup,
        measured_window_s=worker.measured_window_s,
        peak_mem_bytes=max(worker.peak_mem_bytes_per_rank),
        peak_mem_bytes_per_rank=list(worker.peak_mem_bytes_per_rank),
        peak_mem_stage=peak_stage(worker.peak_mem_bytes_per_rank, layout),
        pipeline_idle_frac_per_rank=worker.pipeline_idle_frac_per_rank,
        peak_mem_source=worker.peak_mem_source,
        peak_mem_reserved_bytes=_max(worker.peak_mem_reserved_bytes_per_rank),
        peak_mem_reserved_bytes_per_rank=worker.peak_mem_reserved_bytes_per_rank,
        device_used_bytes=_max(worker.device_used_bytes_per_rank),
        device_used_bytes_per_rank=worker.device_used_bytes_per_rank,
        build_peak_mem_bytes=_max(worker.build_peak_mem_bytes_per_rank),
        build_peak_mem_bytes_per_rank=worker.build_peak_mem_bytes_per_rank,
        peak_rss_growth_bytes=_max(worker.peak_rss_growth_bytes_per_rank),
        peak_rss_growth_bytes_per_rank=worker.peak_rss_growth_bytes_per_rank,
        optimizer_state_bytes_per_rank=worker.optimizer_state_bytes_per_rank,
        num_ooms=worker.num_ooms,
        num_alloc_retries=worker.num_alloc_retries,
        peak_mem_breakdown_rank0=worker.peak_mem_breakdown_rank0,
        losses=list(worker.losses),
        grad_norms=worker.grad_norms,  # before clipping, one per optimizer step; None: clipping off
        rows_built_in_timed_window=worker.rows_built_in_timed_window,
        final_param_norm=worker.final_param_norm,
    ).to_dict()


def _peaks(launches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each memory peak of `PEAK_KEYS` the launches report: per rank the largest any launch saw, and
    the largest of those."""
    out: dict[str, Any] = {}
    for key in PEAK_KEYS:
        per_rank = [m[f"{key}_per_rank"] for m in launches if m.get(f"{key}_per_rank")]
        if per_rank:
            out[f"{key}_per_rank"] = [max(column) for column in zip(*per_rank)]
            out[key] = max(out[f"{key}_per_rank"])
    return out


def repeats_metrics(
    launches: Sequence[Mapping[str, Any]], derived: Derived, layout: Layout = Layout()
) -> dict[str, Any]:
    """The point's `metrics` over the `metrics` blocks of its ok launches (launch order), one or more.

    Throughput is the median over launches: step_time_s = median of their median step times,
    tokens_per_s = gbs_tokens / step_time_s (for an odd count, the median launch's tokens/s);
    `step_times_s` holds every timed step of every launch, in order. Memory is the largest any
    launch saw; losses, the final parameter norm, the peak FLOP/s and the warm-up are the first
    launch's (the data is seeded; each launch keeps its own in the record's `repeats`); the stage of the largest
    peak is that of the per-rank largest.
    """
    if not launches:
        raise ValueError("repeats_metrics needs at least one ok launch")
    if len(launches) == 1:
        return dict(launches[0])
    first = launches[0]
    peaks = _peaks(launches)
    step_time_s = statistics.median(m["step_time_s"] for m in launches)
    total, per_gpu = tokens_per_s(derived, step_time_s)
    by_launch = [m["tokens_per_s_per_gpu"] for m in launches]
    within = statistics.median(relative_spread(m["step_times_s"]) for m in launches)
    across = relative_spread(by_launch)
    return Metrics.from_dict(
        {
            **first,
            "tokens_per_s": total,
            "tokens_per_s_per_gpu": per_gpu,
            "mfu": peak_flops.mfu(derived.flops_per_token, per_gpu, first["peak_flops_per_s"]),
            "hfu": peak_flops.hfu(derived.hw_flops_per_token, per_gpu, first["peak_flops_per_s"]),
            "step_time_s": step_time_s,
            "step_times_s": [t for m in launches for t in m["step_times_s"]],
            "step_time_spread_frac": within,
            "repeat_spread_frac": across,
            "noise_band_frac": max(within, across),
            "repeats_ok": len(launches),
            "tokens_per_s_per_gpu_repeats": by_launch,
            "measured_window_s": sum(m["measured_window_s"] for m in launches),
            **peaks,
            "peak_mem_stage": peak_stage(peaks.get("peak_mem_bytes_per_rank", []), layout),
            "num_ooms": sum(m.get("num_ooms", 0) for m in launches),
            "num_alloc_retries": sum(m.get("num_alloc_retries", 0) for m in launches),
        }
    ).to_dict()
