"""The typed contracts across the process boundary: rank 0's `WorkerReport` (worker.json) round-trips and
keeps the file's keys and order."""

from __future__ import annotations

import json

from scaling.engine.jobfiles import WorkerReport

WORKER_KEYS = ["warmup_steps_run", "warmup_step_times_s", "compile", "recompiles_after_warmup", "phases_s",
               "measured_window_s", "peak_mem_breakdown_rank0", "losses", "step_times_s", "final_param_norm",
               "peak_mem_source", "peak_mem_bytes_per_rank", "peak_mem_reserved_bytes_per_rank",
               "device_used_bytes_per_rank", "build_peak_mem_bytes_per_rank", "peak_rss_growth_bytes_per_rank",
               "optimizer_state_bytes_per_rank", "num_ooms", "num_alloc_retries", "env"]
"""worker.json's keys, in order, as rank 0 wrote them before the report was typed."""

def worker_report() -> WorkerReport:
    """What rank 0 of a two-rank CPU point reports."""
    return WorkerReport(
        warmup_steps_run=2, warmup_step_times_s=[1.5, 0.4], compile=False, recompiles_after_warmup=0,
        phases_s={"init_process_group_s": 0.2, "build_s": 1.7, "warmup_s": 0.4}, measured_window_s=1.2,
        peak_mem_breakdown_rank0={"parameters": 1024, "gradients": 1024}, losses=[6.3, 6.2, 6.1, 6.0, 5.9],
        step_times_s=[0.41, 0.39, 0.40], final_param_norm=12.5, peak_mem_source="mem_tracker",
        peak_mem_bytes_per_rank=[4096, 4100], peak_mem_reserved_bytes_per_rank=None, device_used_bytes_per_rank=None,
        build_peak_mem_bytes_per_rank=[8192, 8000], peak_rss_growth_bytes_per_rank=[16384, 16000],
        optimizer_state_bytes_per_rank=[2048, 2048], num_ooms=0, num_alloc_retries=0,
        env={"torch": "2.13.0", "backend": "gloo", "world_size": 2, "cores_per_rank": [[0], [1]],
             "oversubscribed": False})


def test_worker_report_round_trips_through_worker_json(tmp_path):
    report = worker_report()
    path = tmp_path / "worker.json"
    report.write(path)
    assert list(json.loads(path.read_text())) == WORKER_KEYS
    assert WorkerReport.read(path) == report


def test_worker_report_is_none_when_rank_0_wrote_nothing_whole(tmp_path):
    assert WorkerReport.read(tmp_path / "worker.json") is None
    (tmp_path / "cut.json").write_text('{"warmup_steps_run": 2, "warmup_')
    assert WorkerReport.read(tmp_path / "cut.json") is None
