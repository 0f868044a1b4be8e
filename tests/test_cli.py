"""The `scaling` command: exit statuses that agree between `scaling run -m`, its module form `python -m scaling run`
and `sweep`, `scaling sweep --help`, and bash completion through Hydra's `-sc install=bash` script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaling.cli.main import COMMANDS, completion_target, main
from scaling.store.read import iter_records
from scaling.sweep.named import available, describe, find_sweep

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# A point that times out at once (torchrun is killed before any rank starts) and one rejected before launch.
TIMEOUT_AND_INVALID = [
    "logger=none",
    "train.steps=1",
    "train.warmup_steps=0",
    "launch.timeout_s=0.01",
    "parallel.zero_stage=0,5",
]


def command(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)


@pytest.mark.subprocess
def test_a_multirun_with_a_timed_out_point_exits_1_after_every_point(tmp_path):
    """Through the `scaling` script (the single point below goes through `python -m scaling`)."""
    exe = [str(BIN / "scaling"), "run"]
    out = command([*exe, "-m", *TIMEOUT_AND_INVALID, f"sweep_dir={tmp_path / 'runs'}"], tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]
    assert sorted(r["status"] for r in iter_records(tmp_path / "runs")) == ["invalid", "timeout"]
    assert out.stdout.strip().splitlines()[-1].startswith("sweep adhoc: 2 points: 1 timeout, 1 invalid")
    assert "scaling run: 1 timeout of 2 points" in out.stderr
    # Without a failed or timed-out point the same command exits 0.
    invalid_only = command(
        [*exe, "-m", "logger=none", "parallel.zero_stage=5,6", f"sweep_dir={tmp_path / 'ok'}"], tmp_path
    )
    assert invalid_only.returncode == 0, invalid_only.stderr[-2000:]


@pytest.mark.subprocess
def test_a_single_timed_out_point_exits_1(tmp_path):
    out = command(
        [sys.executable, "-m", "scaling", "run", *TIMEOUT_AND_INVALID[:-1], f"sweep_dir={tmp_path}"], tmp_path
    )
    assert out.returncode == 1 and "1 timeout of 1 points" in out.stderr, out.stderr[-2000:]


def test_scaling_run_hands_hydra_its_arguments_and_leaves_sys_argv_alone(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["the-caller", "--its-own-flag"])
    assert main(["run", "--cfg", "job", "model=small"]) == 0
    assert sys.argv == ["the-caller", "--its-own-flag"]
    assert "name: small" in capsys.readouterr().out


@pytest.mark.subprocess
def test_sweep_help_says_what_each_sweep_does_and_unknown_sweeps_exit_2(tmp_path):
    out = command([sys.executable, "-m", "scaling", "sweep", "--help"], REPO)
    assert out.returncode == 0
    for name in available():
        first_comment = next(ln for ln in find_sweep(name).read_text().splitlines() if ln.startswith("#"))
        assert describe(find_sweep(name)) == first_comment.lstrip("# ").strip()
        assert any(ln.split()[:1] == [name] and describe(find_sweep(name)) in ln for ln in out.stdout.splitlines())
    missing = command([sys.executable, "-m", "scaling", "sweep", "nope"], REPO)
    assert missing.returncode == 2 and "no sweep named 'nope': choose one of best_throughput" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_completion_targets():
    assert completion_target("scaling ") == (list(COMMANDS), [], "scaling ")
    assert completion_target("scaling sweep d")[0] == available()
    path = find_sweep("demo")
    assert completion_target("scaling sweep demo hardware=") == (
        None,
        ["--config-dir", str(path.parent), "--config-name", "demo"],
        "scaling hardware=",
    )
    assert completion_target("scaling run model=tiny train.") == (None, [], "scaling model=tiny train.")
    assert completion_target("scaling report ru")[0] == []


COMPLETE = """
eval "$(scaling run -sc install=bash)"
comp() {
    COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; local w=($COMP_LINE); COMP_CWORD=$(( ${#w[@]} - 1 ))
    [[ "$1" == *" " ]] && COMP_CWORD=${#w[@]}
    COMPREPLY=(); hydra_bash_completion; echo "${COMPREPLY[*]}"
}
comp "scaling ru"
comp "scaling sweep d"
comp "scaling run model=llama_"
comp "scaling sweep demo parallel.z"
"""


@pytest.mark.subprocess
def test_bash_completion_of_scaling_run_and_scaling_sweep(tmp_path):
    install = command([str(BIN / "scaling"), "run", "-sc", "install=bash"], tmp_path)
    assert install.stdout.rstrip().endswith("-F hydra_bash_completion scaling"), install.stdout[-300:]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", COMPLETE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.splitlines() == [
        "run",
        "demo dp_scaling",
        "model=llama_1b model=llama_3b model=llama_70b model=llama_8b",
        "parallel.zero_stage=",
    ], out.stderr[-2000:]


def test_a_command_line_that_composes_no_config_exits_2_in_one_line_from_every_command(tmp_path, monkeypatch, capsys):
    """An unknown config choice and an unknown key (Hydra's own suggestion `+train.seqlen=64`) are refused alike by
    `run`, `predict` and `recipe`: exit 2, one line naming what is wrong and what it could mean, no traceback."""
    monkeypatch.chdir(tmp_path)
    for args in (
        ["run", "model=does_not_exist"],
        ["predict", "model=does_not_exist"],
        ["recipe", "--gbs-tokens", "1024", "--gpus", "1", "model=does_not_exist"],
        ["run", "+train.seqlen=64", "logger=none"],
        ["predict", "+train.seqlen=64"],
    ):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        said = ("model=does_not_exist is not a config of group 'model': valid are", "did you mean train.seq_len?")
        assert len(err.splitlines()) == 1 and err.startswith(f"scaling {args[0]}: ") and any(s in err for s in said)
