"""The optional extras as a user without them meets them: with the [slurm] and [search] libraries unimportable,
selecting the SLURM launcher or the Optuna sweeper fails naming the extra to install, and a sweep that needs
neither runs with no warning from Hydra's plugin scan."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOY_APP = REPO / "tests" / "toy_app" / "toy_app.py"
NOT_INSTALLED = textwrap.dedent("""
    import importlib.abc, importlib.machinery, os, runpy, sys
    EXTRAS = ("submitit", "optuna", "cmaes", "optuna_dashboard")

    class NotInstalled(importlib.abc.MetaPathFinder):
        # The extras' libraries cannot be found, and the hydra_plugins namespace leaves out the directory that
        # holds hydra-submitit-launcher's plugin, as if those distributions were not installed.
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in EXTRAS:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            if name == "hydra_plugins":
                spec = importlib.machinery.PathFinder.find_spec(name)
                spec.submodule_search_locations = [
                    p for p in spec.submodule_search_locations
                    if not os.path.isdir(os.path.join(p, "hydra_submitit_launcher"))
                ]
                return spec
            return None

    sys.meta_path.insert(0, NotInstalled())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")
"""Runs the script in argv[1] (with the rest as its arguments) with the [slurm] and [search] extras not installed."""


def toy_multirun(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The toy app (tests/toy_app) as a two-point multirun without the extras."""
    app = [str(TOY_APP), "-m", f"hydra.sweep.dir={tmp_path}", "x=0.1,0.2", *overrides]
    return subprocess.run(
        [sys.executable, "-c", NOT_INSTALLED, *app],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("choice", "extra"),
    [("hydra/launcher=scaling_slurm", "slurm"), ("hydra/sweeper=scaling_optuna", "search")],
)
@pytest.mark.subprocess
def test_selecting_a_plugin_without_its_extra_names_the_extra(tmp_path: Path, choice: str, extra: str) -> None:
    done = toy_multirun(tmp_path, choice)
    assert done.returncode != 0, done.stdout[-2000:]
    assert f"pip install 'scaling[{extra}]'" in done.stderr, done.stderr[-3000:]
    assert "Error importing" not in done.stderr, done.stderr[-3000:]


@pytest.mark.subprocess
def test_a_sweep_without_the_extras_runs_and_the_plugin_scan_is_quiet(tmp_path: Path) -> None:
    done = toy_multirun(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "x=0.1" in done.stdout and "x=0.2" in done.stdout
    assert "Error importing" not in done.stderr and "Plugins scanner" not in done.stderr, done.stderr[-3000:]
