"""The worked example of a project of one's own (tests/own_project: its model files beside conf/), copied outside
the repository for a test as its working directory: `project`, a fixture the test modules import."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.compose import REPO

PROJECT = REPO / "tests" / "own_project"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """tests/own_project copied to tmp_path/project, the cwd, on sys.path and PYTHONPATH (its ranks import it)."""
    root = tmp_path / "project"
    shutil.copytree(PROJECT, root)
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root
