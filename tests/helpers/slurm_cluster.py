"""A real SLURM cluster on loopback (this host as one node, or as several), for a test session.

Owns the cluster's whole life: a fresh munge key and a private munged (own socket, pid and log),
a minimal `slurm.conf` (free ports, state and spool in one state directory, no accounting),
slurmctld and the slurmd in the foreground as children of the test process, the wait until the
nodes are idle, and a teardown that cancels jobs and kills every process that carries this
cluster's `SLURM_CONF` in its environment (job steps included). A state directory left by an
earlier session whose owner has died is cleaned up first, so a crashed run does not poison the
next one.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

BINARIES = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "sinfo",
    "sbatch",
    "salloc",
    "srun",
    "scancel",
    "squeue",
    "scontrol",
)
APT_HINT = "sudo apt-get install -y slurmctld slurmd slurm-client munge (or: bash scripts/install-system-deps.sh)"
BASE_DIR = Path(tempfile.gettempdir()) / f"scaling-slurm-{os.getuid()}"
OWNER_FILE = "owner.pid"
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
SLURM_DAEMONS = ("slurmstepd", "slurmscriptd", "slurmctld", "slurmd", "munged")
_LIVE: set[Path] = set()
"""State directories of the clusters this process runs now."""


def missing_binaries() -> list[str]:
    """The SLURM/munge programs this host lacks (empty when the cluster can start)."""
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def free_port() -> int:
    """A TCP port nobody listens on right now (all interfaces, as the daemons bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_hardware() -> dict[str, str]:
    """This host's node line as slurmd sees it (`slurmd -C`), falling back to nproc and /proc/meminfo."""
    try:
        out = subprocess.run([_bin("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
        fields = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0]))
        keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
        if all(k in fields for k in keys):
            return {k: fields[k] for k in keys}
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
    return {"CPUs": str(os.cpu_count() or 1), "RealMemory": str(mem_kb // 1024)}


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited: it only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _pids_of(state: Path) -> list[int]:
    """Processes of the cluster in `state` (its SLURM_CONF in their environment, or its path in their
    command line), except this process and its ancestors."""
    env_entry = f"SLURM_CONF={state / 'slurm.conf'}".encode()
    path = str(state).encode()
    keep = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in keep:
        keep.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in keep:
            continue
        try:
            if env_entry in (entry / "environ").read_bytes().split(b"\0") or path in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _term_with_parent() -> None:
    """preexec hook: the daemon gets SIGTERM when the process that started it dies."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _set_subreaper(on: bool) -> None:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def _kill_all(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM the given processes, then SIGKILL those still alive after `grace_s`."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reap_orphaned_children() -> None:
    """Reap exited children this process adopted as subreaper (it never started them, so nobody else waits)."""
    for entry in Path("/proc").iterdir():
        try:
            fields = Path(entry, "stat").read_text().rsplit(")", 1)[1].split()
            comm = Path(entry, "comm").read_text().strip()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid() and comm in SLURM_DAEMONS:
            try:
                os.waitpid(int(entry.name), os.WNOHANG)
            except ChildProcessError:
                pass


def clean_stale_state(base: Path = BASE_DIR) -> None:
    """Remove clusters left by earlier sessions whose owner process is gone, killing what they left running."""
    if not base.is_dir():
        return
    for state in base.iterdir():
        try:
            owner = int((state / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = None
        if state in _LIVE or (owner is not None and owner != os.getpid() and _pid_alive(owner)):
            continue  # a running cluster of this session or of another live one
        _kill_all(_pids_of(state))
        shutil.rmtree(state, ignore_errors=True)


class SlurmCluster:
    """One slurmctld, `nodes` slurmd and a private munged, all on 127.0.0.1 with their state in `state_dir`.

    One node is this host under its own name. With `nodes` > 1 every node is a slurmd of its own
    on this host (`<host>1`, `<host>2`, ...; NodeAddr 127.0.0.1, a port each), so that multi-node
    jobs (srun over several nodes, a c10d rendezvous between them) run for real on one machine.
    """

    def __init__(self, nodes: int = 1, partition: str = "debug") -> None:
        host = socket.gethostname().split(".")[0]
        self.partition = partition
        self.nodes = [host] if nodes == 1 else [f"{host}{i}" for i in range(1, nodes + 1)]
        self.state_dir: Optional[Path] = None
        self.munge_socket: Optional[Path] = None
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def conf(self) -> Path:
        """Path of this cluster's slurm.conf (what SLURM_CONF points at)."""
        assert self.state_dir is not None, "cluster not started"
        return self.state_dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment a client of this cluster needs: the caller's, plus SLURM_CONF."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 60.0) -> None:
        """Write the configs, start munged, slurmctld and each slurmd, and wait until every node is idle."""
        clean_stale_state()
        # slurmstepd daemonizes; as subreaper this process inherits it and can reap it, where an
        # init that does not reap (containers, micro-VMs) would keep it as a zombie.
        _set_subreaper(True)
        BASE_DIR.mkdir(mode=0o700, exist_ok=True)
        self.state_dir = Path(tempfile.mkdtemp(prefix="cluster-", dir=BASE_DIR))
        (self.state_dir / OWNER_FILE).write_text(str(os.getpid()))
        _LIVE.add(self.state_dir)
        for sub in ("munge", "ctld", "spool", "log"):
            (self.state_dir / sub).mkdir(mode=0o755)
        try:
            self._start_munge()
            self.conf.write_text(self._slurm_conf())
            (self.state_dir / "plugstack.conf").write_text("")
            self._spawn("slurmctld", [_bin("slurmctld"), "-D", "-f", str(self.conf)])
            self._wait(lambda: self._run(["scontrol", "ping"]).stdout.count("UP") > 0, timeout_s, "slurmctld")
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", [_bin("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
            self._wait(self._nodes_idle, timeout_s, "the nodes to be idle")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel every job, stop the daemons and any process left with this cluster's SLURM_CONF, remove the state."""
        if self.state_dir is None:
            return
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            self._run(["scancel", "--full", "--user", str(os.getuid())])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._run(["squeue", "-h"]).stdout.strip():
                time.sleep(0.2)
        for name in [f"slurmd-{n}" for n in self.nodes] + ["slurmctld", "munged"]:
            proc = self.procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        _kill_all(_pids_of(self.state_dir))
        _reap_orphaned_children()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        _LIVE.discard(self.state_dir)
        _set_subreaper(bool(_LIVE))
        self.state_dir = None

    def log_tail(self, lines: int = 30) -> str:
        """Last lines of each daemon log, for failure messages."""
        assert self.state_dir is not None
        parts = []
        for log in sorted((self.state_dir / "log").glob("*")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    def _start_munge(self) -> None:
        munge = self.state_dir / "munge"
        key = munge / "munge.key"
        subprocess.run([_bin("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        os.chmod(key, 0o600)
        self.munge_socket = munge / "munge.socket"
        self._spawn(
            "munged",
            [
                _bin("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={self.state_dir / 'log' / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        self._wait(self.munge_socket.exists, 20, "munged's socket")

    def _slurm_conf(self) -> str:
        d = self.state_dir
        hw = " ".join(f"{k}={v}" for k, v in node_hardware().items())
        host = socket.gethostname().split(".")[0]
        node_lines = [
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} {hw} State=UNKNOWN"
            for n in self.nodes
        ]
        return "\n".join(
            [
                "ClusterName=scaling-test",
                # Job ids that do not start again at 1 with every new cluster, as on a cluster that lives on: a
                # point's c10d port is derived from its job id, and a process of an earlier run's job with the same
                # id and port would otherwise be found listening there.
                f"FirstJobId={random.SystemRandom().randrange(1_000, 1_000_000)}",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={free_port()}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={self.munge_socket}",
                f"StateSaveLocation={d / 'ctld'}",
                f"SlurmdSpoolDir={d / 'spool' / '%n'}",
                f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
                f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
                f"PlugStackConfig={d / 'plugstack.conf'}",
                "MpiDefault=none",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SchedulerType=sched/backfill",
                "SlurmdParameters=config_overrides",
                "ReturnToService=2",
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                "JobCompType=jobcomp/none",
                "MailProg=/bin/true",
                "KillWait=5",
                *node_lines,
                f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.state_dir / "log" / f"{name}.out", "wb") as out:
            # Own session: a Ctrl-C in the terminal reaches pytest, which then tears the cluster down;
            # if pytest is killed outright, the daemons get SIGTERM (PR_SET_PDEATHSIG) instead.
            self.procs[name] = subprocess.Popen(
                argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_term_with_parent,
            )

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)

    def _nodes_idle(self) -> bool:
        lines = self._run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split("\n")
        return sorted(line.strip() for line in lines if line.strip()) == sorted(f"{n} idle" for n in self.nodes)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout_s:.0f}s for {what}:\n{self.log_tail()}")
