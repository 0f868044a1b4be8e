"""A driver's agent servers (scaling.launch.agents): off CUDA each launch's torchrun agent is forked from a server
that imported torch once, and starts its ranks as a fresh agent would: in the launch's own session, environment,
working directory and module path, under the command line a fresh agent has, its exit status the launch's; a launch
the server cannot start as a fresh interpreter would is started fresh; the server dies with its driver, and a
launch's processes with it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from scaling.engine.agent import SERVER_ENV, socket_address
from scaling.launch import agents
from scaling.launch.torchrun import LAUNCH_ENV, job_env, launch_torchrun, torchrun_argv

REPO = Path(__file__).resolve().parents[1]
PROBE = "tests.helpers.agent_probe"


ANOTHER_USER = textwrap.dedent("""\
    import socket, sys
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect("\\0" + sys.argv[1][1:])
    print(conn.recv(4096).decode())
    """)


def _answers(address: str) -> bool:
    """Whether a server listens at `address` (a path, or @NAME in the abstract namespace)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(socket_address(address))
        except OSError:
            return False
    return True


def _launch(tmp_path: Path, name: str, env: dict, *args: str, nproc: int = 2):
    """One launch of the probe (tests/helpers/agent_probe.py) on `nproc` ranks; its outcome and what each rank said."""
    out = tmp_path / name
    out.mkdir()
    argv = torchrun_argv(PROBE, [str(out), *args], nproc, log_dir=out / "elastic")  # its files there, not in /tmp
    outcome = launch_torchrun(argv, out, 60, env)
    return outcome, [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


@pytest.mark.torchrun
def test_later_launches_fork_their_agent_from_one_server_and_their_ranks_see_only_their_own_launch(
    tmp_path, monkeypatch
):
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.delenv(SERVER_ENV, raising=False)
    agents.close()
    env = {**job_env(1, None, False), "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "extra")])}
    seen = []
    for n in range(3):
        (tmp_path / f"tmp-{n}").mkdir()
        outcome, ranks = _launch(
            tmp_path, f"launch-{n}", {**env, "PROBE_N": str(n), "TMPDIR": str(tmp_path / f"tmp-{n}")}
        )
        assert outcome.status == "ok", outcome.error
        seen.append(ranks)
    ((key, server),) = agents._servers.items()  # one start-up environment: one server for the three
    assert psutil.Process(server.proc.pid).ppid() == os.getpid()  # the driver's child: its launches stay in its tree
    tokens = set()
    for n, ranks in enumerate(seen):
        assert len(ranks) == 2 and len({r["agent"] for r in ranks}) == 1
        agent = ranks[0]["agent"]
        assert agent not in (os.getpid(), server.proc.pid)
        for rank in ranks:  # the launch's own variables, none of an earlier launch's
            assert rank["env"]["PROBE_N"] == str(n) and rank["env"]["SCALING_FORK_RANKS"] == "1"
            tokens.add(rank["env"][LAUNCH_ENV])
            assert rank["cwd"] == str(project)  # its working directory, then PYTHONPATH, first on its path
            assert rank["path"] == [str(project), str(REPO), str(tmp_path / "extra")]
            assert rank["tmp"] == str(tmp_path / f"tmp-{n}")  # its TMPDIR, not the one the server's imports read
            # the command line a fresh agent would have (a rank knows its agent by it; `ps` shows the point)
            out = tmp_path / f"launch-{n}"
            assert rank["agent_command"].split() == torchrun_argv(PROBE, [str(out)], 2, log_dir=out / "elastic")
            assert PROBE in rank["command"]
    assert len(tokens) == 3
    # every launch over, nothing of it is left: no agent, no rank (the server stays for the next launch)
    assert not any(psutil.pid_exists(r["pid"]) for ranks in seen for r in ranks)
    assert server.proc.poll() is None
    # a rank's exit status is the launch's, as from a fresh agent
    outcome, _ = _launch(tmp_path, "fails", env, "3")
    assert outcome.status == "failed" and outcome.returncode == 1, outcome
    if os.geteuid() == 0:  # its socket has no file mode: another user's process is refused by its uid (here nobody,
        # with the system's Python: this one's may sit where nobody cannot read)
        said = subprocess.run(
            ["/usr/bin/python3", "-c", ANOTHER_USER, server.path],
            user=65534,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert said.stdout.strip() == '{"refused": "another user\'s launch"}', (said.stdout, said.stderr)
    agents.close()
    assert server.proc.poll() is not None and not _answers(server.path)  # its socket (nothing on disk) gone with it


@pytest.mark.torchrun
def test_what_a_server_cannot_start_as_a_fresh_interpreter_would_is_started_fresh(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SERVER_ENV, raising=False)
    agents.close()
    # a directory on PYTHONPATH whose module would stand in for one the server has imported (numpy)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "numpy.py").write_text("raise ImportError('the shadowing numpy was imported')\n")
    env = {**job_env(1, None, False), "PYTHONPATH": os.pathsep.join([str(shadow), str(REPO)])}
    served = agents._served(torchrun_argv(PROBE, ["x"], 1), env, sys.stderr)
    assert served is None
    assert "would stand in for the server's numpy module" in capfd.readouterr().err
    outcome, ranks = _launch(tmp_path, "fresh", env, nproc=1)  # a fresh agent: its numpy is the shadowing one
    assert outcome.status == "failed" and "the shadowing numpy was imported" in (outcome.error or ""), outcome
    # a server asked by path (SCALING_AGENT_SERVER) with another start-up environment (threads): the driver's own
    # server of that environment starts the agent instead
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    env = {**job_env(1, None, False), "PYTHONPATH": str(REPO)}
    outcome, ranks = _launch(tmp_path, "one-thread", env, nproc=1)
    assert outcome.status == "ok", outcome.error
    ((_, first),) = agents._servers.items()
    capfd.readouterr()
    outcome, ranks = _launch(tmp_path, "two-threads", {**job_env(2, None, False), SERVER_ENV: first.path}, nproc=1)
    assert outcome.status == "ok", outcome.error
    said = capfd.readouterr().err
    assert f"{SERVER_ENV}={first.path} (that server refused it:" in said and "OMP_NUM_THREADS" in said, said
    assert (
        len(agents._servers) == 2
        and ranks[0]["agent_parent"] == agents._servers[next(reversed(agents._servers))].proc.pid
    )
    # and with SCALING_AGENT_SERVER=0 (or off) every agent is a fresh interpreter, this driver's own child
    for off in ("0", "off"):
        outcome, ranks = _launch(tmp_path, f"none-{off}", {**env, SERVER_ENV: off}, nproc=1)
        assert outcome.status == "ok" and ranks[0]["agent_parent"] == os.getpid()
    agents.close()


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


DRIVER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from scaling.launch import agents
    from scaling.launch.torchrun import job_env, torchrun_argv
    argv = torchrun_argv("tests.helpers.agent_probe", [sys.argv[1]], 2, log_dir=Path(sys.argv[1]) / "elastic")
    with open(sys.argv[2], "wb") as log:
        agent = agents.start(argv, {**job_env(1, None, False), "PROBE_SLEEP_S": "600"}, log)
    print(type(agent).__name__, agent.pid, flush=True)
    time.sleep(600)
    """)


@pytest.mark.torchrun
@pytest.mark.parametrize("killed", ["driver", "server"])
def test_a_killed_driver_or_server_leaves_no_agent_and_no_rank(tmp_path, killed):
    """Nothing of a launch outlives its driver (the server's connection to it closes: it kills the agent's session;
    the server dies with the driver) or its server (the agent's death signal, then the ranks')."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(SERVER_ENV, None)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(out), str(tmp_path / "log")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        kind, pid = driver.stdout.readline().split()
        assert kind == "Served"
        agent = psutil.Process(int(pid))
        server = psutil.Process(agent.ppid())
        assert server.ppid() == driver.pid
        deadline = time.monotonic() + 60
        while len(list(out.glob("rank-*.json"))) < 2:  # both ranks up, sleeping
            assert time.monotonic() < deadline, (tmp_path / "log").read_text()[-2000:]
            time.sleep(0.02)
        family = [server, agent, *agent.children(recursive=True)]
        assert len(family) == 4
        (driver if killed == "driver" else server).send_signal(signal.SIGKILL)
        # (a killed server stays a zombie until the sleeping driver reaps it: dead all the same)
        deadline = time.monotonic() + 15
        while (alive := [p for p in family if _running(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        driver.kill()
        driver.wait()
