"""docs/own-project.md, run as a user would: a directory with its own model preset, GPU profile, network
figures and sweep (tests/own_project), found beside the shipped configs by `scaling sweep` (by path and by name),
`scaling predict` and the report's published network figures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaling.perf.network_figures import published
from tests.helpers.cli import scaling

OWN = Path(__file__).resolve().parent / "own_project"


@pytest.fixture
def project(tmp_path):
    shutil.copytree(OWN, tmp_path / "project")
    return tmp_path / "project"


def scaling_ok(project: Path, *args: str) -> str:
    """`scaling ARGS` in the project directory, which must succeed; its output."""
    done = scaling(*args, cwd=project, timeout=300)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.mark.subprocess
def test_a_project_runs_its_own_sweep_model_and_profiles(project, monkeypatch, capsys):
    """The sweep by path in a fresh interpreter, as a user runs it; by name (its dry run: what is found, not launched),
    `scaling predict` and `scaling report` in this process from the project's directory (tests/test_docs_commands.py
    runs the page's own commands in fresh interpreters from a copy of the project)."""
    from scaling.cli.main import main as scaling_main
    from scaling.cli.predict import main as predict_main
    from scaling.cli.report import main as report_main

    store = project / "runs" / "mine"
    out = scaling_ok(project, "sweep", "sweeps/my_sweep.yaml", f"sweep_dir={store}")  # by path
    assert "sweep my_sweep: 4 points: 4 ok" in out, out[-2000:]
    records = [json.loads(p.read_text()) for p in store.glob("*/result.json")]
    assert {r["config"]["model"]["name"] for r in records} == {"my_model", "gpt2_tiny"}
    assert {r["config"]["model"].get("hidden") for r in records} == {48, None}  # gpt.GPT's own keys: n_embd, ...
    mine = [r for r in records if r["config"]["model"]["name"] == "gpt2_tiny"]
    assert {r["derived"]["flops_source"] for r in mine} == {"counted"} and all(r["metrics"]["mfu"] > 0 for r in mine)
    monkeypatch.chdir(project)  # where the project's sweeps/ and conf/ (model, hardware and network figures) are found
    capsys.readouterr()
    # by name from the project's sweeps/: the same points, answered by the store
    assert scaling_main(["sweep", "my_sweep", "--dry-run", f"sweep_dir={store}"]) == 0
    assert "0 new" in capsys.readouterr().out
    argv = ["--json", "--analytic", "model=my_model", "hardware=my_gpu", "train.precision=bf16", "train.seq_len=64"]
    assert predict_main(argv) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert predicted["capacity_bytes"] == int((40.0 - 1.5) * 2**30)  # the project's profile: memory_gb - reserve_gb
    assert report_main([str(store), "--jobs", "1"]) == 0
    assert "report:" in capsys.readouterr().out
    assert published("my_gpu")["inter_node"].alpha_s == (1.0e-5, 3.0e-5)  # what the report's extrapolation reads


@pytest.mark.subprocess
def test_a_sweep_path_that_is_not_there_is_a_clear_error(project):
    done = subprocess.run(
        [sys.executable, "-m", "scaling", "sweep", "sweeps/nope.yaml"], cwd=project, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "no sweep file 'sweeps/nope.yaml'" in done.stderr + done.stdout
