"""Synthetic records of every status, built through the record's own type (scaling.store.record.Record),
so they are shaped exactly like the engine's result.json, for analysis tests.

Throughput follows a known model so tests can assert on it: tokens/s per GPU grows with mbs and
falls with dp by a fixed efficiency table (`DP_EFFICIENCY`), so the DP knee is known in advance.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Optional

from scaling.core.derived import Derived
from scaling.core.enums import Status
from scaling.core.files import write_json_atomic
from scaling.core.schema import ExperimentConfig, HardwareConfig, ModelConfig, ParallelConfig, TrainConfig
from scaling.engine.jobfiles import RESULT_FILE
from scaling.store.record import SWEEP_INDEX, Launch, LaunchTiming, Provenance, Record, Timing, job_dir, job_key

DP_EFFICIENCY = {1: 1.0, 2: 0.97, 4: 0.92, 8: 0.85, 16: 0.62, 32: 0.40}
"""Efficiency vs dp of the synthetic throughput model: stays >= 0.8 up to dp=8, the knee."""

GIB = 1024**3


def key_of(config: dict[str, Any]) -> str:
    """The job key of a record's `config` (its experiment groups as the file holds them)."""
    return job_key(ExperimentConfig.from_dict(config))


def tokens_per_s_per_gpu(seq_len: int, mbs: int, dp: int, zero_stage: int) -> float:
    """Throughput of the synthetic model: more work per micro-step pays, more ranks cost efficiency."""
    base = 10000.0 * mbs**0.5 * (1.0 - 0.05 * zero_stage) * (256 / seq_len) ** 0.1
    return base * DP_EFFICIENCY[dp]


def peak_mem_bytes(seq_len: int, mbs: int, dp: int, zero_stage: int) -> int:
    """Peak memory of the synthetic model: activations grow with seq_len x mbs, ZeRO shards state."""
    state = 8 * GIB / (dp if zero_stage >= 1 else 1)
    return int(state + 0.25 * GIB * mbs * seq_len / 256)


def make_record(
    status: str = Status.OK,
    *,
    model: str = "tiny",
    seq_len: int = 256,
    mbs: int = 1,
    grad_acc: int = 1,
    dp: int = 1,
    zero_stage: int = 0,
    precision: str = "bf16",
    recompute: str = "none",
    hardware: str = "h100",
    memory_gb: float = 11.0,
    sweep: str = "synthetic",
    tokens_per_s_per_gpu_value: Optional[float] = None,
    peak_mem_bytes_value: Optional[int] = None,
    predicted_bytes: Optional[int] = None,
    noise_band_frac: float = 0.0,
    threads_per_device: int = 1,
    oversubscribe: bool = False,
) -> dict[str, Any]:
    """One record as the engine writes it; metrics only for `ok`, a measured peak also for `oom`; one launch in
    `repeats` for a point that was launched (ok, oom, timeout, failed), none for one that was not: 12 s in
    torchrun on dp devices, of which an ok launch spent 9 s in its timed steps and 1 s in warm-up.

    `noise_band_frac` is the point's measured band (here its timed steps spread by that much).
    """
    config = {
        "model": dataclasses.asdict(ModelConfig(name=model, max_seq_len=max(seq_len, 256))),
        "train": dataclasses.asdict(
            TrainConfig(seq_len=seq_len, mbs=mbs, grad_acc=grad_acc, precision=precision, recompute=recompute)
        ),
        "parallel": dataclasses.asdict(ParallelConfig(dp=dp, zero_stage=zero_stage)),
        "hardware": dataclasses.asdict(
            HardwareConfig(
                name=hardware,
                device="cuda",
                backend="nccl",
                peak_tflops_bf16=989.0,
                memory_gb=memory_gb,
                threads_per_device=threads_per_device,
                oversubscribe=oversubscribe,
            )
        ),
    }
    gbs = mbs * grad_acc * dp
    n_params = 1_240_000_000
    flops_per_token = 6 * n_params + 12 * 2 * 64 * seq_len
    tps_gpu = tokens_per_s_per_gpu_value or tokens_per_s_per_gpu(seq_len, mbs, dp, zero_stage)
    peak = peak_mem_bytes_value or peak_mem_bytes(seq_len, mbs, dp, zero_stage)
    predicted = predicted_bytes if predicted_bytes is not None else int(peak * 1.05)
    metrics = None
    if status == Status.OK:
        step_time_s = gbs * seq_len / (tps_gpu * dp)
        metrics = {
            "tokens_per_s": tps_gpu * dp,
            "tokens_per_s_per_gpu": tps_gpu,
            "mfu": flops_per_token * tps_gpu / 989e12,
            "hfu": flops_per_token * tps_gpu / 989e12,
            "step_time_s": step_time_s,
            "step_times_s": [step_time_s * (1 - noise_band_frac), step_time_s, step_time_s * (1 + noise_band_frac)],
            "step_time_spread_frac": noise_band_frac,
            "repeat_spread_frac": None,
            "noise_band_frac": noise_band_frac,
            "repeats_ok": 1,
            "tokens_per_s_per_gpu_repeats": [tps_gpu],
            "peak_mem_bytes": peak,
            "peak_mem_bytes_per_rank": [peak] * dp,
            "peak_mem_source": "cuda_max_memory_allocated",
            "peak_flops_source": "config",
            "losses": [6.2, 6.1, 6.0],
        }
    elif status == Status.OOM:
        metrics = {"peak_mem_bytes": int(memory_gb * GIB)}
    errors = {
        Status.OK: None,
        Status.OOM: "torch.OutOfMemoryError: emulated capacity exceeded",
        Status.PREDICTED_OOM: f"predicted {predicted / GIB:.1f} GiB > capacity {memory_gb} GiB",
        Status.TIMEOUT: "timed out after 600 s",
        Status.FAILED: "RuntimeError: rank 1 crashed",
        Status.INVALID: f"parallel.dp={dp} does not divide train.gbs",
    }
    window_s, warmup_s = (9.0, 1.0) if status == Status.OK else (None, None)
    repeats = (
        []
        if status in (Status.PREDICTED_OOM, Status.INVALID)
        else [
            Launch(
                status=status,
                error=errors[status],
                metrics=metrics if status == Status.OK else None,
                timing=LaunchTiming(
                    launched_at="2025-01-01T00:00:01.000000+00:00",
                    device_wait_s=0.0,
                    torchrun_wall_s=12.0,
                    launch_overhead_s=3.0 if status == Status.OK else None,
                ).with_device_time(dp, window_s, warmup_s),
            )
        ]
    )
    return Record(
        job_key=key_of(config),
        sweep=sweep,
        status=status,
        error=errors[status],
        config=config,
        derived=Derived(
            n_params=n_params,
            flops_per_token=flops_per_token,
            gbs=gbs,
            gbs_tokens=gbs * seq_len,
            grad_acc=grad_acc,
            world_size=dp,
        ),
        metrics=metrics,
        repeats=repeats,
        predicted=None
        if status == Status.INVALID
        else {
            "peak_mem_bytes": predicted,
            "method": "analytic",
            "fits": predicted <= memory_gb * GIB,
            "analytic": {"method": "analytic", "peak_mem_bytes": predicted},
            "traced": None,
        },
        env={
            "torch": "2.13.0",
            "python": "3.11.7",
            "device_name": "NVIDIA H100",
            "backend": "nccl",
            "hostname": "node0",
            "threads_per_device": 8,
            "memory_capacity": "real",
            "oversubscribed": oversubscribe,
        },
        provenance=Provenance(attempt=1),
        timing=Timing(started_at="2025-01-01T00:00:00+00:00", wall_s=12.5)
        .with_launches(repeats)
        .with_device_time(repeats),
    ).to_dict()


FAILURES = {(0, 2, 1024, 1): Status.TIMEOUT, (0, 2, 1024, 2): Status.FAILED, (1, 2, 1024, 1): Status.INVALID}
"""Grid points (zero_stage, dp, seq_len, mbs) that `grid_records` turns into each non-memory failure."""


def grid_records(
    seq_lens: Iterable[int] = (256, 512, 1024),
    mbss: Iterable[int] = (1, 2, 4, 8),
    dps: Iterable[int] = (1, 2, 4, 8, 16),
    zero_stages: Iterable[int] = (0, 1),
    sweep: str = "synthetic",
    memory_gb: float = 11.0,
) -> list[dict[str, Any]]:
    """A grid whose statuses follow the memory model, plus the points of `FAILURES`.

    Points over capacity are `oom` at the largest mbs that was launched and `predicted_oom` at the
    largest mbs; the largest (seq_len, mbs) is never run, so its cells stay blank.
    """
    seq_lens, mbss = list(seq_lens), list(mbss)
    records = []
    for zero_stage in zero_stages:
        for dp in dps:
            for seq_len in seq_lens:
                for mbs in mbss:
                    if (seq_len, mbs) == (seq_lens[-1], mbss[-1]):
                        continue
                    status = FAILURES.get((zero_stage, dp, seq_len, mbs), Status.OK)
                    if peak_mem_bytes(seq_len, mbs, dp, zero_stage) > memory_gb * GIB:
                        status = Status.PREDICTED_OOM if mbs == mbss[-1] else Status.OOM
                    records.append(
                        make_record(
                            status,
                            seq_len=seq_len,
                            mbs=mbs,
                            grad_acc=max(8 // dp, 1),
                            dp=dp,
                            zero_stage=zero_stage,
                            sweep=sweep,
                            memory_gb=memory_gb,
                        )
                    )
    return records


def write_sweep(sweep_dir: Path, records: Iterable[dict[str, Any]], name: str = "synthetic") -> Path:
    """Lay records out as a sweep directory: sweep.json plus <job_key>/result.json each."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        sweep_dir / SWEEP_INDEX,
        {"name": name, "created_at": "2025-01-01T00:00:00+00:00", "hardware": {"name": "h100"}, "runs": []},
    )
    for record in records:
        write_json_atomic(job_dir(sweep_dir, record["job_key"]) / RESULT_FILE, record)
    return sweep_dir
