"""Start one point's torchrun as a subprocess, bound its time, and classify how it ended.

torchrun runs in its own session (so a timeout can signal the whole job) and dies with the
driver (PR_SET_PDEATHSIG); each rank dies with torchrun the same way (see scaling.engine.worker). On
timeout every process of the job is killed: SIGTERM, a grace period, then SIGKILL.
`classify` is pure: it turns (exit code, timed out, elastic error files, log tail) into a status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import psutil

from scaling.engine.jobfiles import ELASTIC_LOGS, TORCHRUN_LOG
from scaling.engine.lifetime import die_with_parent
from scaling.record import FAILED, OK, OOM, TIMEOUT

KILL_GRACE_S = 5.0
_OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "out of memory")
_ECHO_MARKERS = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")


@dataclass(frozen=True)
class Outcome:
    """How a launched job ended."""

    status: str
    error: Optional[str]
    returncode: Optional[int]
    wall_s: float


def torchrun_argv(config_path: Path, nproc_per_node: int, prefix: Optional[Sequence[str]] = None) -> list[str]:
    """The command for one point: torchrun (standalone unless a prefix, e.g. SLURM's, is given) + worker."""
    log_dir = config_path.parent / ELASTIC_LOGS
    base = list(prefix) if prefix else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}",
    ]
    return base + ["--log-dir", str(log_dir), "-m", "scaling.engine.worker", str(config_path)]


def _kill_tree(proc: subprocess.Popen) -> None:
    """Terminate the job's process group and every descendant (ranks run in sessions of their own)."""
    try:
        family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in family:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(family, timeout=KILL_GRACE_S)
        if not alive:
            break
        family = alive
    proc.wait()


def _is_echo(message: str) -> bool:
    """A rank that failed only because a peer died first (gloo/NCCL saw the connection drop)."""
    return any(marker in message for marker in _ECHO_MARKERS)


def error_messages(job_dir: Path) -> list[str]:
    """Messages of the elastic error files the ranks wrote (`@record`): root causes first (a peer's
    dropped connection is an echo of another rank's failure), each group oldest first."""
    found = []
    for path in (job_dir / ELASTIC_LOGS).glob("**/error.json"):
        try:
            body = json.loads(path.read_text())["message"]
        except (json.JSONDecodeError, KeyError, OSError):
            continue
        if isinstance(body, dict):
            found.append((body.get("extraInfo", {}).get("timestamp", "0"), str(body.get("message", ""))))
        else:
            found.append(("0", str(body)))
    return [m for _, _, m in sorted((_is_echo(m), t, m) for t, m in found)]


def _last_line(text: str) -> Optional[str]:
    """The last informative line: torchrun's per-rank `traceback :` entry if any, else the last line
    that is not a banner of '=' or '-'."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip().strip("=-")]
    for line in reversed(lines):
        if line.startswith("traceback"):
            return line.split(":", 1)[1].strip()[:500]
    return lines[-1][:500] if lines else None


def classify(returncode: Optional[int], timed_out: bool, errors: Sequence[str], log_tail: str, timeout_s: float) -> tuple[str, Optional[str]]:
    """Status and one-line error of a finished job (pure)."""
    if timed_out:
        return TIMEOUT, f"no result within launch.timeout_s={timeout_s:g}s: all ranks killed"
    for message in errors:
        if any(marker in message for marker in _OOM_MARKERS):
            return OOM, _last_line(message)
    if returncode == 0:
        return OK, None
    if errors:
        return FAILED, _last_line(errors[0])
    if any(marker in log_tail for marker in _OOM_MARKERS):
        return OOM, next(ln.strip() for ln in log_tail.splitlines() if any(m in ln for m in _OOM_MARKERS))[:500]
    return FAILED, _last_line(log_tail) or f"torchrun exited with code {returncode}"


def run_job(argv: Sequence[str], job_dir: Path, timeout_s: float, env: Mapping[str, str],
            log_name: str = TORCHRUN_LOG) -> Outcome:
    """Run the job, wait at most `timeout_s`, leave no process behind, and classify the result."""
    log_path = job_dir / log_name
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env), start_new_session=True, preexec_fn=die_with_parent,
        )
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None or timed_out:
                _kill_tree(proc)
    wall_s = time.perf_counter() - start
    log_tail = log_path.read_bytes()[-20000:].decode(errors="replace")
    status, error = classify(proc.returncode, timed_out, error_messages(job_dir), log_tail, timeout_s)
    return Outcome(status=status, error=error, returncode=proc.returncode, wall_s=wall_s)


def job_env(threads_per_rank: int, devices: Optional[str]) -> dict[str, str]:
    """Environment of a job: this process's, with thread and device settings for the ranks."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads_per_rank)
    env["PYTHONUNBUFFERED"] = "1"
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env
