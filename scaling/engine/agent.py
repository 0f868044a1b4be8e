"""torchrun's agent: `python -m scaling.engine.agent ARGS` is `torchrun ARGS` (torch.distributed.run's own `main`),
with torch imported while the cyclic garbage collector is off, and off CUDA its ranks forked from it (`FORK_ENV`);
with `--serve SOCKET` an agent server: those imports made once, each launch's agent forked from it (`serve`).

The agent imports all of torch to start two ranks and watch them; a collector left on walks the modules being made
over and over while they load and finds next to nothing (a fifth of the import's CPU). What the imports made is frozen
out of the collector's walk and the collector turned back on before the agent starts, so from there it runs as
torchrun does. scaling.launch.torchrun's `torchrun_argv` starts points, warm jobs and the collectives benchmark
through it; a rank knows it for its agent by its command line (scaling.engine.lifetime.TORCHRUN_MARKERS), which a
served agent writes over its server's (`_retitle`). Standard library only until an agent runs or a server starts.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import traceback
from typing import Any, Mapping, Optional, Sequence

from scaling.engine.lifetime import die_with_parent

FORK_ENV = "SCALING_FORK_RANKS"
"""1 (scaling.launch.torchrun.job_env sets it off CUDA unless it is set): `-m MODULE ARGS` becomes torchrun's own
`--start-method=fork --run-path <MODULE's file> ARGS`, after the agent imported MODULE and ran its `preload()` if it
has one (scaling.engine.worker's imports torch's compiler stack, which a rank's first optimizer step imports, the
wrappers and the memory trackers). A rank then starts with all of it in memory instead of importing it: about 2.8 s of
CPU a rank at every launch, paid once by the agent instead. On CUDA (or with 0) the ranks are fresh interpreters, as
torchrun starts them by default: what the agent's imports leave of CUDA's state in a forked child is not checked."""

AGENT_MODULE = "scaling.engine.agent"
"""This module's name: torchrun's command line is `python -m AGENT_MODULE ...` (scaling.launch.agents.TORCHRUN)."""

SERVER_ENV = "SCALING_AGENT_SERVER"
"""The socket of a running agent server a launch asks first (scaling.launch.agents), `0` (or off, false, no) for none
at all: every agent then a fresh interpreter. Unset, a driver starts servers of its own as its launches need them."""


def socket_address(name: str) -> str:
    """The address a server's socket `name` binds: `@NAME` in Linux's abstract namespace (nothing on disk, gone with
    the server however it ends), anything else a path."""
    return "\0" + name[1:] if name.startswith("@") else name


PRELOAD = "scaling.engine.worker"
"""The module whose imports (and `preload()`) a server makes before it serves: the points' ranks."""

STARTUP_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "LD_", "PYTHON", "TORCH", "CUDA_", "NVIDIA_", "NCCL_")
"""Environment variables read when an interpreter or a library starts (the OpenMP and MKL runtimes' threads, glibc's
allocator, the loader, the interpreter's flags, torch's import-time switches): a served agent's must equal its
server's, since it starts from the server's already-started process. PYTHONPATH may differ: the agent's own entries
go in front of its path, as a fresh interpreter puts them (`_path_for`)."""


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` a served agent must share with its server (`STARTUP_PREFIXES`, PYTHONPATH aside)."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k != "PYTHONPATH"}


def forked(argv: list[str]) -> tuple[list[str], str]:
    """torchrun's arguments `[..., '-m', MODULE, *ARGS]` with MODULE run from its file in ranks forked from this
    process, and MODULE's name."""
    at = argv.index("-m")
    module = argv[at + 1]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module named {module!r} to fork ranks of")
    return [*argv[:at], "--start-method=fork", "--run-path", spec.origin, *argv[at + 2 :]], module


def _prepare(args: list[str]) -> list[str]:
    """torchrun's arguments as this agent runs them: with FORK_ENV=1, MODULE imported and preloaded here and its
    ranks forked (`forked`); the ranks' traceback files named in `--log-dir` (`_error_files_in`)."""
    if os.environ.get(FORK_ENV) == "1" and "-m" in args:
        args, name = forked(args)
        _preload(name)
    _error_files_in(args)
    return args


def _preload(name: str) -> None:
    """Import module `name` and run its `preload()` where it has one."""
    preload = getattr(importlib.import_module(name), "preload", None)
    if preload is not None:
        preload()


def _run(args: list[str]) -> int:
    """torchrun's `main` on `args`; its exit status as an interpreter would give it."""
    from torch.distributed.run import main

    try:
        main(args)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # an interpreter prints it and exits 1; so does a served agent
        traceback.print_exc()
        return 1
    return 0


class _TempfileIn:
    """The `tempfile` module as torch.multiprocessing.spawn reads it, its NamedTemporaryFile made in `directory`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __getattr__(self, name: str) -> Any:
        return getattr(tempfile, name)

    def NamedTemporaryFile(self, *args: Any, **kwargs: Any) -> Any:  # tempfile's name
        os.makedirs(self.directory, exist_ok=True)
        return tempfile.NamedTemporaryFile(*args, **{**kwargs, "dir": self.directory})


def _error_files_in(args: Sequence[str]) -> None:
    """torch's start of the ranks (torch.multiprocessing.spawn) names a file for each rank's traceback in the
    temporary directory, and a failed rank's is left there (a sweep of many failed points filled /tmp with them):
    with `--log-dir`, they are named in it, beside the launch's other error files (kept with a failed launch)."""
    if "--log-dir" not in args[:-1]:
        return
    # the module by its name: the attribute torch.multiprocessing.spawn is the module's function `spawn`
    spawn = importlib.import_module("torch.multiprocessing.spawn")
    spawn.tempfile = _TempfileIn(args[args.index("--log-dir") + 1])


# --- The agent server: `--serve SOCKET` -------------------------------------------------------------------------
# A launch connects to SOCKET and sends one byte carrying its log's descriptor (SCM_RIGHTS), then one JSON line:
# {"args": torchrun's arguments, "env", "cwd", "executable", "package"}. The server answers one line, {"pid"} of the
# agent it forked or {"refused": why} (the launch then starts a fresh agent), and, when the agent exits, {"returncode"}
# as Popen gives it (-N for a signal). A launch that closes its connection first (its driver died) has the agent's
# whole session killed: what the agent's death signal does for a fresh one. The server is single-threaded (it forks);
# an agent it forked dies with it (its death signal), and it dies with the driver that started it (the same).


def _top_names(directory: str) -> set[str]:
    """Top-level modules and regular packages in `directory` ('' where it cannot be read)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return set()
    names = {e[:-3] for e in entries if e.endswith(".py")}
    names |= {e for e in entries if os.path.isfile(os.path.join(directory, e, "__init__.py"))}
    return names


def _path_for(cwd: str, pythonpath: Optional[str], home: str, own_pythonpath: Optional[str]) -> list[str]:
    """The module search path a fresh `python -m` started in `cwd` with `pythonpath` would have: the working
    directory, then PYTHONPATH's entries, then the installation's (this server's path without its own)."""
    own = {home, *filter(None, (own_pythonpath or "").split(os.pathsep))}
    rest = [p for p in sys.path if p not in own]
    return [cwd, *filter(None, (pythonpath or "").split(os.pathsep)), *rest]


def _refusal(request: Mapping[str, Any], started_env: Mapping[str, str], path: list[str]) -> Optional[str]:
    """Why this server cannot start the request's agent as a fresh interpreter would start, None when it can."""
    if request.get("executable") != sys.executable:
        return f"another interpreter ({request.get('executable')}, this server {sys.executable})"
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if request.get("package") != package:
        return f"another scaling package ({request.get('package')}, this server {package})"
    env = request["env"]
    if env.get(FORK_ENV) != "1":
        return f"{FORK_ENV}={env.get(FORK_ENV)!r}: its ranks are fresh interpreters"
    differs = sorted(k for k in set(startup_env(env)) | set(started_env) if env.get(k) != started_env.get(k))
    if differs:
        return f"its start-up environment differs from this server's in {', '.join(differs)}"
    for directory in path:
        if directory in sys.path:
            continue
        for name in sorted(_top_names(directory) & set(sys.modules)):
            file = getattr(sys.modules[name], "__file__", None) or ""
            if not file.startswith(os.path.join(directory, "")):
                return f"{os.path.join(directory, name)} would stand in for the server's {name} module"
    return None


TITLE_ROOM = 4096
"""Bytes of command line a server is started with beyond its own arguments (one argument of spaces): the room its
agents' command lines are written into (`_retitle`)."""


def _retitle(words: Sequence[str]) -> None:
    """Show `words` as this process's command line (/proc/PID/cmdline, `ps`, psutil's `cmdline()`), written over
    the room its own arguments take, as setproctitle(3) does: a served agent and the ranks it forks show the
    command line a fresh agent would have, not their server's. Longer than the room, it is cut."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return
    room = end - start
    if room < 2:
        return
    title = " ".join(words).encode()[: room - 2]
    # the title, its end, and the rest not zero: the kernel then reads the title up to its end (its setproctitle case)
    ctypes.memmove(start, title + b"\0" + b" " * (room - len(title) - 1), room)


def _agent(request: Mapping[str, Any], log_fd: int, path: list[str], server: int) -> None:
    """In the forked child: become the request's agent (its own session, its log for stdout and stderr, its working
    directory, environment, module path and arguments) and run torchrun; never returns."""
    code = 1
    try:
        os.setsid()
        die_with_parent(server)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # the launch's TMPDIR, not the one the server's imports read (and kept)
        sys.path[:] = path
        sys.argv = [__file__, *request["args"]]
        _retitle([request["executable"], "-m", AGENT_MODULE, *request["args"]])
        code = _run(_prepare(list(request["args"])))
    except BaseException:  # whatever it was, the agent's log says it and the exit is 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream: nothing left to say
                pass
        os._exit(code if 0 <= code < 256 else 1)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], int]:
    """The descriptor and JSON line one launch sends (at most 10 s: a launch sends both at once)."""
    conn.settimeout(10)
    _, fds, _, _ = socket.recv_fds(conn, 1, 1)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ValueError("no log descriptor")
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            os.close(fds[0])
            raise ValueError("the request ended early")
        data += chunk
    return json.loads(data), fds[0]


def _peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of `conn` (SO_PEERCRED: pid, uid, gid)."""
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]


def _send(conn: socket.socket, message: Mapping[str, Any]) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # the launch is gone; what it left is ended when its connection reads as closed


def serve(path: str) -> None:
    """Serve agents on the Unix socket `path` until this process is ended (by its driver's death signal, or a
    signal of its own)."""
    _retitle([sys.executable, "-m", AGENT_MODULE, "--serve", path])
    gc.disable()
    before = dict(os.environ)
    import torch.distributed.run  # noqa: F401

    _preload(PRELOAD)
    gc.freeze()
    gc.enable()
    started_env = startup_env(before)
    # what the imports set (torch's inductor its cache directory): a fresh agent's imports set it too
    imports_set = {k: v for k, v in os.environ.items() if k not in before}
    home, own_pythonpath = sys.path[0], os.environ.get("PYTHONPATH")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_address(path))
    listener.listen(64)
    agents: dict[int, Optional[socket.socket]] = {}
    """Each live agent's launch connection (None once the launch has gone)."""
    launches: dict[socket.socket, int] = {}
    while True:
        try:
            ready = select.select([listener, wake_r, *launches], [], [])[0]
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = agents.pop(pid, None)
                if conn is not None:
                    launches.pop(conn, None)
                    _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                    conn.close()
        for conn in [c for c in ready if c in launches]:  # a launch says nothing more: it closed, its driver is gone
            pid = launches.pop(conn)
            agents[pid] = None
            conn.close()
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        if _peer_uid(conn) != os.getuid():  # an abstract socket has no file mode: another user's launch is refused
            _send(conn, {"refused": "another user's launch"})
            conn.close()
            continue
        try:
            request, log_fd = _read_request(conn)
        except (OSError, ValueError) as e:
            _send(conn, {"refused": f"unreadable request: {e}"})
            conn.close()
            continue
        env = request.get("env", {})
        agent_path = _path_for(request.get("cwd", "/"), env.get("PYTHONPATH"), home, own_pythonpath)
        why = _refusal(request, started_env, agent_path)
        if why is not None:
            os.close(log_fd)
            _send(conn, {"refused": why})
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the agent: none of the server's loop, whatever happens here
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w):
                    os.close(fd)
                listener.close()
                for other in launches:
                    other.close()
                conn.close()
            except BaseException:
                os._exit(1)
            _agent({**request, "env": {**imports_set, **env}}, log_fd, agent_path, os.getppid())
        os.close(log_fd)
        conn.settimeout(None)
        agents[pid] = conn
        launches[conn] = pid
        _send(conn, {"pid": pid})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
        sys.exit(0)
    gc.disable()
    from torch.distributed.run import main

    arguments = _prepare(sys.argv[1:])
    gc.freeze()
    gc.enable()
    sys.exit(main(arguments))
