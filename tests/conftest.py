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
    """One record store for the session's real points (tests/points.py): a point several tests look at runs once.
    Under pytest-xdist the workers' temporary roots are siblings: the store sits beside them, one for the run."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        store = root.parent / "points"
        store.mkdir(exist_ok=True)
        return store
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


# --- Running the suite on several workers (pytest-xdist: `make test` runs `-n auto --dist loadgroup`) ------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share a fixture wider than one test stay on one worker, where it is made once: a module's fixture
    keeps its module together, and every test on the SLURM cluster shares one worker (one cluster for the run).
    The rest go to whichever worker is free."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        scopes = {d[-1].scope for d in item._fixtureinfo.name2fixturedefs.values() if d}
        if item.get_closest_marker("slurm") or "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif "module" in scopes:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(autouse=True, scope="session")
def _device_locks_per_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each worker leases the host's devices from a lock directory of its own: the workers' points run side by side
    (they share the cores, which no test measures) instead of queueing behind each other's leases."""
    from scaling.launch.devices import LOCK_DIR_ENV

    with pytest.MonkeyPatch.context() as mp:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            mp.setenv(LOCK_DIR_ENV, str(tmp_path_factory.mktemp("device-locks")))
        yield


@pytest.fixture(autouse=True)
def _warm_ranks_only_for_shared_points(request: pytest.FixtureRequest) -> None:
    """The real points of tests/points.py run on this worker's warm ranks, which hold its device lease while they
    wait; any other test first ends them, so that a driver it starts takes the lease at once."""
    if "point_store" not in request.fixturenames:
        from scaling.launch import warm

        warm.close()
