"""Start one point's torchrun as a subprocess, bound its time, and classify how it ended.

Owns the one builder of torchrun command lines (`torchrun_argv`). torchrun runs in its own session and dies with the
driver (scaling.engine.lifetime); on timeout every process of the launch is killed (SIGTERM, a grace period,
SIGKILL) and `end_launch` makes sure none is left before the devices are released. A launch's processes are known
by a token of their own in the environment (LAUNCH_ENV), never by name; a launch through srun names its job step
after it (`end_slurm_step`). `classify` is pure: (exit code, timed out, elastic error files, log tail) -> status.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import psutil

from scaling.core.enums import Status
from scaling.core.files import open_new
from scaling.engine.agent import FORK_ENV
from scaling.engine.jobfiles import ELASTIC_LOGS, TORCHRUN_LOG
from scaling.launch import agents

KILL_GRACE_S = 5.0
STEP_END_S = 60.0
"""How long the end of a launch waits for its SLURM job step to leave the queue after cancelling it."""
STEP_CANCEL_AGAIN_S = 5.0
_OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "out of memory")
_ECHO_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker crashing",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL is aborted",
)
_COLLECTIVE_TIMEOUT_MARKERS = (
    "Timed out waiting",
    "Watchdog caught collective operation timeout",
    "timed out after",
    "Timeout waiting for",
)
"""A rank gave up waiting in a collective (the process-group timeout): a peer hung."""


@dataclass(frozen=True)
class Outcome:
    """How a launched job ended."""

    status: str
    error: Optional[str]
    returncode: Optional[int]
    wall_s: float


TORCHRUN = agents.TORCHRUN
WORKER = "scaling.engine.worker"


def torchrun_argv(
    module: str,
    module_args: Sequence[str],
    nproc_per_node: int,
    *,
    nnodes: int = 1,
    rendezvous: Optional[tuple[str, str]] = None,
    log_dir: Optional[Path] = None,
) -> list[str]:
    """torchrun running `python -m module module_args...` on this node: `--standalone` on one node, or
    joining the c10d `rendezvous` (endpoint, id) of a point that spans `nnodes` nodes.

    The one place a torchrun command line is made: points (locally and under SLURM) and the collectives
    benchmark all come through here.
    """
    if nnodes == 1:
        argv = [*TORCHRUN, "--standalone", "--nnodes=1", f"--nproc-per-node={nproc_per_node}"]
    elif rendezvous is None:
        raise ValueError(f"a {nnodes}-node torchrun needs a rendezvous endpoint and id")
    else:
        endpoint, rdzv_id = rendezvous
        argv = [
            *TORCHRUN,
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}",
        ]
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir)]
    return [*argv, "-m", module, *module_args]


def process_group_timeout_s(timeout_s: float, collective_timeout_s: Optional[float] = None) -> float:
    """The ranks' collective timeout for a point allowed `timeout_s`: `collective_timeout_s` where given
    (launch.collective_timeout_s), else well below `timeout_s`, so a rank left waiting for a dead or hung peer fails
    with its own error (and the point ends) before the driver's kill."""
    if collective_timeout_s is not None:
        return float(collective_timeout_s)
    return max(10.0, 0.5 * float(timeout_s))


def kill_tree(proc: agents.Agent) -> None:
    """Terminate the job this process started and every descendant of it (`end_launch` then finds any that left the
    tree); never raises."""
    try:
        family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
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


def classify(
    returncode: Optional[int], timed_out: bool, errors: Sequence[str], log_tail: str, timeout_s: float
) -> tuple[str, Optional[str]]:
    """Status and one-line error of a finished job (pure).

    An out-of-memory error in any rank wins over everything, also over a timeout: the ranks still
    waiting for the rank that died are its echo. A rank that gave up waiting in a collective (the
    process-group timeout, below the point's) means a peer hung: `timeout` too.
    """
    for message in errors:
        if any(marker in message for marker in _OOM_MARKERS):
            return Status.OOM, _last_line(message)
    if timed_out:
        return Status.TIMEOUT, f"no result within launch.timeout_s={timeout_s:g}s: all ranks killed"
    if returncode == 0:
        return Status.OK, None
    if not errors and any(marker in log_tail for marker in _OOM_MARKERS):  # no rank's own word: its log's, OOM first
        return Status.OOM, next(ln.strip() for ln in log_tail.splitlines() if any(m in ln for m in _OOM_MARKERS))[:500]
    # A rank's own error, else its log: a rank the timeout aborted (SIGABRT from gloo's thread, or from the heap its
    # exit found corrupted after the timeout's error) leaves only its signal in the error file, or no error file at
    # all, and the timeout in its output.
    signalled = all(message.startswith("Signal ") for message in errors)
    said = [_last_line(m) for m in errors if any(k in m for k in _COLLECTIVE_TIMEOUT_MARKERS)]
    said += [ln.strip()[:500] for ln in log_tail.splitlines() if any(k in ln for k in _COLLECTIVE_TIMEOUT_MARKERS)][
        -1:
    ] * bool(signalled)
    if said:
        return Status.TIMEOUT, f"a rank waited past the process-group timeout in a collective: {said[0]}"
    if errors:
        return Status.FAILED, _last_line(errors[0])
    if returncode is not None and returncode < 0:  # the agent itself was killed (or its server): the log's last line
        # is whatever a rank printed last, no cause
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return Status.FAILED, f"torchrun's agent was ended by {name}, no rank said why"
    return Status.FAILED, _last_line(log_tail) or f"torchrun exited with code {returncode}"


LAUNCH_ENV = "SCALING_LAUNCH"
"""The environment variable holding a launch's token (`new_token`): torchrun and its ranks inherit it."""


def new_token() -> str:
    """A launch's identity: this host, this process, and 128 random bits."""
    return f"{os.getpid()}-{uuid.uuid4().hex}"


def launch_processes(token: str, agent: Optional[agents.Agent] = None) -> list[psutil.Process]:
    """Live processes of this user that carry launch `token` in their environment (this process excluded), or are
    of the session of a served `agent` (scaling.launch.agents: forked, they show their server's environment)."""
    me, found = os.getuid(), []
    session = agent.session_id() if isinstance(agent, agents.Served) else None
    for p in psutil.process_iter(["uids"]):
        try:
            uids = p.info["uids"]
            if p.pid == os.getpid() or uids is None or uids.real != me:
                continue  # another user's process is never ours to end
            if (session is not None and os.getsid(p.pid) == session) or p.environ().get(LAUNCH_ENV) == token:
                found.append(p)
        except (psutil.Error, OSError):  # gone, a zombie, or not readable: not one of ours to end
            continue
    return found


def end_launch(token: str, grace_s: float = KILL_GRACE_S, agent: Optional[agents.Agent] = None) -> None:
    """Wait until no process of the launch is left, killing stragglers: a lease on a device may only be
    released once nothing of the launch holds it (an orphaned rank keeps its GPU memory). Never raises: what was
    measured is recorded whatever ending the processes met."""
    try:
        left = launch_processes(token, agent)
        for p in left:  # the launch is over: what is left of it is asked to stop, then killed after the grace
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(left, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=grace_s)
    except (psutil.Error, OSError) as e:
        print(f"[scaling] ending launch {token}: {e}", file=sys.stderr, flush=True)


def step_name(token: str) -> str:
    """The name of the SLURM job step a launch through srun starts (`squeue --steps` shows it)."""
    return f"scaling-{token}"


def _through_srun(argv: Sequence[str]) -> bool:
    """Whether the launch starts its nodes through srun (a multi-node point started from one process)."""
    return bool(argv) and Path(argv[0]).name == "srun"


def srun_named(argv: Sequence[str], token: str) -> list[str]:
    """`argv` with its srun (a multi-node point started from one process) naming its job step after the launch."""
    if _through_srun(argv):
        return [argv[0], f"--job-name={step_name(token)}", *argv[1:]]
    return list(argv)


def slurm_steps(job_id: str, name: str) -> list[str]:
    """The ids (`<job>.<step>`) of the job's steps of that name still in SLURM's queue; [] when squeue cannot say."""
    try:
        out = subprocess.run(
            ["squeue", "--steps", f"--jobs={job_id}", "--noheader", "--format=%i %j"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [words[0] for words in map(str.split, out.splitlines()) if words[1:] == [name]]


def end_slurm_step(token: str, env: Mapping[str, str], wait_s: float = STEP_END_S) -> None:
    """Cancel the SLURM job step the launch `token` started through srun and wait (at most `wait_s`) until it has
    left the queue, on every node: srun's own end does not always end the step's tasks elsewhere (a srun killed
    with SIGKILL forwards nothing). Only this job's step of that name: another launch's is never touched. Never
    raises."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return
    start = time.monotonic()
    asked = start - STEP_CANCEL_AGAIN_S
    while steps := slurm_steps(job, step_name(token)):
        now = time.monotonic()
        if now - start > wait_s:
            print(f"[scaling] SLURM step {', '.join(steps)} still queued after {wait_s:.0f} s", file=sys.stderr)
            return
        if now - asked >= STEP_CANCEL_AGAIN_S:  # again while it stays: a step still starting may miss the first
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["scancel", *steps], capture_output=True, timeout=30)
            asked = now
        time.sleep(0.5)


def launch_torchrun(
    argv: Sequence[str], job_dir: Path, timeout_s: float, env: Mapping[str, str], log_name: str = TORCHRUN_LOG
) -> Outcome:
    """Run one point's torchrun, wait at most `timeout_s`, leave no process of it behind (by its token), and classify
    the result."""
    log_path = job_dir / log_name
    token = new_token()
    start = time.perf_counter()
    with open_new(log_path) as log:
        proc = agents.start(srun_named(argv, token), {**env, LAUNCH_ENV: token}, log)
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None or timed_out:
                kill_tree(proc)
            end_launch(token, agent=proc)
            if _through_srun(argv):
                end_slurm_step(token, env)
    wall_s = time.perf_counter() - start
    status, error = judge(proc.returncode, timed_out, job_dir, log_path, timeout_s)
    return Outcome(status=status, error=error, returncode=proc.returncode, wall_s=wall_s)


def judge(
    returncode: Optional[int], timed_out: bool, job_dir: Path, log_path: Path, timeout_s: float
) -> tuple[str, Optional[str]]:
    """`classify` a job that ended, from the error files in `job_dir` and the tail of its log."""
    log_tail = log_path.read_bytes()[-20000:].decode(errors="replace")
    return classify(returncode, timed_out, error_messages(job_dir), log_tail, timeout_s)


CUDA_ALLOC_CONF = "expandable_segments:True"
"""The CUDA caching allocator's setting of a job's ranks unless PYTORCH_CUDA_ALLOC_CONF is set: segments that grow in
place. Under the default allocator points the predictor put within 5% of the card ran out of memory with gigabytes
reserved but unallocated (llama_1b seq 4096 mbs 8 on an H200: 117.4 GiB allocated, 6.7 GiB reserved and free, 15.7
GiB asked for); with this setting the same point ran, its peak 133.02 GiB against 132.96 predicted
(benchmarks/RESULTS.md, "Models nobody here wrote ... on an H200")."""


def job_env(threads_per_device: int, devices: Optional[str], cuda: bool) -> dict[str, str]:
    """Environment of a job: this process's, with each rank's thread count and devices, NCCL's error handling on (a
    failed collective aborts its communicator instead of hanging) and the allocator's growable segments
    (CUDA_ALLOC_CONF) on CUDA unless this process's environment says otherwise, and off CUDA the ranks forked from
    their agent (scaling.engine.agent.FORK_ENV) unless it says otherwise."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads_per_device)
    env["PYTHONUNBUFFERED"] = "1"
    if cuda:
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)
        env.pop(FORK_ENV, None)
    else:
        env.setdefault(FORK_ENV, "1")  # ranks forked from the agent, their imports made once (scaling/engine/agent.py)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env
