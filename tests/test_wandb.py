"""W&B offline runs of a real sweep under the joblib launcher: one run per point and attempt, every status,
readable names and axis tags, sectioned summaries, WANDB_* defaults, and the runs read back equal to
`collect()`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.collect import collect, from_wandb_offline
from scaling.cli.main import main
from scaling.core.schema import LoggerConfig
from scaling.job.wandb_log import init_kwargs, log_point
from scaling.store.index import store_id
from scaling.store.read import iter_records
from scaling.store.wandb_runs import read_offline_run, run_name, run_tags
from tests.helpers.cli import scaling
from tests.helpers.compose import compose_point
from tests.helpers.records import make_record

FAST = ["model=tiny", "train.seq_len=32", "train.mbs=2", "train.warmup_steps=0", "train.steps=2"]


def offline_runs(sweep_dir: Path) -> list[dict]:
    return [read_offline_run(p) for p in sorted((sweep_dir / "wandb").glob("offline-run-*/run-*.wandb"))]


def test_logger_defaults_come_from_wandb_environment_variables_and_overrides_win(monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("WANDB_ENTITY", "team")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    logger = compose_point(["logger=wandb"]).logger
    assert (logger.project, logger.entity, logger.mode) == ("from-env", "team", "disabled")
    logger = compose_point(["logger=wandb", "logger.project=cli", "logger.mode=offline"]).logger
    assert (logger.project, logger.entity, logger.mode) == ("cli", "team", "offline")
    for name in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE"):
        monkeypatch.delenv(name)
    logger = compose_point(["logger=wandb"]).logger
    assert (logger.project, logger.entity, logger.mode) == ("scaling", None, "offline")


def test_init_respects_wandb_dir_console_and_silent_and_is_quiet_otherwise(tmp_path):
    logger = LoggerConfig(name="wandb", project="p")
    record, store = make_record(sweep="s"), str(tmp_path)
    quiet = init_kwargs(record, logger, store, {})
    assert quiet["dir"] == store and quiet["settings"]["silent"] is True and quiet["settings"]["console"] == "off"
    assert quiet["id"] == f"s-{store_id(store)}-{record['job_key']}-1"
    user = init_kwargs(record, logger, store, {"WANDB_DIR": "/w", "WANDB_CONSOLE": "wrap", "WANDB_SILENT": "false"})
    assert user["dir"] == "/w" and "silent" not in user["settings"] and "console" not in user["settings"]
    assert init_kwargs(record, dataclasses.replace(logger, dir="/l"), store, {"WANDB_DIR": "/w"})["dir"] == "/l"


def test_two_layouts_never_share_a_run_name_or_tags():
    """A run is named and tagged by every axis of its layout that is not neutral (scaling.core.layout): dp=2 × tp=2,
    hybrid sharding and pipeline stages (by their schedule and virtual stages too) are not plain dp=2."""
    plain = make_record(dp=2, zero_stage=3)
    tp = make_record(dp=2, zero_stage=3)
    tp["config"]["parallel"]["tp"] = 2
    hybrid = make_record(dp=4, zero_stage=3)
    hybrid["config"]["parallel"]["dp_shard"] = 2
    pipelines = [make_record(dp=2, zero_stage=3) for _ in range(2)]
    for record, (schedule, virtual) in zip(pipelines, (("one_f_one_b", 1), ("interleaved_1f1b", 2))):
        record["config"]["parallel"].update(pp=2, pp_schedule=schedule, pp_virtual=virtual)
    names = [run_name(r) for r in (plain, tp, hybrid, *pipelines)]
    assert names == [
        "tiny seq256 mbs1 ga1 dp2 zero3",
        "tiny seq256 mbs1 ga1 dp2 zero3 tp2",
        "tiny seq256 mbs1 ga1 dp4 zero3 dp_shard2",
        "tiny seq256 mbs1 ga1 dp2 zero3 pp2 one_f_one_b",
        "tiny seq256 mbs1 ga1 dp2 zero3 pp2 interleaved_1f1b pp_virtual2",
    ]
    assert "tp=2" in run_tags(tp) and "dp_shard=2" in run_tags(hybrid) and not any("tp=" in t for t in run_tags(plain))
    assert {"pp=2", "pp_schedule=interleaved_1f1b", "pp_virtual=2"} <= set(run_tags(pipelines[1]))
    assert not any(t.startswith("pp") for t in run_tags(plain))


def test_an_offline_run_whose_last_record_is_still_being_written_reads_as_the_records_before_it(tmp_path):
    """W&B's service may still be writing a run's file when `finish()` returns: a record cut short at the file's end
    (its header says more bytes than the file has) is not read, and the ones before it are (it raised DecodeError)."""
    from wandb.proto import wandb_internal_pb2 as pb

    def record(payload: bytes) -> bytes:  # LevelDB's framing, one FULL record: checksum, length, type, payload
        return b"\0\0\0\0" + len(payload).to_bytes(2, "little") + b"\x01" + payload

    run = pb.Record(run=pb.RunRecord(run_id="r1", project="p", display_name="tiny"))
    summary = pb.Record(summary=pb.SummaryRecord(update=[pb.SummaryItem(key="status", value_json='"ok"')]))
    whole = b":W&B\0\0\0" + record(run.SerializeToString()) + record(summary.SerializeToString())
    path = tmp_path / "run-r1.wandb"
    path.write_bytes(whole)
    assert read_offline_run(path)["summary"] == {"status": "ok"}
    for cut in (1, 2, len(summary.SerializeToString()) - 1):  # the summary's payload cut short
        path.write_bytes(whole[:-cut])
        read = read_offline_run(path)
        assert (read["id"], read["name"], read["summary"]) == ("r1", "tiny", {}), cut


@pytest.mark.subprocess
def test_a_model_of_ones_own_is_logged_by_its_name(tmp_path, monkeypatch):
    """A record of a model the user brings has a `derived.model` block: its run is named and tagged by the model's
    name (the block whole made a 700-character tag that W&B refused), and any tag is cut to W&B's 64 characters."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    record = make_record(sweep="own", model="qwen2_tiny")
    tensors = {"module": ["root", "block", "root"], "rows": [1024, 128, 128], "cols": [128, 128, 1]}
    own = {"name": "qwen2_tiny", "source": "scaling.engine.hf_model.causal_lm", "block": "Qwen2DecoderLayer"}
    own |= {"n_blocks": 1, "config_hash": "755ea0355bab", "param_tensors": tensors}
    record["derived"] |= {"model": own, "hw_flops_per_token": record["derived"]["flops_per_token"]}
    assert log_point(record, LoggerConfig(name="wandb", project="p"), str(tmp_path)) is None
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 20
    while (run := read_offline_run(run_file))["id"] is None and time.monotonic() < deadline:
        time.sleep(0.2)  # W&B's service may still be writing the file when finish() returns
    assert "model=qwen2_tiny" in run["tags"] and run["name"].startswith("qwen2_tiny seq256"), run
    record["config"]["model"]["name"] = record["derived"]["model"]["name"] = "m" * 80
    assert max(len(t) for t in init_kwargs(record, LoggerConfig(name="wandb"), str(tmp_path), {})["tags"]) == 64


@pytest.mark.subprocess
def test_parallel_sweep_logs_every_point_and_attempt_and_reads_back_equal_to_collect(tmp_path):
    sweep_dir = tmp_path / "wb"
    env = {**os.environ, "WANDB_SILENT": "true", "WANDB_PROJECT": "from-env"}
    env.pop("WANDB_MODE", None)
    # ok, predicted_oom (not launched) and two invalid points, two Hydra jobs at a time
    grid = [
        "logger=wandb",
        *FAST,
        "parallel.zero_stage=0,5",
        "hardware.memory_gb=null,0.0005",
        "sweep=wbtest",
        f"sweep_dir={sweep_dir}",
    ]
    out = scaling(*["run", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *grid], cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    # a second attempt of one point (launch.rerun=all) is a second run; the first stays
    again = scaling(
        *[
            "run",
            "logger=wandb",
            *FAST,
            "parallel.zero_stage=5",
            "hardware.memory_gb=null",
            "launch.rerun=all",
            "sweep=wbtest",
            f"sweep_dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert again.returncode == 0, again.stderr[-3000:]

    records = {r["job_key"]: r for r in iter_records(sweep_dir)}
    assert sorted(r["status"] for r in records.values()) == ["invalid", "invalid", "ok", "predicted_oom"]
    runs = offline_runs(sweep_dir)
    assert len(runs) == 5 and {r["project"] for r in runs} == {"from-env"}
    store = store_id(sweep_dir)
    assert {r["id"] for r in runs} == {f"wbtest-{store}-{key}-1" for key in records} | {
        f"wbtest-{store}-{key}-2" for key, r in records.items() if r["provenance"]["attempt"] == 2
    }
    by_status = {r["summary"]["status"]: r for r in runs}
    ok, ok_record = by_status["ok"], next(r for r in records.values() if r["status"] == "ok")
    assert ok["name"] == "tiny seq32 mbs2 ga1 dp1 zero0" and ok["group"] == "wbtest"
    assert {"ok", "model=tiny", "seq_len=32", "mbs=2", "grad_acc=1", "dp=1", "zero_stage=0"} == set(ok["tags"])
    assert any(r["name"] == "tiny seq32 mbs2 ga1 dp1 zero5 #2" for r in runs)
    # the headline is the record's median figure; each step's figures live under step/ with min/max/mean
    assert ok["summary"]["metrics/tokens_per_s_per_gpu"] == ok_record["metrics"]["tokens_per_s_per_gpu"]
    assert ok["summary"]["memory/peak_mem_bytes"] == ok_record["metrics"]["peak_mem_bytes"]
    assert set(ok["summary"]["step/tokens_per_s_per_gpu"]) == {"min", "max", "mean"}
    assert [row["step/timed_step"] for row in ok["history"]] == [0, 1]
    assert "tokens_per_s_per_gpu" not in ok["summary"] and "metrics/losses" in ok["summary"]
    for status in ("predicted_oom", "invalid"):  # on the dashboard too: status and config, no history
        assert by_status[status]["history"] == [] and by_status[status]["config"]["model.name"] == "tiny"
    assert by_status["predicted_oom"]["config"]["hardware.memory_gb"] == 0.0005

    # Logging the same attempt again resumes its run (same id), it never adds a point.
    logger = LoggerConfig(name="wandb", project="from-env")
    assert log_point(ok_record, logger, str(sweep_dir)) is None  # no failure
    deadline = time.monotonic() + 30  # wandb-core finishes writing the log after finish() returns
    while sum(r["id"] == ok["id"] and "status" in r["summary"] for r in offline_runs(sweep_dir)) < 2:
        assert time.monotonic() < deadline, "the second log of the attempt never reached its .wandb file"
        time.sleep(0.2)

    from_runs = from_wandb_offline(sweep_dir)
    assert from_runs["wandb_run_id"].str.endswith("-2").sum() == 1
    pd.testing.assert_frame_equal(from_runs.drop(columns="wandb_run_id"), collect(sweep_dir))

    # docs/sweeps.md's recipe: the report run joins the same folder, and one `wandb sync` takes all of it. The report
    # runs in this process (the command's own entry, with the sweep's W&B environment): `scaling report` as a fresh
    # interpreter is tests/test_docs_commands.py's.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_PROJECT", "from-env")
        mp.delenv("WANDB_MODE", raising=False)
        assert main(["report", str(sweep_dir), "--wandb", "--jobs", "1"]) == 0
    folders = sorted(str(p) for p in (sweep_dir / "wandb").glob("offline-run-*"))
    dry = subprocess.run(
        [str(Path(sys.executable).parent / "wandb"), "sync", "--dry-run", *folders],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"Would sync {len(folders)} run(s)" in dry.stdout + dry.stderr and len(folders) == 7
    pd.testing.assert_frame_equal(from_wandb_offline(sweep_dir).drop(columns="wandb_run_id"), collect(sweep_dir))
