"""The files of one point's job directory, named once, and the typed content of `worker.json` (`WorkerReport`), the
contract between rank 0 and the driver; and the files of a warm job's folder, where the driver hands out points
(`warm_send`, `warm_command`) and rank 0 answers. The list of files and what writes each: docs/record.md.
Standard library only: the worker and the driver both import it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from scaling.core.files import read_json, write_json_atomic
from scaling.core.schema import ExperimentConfig

CONFIG_FILE = "config.json"
MEMORY_SNAPSHOT_FILE = "memory_snapshot.pickle"
"""launch.memory_snapshot on CUDA: rank 0's allocator history of the build and the warm-up steps."""
WORKER_OUTPUT = "worker.json"
TORCHRUN_LOG = "torchrun.log"
ELASTIC_LOGS = "elastic"
LAUNCHES_DIR = "launches"
"""Under a point's directory, one directory per launch (`<attempt>.<n>`): its config.json, torchrun log, rank 0's
worker.json, torchrun's error files (elastic/) and the memory snapshot. A launch writes only into its own."""
RESULT_FILE = "result.json"
RUNNING_FILE = "running.json"
CLAIM_FILE = "claim.lock"


WARM_CHECK_S = 0.5
"""How often the driver, blocked on a warm job's `done` pipe, looks whether the job's torchrun still runs."""
DONE_PIPE = "done"


def wake_pipe(pool_dir: Path, rank: int) -> Path:
    """The named pipe a warm rank blocks on between points: the driver writes a byte to it after each command."""
    return pool_dir / f"wake-{rank}"


def make_pipes(pool_dir: Path, nproc: int) -> None:
    """The driver, before it starts a warm job: one wake pipe per rank and the pipe rank 0 says `done` on."""
    for path in [*(wake_pipe(pool_dir, r) for r in range(nproc)), pool_dir / DONE_PIPE]:
        os.mkfifo(path, 0o600)


def open_pipe(path: Path) -> int:
    """The reading end of a pipe, kept open (read-write, so that no writer's close ends it): reads block until a
    byte comes, and a writer's non-blocking open finds a reader."""
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)


def poke(path: Path) -> None:
    """Write one byte to a pipe without blocking; nothing when no reader has it open yet (it will look at the files
    before it blocks) or its buffer is full (it has bytes to wake on already)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # ENXIO: no reader yet; ENOENT: the job is gone
        return
    try:
        os.write(fd, b".")
    except BlockingIOError:
        pass
    finally:
        os.close(fd)


def warm_send(pool_dir: Path, n: int, config_path: Optional[Path], nproc: int) -> None:
    """The driver: hand point `n` (its config.json) to a warm job of `nproc` ranks, or tell it to stop (None), and
    wake its ranks."""
    write_json_atomic(pool_dir / f"command-{n}.json", {"config": None if config_path is None else str(config_path)})
    for rank in range(nproc):
        poke(wake_pipe(pool_dir, rank))


def warm_command(pool_dir: Path, n: int, wake_fd: int) -> Optional[Path]:
    """A warm rank: wait for command `n`, blocked on its wake pipe (`wake_fd`, from `open_pipe`: no polling on the
    cores the next point is measured on); the config.json of the point to measure, or None to stop."""
    path = pool_dir / f"command-{n}.json"
    while (command := read_json(path)) is None:
        os.read(wake_fd, 64)
    return None if command["config"] is None else Path(command["config"])


def warm_taken(pool_dir: Path, n: int) -> None:
    """Rank 0 of a warm job: point `n` is taken (from here on the job answers for it)."""
    (pool_dir / f"taken-{n}").touch()


def warm_was_taken(pool_dir: Path, n: int) -> bool:
    """The driver: whether rank 0 took point `n` (a job that ended before it did never started the point)."""
    return (pool_dir / f"taken-{n}").exists()


def warm_done(pool_dir: Path, n: int) -> None:
    """Rank 0 of a warm job: point `n` is measured and every rank has freed it (and the driver is woken)."""
    (pool_dir / f"done-{n}").touch()
    poke(pool_dir / DONE_PIPE)


def warm_is_done(pool_dir: Path, n: int) -> bool:
    """The driver: whether point `n` of a warm job is done."""
    return (pool_dir / f"done-{n}").exists()


@dataclass(frozen=True)
class PointJob:
    """What a rank is told to measure, read from the job directory's config.json: the typed experiment config, the
    grad_acc the driver derived, and the process group's timeout (below the point's, so that a rank left waiting for
    a dead peer fails with its own error before the driver ends it)."""

    config: ExperimentConfig
    grad_acc: int
    pg_timeout_s: float

    @classmethod
    def read(cls, path: str | os.PathLike) -> PointJob:
        """The job in a config.json the driver wrote (its `derived` and `runtime` beside the experiment groups)."""
        data = json.loads(Path(path).read_text())
        derived, runtime = data.pop("derived"), data.pop("runtime")
        return cls(ExperimentConfig.from_dict(data), int(derived["grad_acc"]), runtime["pg_timeout_s"])


@dataclass(kw_only=True)
class WorkerReport:
    """What rank 0 measured, as `worker.json` holds it: one key per field, in this order.

    Lists `*_per_rank` are indexed by rank; a memory figure the device kind does not have (CUDA's
    reserved bytes on CPU, say) is None.
    """

    warmup_steps_run: int
    """Untimed steps run before the timed ones (on CPU the last one under the memory tracker)."""
    warmup_step_times_s: list[float]
    """Seconds of each warm-up step, on rank 0."""
    compile: bool
    """Whether the model ran under torch.compile (train.compile)."""
    recompiles_after_warmup: int
    """Graphs compiled during the timed steps (0 when the warm-up compiled them all)."""
    phases_s: dict[str, float]
    """Seconds of each start-up phase on rank 0, by name (init_process_group_s, build_s, warmup_s)."""
    measured_window_s: float
    """Seconds from the barrier before the timed steps to the end of the last one, on rank 0."""
    peak_mem_breakdown_rank0: Optional[dict[str, int]]
    """Rank 0's live tensor bytes by kind at its tracked peak (CPU); None on CUDA."""
    losses: list[float]
    """Loss of every optimizer step, warm-up steps included, averaged over ranks."""
    step_times_s: list[float]
    """Seconds of each timed step: the slowest rank's."""
    final_param_norm: float
    """L2 norm of all parameters after the last step (identical on every rank)."""
    peak_mem_source: str
    """How `peak_mem_bytes_per_rank` was measured: `cuda_max_memory_allocated` or `mem_tracker` (CPU)."""
    peak_mem_bytes_per_rank: list[int]
    """Peak bytes of the training steps: CUDA's max allocated, or on CPU the tracked live tensor bytes."""
    peak_mem_reserved_bytes_per_rank: Optional[list[int]]
    """CUDA's max reserved bytes over the training steps; None on CPU."""
    device_used_bytes_per_rank: Optional[list[int]]
    """Bytes in use on the CUDA device after the last step (every process on it); None on CPU."""
    build_peak_mem_bytes_per_rank: Optional[list[int]]
    """Peak bytes of building the model: CUDA's max allocated, or on CPU the growth of peak resident memory."""
    peak_rss_growth_bytes_per_rank: Optional[list[int]]
    """Growth of peak resident memory over the warm-up and timed steps, bytes (None off Linux)."""
    optimizer_state_bytes_per_rank: Optional[list[int]]
    """Bytes of the optimizer states each rank holds."""
    num_ooms: int
    """CUDA allocator out-of-memory events, summed over ranks (0 on CPU)."""
    num_alloc_retries: int
    """CUDA allocator retries after freeing its cache, summed over ranks (0 on CPU)."""
    env: dict[str, Any]
    """Where it ran: torch, python, backend, hostname, memory_capacity, world_size and the device's own facts
    (device_name, threads_per_device, ...; on CPU also cores_per_rank and oversubscribed)."""
    rows_built_in_timed_window: Optional[int] = None
    """Data rows built between the first and the last timed step: 0, since every timed step's batches are built
    before the window."""
    grad_norms: Optional[list[float]] = None
    """The global gradient norm of each optimizer step before clipping (train.grad_clip); None with clipping off."""
    points_before: int = 0
    """Points the same ranks measured before this one (launch.reuse); 0 for a fresh launch."""
    pipeline_idle_frac_per_rank: Optional[list[float]] = None
    """With pipeline stages: each rank's share of the timed steps' schedule time it did not compute (waits on the
    other stages, sends: the bubble, measured); None without stages."""

    def write(self, path: str | os.PathLike) -> None:
        """Write the report atomically as JSON."""
        write_json_atomic(path, asdict(self))

    @classmethod
    def read(cls, path: str | os.PathLike) -> Optional[WorkerReport]:
        """The report in `path`, or None when it is missing or not whole JSON."""
        data = read_json(path)
        return None if data is None else cls(**data)
