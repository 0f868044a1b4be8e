"""One experiment point end to end: real torchrun, 1-2 ranks over gloo, records checked."""

from __future__ import annotations

import json

import pytest

from scaling.engine.jobfiles import RESULT_FILE
from scaling.job.run import run_point
from scaling.store.record import job_key, launch_dir
from tests.helpers.compose import compose_point
from tests.helpers.points import CLIP, FRESH, point
from tests.helpers.processes import processes_mentioning
from tests.test_validate import INVALID

pytestmark = pytest.mark.torchrun  # its points run on torchrun ranks (the session's point store)


@pytest.fixture
def sweep_dir(point_store):
    """The session's store of real points (tests/helpers/points.py): the DP-split points serve several tests."""
    return point_store


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_dp_split_does_not_change_training(sweep_dir, stage):
    """Also with clipping: the global gradient norm is the same whether it is whole (stages 0-1) or sharded."""
    two = point(sweep_dir, "parallel.dp=2", "train.grad_acc=2", f"parallel.zero_stage={stage}", CLIP)
    one = point(sweep_dir, "parallel.dp=1", "train.grad_acc=4", f"parallel.zero_stage={stage}", CLIP)
    assert two["status"] == one["status"] == "ok", (two["error"], one["error"])
    l2, l1 = two["metrics"]["losses"], one["metrics"]["losses"]
    assert len(l2) == len(l1) == 5  # warm-up, memory-tracked warm-up step, 3 timed steps
    assert max(rel(a, b) for a, b in zip(l2, l1)) <= 1e-5, (l2, l1)
    n2, n1 = two["metrics"]["grad_norms"], one["metrics"]["grad_norms"]
    assert len(n2) == 5 and min(n2) > 0.05 and max(rel(a, b) for a, b in zip(n2, n1)) <= 1e-5, (n2, n1)
    assert rel(two["metrics"]["final_param_norm"], one["metrics"]["final_param_norm"]) <= 1e-5
    assert two["derived"]["gbs"] == one["derived"]["gbs"] == 8
    assert two["env"]["threads_per_device"] == 1 and two["env"]["world_size"] == 2
    cores = two["env"]["cores_per_rank"]
    assert len(cores) == 2 and len({c for rank in cores for c in rank}) == 2 and not two["env"]["oversubscribed"]
    assert len(two["metrics"]["peak_mem_bytes_per_rank"]) == 2


def test_recompute_gives_same_losses(sweep_dir):
    plain = point(sweep_dir, "parallel.dp=1", "train.grad_acc=4", CLIP)
    recomputed = point(sweep_dir, "parallel.dp=1", "train.grad_acc=4", "train.recompute=full", CLIP)
    assert recomputed["status"] == "ok"
    assert max(rel(a, b) for a, b in zip(plain["metrics"]["losses"], recomputed["metrics"]["losses"])) <= 1e-5
    assert recomputed["derived"]["hw_flops_per_token"] > recomputed["derived"]["flops_per_token"]
    # Recomputation frees each block's activations: the tracked peak must not grow.
    assert recomputed["metrics"]["peak_mem_bytes"] < plain["metrics"]["peak_mem_bytes"]


@pytest.mark.parametrize(
    "precision, every, tolerance", [("fp32", 1, 1e-5), ("bf16", 2, 1e-3)], ids=["fp32", "bf16-every-2"]
)
def test_selective_recompute_gives_the_same_losses_at_zero3(sweep_dir, precision, every, tolerance):
    """train.recompute=selective at dp=2 ZeRO-3 (FSDP2 gathers a block's parameters again for its recomputation)
    trains as without recomputation; bf16 with only every second block checkpointed (recompute_every=2). No matmul
    runs twice: its hardware FLOPs are its model FLOPs; it keeps less than no recomputation."""
    at = ["parallel.dp=2", "train.grad_acc=2", "parallel.zero_stage=3", f"train.precision={precision}", CLIP]
    plain = point(sweep_dir, *at)
    selective = point(sweep_dir, *at, "train.recompute=selective", f"train.recompute_every={every}")
    assert plain["status"] == selective["status"] == "ok", (plain["error"], selective["error"])
    l0, l1 = plain["metrics"]["losses"], selective["metrics"]["losses"]
    assert max(rel(a, b) for a, b in zip(l0, l1)) <= tolerance, (l0, l1)
    assert selective["derived"]["hw_flops_per_token"] == selective["derived"]["flops_per_token"]
    assert selective["metrics"]["peak_mem_bytes"] < plain["metrics"]["peak_mem_bytes"]  # fewer tensors kept


def test_record_schema(sweep_dir):
    rec = point(sweep_dir, "parallel.dp=2", "train.grad_acc=2", "parallel.zero_stage=0")
    on_disk = json.loads((sweep_dir / rec["job_key"] / RESULT_FILE).read_text())
    assert on_disk == rec
    for block in (
        "schema_version",
        "job_key",
        "sweep",
        "status",
        "error",
        "config",
        "derived",
        "metrics",
        "predicted",
        "env",
        "timing",
    ):
        assert block in rec
    m = rec["metrics"]
    assert m["tokens_per_s"] == pytest.approx(rec["derived"]["gbs_tokens"] / m["step_time_s"])
    assert m["tokens_per_s_per_gpu"] == pytest.approx(m["tokens_per_s"] / 2)
    assert 0 < m["mfu"] < 1 and m["peak_mem_bytes"] == max(m["peak_mem_bytes_per_rank"])
    assert rec["env"]["memory_capacity"] == "unlimited" and rec["env"]["backend"] == "gloo"
    assert rec["timing"]["launch_overhead_s"] > 0
    t = rec["timing"]  # device time: the two ranks held their devices for torchrun's wall time
    assert rec["repeats"][0]["timing"]["devices"] == 2 and t["device_s"] == pytest.approx(t["torchrun_wall_s"] * 2)
    assert t["timed_device_s"] + t["warmup_device_s"] + t["startup_device_s"] == pytest.approx(t["device_s"])
    assert 0 < t["timed_device_s"] / t["device_s"] < 1 and t["warmup_device_s"] > 0 and t["startup_device_s"] > 0
    assert set(rec["config"]) == {"model", "train", "parallel", "hardware"}
    assert rec["config"]["train"]["grad_clip"] == 1.0 and len(m["grad_norms"]) == 5  # real runs clip
    assert m["rows_built_in_timed_window"] == 0  # every timed step's batches were built before timing


def test_oversubscribed_point_runs_when_asked_and_says_so(sweep_dir):
    rec = point(sweep_dir, "parallel.dp=3", "hardware.oversubscribe=true", "train.steps=1")
    assert rec["status"] == "ok", rec["error"]
    assert rec["config"]["hardware"]["oversubscribe"] is True
    cores = rec["env"]["cores_per_rank"]
    assert rec["env"]["oversubscribed"] is True and len(cores) == 3 and cores[2] == cores[0] != cores[1]


def test_hanging_rank_times_out_and_leaves_nothing(sweep_dir):
    """A lone rank that hangs is killed at launch.timeout_s; with a peer, the peer gives up first, at the
    process-group timeout (half the point's), and says so."""
    alone = point(sweep_dir, "parallel.dp=1", "train.fault=hang", "launch.timeout_s=6", FRESH)  # hung or starting
    assert alone["status"] == "timeout" and "launch.timeout_s=6s" in alone["error"]
    # start-up took over 22 s in a loaded suite; the peer gives up 8 s after its collective began
    # (launch.collective_timeout_s), long before the point's 60 s
    pair = point(
        sweep_dir, "parallel.dp=2", "train.fault=hang", "launch.timeout_s=60", "launch.collective_timeout_s=8", FRESH
    )
    assert pair["status"] == "timeout" and "process-group timeout" in pair["error"], pair["error"]
    assert pair["timing"]["torchrun_wall_s"] < 60
    assert processes_mentioning(alone["job_key"]) == processes_mentioning(pair["job_key"]) == []


def test_one_rank_out_of_memory_while_its_peer_waits_in_a_collective_is_oom_within_seconds(sweep_dir):
    """The OOM rank's error wins over its peer's dropped connection, long before the point's timeout."""
    rec = point(sweep_dir, "parallel.dp=2", "train.fault=oom", "launch.timeout_s=120", FRESH)
    assert rec["status"] == "oom", rec["error"]
    assert "rank 1 ran out of memory on purpose" in rec["error"]
    assert rec["timing"]["torchrun_wall_s"] < 30
    assert processes_mentioning(rec["job_key"]) == []


def test_rank_that_dies_is_failed_with_last_line(sweep_dir):
    rec = point(sweep_dir, "parallel.dp=2", "train.fault=crash", FRESH)
    assert rec["status"] == "failed"
    assert rec["error"] == "RuntimeError: injected fault: rank 1 crashed on purpose (train.fault=crash)"
    assert processes_mentioning(rec["job_key"]) == []


def test_a_failed_ranks_traceback_file_is_left_with_its_launch_not_in_the_temporary_directory(
    sweep_dir, tmp_path, monkeypatch
):
    """torch names a file for each rank's traceback in the temporary directory and leaves a failed rank's there (a
    sweep of many failed points filled /tmp with them): the agent, fresh or forked from a server whose imports read
    another TMPDIR, names them in the launch's elastic directory, which a failed launch keeps."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    rec = point(sweep_dir, "parallel.dp=2", "train.fault=crash", "train.seed=11", FRESH)
    assert rec["status"] == "failed", rec["error"]
    assert not list(tmp.glob("pytorch-errorfile-*")), sorted(p.name for p in tmp.iterdir())
    kept = list((launch_dir(sweep_dir / rec["job_key"], rec) / "elastic").glob("pytorch-errorfile-*.pickle"))
    assert kept, sorted(p.name for p in tmp.iterdir())  # rank 1's traceback (and rank 0's: its peer closed)


@pytest.mark.parametrize("overrides,expected", INVALID[:12], ids=[" ".join(o) for o, _ in INVALID[:12]])
def test_invalid_point_is_recorded_without_starting_anything(sweep_dir, overrides, expected, capsys):
    cfg = compose_point(overrides, sweep_dir)
    rec = run_point(cfg)
    assert rec["status"] == "invalid" and expected in rec["error"]
    job = sweep_dir / job_key(cfg)
    assert sorted(p.name for p in job.iterdir()) == [RESULT_FILE]  # no config.json, no torchrun log
    assert "invalid" in capsys.readouterr().out


def test_a_launch_is_judged_by_its_own_error_files_not_an_earlier_ones(sweep_dir):
    """Each launch writes into a directory of its own: an out-of-memory error file in an earlier launch's (or one a
    killed driver left under the name the next launch would take) does not make a rerun `oom` (an out-of-memory
    error wins over any other), and nobody's files are removed: the crashed point, launched again, fails with its
    own error, in a new directory."""
    first = point(sweep_dir, "parallel.dp=2", "train.fault=crash", FRESH)
    point_dir = sweep_dir / first["job_key"]
    first_dir = launch_dir(point_dir, first)
    assert first_dir.parent.name == "launches" and (first_dir / "torchrun.log").exists()
    oom = {"message": {"message": "torch.OutOfMemoryError: from a launch long ago"}}
    stale = [first_dir / "elastic" / "old-run" / "attempt_0" / "0" / "error.json"]
    stale.append(point_dir / "launches" / "2.0" / "elastic" / "dead" / "attempt_0" / "0" / "error.json")
    for path in stale:  # the second: what a driver killed during attempt 2's launch would have left
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(oom))
    again = point(sweep_dir, "parallel.dp=2", "train.fault=crash", "launch.rerun=failed", FRESH)
    assert (again["status"], again["error"]) == ("failed", first["error"]), again["error"]
    assert again["provenance"]["attempt"] == 2 and all(path.exists() for path in stale)
    assert launch_dir(point_dir, again) == point_dir / "launches" / "2.0-2"  # not the dead launch's directory


def test_rerun_skips_recorded_point(sweep_dir, capsys):
    first = point(sweep_dir, "parallel.dp=2", "train.grad_acc=2", "parallel.zero_stage=0")
    again = point(sweep_dir, "parallel.dp=2", "train.grad_acc=2", "parallel.zero_stage=0")
    assert again == first
    assert "already recorded as ok: skipped" in capsys.readouterr().out
