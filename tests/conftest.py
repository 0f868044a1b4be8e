"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from slurm_cluster import SlurmCluster


@pytest.fixture(scope="session")
def point_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One record store for the session's real points (tests/points.py): a point several tests look at runs once."""
    return tmp_path_factory.mktemp("points")


# --- SLURM: a real cluster on loopback (see tests/slurm_cluster.py) ---------------------------
@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A SLURM cluster on loopback for the session (two slurmd, so multi-node jobs run); SLURM_CONF points at it."""
    from slurm_cluster import APT_HINT, SlurmCluster, missing_binaries

    missing = missing_binaries()
    if missing:
        pytest.skip(f"SLURM is not installed (missing {', '.join(missing)}): {APT_HINT}")
    if os.geteuid() != 0:
        pytest.skip("the test SLURM cluster runs slurmd as root (SlurmUser=root): run the slurm tests as root")
    cluster = SlurmCluster(nodes=2)
    cluster.start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", str(cluster.conf))
            yield cluster
    finally:
        cluster.stop()
