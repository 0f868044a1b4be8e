"""No sweep file in sweeps/ can rot: each grid's every point composes and validates (through
`scaling predict --sweep`, in this process: it launches nothing), and each runs end to end for one CPU point.
The Optuna searches (best_throughput*) run for one trial in test_optuna_sweeper.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scaling.cli.predict import main as predict_main
from scaling.store.read import iter_records
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
