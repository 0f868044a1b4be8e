"""Points in flight: the `<job_dir>/running.json` marker, and whether the job behind it still lives.

run_point writes a marker (atomically) before it launches torchrun and removes it once the record
is written; the SLURM launcher writes one for each point it submits (state `queued`, with its SLURM
job id), which the job's own marker replaces when it starts. A marker outlives its point when the
process or the SLURM job dies without writing a record. `is_live` tells such a stale marker from a
live one: by the SLURM job's state (squeue) when the marker names a job, else by its process when
it ran on this host (the pid is alive and was started when the marker says). The grid sweeper
leaves points with a live marker to the job that holds them; `scaling status` lists them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import psutil

from scaling.core.files import write_json_atomic
from scaling.engine.jobfiles import RUNNING_FILE

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


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def slurm_job_id(env: Mapping[str, str]) -> Optional[str]:
    """This process's SLURM job as squeue names it: `ARRAY_TASK` for an array task, else the job id."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def mark_running(point_dir: Path, env: Mapping[str, str]) -> None:
    """Say that this process runs the point of job directory `point_dir` from now on."""
    write_json_atomic(
        point_dir / RUNNING_FILE,
        {
            "state": RUNNING,
            "started_at": _now(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_started_at": psutil.Process().create_time(),
            "slurm_job_id": slurm_job_id(env),
        },
    )


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
    """Whether the job behind a marker may still write the point's record; None when this host cannot
    tell (a process on another host, or no squeue to ask)."""
    job_id = marker.get("slurm_job_id")
    if job_id:
        return None if states is None else states.get(job_id) in SLURM_ACTIVE
    if marker.get("host") != host:
        return None
    return alive(int(marker["pid"]), marker.get("pid_started_at"))


def marker_states(markers: Mapping[str, Mapping[str, Any]]) -> Optional[dict[str, str]]:
    """squeue's state of the SLURM jobs the markers name (one call for all; see slurm_states)."""
    return slurm_states(m["slurm_job_id"] for m in markers.values() if m.get("slurm_job_id"))


def live_markers(
    markers: Mapping[str, Mapping[str, Any]], states: Optional[Mapping[str, str]]
) -> dict[str, Optional[bool]]:
    """`is_live` of each marker, by job key, given `marker_states(markers)`."""
    host = socket.gethostname()
    return {key: is_live(marker, states, host) for key, marker in markers.items()}
