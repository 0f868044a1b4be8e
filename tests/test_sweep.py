"""Sweeps: what a sweep does with each status (stand-in points), where its records go and what they keep of the
Hydra job that made them (real Hydra multiruns), repeats of a real point, and a W&B failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scaling.engine.agent import FORK_ENV
from scaling.job.run import run_point
from scaling.store.read import iter_records
from tests.helpers.cli import scaling
from tests.helpers.compose import REPO, compose_point

STANDIN = REPO / "tests" / "standin_app" / "standin_app.py"

FAST = ["model=tiny", "train.seq_len=32", "train.mbs=2", "train.warmup_steps=0", "train.steps=1"]

FAULT_CASES = {
    "ok": {},
    "oom": {"train": {"fault": "oom"}},
    "predicted": {"hardware": {"memory_gb": 0.0005}},
    "crash": {"train": {"fault": "crash"}},
    "hang": {"train": {"fault": "hang"}},
    "invalid": {"parallel": {"zero_stage": 5}},
}
"""One point per status; the stand-in records what a launch of it ends in (tests/standin_app)."""


def write_fault_sweep(root: Path) -> Path:
    """A named sweep whose grid is a config group of cases, one point per expected status; its folder."""
    (root / "sweeps" / "case").mkdir(parents=True)
    for name, body in FAULT_CASES.items():
        text = "# @package _global_\n" + json.dumps(body)  # JSON is YAML
        (root / "sweeps" / "case" / f"{name}.yaml").write_text(text)
    (root / "sweeps" / "faults.yaml").write_text(
        textwrap.dedent("""\
        defaults:
          - config
          - _self_
          - case: ok
        sweep: faults
        logger:
          name: none
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              case: ok,oom,predicted,crash,hang,invalid
        """)
    )
    return root / "sweeps"


@pytest.mark.subprocess
def test_sweep_with_faults_records_every_point_and_counts(tmp_path):
    """Every status in one sweep (stand-in points: what is tested is the sweep's accounting; each status of a real
    launch is tested in test_engine.py, predicted_oom in test_predict_cli.py): the sweep goes on past each, prints
    a line per point and the counts, and a re-run answers from the store or, with launch.rerun=failed, runs the
    failed points again."""
    sweeps = write_fault_sweep(tmp_path)
    faults = [
        sys.executable,
        str(STANDIN),
        "--config-dir",
        str(sweeps),
        "--config-name",
        "faults",
        f"sweep_dir={tmp_path / 'runs'}",
    ]
    out = subprocess.run(faults, cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    records = list(iter_records(tmp_path / "runs"))
    by_case = {}
    for rec in records:
        fault, mem, zero = (
            rec["config"]["train"]["fault"],
            rec["config"]["hardware"]["memory_gb"],
            rec["config"]["parallel"]["zero_stage"],
        )
        case = "predicted" if mem else "invalid" if zero == 5 else {"none": "ok"}.get(fault, fault)
        by_case.setdefault(case, []).append(rec["status"])
    assert by_case == {
        "ok": ["ok"],
        "oom": ["oom"],
        "predicted": ["predicted_oom"],
        "crash": ["failed"],
        "hang": ["timeout"],
        "invalid": ["invalid"],
    }, out.stdout
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("sweep faults: 6 points: 1 ok, 1 oom, 1 predicted_oom, 1 timeout, 1 failed, 1 invalid")
    assert sum(line.startswith("[") and "/6] " in line for line in out.stdout.splitlines()) == 6
    index = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    assert index["name"] == "faults" and index["runs"][0]["points"] == 6 and index["hardware"]["name"] == "cpu"

    # Re-running answers every point from the store; rerun=failed runs the failed and timed-out ones again.
    again = subprocess.run(faults, cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert (
        "[6/6] 6 points already recorded (1 ok, 1 oom, 1 predicted_oom, 1 timeout, 1 failed, 1 invalid): not "
        "launched again" in again.stdout
    ), again.stdout[-2000:]
    crash_key = next(r["job_key"] for r in records if r["status"] == "failed")
    retry = subprocess.run(
        [*faults, "launch.rerun=failed", "case=crash,invalid"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert "[1/2] 1 points already recorded (1 invalid): not launched again" in retry.stdout, retry.stdout[-2000:]
    assert f"[2/2] {crash_key} failed " in retry.stdout
    assert len(list(iter_records(tmp_path / "runs"))) == 6


@pytest.mark.subprocess
def test_wandb_failure_never_fails_the_point(tmp_path):
    # Online mode with no API key and no network: wandb.init raises; the point must not care.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc credentials either
    out = scaling(
        *["run", "logger=wandb", "logger.mode=online", *FAST, f"sweep_dir={tmp_path / 'x'}"],
        cwd=tmp_path,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("[scaling] ")]
    assert " ok " in line and "; W&B logging failed (the record is kept): " in line
    assert [r["status"] for r in iter_records(tmp_path / "x")] == ["ok"]


@pytest.mark.subprocess
@pytest.mark.parametrize("search", [False, True], ids=["grid", "optuna"])
@pytest.mark.parametrize("override", ["hydra.sweep.dir", "sweep_dir"])
def test_one_output_directory_whichever_is_overridden(override, search, tmp_path):
    """Records, sweep.json, the closing count and (for a search) the journal and best.yaml share one folder."""
    out_dir = tmp_path / "out"
    # rejected before launch, each point (a shard group that does not divide dp=1): fast, and counted; a value no
    # point can take (parallel.zero_stage=5) the search refuses whole before its study opens
    grid = ["parallel.dp_shard=3,5"]
    if search:
        grid += ["hydra/sweeper=scaling_optuna", "hydra.sweeper.sampler.name=grid", "hydra.sweeper.n_trials=2"]
    out = scaling(*["run", "-m", "logger=none", *grid, f"{override}={out_dir}"], cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [r["status"] for r in iter_records(out_dir)] == ["invalid", "invalid"]
    assert (out_dir / "sweep.json").is_file()
    assert out.stdout.strip().splitlines()[-1] == f"sweep adhoc: 2 points: 2 invalid ({out_dir})"
    if search:
        assert (out_dir / "optuna.journal").is_file() and (out_dir / "best.yaml").is_file()
    assert not (tmp_path / "runs").exists()
    if not search:  # the store is that folder: a re-run answers every point from it
        again = scaling(*["run", "-m", "logger=none", *grid, f"{override}={out_dir}"], cwd=tmp_path, timeout=300)
        assert "[2/2] 2 points already recorded (2 invalid): not launched again" in again.stdout, again.stdout[-2000:]


@pytest.mark.subprocess
def test_records_keep_the_hydra_job_and_overrides_that_made_them_and_count_attempts(tmp_path):
    grid = ["run", "-m", "logger=none", "parallel.zero_stage=5,6", "train.mbs=3", f"sweep_dir={tmp_path}"]
    assert scaling(*grid, cwd=tmp_path, timeout=300).returncode == 0
    by_stage = {r["config"]["parallel"]["zero_stage"]: r["provenance"] for r in iter_records(tmp_path)}
    assert by_stage[5] == {
        "hydra_job_num": 0,
        "overrides": ["logger=none", "parallel.zero_stage=5", "train.mbs=3", f"sweep_dir={tmp_path}"],
        "optuna_trial": None,
        "slurm_job_id": None,
        "attempt": 1,
        "took_over": None,
        "model_code": None,  # the built-in model's code is the project's: no fingerprint
    }
    assert by_stage[6]["hydra_job_num"] == 1 and "parallel.zero_stage=6" in by_stage[6]["overrides"]
    # launch.rerun=all records a second attempt of each point; a single run has no job number
    scaling(
        *["run", "logger=none", "parallel.zero_stage=6", "train.mbs=3", "launch.rerun=all", f"sweep_dir={tmp_path}"],
        cwd=tmp_path,
        timeout=300,
    )
    by_stage = {r["config"]["parallel"]["zero_stage"]: r["provenance"] for r in iter_records(tmp_path)}
    assert (by_stage[6]["attempt"], by_stage[6]["hydra_job_num"], by_stage[5]["attempt"]) == (2, None, 1)


@pytest.mark.torchrun
def test_repeats_are_fresh_launches_kept_in_one_record_and_resume_launches_only_the_missing(
    tmp_path, capsys, monkeypatch
):
    sweep_dir = tmp_path / "rep"

    def point(repeats: int) -> dict:
        return run_point(compose_point(["logger=none", *FAST, "train.steps=2", f"launch.repeats={repeats}"], sweep_dir))

    record = point(2)
    assert record == next(iter_records(sweep_dir))
    first_two = record["repeats"]
    assert [r["status"] for r in first_two] == ["ok", "ok"]
    assert first_two[0]["timing"]["launched_at"] < first_two[1]["timing"]["launched_at"]
    m = record["metrics"]
    assert m["repeats_ok"] == 2 and len(m["step_times_s"]) == 4  # every timed step of both launches
    by_launch = [r["metrics"]["tokens_per_s_per_gpu"] for r in first_two]
    assert m["tokens_per_s_per_gpu_repeats"] == by_launch
    assert m["repeat_spread_frac"] == pytest.approx((max(by_launch) - min(by_launch)) / sum(by_launch))
    assert m["noise_band_frac"] >= m["step_time_spread_frac"] > 0

    # Asking for three: the point is not done, and only the third launch runs; the first two are kept. Its ranks are
    # fresh interpreters, as CUDA's are (the first two were forked from their agent): one record all the same.
    monkeypatch.setenv(FORK_ENV, "0")
    capsys.readouterr()
    point(3)
    assert "skipped" not in capsys.readouterr().out
    (record,) = iter_records(sweep_dir)
    assert record["repeats"][:2] == first_two and len(record["repeats"]) == 3
    assert record["metrics"]["repeats_ok"] == 3
    assert record["metrics"]["tokens_per_s_per_gpu"] == pytest.approx(
        sorted(r["metrics"]["tokens_per_s_per_gpu"] for r in record["repeats"])[1]
    )  # the median launch
    assert record["timing"]["launched_at"] == record["repeats"][2]["timing"]["launched_at"]
    for repeats in (3, 1):  # done: answered from the store
        assert point(repeats) == record
        assert "already recorded as ok: skipped" in capsys.readouterr().out
