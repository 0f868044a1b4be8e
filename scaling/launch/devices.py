"""Device leases on one host: which GPUs (or the host's one CPU slot) a point's ranks use while it runs.

Points that run at once on one machine share the devices through `fcntl.flock` locks, one file per slot in a lock
directory of this user's (`$SCALING_DEVICE_LOCK_DIR`, else under `$XDG_RUNTIME_DIR` or /tmp; mode 0700, never
followed through a link): `cuda-<id>.lock` per GPU, `cpu-host.lock` for the whole host. The kernel drops a lock
when its holder exits, however it exits; each lock file names its holder, and waiters queue so a wide point is not
starved by narrow ones. A holder stopped with its launch idle (scaling.launch.stalled) is gone past after
launch.stalled_wait_s: on CPU the waiter runs beside it, first in line meanwhile; on CUDA the point is not run.
Inside a SLURM allocation points lease its GPUs with locks of that job's own. docs/sweeps.md.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import multiprocessing
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from scaling.core.host import usable_cores
from scaling.core.schema import ExperimentConfig, HardwareConfig
from scaling.launch.stalled import stalled_for_s
from scaling.store.inflight import process_stopped

LOCK_DIR_ENV = "SCALING_DEVICE_LOCK_DIR"
POLL_S = 0.25
CPU_SLOT = "host"


@dataclass(frozen=True)
class Request:
    """What one point leases before it launches: `wanted` of the `slots` of one kind."""

    kind: str
    """`cuda` (one slot per GPU) or `cpu` (one slot for the host)."""
    wanted: int
    """Slots the point holds while it runs."""
    slots: tuple[str, ...]
    """The slots it chooses from: GPU ids as CUDA_VISIBLE_DEVICES names them, or the host."""


@dataclass(frozen=True)
class Held:
    """A point's devices while it runs."""

    visible: Optional[str]
    """CUDA_VISIBLE_DEVICES for its ranks (None: left as inherited)."""
    wait_s: float
    """Seconds spent waiting for the slots."""
    lock_dir: Optional[Path] = None
    """The lock directory the slots are leased in (None: nothing leased): where a holder looks whether another
    process waits for them, whatever the environment says by then."""


class LockDirError(ValueError):
    """A lock directory or lock file that another user could have planted or can write: refused, never used."""


def lock_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The host's lock directory: $SCALING_DEVICE_LOCK_DIR, else $XDG_RUNTIME_DIR/scaling-devices (the user's own
    runtime directory), else /tmp/scaling-devices-<uid>; inside a SLURM allocation a folder of its own under it,
    since the GPU ids SLURM shows a job are that job's alone."""
    if environ.get(LOCK_DIR_ENV):
        root = Path(environ[LOCK_DIR_ENV])
    elif environ.get("XDG_RUNTIME_DIR"):
        root = Path(environ["XDG_RUNTIME_DIR"]) / "scaling-devices"
    else:
        root = Path(f"/tmp/scaling-devices-{os.getuid()}")
    return root / f"slurm-{environ['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in environ else root


def checked_lock_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """`lock_dir`, made (mode 0700) where missing and checked before any lock in it is opened: a directory, not a
    symbolic link, owned by this user, closed to group and others (in /tmp anyone could have made it first, and
    a file planted in it could point a lock at the user's own files). LockDirError naming what is wrong otherwise."""
    root = lock_dir(environ)
    fix = f"remove it, or set {LOCK_DIR_ENV} to a directory of your own with mode 0700"
    for d in [root.parent, root] if "SLURM_JOB_ID" in environ else [root]:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except FileNotFoundError:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode):
            raise LockDirError(f"device lock directory {d} is a symbolic link (to {os.readlink(d)}): {fix}")
        if not stat.S_ISDIR(st.st_mode):
            raise LockDirError(f"device lock directory {d} is not a directory: {fix}")
        if st.st_uid != os.getuid():
            raise LockDirError(
                f"device lock directory {d} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}): "
                f"another user made it; {fix}"
            )
        if st.st_mode & 0o077:
            raise LockDirError(
                f"device lock directory {d} has mode {stat.S_IMODE(st.st_mode):o}: group or others can write or read "
                f"its locks; chmod 700 {d}, or {fix}"
            )
    return root


def pick(free: set[int], wanted: int) -> Optional[list[int]]:
    """`wanted` of the free slots, or None when too few are free (pure).

    Neighbouring GPUs tend to share a PCIe switch or NUMA node, so a contiguous block is preferred,
    and an aligned one (0-1 or 2-3 for two) first, which keeps the free slots in blocks for wider points.
    """
    if wanted < 1:
        raise ValueError(f"a lease needs at least one slot, got wanted={wanted}")
    if len(free) < wanted:
        return None
    runs = [list(range(s, s + wanted)) for s in sorted(free) if all(s + k in free for k in range(wanted))]
    aligned = [r for r in runs if r[0] % wanted == 0]
    return (aligned or runs or [sorted(free)[:wanted]])[0]


class LeaseTimeout(TimeoutError):
    """A lease not granted within its deadline; the message names who holds the slots."""


_MINE: dict[Path, str] = {}
"""The slot lock files this process holds, and since when: a second lease of one would wait for itself."""


SINCE_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
"""How a lock file, and this process's table of its slots, say since when."""


def _open_lock(path: Path, blocking: bool, sign: bool = True) -> Optional[int]:
    """A descriptor holding an exclusive flock on `path`, or None if another holds it (non-blocking); with `sign`
    the file then names this process, its command and since when (what a waiter's message quotes)."""
    try:  # never through a symbolic link: a planted one would truncate the file it points to
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LockDirError(f"device lock file {path} is a symbolic link (to {os.readlink(path)}): remove it") from e
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise LockDirError(f"device lock file {path} is not a regular file of this user's: remove it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    if sign:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {time.strftime(SINCE_FORMAT)} {_command()}\n".encode(), 0)
    return fd


def _command() -> str:
    """This process's command line, shortened."""
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
        return " ".join(w.decode(errors="replace") for w in words if w)[:200]
    except OSError:
        return "?"


def _note(path: Path) -> Optional[tuple[str, str, str]]:
    """What a lock file says of its holder: (pid, since when, command), None when it cannot be read or says nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        words = os.pread(fd, 4096, 0).decode(errors="replace").strip().split(" ", 2)
    finally:
        os.close(fd)
    pid, since, command = (words + ["", ""])[:3]
    return (pid, since, command) if pid else None


def holder_of(path: Path) -> str:
    """Who a slot's lock file says holds it: `pid P (COMMAND) since T`, `, stopped` when it is; or that it cannot
    tell."""
    note = _note(path)
    if note is None:
        return "a process this user cannot name"
    pid, since, command = note
    state = ", stopped" if pid.isdigit() and process_stopped(int(pid)) else ""
    return f"pid {pid} ({command or '?'}) since {since or '?'}{state}"


def waiting_s(req: Optional[Request], root: Optional[Path] = None) -> Optional[float]:
    """How long another process has waited at the head of the line for slots of this request's kind (it holds the
    kind's queue lock, whose file says since when) in lock directory `root` (default: this environment's); None when
    nobody waits. The probe leaves the file as it is."""
    if req is None:
        return None
    path = (root or checked_lock_dir()) / f"{req.kind}.queue.lock"
    fd = _open_lock(path, blocking=False, sign=False)
    if fd is not None:
        os.close(fd)
        return None
    note = _note(path)
    if note is not None and note[0] == str(os.getpid()):
        return None  # this process keeps its place in line while it runs beside a stopped holder
    try:
        return max(0.0, time.time() - dt.datetime.strptime(note[1], SINCE_FORMAT).timestamp()) if note else 0.0
    except ValueError:  # a holder that wrote no time: waiting, for how long unknown
        return 0.0


def _slot_file(root: Path, kind: str, slot: str) -> Path:
    return root / f"{kind}-{slot.replace('/', '_')}.lock"  # MIG ids contain slashes


@contextmanager
def lease(
    wanted: int,
    slots: Sequence[str],
    *,
    kind: str = "cuda",
    poll_s: float = POLL_S,
    wait_s: Optional[float] = None,
    name: str = "",
    stalled_wait_s: Optional[float] = None,
) -> Iterator[list[str]]:
    """Block until `wanted` of `slots` are free (at most `wait_s`, then LeaseTimeout naming the holders), hold them
    for the body, release them on exit. A slot this process holds already is refused at once (a lease of it would
    wait for itself); waiting, it says once who holds the slots. A holder stalled for `stalled_wait_s` is gone past
    (the module's docstring says how)."""
    if not 1 <= wanted <= len(slots):
        raise ValueError(f"cannot lease {wanted} of the {len(slots)} {kind} slot(s) {list(slots)}")
    root = checked_lock_dir()
    files = [_slot_file(root, kind, s) for s in slots]
    mine = [f"{f.name} (since {_MINE[f]})" for f in files if f in _MINE]
    if len(files) - len(mine) < wanted:
        raise RuntimeError(
            f"this process (pid {os.getpid()}) already holds {', '.join(mine)}: a second lease of "
            f"{wanted} of {[f.name for f in files]} would wait for itself"
        )
    wait = _Wait(wait_s, poll_s, name, stalled_wait_s)
    queue_file = root / f"{kind}.queue.lock"
    while (queue := _open_lock(queue_file, False)) is None:  # the first in line holds it while it waits for slots
        if wait.past(queue_file):
            break
        wait.again(f"in line behind {holder_of(queue_file)}")
    try:
        while True:
            taken = {i: fd for i, f in enumerate(files) if f not in _MINE and (fd := _open_lock(f, False)) is not None}
            chosen = pick(set(taken), wanted) or []
            if not chosen:
                past = {i for i, f in enumerate(files) if i not in taken and f not in _MINE and wait.past(f)}
                chosen = pick(set(taken) | past, wanted) or []
                if chosen and kind != "cpu":
                    raise LeaseTimeout(
                        f"{', '.join(files[i].name for i in set(chosen) - set(taken))} held by a stopped process "
                        f"past launch.stalled_wait_s={stalled_wait_s:g}s: its device memory stays taken; not run"
                    )
            for i in set(taken) - set(chosen):
                os.close(taken[i])
            if chosen:
                break
            busy = [f for i, f in enumerate(files) if i not in taken]
            wait.again(f"for {kind} slots: " + "; ".join(f"{f.name} held by {holder_of(f)}" for f in busy))
    except BaseException:
        if queue is not None:
            os.close(queue)
        raise
    if queue is not None and set(chosen) <= set(taken):
        os.close(queue)  # else kept: first in line while it runs beside a stopped holder, who waits behind it
        queue = None
    since = time.strftime(SINCE_FORMAT)
    for i in chosen:
        _MINE[files[i]] = since
    try:
        yield [slots[i] for i in chosen]
    finally:
        for i in chosen:
            _MINE.pop(files[i], None)
            if i in taken:
                os.close(taken[i])
        if queue is not None:
            os.close(queue)


class _Wait:
    """A lease's wait: says once what it waits for, gives up past its deadline (LeaseTimeout saying what it waited
    for), else sleeps a poll; and whether a lock's holder has been stalled long enough to go past (said once)."""

    def __init__(self, wait_s: Optional[float], poll_s: float, name: str, stalled_wait_s: Optional[float]) -> None:
        self.deadline = None if wait_s is None else time.monotonic() + wait_s
        self.wait_s, self.poll_s, self.name, self.said = wait_s, poll_s, name, False
        self.stalled_wait_s = stalled_wait_s

    def again(self, why: str) -> None:
        if not self.said:
            print(f"[scaling] {self.name}waiting {why}", file=sys.stderr, flush=True)
            self.said = True
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise LeaseTimeout(f"waited {self.wait_s:g}s {why}")
        time.sleep(self.poll_s)

    def past(self, path: Path) -> bool:
        """Whether to go past the holder of lock file `path`: stopped, its processes idle, for stalled_wait_s."""
        note = _note(path)
        if self.stalled_wait_s is None or note is None or not note[0].isdigit():
            return False
        stalled = stalled_for_s(int(note[0]))
        if stalled is None or stalled < self.stalled_wait_s:
            return False
        print(
            f"[scaling] {self.name}going past {path.name}, held by {holder_of(path)} and idle for {stalled:.0f} s "
            f"(launch.stalled_wait_s={self.stalled_wait_s:g})",
            file=sys.stderr,
            flush=True,
        )
        return True


def request(cfg: ExperimentConfig, environ: Mapping[str, str]) -> Optional[Request]:
    """What a point must lease before it launches; None when it leases nothing.

    CPU: the host's one slot. CUDA: dp GPUs of this node (the entries of an inherited
    CUDA_VISIBLE_DEVICES, which SLURM sets to the GPUs of its allocation, else 0..devices_per_node-1),
    unless `launch.devices` fixes them or devices_per_node is unknown. A point spanning several nodes
    leases nothing: under SLURM those nodes are its own.
    """
    hw, dp = cfg.hardware, cfg.parallel.layout.world_size  # its ranks
    if hw.device == "cpu":
        checked_lock_dir(environ)  # refused before anything starts
        return Request("cpu", 1, (CPU_SLOT,))
    per_node = hw.devices_per_node
    if cfg.launch.devices is not None or per_node is None or dp > per_node:
        return None
    inherited = environ.get("CUDA_VISIBLE_DEVICES")
    slots = (
        tuple(s.strip() for s in inherited.split(",") if s.strip())
        if inherited is not None
        else tuple(str(i) for i in range(per_node))
    )
    slots = slots[:per_node]
    if dp > len(slots):
        where = (
            f"CUDA_VISIBLE_DEVICES={inherited!r} lists {len(slots)}"
            if inherited is not None
            else f"hardware.devices_per_node={per_node}"
        )
        raise ValueError(
            f"{cfg.parallel.layout.ranks()} needs {dp} GPUs on this node but {where}: widen CUDA_VISIBLE_DEVICES "
            f"(under SLURM: ask for more GPUs) or lower it to {len(slots)}"
        )
    checked_lock_dir(environ)
    return Request("cuda", dp, slots)


def start_sweep_watcher(poll_s: float = 1.0) -> None:
    """In a worker process of the sweep, start a daemon thread that kills this process as soon as the sweep's
    process dies (idempotent; nothing in the sweep's own process).

    The parallel launcher's workers outlive a killed sweep and would go on launching points; the
    point's torchrun and ranks die with the worker (PR_SET_PDEATHSIG, see scaling.launch.torchrun).
    """
    sweep = multiprocessing.parent_process()
    if sweep is None or any(t.name == "exit-with-sweep" for t in threading.enumerate()):
        return

    def watch() -> None:
        # Compare with the pid that spawned this worker, not the parent found at the first call:
        # the sweep may have died before this point got here.
        while os.getppid() == sweep.pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="exit-with-sweep", daemon=True).start()


@contextmanager
def hold(
    req: Optional[Request],
    visible: Optional[str],
    poll_s: float = POLL_S,
    wait_s: Optional[float] = None,
    stalled_wait_s: Optional[float] = None,
) -> Iterator[Held]:
    """Hold the requested slots for the body (waiting at most `wait_s`, and `stalled_wait_s` behind a stalled
    holder: `lease`); `visible` is CUDA_VISIBLE_DEVICES when nothing is leased."""
    t0 = time.perf_counter()
    if req is None:
        yield Held(visible=visible, wait_s=0.0)
        return
    root = lock_dir()
    lent = lease(req.wanted, req.slots, kind=req.kind, poll_s=poll_s, wait_s=wait_s, stalled_wait_s=stalled_wait_s)
    with lent as got:
        yield Held(",".join(got) if req.kind == "cuda" else visible, time.perf_counter() - t0, root)


def points_in_flight(device: str, devices_per_node: Optional[int]) -> int:
    """Hydra jobs the parallel launcher runs at once: one per GPU of the node, one on CPU.

    On CPU the launches queue for the host anyway, and a second job's own work (validation,
    memory prediction, logging) would run beside the measured point.
    """
    return int(devices_per_node) if device == "cuda" and devices_per_node else 1


def register_resolvers() -> None:
    """Register the OmegaConf resolver conf/hydra/launcher/parallel.yaml uses (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("scaling.points_in_flight"):
        OmegaConf.register_new_resolver("scaling.points_in_flight", points_in_flight)


def devices_at_hand(hw: HardwareConfig) -> int:
    """Devices of the target's kind this host offers: CPU ranks of hardware.threads_per_device cores each, or the
    GPUs CUDA_VISIBLE_DEVICES (else nvidia-smi) lists, at most devices_per_node; 0 when none."""
    if hw.device == "cpu":
        return max(1, usable_cores() // hw.threads_per_device)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip()])
    elif shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
        count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    else:
        count = 0
    per_node = hw.devices_per_node
    return min(count, per_node) if per_node else count
