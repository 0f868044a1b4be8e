"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
import gc
import os
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import pytest

from scaling.engine.lifetime import TORCHRUN_MARKERS
from scaling.launch import agents

if TYPE_CHECKING:
    from tests.helpers.slurm_cluster import SlurmCluster

pytest_plugins = ("tests.helpers.own_project",)
"""Fixtures kept in helper modules: `project`, the worked example copied out as the working directory."""


@pytest.fixture(scope="session")
def point_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One record store for the session's real points (tests/helpers/points.py): a point several tests look at runs once.
    Under pytest-xdist the workers' temporary roots are siblings: the store sits beside them, one for the run."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        store = root.parent / "points"
        store.mkdir(exist_ok=True)
        return store
    return tmp_path_factory.mktemp("points")


# --- SLURM: a real cluster on loopback (see tests/helpers/slurm_cluster.py) ---------------------------
@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A SLURM cluster on loopback for the session (two slurmd, so multi-node jobs run); SLURM_CONF points at it."""
    from tests.helpers.slurm_cluster import APT_HINT, SlurmCluster, missing_binaries

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


# --- Collecting: imports of torch, pandas, Hydra and the test modules make millions of objects, and the collector
# walked them over and over while they were made (two fifths of a worker's collection CPU). Off while collecting;
# what collection made is then frozen out of the collector's walk, and the tests run with it on, as usual.
@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[object]:
    gc.disable()
    try:
        return (yield)
    finally:
        gc.freeze()
        gc.enable()


# --- Running the suite on several workers (pytest-xdist: `make test` runs `-n auto --dist loadgroup`) ------------
@pytest.hookimpl(tryfirst=True)  # before xdist's own, which names each item by the group it is marked with by then
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share a fixture wider than one test stay on one worker, where it is made once: a module's fixture
    keeps its module together, and every test on the SLURM cluster shares one worker (one cluster for the run).
    The rest go to whichever worker is free, the ones that start processes first: the suite then ends on short tests
    that fill the workers' last minutes instead of one worker's long test leaving the others' cores idle."""
    weight = {"slurm": 0, "browser": 0, "torchrun": 0, "subprocess": 0, "slow": 1}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(
        key=lambda it: (min((w for m, w in weight.items() if it.get_closest_marker(m)), default=2), order[id(it)])
    )
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        scopes = {d[-1].scope for d in item._fixtureinfo.name2fixturedefs.values() if d}
        if item.get_closest_marker("slurm") or "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif "module" in scopes:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(autouse=True)
def _device_locks_per_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test leases the host's devices from a lock directory of its own: the workers' points run side by side
    (they share the cores, which no test measures) instead of queueing behind each other's leases, and the drivers a
    test starts do not end the warm jobs earlier tests of its worker left idle (a warm job watches the directory its
    lease is in: scaling.launch.devices.Held.lock_dir). The drivers of one test meet in its directory."""
    from scaling.launch.devices import LOCK_DIR_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOCK_DIR_ENV, str(tmp_path_factory.mktemp("device-locks")))
        yield


@pytest.fixture(autouse=True)
def _pythonpath_as_found() -> Iterator[None]:
    """Each test leaves PYTHONPATH as it found it: importing a model of one's own adds the working directory to it,
    for the processes the command starts (scaling.model.custom.build.project_importable), and PYTHONPATH is part of
    what warm ranks share (scaling.launch.warm.Shape): a test's project left in it would send every later point of
    its worker to new warm jobs."""
    before = os.environ.get("PYTHONPATH")
    yield
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before


# --- Markers that say which tests start processes (pyproject.toml lists them) --------------------------------------
PROCESS_MARKERS = ("torchrun", "slurm", "browser", "subprocess")
"""`make test-fast` and `make test-lowest` run the tests that carry none of these: the ones that start no process."""


def _starts_ranks(args: object) -> bool:
    words = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    return any(w in TORCHRUN_MARKERS or w.endswith("/torchrun") for w in words)


@contextlib.contextmanager
def _processes_marked(item: pytest.Item) -> Iterator[None]:
    """Within it, a process the test starts (in its fixtures' setup too) must be allowed by its markers: torchrun
    ranks need `torchrun` (or `slurm`), any other process one of PROCESS_MARKERS. So the subsets chosen by marker
    are what they say. With SCALING_PROCESS_AUDIT=FILE the offenders are listed there instead of failed."""
    marks = {m.name for m in item.iter_markers()}
    unmarked: list[tuple[str, str]] = []
    real_init = subprocess.Popen.__init__

    def note(args: Any) -> None:
        kind = "torchrun" if _starts_ranks(args) else "subprocess"
        if not marks & ({"torchrun", "slurm"} if kind == "torchrun" else set(PROCESS_MARKERS)):
            unmarked.append((kind, shlex.join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)))

    def gated(self: subprocess.Popen, args: Any, *a: Any, **kw: Any) -> None:
        note(args)
        real_init(self, args, *a, **kw)

    def started(argv: Any, *a: Any, **kw: Any) -> Any:  # a launch's agent, also one forked from a server (no Popen)
        note(argv)
        return real_start(argv, *a, **kw)

    real_start = agents.start
    subprocess.Popen.__init__ = gated  # type: ignore[method-assign]
    agents.start = started  # type: ignore[assignment]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real_init  # type: ignore[method-assign]
        agents.start = real_start  # type: ignore[assignment]
    if unmarked:
        kind, command = unmarked[0]
        audit = os.environ.get("SCALING_PROCESS_AUDIT")
        if not audit:
            pytest.fail(f"starts a process without its marker (@pytest.mark.{kind}): {command[:200]}")
        with open(audit, "a") as f:
            f.write(f"{item.nodeid}\t{kind}\n")


# --- One agent server for a worker's drivers: a driver starts an agent server at its first launch (torch imported in
# it, 2.2-3.1 s of CPU here) and the suite starts a few dozen drivers. The tests that start processes share one
# server per worker instead (SCALING_AGENT_SERVER, as a user may name one): each launch's agent is still forked from a
# server that imported torch, and a launch the server refuses (another start-up environment, a project whose modules
# would stand in for its own) still gets its driver's own server. Tests of the servers themselves and of what a killed
# or stopped driver leaves behind set the variable themselves or carry `own_agent_servers`; SLURM's steps never share.
_shared_server: dict[str, Any] = {}


def _agent_server_for(item: pytest.Item) -> Optional[str]:
    """The socket of this worker's shared agent server (started at the first test that may use it), None for a test
    whose drivers keep their own."""
    from scaling.engine.agent import SERVER_ENV

    marks = {m.name for m in item.iter_markers()}
    if SERVER_ENV in os.environ or not marks & {"torchrun", "subprocess"} or marks & {"slurm", "own_agent_servers"}:
        return None
    if "server" not in _shared_server:
        from scaling.engine.agent import FORK_ENV
        from scaling.launch.torchrun import job_env

        # as a driver starts its own (scaling.launch.agents._Server): a launch's environment without its own variables
        env = {k: v for k, v in job_env(1, None, False).items() if not k.startswith("SCALING_")}
        server = _shared_server["server"] = agents._Server({**env, FORK_ENV: "1"})
        _wait_for(server)
    return _shared_server["server"].path


def _wait_for(server: agents._Server) -> None:
    """Until the server takes requests, as a driver waits for its own (agents.connect): a driver that asked before
    would start its own server and say so on stderr."""
    conn = agents.connect(server.path, server)
    if conn is None:
        pytest.fail(f"the worker's agent server did not start: {server.tail()}")
    conn.close()  # the server reads it as a request without its log descriptor and refuses it


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "server" in _shared_server:
        _shared_server.pop("server").close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    server = _agent_server_for(item)  # before the marker guard: the worker's, not the test's process
    if server is not None:
        from scaling.engine.agent import SERVER_ENV

        os.environ[SERVER_ENV] = server
        item.stash[_SHARED_SET] = True
    with _processes_marked(item):
        return (yield)


_SHARED_SET = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    try:
        return (yield)
    finally:
        if item.stash.get(_SHARED_SET, False):
            from scaling.engine.agent import SERVER_ENV

            os.environ.pop(SERVER_ENV, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _processes_marked(item):
        return (yield)


# --- Where the suite's CPU goes: with SCALING_TEST_CPU=FILE each test appends its worker's CPU seconds and those of
# the processes it waited for (torchrun, ranks, drivers: RUSAGE_CHILDREN) to FILE. On a host the suite keeps busy,
# CPU, not a test's wall (much of it waiting on processes), is what the suite's wall is made of.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object) -> Iterator[object]:
    out = os.environ.get("SCALING_TEST_CPU")
    if not out:
        return (yield)
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    cpu0, wall0 = cpu(), time.perf_counter()
    try:
        return (yield)
    finally:
        with open(out, "a") as f:
            f.write(f"{cpu() - cpu0:.2f}\t{time.perf_counter() - wall0:.2f}\t{item.nodeid}\n")
