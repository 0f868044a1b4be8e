"""One launch's metrics block as the driver makes it from what rank 0 wrote, for the tests of the metrics and
their noise (the job writes it through scaling.job.throughput)."""

from __future__ import annotations

from scaling.core.derived import Derived
from scaling.engine.jobfiles import WorkerReport
from scaling.engine.peak_flops import PeakFlops
from scaling.job.throughput import throughput_metrics

DERIVED = Derived(
    gbs=10, gbs_tokens=1000, grad_acc=1, world_size=2, n_params=1000, flops_per_token=6e6, hw_flops_per_token=8e6
)
PEAK_FLOPS_PER_S = 1e12


def launch_metrics(step_times_s: list[float], peak_per_rank: list[int]) -> dict:
    """One launch's metrics block, as the driver makes it from what rank 0 wrote (a CPU run)."""
    ranks = len(peak_per_rank)
    worker = WorkerReport(
        warmup_steps_run=2,
        warmup_step_times_s=[1.0],
        compile=False,
        recompiles_after_warmup=0,
        phases_s={"build_s": 1.0},
        measured_window_s=sum(step_times_s),
        peak_mem_breakdown_rank0=None,
        losses=[6.0, 5.9],
        step_times_s=step_times_s,
        final_param_norm=3.0,
        peak_mem_source="mem_tracker",
        peak_mem_bytes_per_rank=peak_per_rank,
        peak_mem_reserved_bytes_per_rank=None,
        device_used_bytes_per_rank=None,
        build_peak_mem_bytes_per_rank=None,
        peak_rss_growth_bytes_per_rank=[2 * b for b in peak_per_rank],
        optimizer_state_bytes_per_rank=[0] * ranks,
        num_ooms=0,
        num_alloc_retries=0,
        env={"backend": "gloo", "world_size": ranks},
    )
    return throughput_metrics(worker, DERIVED, PeakFlops(PEAK_FLOPS_PER_S, "config"))
