"""The grid sweeper (hydra_plugins/scaling_grid_sweeper), through real `scaling run -m` multiruns: a resume
launches exactly the points the store does not answer (and reruns failed/timeout ones under
launch.rerun=failed), leaves points a live job holds alone, keeps the progress and closing counts right
when most points are skipped, and a dry run forecasts the grid without launching anything."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from scaling.cli.predict import main as predict_main
from scaling.core.enums import Status
from scaling.core.files import write_json_atomic
from scaling.engine.jobfiles import RESULT_FILE, RUNNING_FILE
from scaling.store.record import SWEEP_INDEX, job_key
from tests.helpers.cli import scaling
from tests.helpers.compose import REPO, compose_point

POINT = ["logger=none", "model=tiny", "train.seq_len=32", "train.warmup_steps=0", "train.steps=1"]
ZEROS, MBSS = (0, 1, 5, 6), (1, 2, 3, 4, 5)
GRID = [f"parallel.zero_stage={','.join(map(str, ZEROS))}", f"train.mbs={','.join(map(str, MBSS))}"]
SEEDED = {  # (zero_stage, mbs) -> status of a record already in the store; zero 5 and 6 run as `invalid`
    **{(z, m): Status.OK for z in (0, 1) for m in MBSS},
    (1, 4): Status.OOM,
    (1, 5): Status.OOM,
    (0, 1): None,
    (5, 1): Status.FAILED,
    (5, 2): Status.FAILED,
    (5, 3): Status.TIMEOUT,
    (5, 4): Status.INVALID,
    (6, 1): Status.PREDICTED_OOM,
}
PROGRESS = re.compile(r"^\[(\d+)/20\] ([0-9a-f]{12}) (\w+) ")


def seed(sweep_dir: Path) -> dict[tuple[int, int], str]:
    """Write a record for each seeded point (the key from a full composition); the grid point -> key map."""
    keys = {}
    for z in ZEROS:
        for m in MBSS:
            cfg = compose_point([*POINT, f"parallel.zero_stage={z}", f"train.mbs={m}"], sweep_dir)
            keys[z, m] = job_key(cfg)
            if SEEDED.get((z, m)):
                write_json_atomic(
                    sweep_dir / keys[z, m] / RESULT_FILE,
                    {
                        "job_key": keys[z, m],
                        "status": SEEDED[z, m],
                        "error": None,
                        "config": cfg.experiment(),
                        "metrics": None,
                        "predicted": None,
                        "timing": {"wall_s": 8.0},
                        "repeats": [{"status": SEEDED[z, m], "error": None, "metrics": None, "timing": {}}],
                    },
                )
    return keys


def launched(out: str) -> list[str]:
    """Job keys that run_point ran (its one summary line per point)."""
    return [line.split()[1] for line in out.splitlines() if line.startswith("[scaling] ")]


@pytest.mark.subprocess
def test_resume_runs_exactly_the_missing_points_and_counts_the_rest(tmp_path):
    sweep_dir = tmp_path / "runs"
    keys = seed(sweep_dir)
    point_of = {k: p for p, k in keys.items()}
    # A point a live process holds (this test's own) is left to it; a dead process's marker is stale.
    me = psutil.Process()
    write_json_atomic(
        sweep_dir / keys[6, 5] / RUNNING_FILE,
        {"state": "running", "host": os.uname().nodename, "pid": me.pid, "pid_started_at": me.create_time()},
    )
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_json_atomic(
        sweep_dir / keys[6, 4] / RUNNING_FILE,
        {"state": "running", "host": os.uname().nodename, "pid": gone.pid, "pid_started_at": 0.0},
    )
    args = ["run", "-m", *POINT, *GRID, f"sweep_dir={sweep_dir}"]

    dry = scaling(*args, "hydra.sweeper.dry_run=true")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert dry.stdout.splitlines()[-2:] == [
        "sweep adhoc: 20 points: 5 new (1 to launch, 0 predicted_oom, 4 invalid), 14 recorded (7 ok, 2 oom, "
        "1 predicted_oom, 1 timeout, 2 failed, 1 invalid), 1 in flight",
        "wall time: about 8 s (1 launch, 1 at a time; median 8.0 s per launched point over 12 recorded)",
    ]
    assert not (sweep_dir / SWEEP_INDEX).exists() and not (sweep_dir / "multirun.yaml").exists()

    first = scaling(*args)
    assert first.returncode == 1, first.stderr[-3000:]  # the store still holds the failed and timed-out points
    ran = [point_of[k] for k in launched(first.stdout)]
    assert sorted(ran) == [(0, 1), (5, 5), (6, 2), (6, 3), (6, 4)], first.stdout
    lines = first.stdout.splitlines()
    assert (
        "[14/20] 14 points already recorded (7 ok, 2 oom, 1 predicted_oom, 1 timeout, 2 failed, 1 invalid): "
        "not launched again" in lines
    )
    assert any(line.startswith("[14/20] 1 points in flight in other jobs (pid ") for line in lines)
    numbers = [int(m.group(1)) for m in map(PROGRESS.match, lines) if m]
    assert numbers == [15, 16, 17, 18, 19]  # the launched points continue the count, one line each
    assert lines[-1] == (
        f"sweep adhoc: 19 points: 8 ok, 2 oom, 1 predicted_oom, 1 timeout, 2 failed, 5 invalid "
        f"({sweep_dir}); 1 still in flight (scaling status {sweep_dir})"
    )
    assert not (sweep_dir / keys[6, 5] / RESULT_FILE).exists() and not (sweep_dir / keys[6, 4] / RUNNING_FILE).exists()
    index = json.loads((sweep_dir / SWEEP_INDEX).read_text())
    assert index["runs"][-1]["job_keys"] == [keys[z, m] for z in ZEROS for m in MBSS]

    (sweep_dir / keys[6, 5] / RUNNING_FILE).unlink()  # the holder gave up the point
    retry = scaling(*args, "launch.rerun=failed")
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert sorted(point_of[k] for k in launched(retry.stdout)) == [(5, 1), (5, 2), (5, 3), (6, 5)]
    assert "[16/20] 16 points already recorded" in retry.stdout
    assert retry.stdout.splitlines()[-1].startswith("sweep adhoc: 20 points: 8 ok, 2 oom, 1 predicted_oom, 9 invalid (")

    again = scaling(*args)
    assert again.returncode == 0 and launched(again.stdout) == [] and "Launching" not in again.stderr + again.stdout
    assert "[20/20] 20 points already recorded (8 ok, 2 oom, 1 predicted_oom, 9 invalid)" in again.stdout
    assert Counter(json.loads(p.read_text())["status"] for p in sweep_dir.glob(f"*/{RESULT_FILE}")) == Counter(
        {Status.OK: 8, Status.OOM: 2, Status.PREDICTED_OOM: 1, Status.INVALID: 9}
    )


def launch_in_process(master: Any, points: list[list[str]], compose_once: bool) -> tuple[list[Any], Any]:
    """Each job's config and hydra node as the task function sees them, from the grid sweeper's launcher (Hydra's
    basic one) launching `points` of `master`'s grid in this process; and the sweeper's compositions."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import HydraContext
    from omegaconf import OmegaConf

    from hydra_plugins.scaling_grid_sweeper._impl import GridSweep
    from scaling.sweep.hydra_adapter import Callbacks

    seen: list[Any] = []

    def task(cfg: Any) -> None:
        seen.append((OmegaConf.to_container(cfg), OmegaConf.to_container(HydraConfig.get())))

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level  # the launcher configures logging as a Hydra run does
    try:
        sweep = GridSweep(max_batch_size=None, dry_run=False, params=None, compose_once=compose_once)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=Callbacks())
        sweep.setup(hydra_context=context, task_function=task, config=master)
        sweep.launcher.launch(points, initial_job_idx=0)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return seen, sweep.configs


@pytest.mark.slow
def test_hydras_basic_launcher_runs_every_job_on_the_grids_compositions(tmp_path):
    """The jobs of the grid sweeper's basic launcher get the config (hydra node included: task overrides,
    override_dirname, choices, output_dir) that Hydra's own composition of each job gives (`compose_once=false`),
    with one composition per group choice and none per job."""
    from omegaconf import OmegaConf

    from scaling.sweep.compose import sweep_file_grid

    with sweep_file_grid(REPO / "sweeps" / "demo.yaml", [f"hydra.sweep.dir={tmp_path}"]) as (points, configs):
        picked = [p for p in points if "parallel.dp=1" in p and "train.mbs=2" in p and "train.seq_len=128" in p]
        assert len(picked) == 8 and {o for p in picked for o in p} >= {"model=tiny", "model=small"}
        # `${now:...}` resolved (and cached) in the master once: both launches name each job's folder alike
        OmegaConf.select(configs.master, "hydra.run.dir")
        composed_once, grid = launch_in_process(configs.master, picked, compose_once=True)
        by_hydra, _ = launch_in_process(configs.master, picked, compose_once=False)
    assert grid.compositions == 2  # model=tiny and model=small
    assert len(composed_once) == len(picked) and composed_once == by_hydra
    assert [hydra["overrides"]["task"] for _, hydra in composed_once] == picked
    assert [hydra["job"]["num"] for _, hydra in composed_once] == list(range(len(picked)))


@pytest.mark.subprocess
def test_sweep_dry_run_forecasts_as_predict_sweep_does_and_writes_nothing(tmp_path, capsys):
    sweep_dir = tmp_path / "runs"
    dry = scaling("sweep", "dp_scaling", "--dry-run", f"sweep_dir={sweep_dir}")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert predict_main(["--sweep", "dp_scaling", f"sweep_dir={sweep_dir}"]) == 0  # `scaling predict`, in this process
    assert dry.stdout.splitlines()[-2:] == capsys.readouterr().out.splitlines()[-2:]
    assert dry.stdout.splitlines()[-2].startswith("sweep dp_scaling: ") and not sweep_dir.exists()


@pytest.mark.subprocess
def test_bad_sweeper_and_launcher_settings_fail_before_any_point(tmp_path):
    for setting, message in [
        ("hydra.sweeper.max_batch_size=0", "hydra.sweeper.max_batch_size=0 must be >= 1"),
        ("hydra.launcher.array_chunk=0", "hydra.launcher.array_chunk=0 must be >= 1"),
        ("hydra.launcher.array_parallelism=0", "hydra.launcher.array_parallelism=0 must be >= 1"),
    ]:
        out = scaling("run", "-m", "hydra/launcher=slurm", setting, "parallel.zero_stage=5,6", f"sweep_dir={tmp_path}")
        assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]
        assert list(tmp_path.glob("*/result.json")) == [] and not (tmp_path / ".submitit").exists()
