"""No sweep file in sweeps/ can rot: each grid's every point composes and validates (through
`scaling predict --sweep`, in this process: it launches nothing), and each runs end to end for one CPU point.
The Optuna searches (best_throughput*) run for one trial in test_optuna_sweeper.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scaling.cli.predict import main as predict_main
from scaling.store.read import iter_records
from tests.helpers.cli import scaling
from tests.helpers.compose import REPO

GRIDS = sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml") if "scaling_optuna" not in p.read_text())
ONE_CPU_POINT = [
    "hardware=cpu",
    "model=tiny",
    "train.seq_len=32",
    "train.mbs=2",
    "train.grad_acc=1",
    "train.gbs_tokens=null",
    "train.precision=fp32",
    "parallel.dp=1",
    "parallel.zero_stage=0",
    "train.warmup_steps=0",
    "train.steps=1",
    "launch.repeats=1",
    "logger=none",
]


def test_grid_sweeps_are_found():
    assert {"demo", "dp_scaling", "playbook_grid"} <= set(GRIDS)


@pytest.mark.slow
@pytest.mark.parametrize("name", GRIDS)
def test_every_point_of_the_grid_composes_and_validates(name, capsys):
    assert predict_main(["--sweep", name]) == 0
    out = capsys.readouterr().out
    assert " 0 invalid), " in out.splitlines()[-2], out[-2000:]  # the grid's summary line


@pytest.mark.subprocess
@pytest.mark.parametrize("name", GRIDS)
def test_the_sweep_runs_one_cpu_point(name, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "scaling", "sweep", name, *ONE_CPU_POINT, f"sweep_dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["status"] for r in iter_records(tmp_path)] == ["ok"]
    assert out.stdout.strip().splitlines()[-1].startswith(f"sweep {name}: 1 points: 1 ok")


@pytest.mark.subprocess
def test_a_sweep_file_of_ones_own_is_a_multirun_and_a_group_set_as_a_key_is_refused_with_the_line_to_write(tmp_path):
    """A user's file without `hydra.mode: MULTIRUN`: `scaling sweep NAME --dry-run` ran its first point (its grid and
    --dry-run ignored). A group set as a plain key (`logger: none`): "ValidationError raised while composing config:"
    and nothing after it."""
    (tmp_path / "sweeps").mkdir()
    head = "defaults:\n  - config\n  - override /model: tiny\n"
    grid = "hydra:\n  sweeper:\n    params:\n      train.mbs: 1,2\n"
    (tmp_path / "sweeps" / "mine.yaml").write_text(f"{head}  - _self_\nsweep: mine\n{grid}")
    dry = scaling("sweep", "mine", "--dry-run", f"sweep_dir={tmp_path / 'runs'}", cwd=tmp_path)
    assert dry.returncode == 0 and "sweep mine: 2 points: 2 new" in dry.stdout, dry.stdout + dry.stderr
    assert not (tmp_path / "runs").exists()  # nothing launched, nothing recorded
    (tmp_path / "sweeps" / "keyed.yaml").write_text(f"{head}  - _self_\nsweep: keyed\nlogger: none\n{grid}")
    refused = scaling("sweep", "keyed", "--dry-run", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert (
        "str is not a subclass of LoggerConfig. value: none (a config group's choice goes in the defaults "
        "list: `- override /logger: none`)" in refused.stderr
    ), refused.stderr
