"""The project as a team installs it: a wheel that carries its configs and sweeps and runs from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from setuptools import find_namespace_packages
from setuptools.config.pyprojecttoml import read_configuration

REPO = Path(__file__).resolve().parents[1]


def test_every_package_of_the_tree_is_listed_for_the_wheel():
    """pyproject.toml names every package (the configs and sweeps mapped from conf/ and sweeps/ into the package):
    a package added to the tree and not to the list would be missing from the wheel."""
    listed = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]["packages"]
    code = find_namespace_packages(REPO, include=["scaling*", "analysis*", "hydra_plugins*"])
    data = {"scaling.conf", "scaling.sweeps"} | {
        "scaling.conf." + ".".join(p.relative_to(REPO / "conf").parts)
        for p in (REPO / "conf").rglob("*")
        if p.is_dir() and p.name != "__pycache__"
    }
    assert sorted(listed) == sorted({*code, *data} - {"tests"})


@pytest.mark.subprocess
def test_the_wheel_runs_from_an_empty_directory(tmp_path):
    """Build the wheel, install it alone into a clean virtual environment, and from an empty directory run a point,
    the demo's dry run, the report and the status: the configs come from the installed package, not from a
    checkout. The environment finds the dependencies in this one's site-packages (a .pth line: the pinned versions,
    compiled, none downloaded or installed again; the checkout is not among them), so the wheel is what is tested;
    the set-up that installs them is what every test here runs on, and the lowest-version run checks the ranges."""
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "empty"
    work.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("scaling-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # the wheel first, into an environment that sees nothing else (pip would take this environment's editable
    # install for it and skip it), then this environment's site-packages for the dependencies
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--ignore-installed",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (Path(purelib) / "scaling" / "core" / "schema.py").is_file()
    ours = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})  # this environment's, not sys.path
    (Path(purelib) / "dependencies.pth").write_text("\n".join(ours) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV"))}
    env["WANDB_MODE"] = "offline"

    def scaling(*args: str) -> str:
        done = subprocess.run(
            [str(venv / "bin" / "scaling"), *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import scaling.core.schema as s; print(s.CONF_DIR)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, (ours, found.stderr[-3000:])
    where = found.stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the installed package's configs, not the checkout's
    store = work / "runs" / "wheel"
    point = scaling("run", "logger=none", "model=tiny", "train.seq_len=32", "train.steps=1", f"sweep_dir={store}")
    assert " ok " in point, point
    assert "sweep demo: 64 points: 64 new" in scaling(
        "sweep", "demo", "--dry-run", f"sweep_dir={work / 'runs' / 'demo'}"
    )
    assert "report:" in scaling("report", str(store))
    assert "1 ok" in scaling("status", str(store))
