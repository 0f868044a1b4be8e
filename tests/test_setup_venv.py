"""`make setup`'s choice of torch build, as pip is configured (scripts/setup-venv.sh, scripts/torch_build.py).

PyTorch's CPU build (torch==X+cpu) where a find-links or an index pip is configured with offers a wheel of it for this
interpreter, else the default index's torch==X, with requirements.lock's CPU pin read as X. The script's dry run
(SETUP_VENV_DRY_RUN=1) makes the choice and creates nothing; pip is configured through PIP_CONFIG_FILE and PIP_*
variables, towards folders that hold a wheel's name (an empty file): no network, no install."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"
TORCH = re.search(r"^TORCH \?= (torch==\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
VERSION = TORCH.removeprefix("torch==")


def _torch_build():
    """scripts/torch_build.py as a module (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("torch_build", REPO / "scripts" / "torch_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_wheel(folder: Path) -> Path:
    """An empty file named as the CPU wheel of torch VERSION for this interpreter, in `folder`."""
    from pip._vendor.packaging.tags import sys_tags

    tag = next(iter(sys_tags()))
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"torch-{VERSION}+cpu-{tag.interpreter}-{tag.abi}-{tag.platform}.whl"
    wheel.touch()
    return wheel


def dry_run(tmp_path: Path, **pip: str) -> list[str]:
    """The torch requirement and install arguments `make setup` would use, with pip configured by `pip` alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(pip, SETUP_VENV_DRY_RUN="1", PYTHON=sys.executable, TMPDIR=str(tmp_path))
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup-venv.sh"), ".venv", TORCH, "-c", str(LOCK), "-e", ".[dev]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    print(out.stderr, end="")
    return out.stdout.splitlines()


def test_the_lock_pins_the_cpu_build_of_the_makefiles_torch():
    assert re.search(rf"^torch=={re.escape(VERSION)}\+cpu$", LOCK.read_text(), re.M)


@pytest.mark.subprocess
def test_setup_takes_the_cpu_build_from_a_configured_find_links_or_index_else_the_default_indexs(tmp_path: Path):
    # find-links in the environment, no configuration file: the CPU build, the lock as it is
    links = cpu_wheel(tmp_path / "wheels").parent
    got = dry_run(tmp_path, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(links))
    assert got == [f"torch=={VERSION}+cpu", "-c", str(LOCK), "-e", ".[dev]"]

    # an extra index (a file:// simple index) in a configuration file: the CPU build
    cpu_wheel(tmp_path / "simple" / "torch")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nextra-index-url = {(tmp_path / 'simple').as_uri()}\n")
    assert dry_run(tmp_path, PIP_CONFIG_FILE=str(conf))[0] == f"torch=={VERSION}+cpu"

    # nothing configured: the default index's torch==X, and a copy of the lock that pins it instead of X+cpu
    got = dry_run(tmp_path, PIP_CONFIG_FILE=os.devnull)
    assert got[0] == TORCH and got[1] == "-c" and got[3:] == ["-e", ".[dev]"]
    constraints = Path(got[2])
    assert constraints.parent == tmp_path
    assert constraints.read_text() == LOCK.read_text().replace(f"\n{TORCH}+cpu\n", f"\n{TORCH}\n")


def test_a_wheel_for_another_interpreter_or_version_is_not_offered(tmp_path: Path):
    build = _torch_build()
    tags = build.wheel_tags()
    mine = cpu_wheel(tmp_path / "wheels").name
    assert build.offers(mine, VERSION, tags)
    assert not build.offers(f"torch-{VERSION}+cpu-cp27-cp27mu-manylinux1_x86_64.whl", VERSION, tags)
    assert not build.offers(mine.replace(VERSION, VERSION + "1"), VERSION, tags)
    assert build.offers(f"<a href='{mine.replace('+', '%2B')}#sha256=00'>", VERSION, tags)  # an index page's link
    settings = {"find-links": [str(tmp_path / "wheels")], "index-url": [], "extra-index-url": []}
    assert build.choose(TORCH, settings, tags)[0] == f"{TORCH}+cpu"
    assert build.choose(TORCH, {k: [] for k in settings}, tags)[0] == TORCH
    assert build.choose("torch==2.13.0+cu130", settings, tags)[0] == "torch==2.13.0+cu130"  # a build named: as given
