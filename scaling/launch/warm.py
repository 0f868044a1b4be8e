"""Warm ranks (`launch.reuse=true`): one torchrun job whose ranks stay up for the points of one shape.

A fresh launch spends seconds per rank on the interpreter, torch and the process group; points of one shape (world
size, hardware, process-group timeout, devices, rank environment) share those ranks instead. This driver keeps the
warm jobs and hands each a point of its shape (scaling.engine.jobfiles.warm_send); a job holds its device lease for
its life and ends when idle (`launch.reuse_idle_s`), when a fresh launch needs its devices, with the driver, or
with the first point that may have left a rank inside a collective. Each point keeps its own job directory and its
ordinary record. When a job ends and why: docs/concepts.md.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from scaling.core.enums import Status
from scaling.core.files import open_new
from scaling.core.schema import ExperimentConfig, HardwareConfig
from scaling.engine.agent import SERVER_ENV
from scaling.engine.jobfiles import (
    DONE_PIPE,
    ELASTIC_LOGS,
    TORCHRUN_LOG,
    WARM_CHECK_S,
    make_pipes,
    open_pipe,
    warm_is_done,
    warm_send,
    warm_was_taken,
)
from scaling.launch import agents, devices, torchrun

RANK_ENV_PREFIXES = (
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "MALLOC_",
    "NCCL_",
    "GLOO_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "NVIDIA_",
    "SCALING_",
    "LD_",
    "PYTHON",
    "PATH",
)
"""The environment variables that can change what a rank does: a point shares a warm job only with points whose
ranks would see the same values of these (others, a shell's or a test runner's bookkeeping, do not count)."""
DRIVER_ONLY_ENV = (devices.LOCK_DIR_ENV, SERVER_ENV)
"""Variables of those prefixes that only the driver reads: the device lock directory is where a lease is taken (a
job holds its lease where it took it and watches that directory for waiters, `devices.Held.lock_dir`), the agent
server is what forks an agent (scaling.launch.agents), and no rank reads either."""


@dataclass(frozen=True)
class Shape:
    """What the points of one warm job have in common: whatever the ranks fixed when they started."""

    nproc: int
    hardware: str
    """The hardware block as JSON: device, backend, threads, memory capacity."""
    pg_timeout_s: float
    request: Optional[devices.Request]
    visible: Optional[str]
    """launch.devices: CUDA_VISIBLE_DEVICES fixed by the point (None: leased or inherited)."""
    env: tuple[tuple[str, str], ...]

    def hardware_block(self) -> HardwareConfig:
        """The points' `hardware` group."""
        return HardwareConfig(**json.loads(self.hardware))


def shape_of(cfg: ExperimentConfig, request: Optional[devices.Request], environ: Mapping[str, str]) -> Shape:
    """The shape of a point about to launch on this node (pure)."""
    return Shape(
        nproc=cfg.parallel.layout.world_size,
        hardware=json.dumps(asdict(cfg.hardware), sort_keys=True),
        pg_timeout_s=torchrun.process_group_timeout_s(cfg.launch.timeout_s, cfg.launch.collective_timeout_s),
        request=request,
        visible=cfg.launch.devices,
        env=tuple(
            sorted((k, v) for k, v in environ.items() if k.startswith(RANK_ENV_PREFIXES) and k not in DRIVER_ONLY_ENV)
        ),
    )


class JobGone(RuntimeError):
    """The warm job ended before its rank 0 took the point: nothing of the point ran, so it is no measurement of
    the point (the caller launches it fresh)."""


class WarmJob:
    """A torchrun job of warm ranks and the device lease it holds."""

    def __init__(self, shape: Shape, held: devices.Held) -> None:
        self.shape = shape
        self.points = 0
        """Points handed to the job so far."""
        self.last_used = time.monotonic()
        self.busy = False
        """A turn runs: the job is not ended by its idle watch."""
        self._idle: Optional[threading.Event] = None
        self._stack = contextlib.ExitStack()
        self.held = held
        """The devices (a lease counted by `_share` or `_take`); `wait_s` is the lease's wait until the first turn
        has run, then 0."""
        self._stack.callback(_unhold, shape.request, shape.visible)
        self.pool_dir = Path(tempfile.mkdtemp(prefix="scaling-warm-"))
        self._stack.callback(shutil.rmtree, self.pool_dir, True)
        self.log_path = self.pool_dir / TORCHRUN_LOG
        self.proc: Optional[agents.Agent] = None
        self.token = torchrun.new_token()
        """The job's identity in its processes' environment: what is left of it is ended by this, never by name."""

    def idle_after(self, seconds: float, end: Any) -> None:
        """Call `end` once the job has waited `seconds` for its next point, or as soon as another process waits
        for its devices (looked at every IDLE_CHECK_S)."""
        self.cancel_idle()
        stop = self._idle = threading.Event()
        deadline = time.monotonic() + seconds

        def watch() -> None:
            while not stop.wait(max(0.0, min(IDLE_CHECK_S, deadline - time.monotonic()))):
                if (
                    time.monotonic() >= deadline
                    or devices.waiting_s(self.shape.request, self.held.lock_dir) is not None
                ):
                    end()
                    return

        threading.Thread(target=watch, name="warm-ranks-idle", daemon=True).start()

    def cancel_idle(self) -> None:
        """A point came: the job is no longer idle."""
        if self._idle is not None:
            self._idle.set()

    @property
    def alive(self) -> bool:
        """Whether the job can take another point: not started yet, or its torchrun still running."""
        return self.proc is None or self.proc.poll() is None

    def _start(self) -> None:
        hw = self.shape.hardware_block()
        argv = torchrun.torchrun_argv(
            torchrun.WORKER,
            ["--serve", str(self.pool_dir)],
            self.shape.nproc,
            log_dir=self.pool_dir / ELASTIC_LOGS,
        )
        env = {
            **torchrun.job_env(hw.threads_per_device, self.held.visible, hw.device == "cuda"),
            torchrun.LAUNCH_ENV: self.token,
        }
        make_pipes(self.pool_dir, self.shape.nproc)
        self._done_fd = open_pipe(self.pool_dir / DONE_PIPE)
        self._stack.callback(os.close, self._done_fd)
        with open_new(self.log_path) as log:
            self.proc = agents.start(argv, env, log)

    def run(
        self, config_path: Path, launch_dir: Path, timeout_s: float, log_name: str = TORCHRUN_LOG
    ) -> tuple[torchrun.Outcome, int]:
        """Measure one point on the job's ranks (starting them for the first), wait at most `timeout_s`, copy what
        the job wrote meanwhile into this launch's directory (where the point's config.json is), and classify the
        outcome as a fresh launch's; also how many points the job had run before this one."""
        if self.proc is None:
            self._start()
        assert self.proc is not None
        n, self.points = self.points, self.points + 1
        offset = self.log_path.stat().st_size
        start = time.perf_counter()
        warm_send(self.pool_dir, n, config_path, self.shape.nproc)
        timed_out = False
        while not warm_is_done(self.pool_dir, n) and self.proc.poll() is None:
            left = timeout_s - (time.perf_counter() - start)
            if left <= 0:
                timed_out = True
                break
            # blocked until rank 0 says done (or, every WARM_CHECK_S, to see whether torchrun still runs)
            if select.select([self._done_fd], [], [], min(left, WARM_CHECK_S))[0]:
                os.read(self._done_fd, 4096)
        done = not timed_out and warm_is_done(self.pool_dir, n)
        if not done:  # the job is over for every point: end what is left of it
            if self.proc.poll() is None:
                torchrun.kill_tree(self.proc)
            self.proc.wait()
            torchrun.end_launch(self.token, agent=self.proc)
            if not timed_out and not warm_was_taken(self.pool_dir, n):
                raise JobGone(f"the warm ranks ended (torchrun exit code {self.proc.returncode}) before taking it")
        wall_s = time.perf_counter() - start
        self.held = dataclasses.replace(self.held, wait_s=0.0)  # a later turn waited for no device
        try:
            with open(self.log_path, "rb") as log, open_new(launch_dir / log_name) as out:
                log.seek(offset)
                shutil.copyfileobj(log, out)
        except OSError as e:  # a full disk: what the ranks measured is in worker.json; this copy may be cut short
            print(f"[scaling] {launch_dir / log_name}: not copied whole ({e.strerror})", file=sys.stderr, flush=True)
        if done and not torchrun.error_messages(launch_dir):
            return torchrun.Outcome(status=Status.OK, error=None, returncode=0, wall_s=wall_s), n
        if done:  # a point the ranks came through together (the emulated capacity exceeded): the job goes on
            status, error = torchrun.judge(1, False, launch_dir, launch_dir / log_name, timeout_s)
            return torchrun.Outcome(status=status, error=error, returncode=1, wall_s=wall_s), n
        if (self.pool_dir / ELASTIC_LOGS).exists():
            shutil.copytree(self.pool_dir / ELASTIC_LOGS, launch_dir / ELASTIC_LOGS, dirs_exist_ok=True)
        returncode = self.proc.returncode if self.proc.returncode != 0 else 1  # it stopped before the point's end
        status, error = torchrun.judge(returncode, timed_out, launch_dir, launch_dir / log_name, timeout_s)
        return torchrun.Outcome(status=status, error=error, returncode=self.proc.returncode, wall_s=wall_s), n

    def close(self, grace_s: float = torchrun.KILL_GRACE_S) -> None:
        """Stop the ranks (asked first, killed after `grace_s`), then give the devices back."""
        self.cancel_idle()
        try:
            if self.proc is not None and self.proc.poll() is None:
                warm_send(self.pool_dir, self.points, None, self.shape.nproc)
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    torchrun.kill_tree(self.proc)
            if self.proc is not None:  # the lease goes back only once no process of the job is left
                torchrun.end_launch(self.token, agent=self.proc)
        finally:
            self._stack.close()


MAX_CPU_JOBS = 4
"""Warm jobs of different shapes one CPU driver keeps at once (the oldest idle one ends first)."""
IDLE_CHECK_S = 1.0
"""How often an idle job looks whether another process waits for its devices."""

_LOCK = threading.RLock()
_jobs: dict[Shape, WarmJob] = {}
_leases: dict[Any, tuple[contextlib.ExitStack, devices.Held, int]] = {}
"""This process's leases by slot set (`_lease_key`): the stack that releases it, the devices, the jobs using it."""


def _lease_key(request: Optional[devices.Request], visible: Optional[str]) -> Any:
    """One lease per slot set in this process: the request names the slots (its `visible` is what it leased);
    without one, the devices given."""
    return (request.kind, request.slots) if request is not None else ("given", visible)


def _share(request: Optional[devices.Request], visible: Optional[str]) -> Optional[devices.Held]:
    """The lease of a job of this process on the same slots, counted once more (CPU jobs of this driver run their
    points one at a time, so they may share the host); None when there is none. Under _LOCK."""
    key = _lease_key(request, visible)
    if key not in _leases:
        return None
    stack, held, users = _leases[key]
    _leases[key] = (stack, held, users + 1)
    return dataclasses.replace(held, wait_s=0.0)


def _take(shape: Shape, wait_s: Optional[float], stalled_wait_s: Optional[float] = None) -> devices.Held:
    """A new lease for a job of this process: waited for without _LOCK (the idle watches of this process's other
    jobs end them meanwhile), then counted under it."""
    stack = contextlib.ExitStack()
    held = stack.enter_context(devices.hold(shape.request, shape.visible, wait_s=wait_s, stalled_wait_s=stalled_wait_s))
    with _LOCK:
        _leases[_lease_key(shape.request, shape.visible)] = (stack, held, 1)
    return held


def _unhold(request: Optional[devices.Request], visible: Optional[str]) -> None:
    key = _lease_key(request, visible)
    stack, held, users = _leases.pop(key)
    if users > 1:
        _leases[key] = (stack, held, users - 1)
    else:
        stack.close()


def _end(job: WarmJob) -> None:
    with _LOCK:
        if _jobs.get(job.shape) is job:
            del _jobs[job.shape]
            job.close()


def _end_idle(job: WarmJob) -> None:
    """The idle watch's end: not of a job that took a point meanwhile."""
    with _LOCK:
        if not job.busy:
            _end(job)


def close() -> None:
    """End every warm job of this process (the next point starts fresh)."""
    with _LOCK:
        for job in list(_jobs.values()):
            _end(job)


atexit.register(close)


@contextlib.contextmanager
def fresh_lease(
    request: Optional[devices.Request],
    visible: Optional[str],
    wait_s: Optional[float] = None,
    stalled_wait_s: Optional[float] = None,
) -> Iterator[devices.Held]:
    """The devices for a launch that is not a turn of a warm job (a fresh point, the collectives benchmark). On CPU
    it shares the lease this process's warm jobs hold on the host, as they share it among themselves (this process
    runs its points one at a time, and idle ranks hold memory, not cores); otherwise this process's warm jobs end
    first, since an idle one keeps its devices (a CUDA context) and holds the lease such a launch would wait for
    until it times out (launch.reuse_idle_s)."""
    with _LOCK:
        shared = _share(request, visible) if request is not None and request.kind == "cpu" else None
    if shared is None:
        close()
        with devices.hold(request, visible, wait_s=wait_s, stalled_wait_s=stalled_wait_s) as held:
            yield held
        return
    try:
        yield shared
    finally:
        with _LOCK:
            _unhold(request, visible)


@contextlib.contextmanager
def job_for(
    shape: Shape, idle_s: float, wait_s: Optional[float] = None, stalled_wait_s: Optional[float] = None
) -> Iterator[WarmJob]:
    """The warm job for a point of `shape`: a running one of the same shape, else a new one (its lease waited for
    at most `wait_s`, devices.LeaseTimeout past it; a stalled holder as devices.lease says, after `stalled_wait_s`).

    On CUDA a new job first ends the others (an idle job's ranks keep a CUDA context on their devices); on CPU up
    to MAX_CPU_JOBS jobs of different shapes wait side by side (idle ranks hold memory, not cores, and the
    capacity a CPU point runs against is emulated). After its point a job gives its devices back when another
    process has waited `idle_s` (launch.reuse_idle_s) for them, so a driver waits at most that and one turn, while
    a stream of points is not cut into warm-job starts by every wait; it then waits `idle_s` for its next point (giving
    the devices back as soon as another process waits), then ends. A job whose ranks stopped with their point ends
    at once."""
    with _LOCK:
        job, held = _jobs.get(shape), None
        if job is not None:
            job.cancel_idle()
            if not job.alive:
                _end(job)
                job = None
        if job is None:
            cuda = shape.hardware_block().device == "cuda"
            while _jobs and (cuda or len(_jobs) >= MAX_CPU_JOBS):
                _end(min(_jobs.values(), key=lambda j: j.last_used))
            held = _share(shape.request, shape.visible)
        else:
            job.busy = True
    if job is None:
        job = WarmJob(shape, held if held is not None else _take(shape, wait_s, stalled_wait_s))
        job.busy = True
        with _LOCK:
            _jobs[shape] = job
    try:
        yield job
    finally:
        with _LOCK:
            job.busy, job.last_used = False, time.monotonic()
            waited = devices.waiting_s(shape.request, job.held.lock_dir)
            if not job.alive or (waited is not None and waited >= idle_s):
                _end(job)  # stopped with its point, or another process has waited idle_s for its devices
            else:
                job.idle_after(idle_s, functools.partial(_end_idle, job))
