"""Points in flight: the claim a run takes on its point, the `<job_dir>/running.json` marker, and whether the job
behind a marker still lives.

`claim` is an exclusive `flock` on `<job_dir>/claim.lock`, held until the record is written, with the marker (host,
pid, its start time, a heartbeat every HEARTBEAT_S) under it; a claim whose holder is dead (a dead pid here, a
heartbeat older than STALE_AFTER_S elsewhere) is taken over and the record says whose. A live holder that does not
progress (stopped, or its heartbeat older than STALLED_AFTER_S) is `stalled`: named, never taken over, waited for at
most launch.stalled_wait_s; the claim's thread notes when this process was stopped (`Claim.stopped_s`). The SLURM
launcher writes a `queued` marker per submitted point. `is_live` tells a stale marker from a live one. docs/sweeps.md.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import psutil

from scaling.core.files import write_json_atomic
from scaling.engine.jobfiles import CLAIM_FILE, RUNNING_FILE

QUEUED, RUNNING = "queued", "running"
SLURM_ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
"""squeue states of a job that has not ended (it may still write a record)."""
HEARTBEAT_S = 10.0
"""How often a claim's holder rewrites its marker's `heartbeat_at`."""
STALE_AFTER_S = 120.0
"""A marker whose heartbeat is older than this is stale: its holder died (or its host lost the file system)."""
STALLED_AFTER_S = 3 * HEARTBEAT_S
"""A live holder whose heartbeat is older than this has stalled (three beats missed)."""
TICK_S = 0.5
"""How often a claim's heartbeat thread wakes: a wake this late by more than STOP_GAP_S means the process was
stopped meanwhile (SIGSTOP, a suspended terminal, a frozen VM, a debugger)."""
STOP_GAP_S = 2.0


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def slurm_job_id(env: Mapping[str, str]) -> Optional[str]:
    """This process's SLURM job as squeue names it: `ARRAY_TASK` for an array task, else the job id."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def mark_running(point_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """Say that this process runs the point of job directory `point_dir` from now on; the marker written."""
    now = _now()
    marker = {
        "state": RUNNING,
        "started_at": now,
        "heartbeat_at": now,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_started_at": psutil.Process().create_time(),
        "slurm_job_id": slurm_job_id(env),
    }
    write_json_atomic(point_dir / RUNNING_FILE, marker)
    return marker


def holder(marker: Mapping[str, Any]) -> str:
    """Who a marker says holds its point, in words."""
    if marker.get("state") == QUEUED:
        return f"SLURM job {marker.get('slurm_job_id')} (queued since {marker.get('submitted_at')})"
    slurm = f", SLURM job {marker['slurm_job_id']}" if marker.get("slurm_job_id") else ""
    return f"pid {marker.get('pid')} on {marker.get('host')}{slurm} (since {marker.get('started_at')})"


class Claim:
    """This process's exclusive hold on one point (`claim`): the lock, the marker and its heartbeat, whose thread also
    notes when this process was stopped. Leaving it (or `release`) stops the heartbeat, removes the marker and lets the
    next waiter in."""

    def __init__(self, point_dir: Path, fd: int, marker: dict[str, Any], took_over: Optional[dict[str, Any]]):
        self.point_dir, self._fd, self.marker = point_dir, fd, marker
        self.took_over = took_over
        """The stale marker this claim replaced (its holder died), or None."""
        self.since = self._tick = time.monotonic()
        self._stopped: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="claim-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        beat = time.monotonic()
        while not self._stop.wait(TICK_S):
            now = self._note_stop()
            if now - beat < HEARTBEAT_S:
                continue
            beat = now
            self.marker["heartbeat_at"] = _now()
            try:
                write_json_atomic(self.point_dir / RUNNING_FILE, self.marker)
            except OSError:
                pass  # the next beat tries again; the lock still holds the point on this host

    def _note_stop(self) -> float:
        """Note the span since the last tick as stopped when it is late by more than STOP_GAP_S; the time now."""
        with self._lock:
            now = time.monotonic()
            if now - self._tick - TICK_S > STOP_GAP_S:
                self._stopped.append((self._tick + TICK_S, now))
            self._tick = now
            return now

    def stopped_s(self, since: Optional[float] = None, until: Optional[float] = None) -> float:
        """Seconds this process was stopped between two `time.monotonic()` readings (from the claim to now by
        default), to within TICK_S."""
        now = self._note_stop()  # a stop that has just ended, before the thread has woken to note it
        since, until = self.since if since is None else since, now if until is None else until
        with self._lock:
            return sum(max(0.0, min(end, until) - max(start, since)) for start, end in self._stopped)

    def release(self) -> None:
        """The point's record is written (or it was not run): it is no longer in flight."""
        if self._fd < 0:
            return
        self._stop.set()
        self._beat.join()
        clear(self.point_dir)
        # removed while still locked: a waiter that locks the removed file sees that it is no longer the path's and
        # opens the new one (`claim`), so the point's directory keeps only what the run wrote
        (self.point_dir / CLAIM_FILE).unlink(missing_ok=True)
        os.close(self._fd)  # the flock goes with the last descriptor
        self._fd = -1

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def held_elsewhere(marker: Optional[Mapping[str, Any]], host: str) -> bool:
    """Whether a marker found under a claim this process has just locked still holds the point: a live process on
    this host that does not lock (a run before claims existed), or a fresh heartbeat from another host (whose lock
    this host may not see)."""
    if marker is None or marker.get("state") != RUNNING:
        return False  # none, or queued by the SLURM launcher for the task that is claiming it now
    if marker.get("host") == host:
        return marker.get("pid") != os.getpid() and pid_alive(int(marker["pid"]), marker.get("pid_started_at"))
    return heartbeat_fresh(marker)


def heartbeat_fresh(marker: Mapping[str, Any], now: Optional[dt.datetime] = None) -> bool:
    """Whether the marker's heartbeat is younger than STALE_AFTER_S (False when it has none)."""
    age = heartbeat_age_s(marker, now)
    return age is not None and age < STALE_AFTER_S


def heartbeat_age_s(marker: Mapping[str, Any], now: Optional[dt.datetime] = None) -> Optional[float]:
    """Seconds since the marker's last heartbeat; None when it has none."""
    beat = marker.get("heartbeat_at")
    if not beat:
        return None
    return ((now or dt.datetime.now(dt.timezone.utc)) - dt.datetime.fromisoformat(beat)).total_seconds()


def process_stopped(pid: int) -> bool:
    """Whether process `pid` (on this host) is stopped: SIGSTOP, a suspended terminal, a debugger's trap."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def stalled(marker: Mapping[str, Any], host: str, now: Optional[dt.datetime] = None) -> Optional[str]:
    """How the live holder of a running marker is not progressing (`stopped, heartbeat 3.0 min old`), or None when
    it is: its process stopped (this host), or its heartbeat older than STALLED_AFTER_S."""
    if marker.get("state") != RUNNING:
        return None
    age = heartbeat_age_s(marker, now)
    stopped = marker.get("host") == host and marker.get("pid") is not None and process_stopped(int(marker["pid"]))
    if not stopped and (age is None or age <= STALLED_AFTER_S):
        return None
    return ", ".join((["stopped"] if stopped else []) + ([] if age is None else [f"heartbeat {_duration(age)} old"]))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class ClaimTimeout(TimeoutError):
    """A point another process holds, not had within its deadline; the message names the holder and its state."""


def claim(
    point_dir: Path,
    env: Mapping[str, str],
    poll_s: float = 0.2,
    name: str = "",
    wait_s: Optional[float] = None,
    stalled_wait_s: Optional[float] = None,
) -> Claim:
    """Claim the point of job directory `point_dir` for this process, waiting while another holds it (it says once
    who): at most `wait_s`, and at most `stalled_wait_s` once the holder has stalled (`stalled`), then ClaimTimeout.
    A stale claim is taken over. The caller checks the store again once it holds the claim."""
    point_dir.mkdir(parents=True, exist_ok=True)
    path, host, said = point_dir / CLAIM_FILE, socket.gethostname(), set()
    start, stalled_since = time.monotonic(), None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                found = read_marker(point_dir)
            else:
                if not _still_the_path(fd, path):  # its holder removed it as it let go: lock the new one
                    os.close(fd)
                    continue
                found = read_marker(point_dir)
                if not held_elsewhere(found, host):
                    stale = found if found is not None and found.get("state") == RUNNING else None
                    return Claim(point_dir, fd, mark_running(point_dir, env), stale)
            os.close(fd)
        except BaseException:
            os.close(fd)
            raise
        who, how, now = holder(found) if found else "another process", stalled(found or {}, host), time.monotonic()
        stalled_since = (stalled_since or now) if how else None
        if not said:
            _say(f"{name or point_dir.name}: {who} runs it: waiting for its record")
            said.add("held")
        if how and "stalled" not in said:
            bound = "" if stalled_wait_s is None else f" at most launch.stalled_wait_s={stalled_wait_s:g} s"
            _say(f"{name or point_dir.name}: {who} has stalled ({how}): waiting{bound} for it")
            said.add("stalled")
        if how and stalled_wait_s is not None and now - stalled_since >= stalled_wait_s:
            raise ClaimTimeout(f"held by {who}, stalled ({how}): waited launch.stalled_wait_s={stalled_wait_s:g} s")
        if wait_s is not None and now - start >= wait_s:
            raise ClaimTimeout(f"held by {who}: waited launch.lease_wait_s={wait_s:g} s for its record")
        time.sleep(poll_s)


def _say(line: str) -> None:
    print(f"[scaling] {line}", file=sys.stderr, flush=True)


def _still_the_path(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the one at `path` (not removed or replaced since it was opened)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def mark_queued(point_dir: Path, job_id: str) -> None:
    """Say that SLURM job `job_id` was submitted to run the point of job directory `point_dir`, unless the task has
    already said that it runs it (a task can start before the driver gets here)."""
    staged = point_dir / f".{RUNNING_FILE}.{os.getpid()}.queued"
    write_json_atomic(staged, {"state": QUEUED, "submitted_at": _now(), "slurm_job_id": job_id})
    try:
        os.link(staged, point_dir / RUNNING_FILE)  # atomic, and never over the task's own marker
    except FileExistsError:
        pass
    finally:
        staged.unlink()


def clear(point_dir: Path) -> None:
    """The point's record is written: it is no longer in flight."""
    (point_dir / RUNNING_FILE).unlink(missing_ok=True)


def read_marker(point_dir: Path) -> Optional[dict[str, Any]]:
    """The marker of a job directory, or None (no marker, or one being replaced)."""
    try:
        return json.loads((point_dir / RUNNING_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_markers(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """Every marker of a sweep directory, by job key."""
    found = {}
    for path in Path(sweep_dir).glob(f"*/{RUNNING_FILE}"):
        marker = read_marker(path.parent)
        if marker is not None:
            found[path.parent.name] = marker
    return found


def slurm_states(job_ids: Iterable[str]) -> Optional[dict[str, str]]:
    """squeue's state of each given job (array tasks one by one) that it still knows; a job it
    does not list has ended. None when squeue cannot be asked."""
    arrays = sorted({str(j).split("_")[0] for j in job_ids})
    if not arrays:
        return {}
    try:
        out = subprocess.run(
            ["squeue", "--noheader", "--array", "--jobs", ",".join(arrays), "--format=%i|%T"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return {} if "Invalid job id" in out.stderr else None  # every job asked about has ended
    return dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)


def pid_alive(pid: int, started_at: Optional[float]) -> bool:
    """Whether process `pid` runs and is the one started at `started_at` (not a later one with its pid)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and (
            started_at is None or abs(proc.create_time() - started_at) < 1
        )
    except psutil.Error:
        return False


def is_live(
    marker: Mapping[str, Any],
    states: Optional[Mapping[str, str]],
    host: str,
    alive: Callable[[int, Optional[float]], bool] = pid_alive,
) -> Optional[bool]:
    """Whether the job behind a marker may still write the point's record: by squeue's state of its SLURM job, else
    by its process on this host, else by its heartbeat; None when this host cannot tell (a queued SLURM job and no
    squeue to ask, or another host's marker without a heartbeat)."""
    job_id = marker.get("slurm_job_id")
    if job_id and states is not None:
        return states.get(job_id) in SLURM_ACTIVE
    if marker.get("host") == host and marker.get("pid") is not None:
        return alive(int(marker["pid"]), marker.get("pid_started_at"))
    if marker.get("heartbeat_at"):
        return heartbeat_fresh(marker)
    return None


def marker_states(markers: Mapping[str, Mapping[str, Any]]) -> Optional[dict[str, str]]:
    """squeue's state of the SLURM jobs the markers name (one call for all; see slurm_states)."""
    return slurm_states(m["slurm_job_id"] for m in markers.values() if m.get("slurm_job_id"))


def live_markers(
    markers: Mapping[str, Mapping[str, Any]], states: Optional[Mapping[str, str]]
) -> dict[str, Optional[bool]]:
    """`is_live` of each marker, by job key, given `marker_states(markers)`."""
    host = socket.gethostname()
    return {key: is_live(marker, states, host) for key, marker in markers.items()}
