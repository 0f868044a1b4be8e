"""The worked example of a project of one's own (tests/own_project: its model files beside conf/), copied outside
the repository for a test as its working directory: `project`, a fixture the test modules import, and `warm_project`,
one copy for the session whose tests' points share warm jobs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.compose import REPO

PROJECT = REPO / "tests" / "own_project"


def _work_in(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`root` the cwd, on sys.path and on PYTHONPATH (the ranks import the project's modules from it)."""
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """tests/own_project copied to tmp_path/project, the cwd, on sys.path and PYTHONPATH (its ranks import it)."""
    root = tmp_path / "project"
    shutil.copytree(PROJECT, root)
    return _work_in(root, monkeypatch)


@pytest.fixture(scope="session")
def _one_project_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/own_project copied once for the session (once per worker under pytest-xdist)."""
    root = tmp_path_factory.mktemp("warm-project") / "project"
    shutil.copytree(PROJECT, root)
    return root


@pytest.fixture
def warm_project(_one_project_copy: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """As `project`, but one copy for the session: PYTHONPATH, part of what warm ranks share (scaling.launch.warm.Shape),
    names the same directory in every test that takes it, so their points of one shape run on the same warm job
    instead of each test starting its own. A test keeps its records apart (a sweep_dir under its own tmp_path) and
    writes its modules under names no other test uses."""
    return _work_in(_one_project_copy, monkeypatch)
