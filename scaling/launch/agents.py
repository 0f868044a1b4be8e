"""A driver's agent servers: each launch's torchrun agent forked from a server that imported torch once
(scaling.engine.agent's `--serve`), instead of a fresh interpreter importing it again at every point.

Off CUDA, where the ranks are forked from their agent (FORK_ENV=1), a driver starts a server on its first launch and
keeps it for its life (one per start-up environment, `MAX_SERVERS`): the first point costs what a fresh agent costs,
every later one 1.3-2.5 s of CPU less (benchmarks/bench_agents.py). The server is the driver's child and the agents
the server's, so a launch's processes stay in the driver's process tree (what `kill_tree`, a stalled holder's check
and a killed driver rely on); the server dies with the driver, an agent with its server or its launch (its driver's
connection closing), a rank with its agent. `SCALING_AGENT_SERVER=0` starts every agent fresh; a socket there (a
path, or `@NAME` in the abstract namespace) is asked first. Where a server cannot start an agent as a fresh
interpreter would (another interpreter or package, another start-up environment, a directory whose modules would
stand in for the server's), the launch starts a fresh one.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any, Mapping, Optional, Sequence, Union

import psutil

from scaling.engine.agent import AGENT_MODULE, FORK_ENV, SERVER_ENV, TITLE_ROOM, socket_address, startup_env
from scaling.engine.lifetime import die_with_parent

TORCHRUN = (sys.executable, "-m", AGENT_MODULE)
"""torchrun (torch.distributed.run's `main`), its torch imported with the cyclic collector off (scaling/engine/agent.py),
off CUDA forked from the driver's agent server; the start of its command line (scaling.launch.torchrun.torchrun_argv)."""
OFF = ("0", "off", "false", "no")
"""SCALING_AGENT_SERVER's values that start every agent fresh; any other names a server's socket to ask first."""
MAX_SERVERS = 2
"""Servers one driver keeps at once (each holds torch and the ranks' imports in memory); the oldest ends first."""
START_WAIT_S = 120.0
"""How long a launch waits for a new server to take requests (its imports: seconds) before starting fresh."""
PACKAGE = str(Path(__file__).resolve().parents[1])
"""The directory this scaling package is imported from: a server imported from another one refuses the launch."""


class Served:
    """An agent a server forked, as the driver holds it: Popen's `pid`, `poll`, `wait` and `returncode`."""

    def __init__(self, conn: socket.socket, pid: int, buffered: bytes, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: Optional[int] = None
        self._conn, self._buf = conn, buffered
        try:
            self._created: Optional[float] = psutil.Process(pid).create_time()
        except psutil.Error:
            self._created = None

    def poll(self) -> Optional[int]:
        if self.returncode is None and (b"\n" in self._buf or select.select([self._conn], [], [], 0)[0]):
            self._read()
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            if b"\n" not in self._buf and not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read()
        assert self.returncode is not None
        return self.returncode

    def _read(self) -> None:
        while b"\n" not in self._buf:
            chunk = self._conn.recv(4096)
            if not chunk:  # the server is gone: its agents were killed with it (their death signal)
                self.returncode = -signal.SIGKILL
                self._conn.close()
                return
            self._buf += chunk
        self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["returncode"])
        self._conn.close()

    def session_id(self) -> Optional[int]:
        """The agent's session (the agent, its ranks and what they started, forked with the server's environment in
        /proc): what is left of the launch once the agent has ended. None when the agent's pid has since gone to
        another process (the kernel keeps a pid while a process of its session lives, so none of the launch's can be
        left then)."""
        try:
            if self._created is None or psutil.Process(self.pid).create_time() != self._created:
                return None
        except psutil.NoSuchProcess:
            pass
        except psutil.Error:
            return None
        return self.pid


Agent = Union[subprocess.Popen, Served]


class _Server:
    """One agent server this driver started: its socket in the abstract namespace (nothing on disk to leave behind
    when the driver is killed) and its output in a file already unlinked."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.path = f"@scaling-agents-{os.getpid()}-{uuid.uuid4().hex}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - open for the server's life, closed by `close`
        self.proc = _process([*TORCHRUN, "--serve", self.path, " " * TITLE_ROOM], env, self.log)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def tail(self) -> str:
        try:
            self.log.seek(0)
            return self.log.read().decode(errors="replace").strip().splitlines()[-1][:300]
        except (OSError, ValueError, IndexError):
            return "(nothing in its log)"


_LOCK = threading.Lock()
_servers: dict[tuple[tuple[str, str], ...], _Server] = {}
"""This driver's servers by start-up environment, oldest first."""
_failed: set[tuple[tuple[str, str], ...]] = set()
"""Start-up environments whose server did not start: their launches start fresh, without trying again."""
_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(f"[scaling] {message}", file=sys.stderr, flush=True)


def connect(path: str, server: Optional[_Server] = None) -> Optional[socket.socket]:
    """A connection to the server at `path`, None where none answers; for `server` (one started here) waited for
    while it starts (its imports: seconds), up to START_WAIT_S."""
    deadline = time.monotonic() + (START_WAIT_S if server is not None else 0.0)
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(socket_address(path))
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if server is None or server.proc.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        except OSError:
            conn.close()
            return None


def _ask(path: str, argv: Sequence[str], env: Mapping[str, str], log: IO[bytes], server: Optional[_Server]) -> Any:
    """Ask the server at `path` for an agent: a `Served`, a refusal's reason (str), or None where no server answers
    (`server`: one this driver started, waited for while it starts)."""
    conn = connect(path, server)
    if conn is None:
        return None
    request = {
        "args": list(argv[3:]),
        "env": dict(env),
        "cwd": os.getcwd(),
        "executable": sys.executable,
        "package": PACKAGE,
    }
    try:
        socket.send_fds(conn, [b"\0"], [log.fileno()])
        conn.sendall((json.dumps(request) + "\n").encode())
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
    except OSError:
        conn.close()
        return None
    line, rest = buf.split(b"\n", 1)
    answer = json.loads(line)
    if "pid" not in answer:
        conn.close()
        return str(answer.get("refused", answer))
    return Served(conn, int(answer["pid"]), rest, argv)


def _served(argv: Sequence[str], env: Mapping[str, str], log: IO[bytes]) -> Optional[Served]:
    """The launch's agent forked from a server, or None: start it fresh."""
    if tuple(argv[:3]) != TORCHRUN or env.get(FORK_ENV) != "1":
        return None
    setting = env.get(SERVER_ENV, "").strip()
    if setting.lower() in OFF:
        return None
    if setting:
        answer = _ask(setting, argv, env, log, None)
        if isinstance(answer, Served):
            return answer
        why = "no server answers there" if answer is None else f"that server refused it: {answer}"
        _say_once(f"{SERVER_ENV}={setting} ({why}): this driver's own agent server starts it")
    key = tuple(sorted(startup_env(env).items()))
    with _LOCK:
        if key in _failed:
            return None
        server = _servers.get(key)
        if server is None or server.proc.poll() is not None:
            if server is not None:
                server.close()
            while len(_servers) >= MAX_SERVERS:
                _servers.pop(next(iter(_servers))).close()
            # No launch's own variables (its token above all: the server's environment is every agent's in /proc),
            # and this driver's module path: a launch's own entries go in front of it in its agent (a project's).
            server_env = {k: v for k, v in env.items() if not k.startswith("SCALING_") and k != "PYTHONPATH"}
            server_env[FORK_ENV] = "1"
            if os.environ.get("PYTHONPATH"):
                server_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            try:
                server = _servers[key] = _Server(server_env)
            except OSError as e:  # no room for its socket, no process to be had: as before servers, fresh agents
                _say_once(f"no agent server ({e}): agents start fresh")
                _failed.add(key)
                return None
        answer = _ask(server.path, argv, env, log, server)
        if answer is None:
            _say_once(f"the agent server did not start ({server.tail()}): agents start fresh")
            _failed.add(key)
            _servers.pop(key, None)
            server.close()
        elif isinstance(answer, str):
            _say_once(f"agent started fresh: the agent server refused it ({answer})")
    return answer if isinstance(answer, Served) else None


def start(argv: Sequence[str], env: Mapping[str, str], log: IO[bytes]) -> Agent:
    """Start a launch's torchrun (`argv`, its environment `env`, its output into `log`): forked from this driver's
    agent server where one serves it, else as a process of its own; either in a session of its own, dying with this
    process."""
    served = _served(argv, env, log)
    return served if served is not None else _process(argv, env, log)


def _process(argv: Sequence[str], env: Mapping[str, str], log: IO[bytes]) -> subprocess.Popen:
    """`argv` as a process of its own: its output into `log`, in a session of its own, dying with this process."""
    return subprocess.Popen(
        list(argv),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )


@atexit.register
def close() -> None:
    """End this driver's servers (their agents with them)."""
    with _LOCK:
        while _servers:
            _servers.popitem()[1].close()


def _forget() -> None:
    """In a child this driver forked: its servers are the parent's (their agents would be the parent's children, and
    ending them would end the parent's launches); the child starts its own if it launches."""
    global _LOCK
    _LOCK = threading.Lock()
    _servers.clear()
    _failed.clear()


os.register_at_fork(after_in_child=_forget)
