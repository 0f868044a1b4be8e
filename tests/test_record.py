"""The typed contracts across the process boundary: rank 0's `WorkerReport` (worker.json) and the `Record`
(result.json) each round-trip, keep their files' keys and order, and read older records."""

from __future__ import annotations

import json

import pytest

from scaling.core.derived import Derived
from scaling.core.enums import Status
from scaling.engine.jobfiles import WorkerReport
from scaling.store.record import (
    SCHEMA_VERSION,
    Launch,
    LaunchTiming,
    Provenance,
    Record,
    Timing,
    ok_launches,
)
from tests.helpers.records import make_record

WORKER_KEYS = [
    "warmup_steps_run",
    "warmup_step_times_s",
    "compile",
    "recompiles_after_warmup",
    "phases_s",
    "measured_window_s",
    "peak_mem_breakdown_rank0",
    "losses",
    "step_times_s",
    "final_param_norm",
    "peak_mem_source",
    "peak_mem_bytes_per_rank",
    "peak_mem_reserved_bytes_per_rank",
    "device_used_bytes_per_rank",
    "build_peak_mem_bytes_per_rank",
    "peak_rss_growth_bytes_per_rank",
    "optimizer_state_bytes_per_rank",
    "num_ooms",
    "num_alloc_retries",
    "env",
    "rows_built_in_timed_window",
    "grad_norms",
    "points_before",
    "pipeline_idle_frac_per_rank",
]
"""worker.json's keys, in order: as rank 0 wrote them before the report was typed, then the clipping's
gradient norms, the data check of the timed window, the warm ranks' count of earlier points and the pipeline
stages' idle shares."""

RECORD_KEYS = [
    "schema_version",
    "job_key",
    "sweep",
    "status",
    "error",
    "config",
    "derived",
    "metrics",
    "repeats",
    "predicted",
    "env",
    "provenance",
    "timing",
]
"""result.json's keys, in order, as run_point wrote them before the record was typed."""


def worker_report() -> WorkerReport:
    """What rank 0 of a two-rank CPU point reports."""
    return WorkerReport(
        warmup_steps_run=2,
        warmup_step_times_s=[1.5, 0.4],
        compile=False,
        recompiles_after_warmup=0,
        phases_s={"init_process_group_s": 0.2, "build_s": 1.7, "warmup_s": 0.4},
        measured_window_s=1.2,
        peak_mem_breakdown_rank0={"parameters": 1024, "gradients": 1024},
        losses=[6.3, 6.2, 6.1, 6.0, 5.9],
        step_times_s=[0.41, 0.39, 0.40],
        final_param_norm=12.5,
        peak_mem_source="mem_tracker",
        peak_mem_bytes_per_rank=[4096, 4100],
        peak_mem_reserved_bytes_per_rank=None,
        device_used_bytes_per_rank=None,
        build_peak_mem_bytes_per_rank=[8192, 8000],
        peak_rss_growth_bytes_per_rank=[16384, 16000],
        optimizer_state_bytes_per_rank=[2048, 2048],
        num_ooms=0,
        num_alloc_retries=0,
        env={
            "torch": "2.13.0",
            "backend": "gloo",
            "world_size": 2,
            "cores_per_rank": [[0], [1]],
            "oversubscribed": False,
        },
    )


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


def full_record() -> Record:
    """A point launched twice: one ok launch kept from an earlier run, one made now."""
    metrics = {"tokens_per_s": 2000.0, "tokens_per_s_per_gpu": 1000.0, "step_times_s": [0.5, 0.5]}
    launches = [
        Launch(
            status=Status.OK,
            metrics=metrics,
            timing=LaunchTiming(
                launched_at="t0", device_wait_s=0.5, torchrun_wall_s=8.0, launch_overhead_s=7.0
            ).with_device_time(2, 1.0, 2.0),
        ),
        Launch(
            status=Status.OK,
            metrics=metrics,
            timing=LaunchTiming(
                launched_at="t1", device_wait_s=0.0, torchrun_wall_s=7.5, launch_overhead_s=6.5
            ).with_device_time(2, 1.0, 2.0),
        ),
    ]
    return Record(
        job_key="0123456789ab",
        sweep="demo",
        status=Status.OK,
        config={"model": {"name": "tiny"}},
        derived=Derived(gbs=8, gbs_tokens=512, grad_acc=2, world_size=2),
        metrics=metrics,
        repeats=launches,
        predicted={"peak_mem_bytes": 4096, "method": "analytic", "fits": True},
        env={"backend": "gloo", "devices": None},
        provenance=Provenance(hydra_job_num=3, overrides=["parallel.dp=2"], attempt=2),
        timing=Timing(started_at="t", wall_s=9.0).with_launches(launches[1:]).with_device_time(launches),
    )


def test_time_the_driver_was_stopped_is_no_device_time():
    """A launch of 10 s on 2 devices whose driver was stopped 4 s of it (SIGSTOP) held 12 device-seconds, of which 6
    timed and 2 warming up; the record's timing sums the stopped seconds of this run's launches."""
    t = LaunchTiming(torchrun_wall_s=10.0, stopped_s=4.0).with_device_time(2, window_s=3.0, warmup_s=1.0)
    assert (t.device_s, t.timed_device_s, t.warmup_device_s, t.startup_device_s) == (12.0, 6.0, 2.0, 4.0)
    launches = [Launch(timing=t), Launch(timing=LaunchTiming(torchrun_wall_s=5.0).with_device_time(2))]
    assert Timing().with_launches(launches).with_device_time(launches).stopped_s == 4.0


def test_a_record_round_trips_with_todays_keys_in_order():
    record = full_record()
    data = record.to_dict()
    assert list(data) == RECORD_KEYS and data["schema_version"] == SCHEMA_VERSION == 1
    assert list(data["repeats"][0]) == ["status", "error", "metrics", "timing", "dir"]
    assert list(data["repeats"][0]["timing"]) == [
        "launched_at",
        "device_wait_s",
        "torchrun_wall_s",
        "stopped_s",
        "launch_overhead_s",
        "devices",
        "device_s",
        "timed_device_s",
        "warmup_device_s",
        "startup_device_s",
        "points_before",
    ]
    assert list(data["timing"]) == [
        "started_at",
        "wall_s",
        "device_wait_s",
        "launched_at",
        "torchrun_wall_s",
        "stopped_s",
        "launch_overhead_s",
        "device_s",
        "timed_device_s",
        "warmup_device_s",
        "startup_device_s",
    ]
    assert list(data["provenance"]) == [
        "hydra_job_num",
        "overrides",
        "optuna_trial",
        "slurm_job_id",
        "attempt",
        "took_over",
        "model_code",
    ]
    assert data["timing"]["launched_at"] == "t1" and data["timing"]["torchrun_wall_s"] == 7.5  # this run's launch only
    assert data["timing"]["device_s"] == 2 * (8.0 + 7.5)  # but the device time of every launch the record holds
    assert Record.from_dict(json.loads(json.dumps(data))) == record


@pytest.mark.parametrize(
    "status", [Status.OK, Status.OOM, Status.PREDICTED_OOM, Status.TIMEOUT, Status.FAILED, Status.INVALID]
)
def test_the_synthetic_records_are_records(status):
    data = make_record(status)
    assert list(data) == RECORD_KEYS
    assert Record.from_dict(data).to_dict() == data


def test_an_old_record_reads_with_defaults_and_keeps_its_meaning():
    old = {
        "job_key": "0123456789ab",
        "status": Status.OK,
        "metrics": {"tokens_per_s": 10.0},
        "timing": {"started_at": "t", "wall_s": 3.0, "t0": 1.0},
    }  # no version, repeats or provenance
    record = Record.from_dict(old)
    assert record == Record(
        schema_version=None,
        job_key="0123456789ab",
        status=Status.OK,
        metrics={"tokens_per_s": 10.0},
        repeats=None,
        timing=Timing(started_at="t", wall_s=3.0),
    )
    assert record.sweep is None and record.config == {} and record.provenance == Provenance()
    assert record.provenance.overrides == [] and record.provenance.attempt is None
    # Written back, it is still a record of one ok launch (no `repeats`: the record itself is the launch).
    assert len(ok_launches(record.to_dict())) == len(ok_launches(old)) == 1
    assert Launch.from_dict({"status": Status.TIMEOUT}) == Launch(status=Status.TIMEOUT)
    launch = Launch.from_dict({"status": Status.OK, "timing": {"torchrun_wall_s": 8.0, "launch_overhead_s": 7.0}})
    assert launch.timing.devices is launch.timing.device_s is launch.timing.startup_device_s is None


def test_device_time_splits_what_a_launch_held_and_a_record_sums_its_launches():
    ok = LaunchTiming(torchrun_wall_s=10.0, launch_overhead_s=8.0).with_device_time(4, window_s=2.0, warmup_s=0.5)
    assert (ok.devices, ok.device_s, ok.timed_device_s, ok.warmup_device_s) == (4, 40.0, 8.0, 2.0)
    assert ok.startup_device_s == 40.0 - 8.0 - 2.0 and ok.launch_overhead_s == 8.0  # the rest; overhead as it was
    oom = LaunchTiming(torchrun_wall_s=3.0).with_device_time(4)  # no worker report: only what it held is known
    assert oom.device_s == 12.0 and oom.timed_device_s is oom.warmup_device_s is oom.startup_device_s is None
    assert LaunchTiming().with_device_time(4).device_s is None  # torchrun never timed
    kept, now = Launch(status=Status.OK, timing=ok), Launch(status=Status.OOM, timing=oom)
    timing = Timing(started_at="t").with_launches([now]).with_device_time([kept, now])
    assert timing.torchrun_wall_s == 3.0  # this run's launch
    assert timing.device_s == 40.0 + 12.0 and timing.timed_device_s == 8.0  # every launch the record holds
    assert timing.warmup_device_s == 2.0 and timing.startup_device_s == 30.0
    assert Timing().with_device_time([]) == Timing()


def test_a_record_without_a_job_key_is_refused():
    with pytest.raises(ValueError, match="needs a job_key.*'status'"):
        Record.from_dict({"status": Status.OK})


def test_a_log_is_never_written_through_a_planted_symbolic_link(tmp_path):
    """A torchrun.log planted as a link in a shared store would make the write land in the file it points to."""
    from scaling.core.files import open_new

    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "torchrun.log").symlink_to(victim)
    with pytest.raises(OSError):
        open_new(tmp_path / "torchrun.log")
    assert victim.read_text() == "precious"
    with open_new(tmp_path / "fresh.log") as f:
        f.write(b"ok")
    assert (tmp_path / "fresh.log").read_bytes() == b"ok"
