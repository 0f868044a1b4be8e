"""What each torchrun rank runs: train a few steps of one experiment point and measure them.

    torchrun --standalone --nproc-per-node=<world size> -m scaling.engine.worker <launch_dir>/config.json

`measure_point`, read top-down, is a rank's whole job: the device, the process group, the model built for its ZeRO
stage (scaling.engine.parallel), the warm-up steps (on CPU the last under the memory tracker), the timed steps,
and rank 0's `worker.json` (scaling.engine.jobfiles.WorkerReport). `main` is wrapped in torch elastic's `@record`,
so an exception lands in an error file the driver classifies. `--serve <pool_dir>` keeps the ranks up for several
points of one shape (warm ranks: scaling.launch.warm), each freed after it is measured (`release`).
torch and the standard library only: this must run on a bare GPU box.
"""

from __future__ import annotations

if __name__ == "__main__":  # a rank: first of all, before `import torch` (seconds), tie its life to torchrun's
    import gc

    # No cyclic collection while torch and its compiler stack are imported (a fifth of the import's CPU goes to
    # collections that walk the new modules over and over and find next to nothing): `measure_point` freezes what
    # the imports made and turns the collector back on, before the point's build.
    gc.disable()
    from scaling.engine.lifetime import die_with_torchrun, forked_from_agent, gate

    forked_from_agent()

    gate("rank_started")
    die_with_torchrun()
    gate("before_torch")

import ctypes
import datetime as dt
import gc
import importlib
import os
import platform
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from scaling.core.enums import ZeroStage
from scaling.core.schema import HardwareConfig, TrainConfig
from scaling.engine import device as devices
from scaling.engine import kernels, memtrack
from scaling.engine.data import GlobalBatch, step_batches
from scaling.engine.jobfiles import (
    ELASTIC_LOGS,
    MEMORY_SNAPSHOT_FILE,
    WORKER_OUTPUT,
    PointJob,
    WorkerReport,
    open_pipe,
    wake_pipe,
    warm_command,
    warm_done,
    warm_taken,
)
from scaling.engine.lifetime import forked_by_agent, gate
from scaling.engine.parallel import WRAPPERS, load_wrappers, parallelize
from scaling.engine.step import train_step
from scaling.model.family import family_of

MEMORY_HISTORY_ENTRIES = 2_000_000
"""Allocator events kept for launch.memory_snapshot: a llama_1b step makes tens of thousands; the oldest go first."""


def warmup_steps(train: TrainConfig, device_type: str) -> int:
    """Untimed steps before timing: as configured, but on CPU at least 2 (the second is memory-tracked: the first
    made the optimizer states, and DDP rebuilds its gradient buckets in the second, a one-off peak that a device
    would have to hold too) and on CUDA at least 2, 3 with compile (lazy init, autotuning)."""
    floor = (3 if train.compile else 2) if device_type == "cuda" else 2
    return max(train.warmup_steps, floor)


def _inject_fault(kind: str, rank: int, world: int) -> None:
    """Fault injection for resilience tests, on the last rank at its first step: crash, hang or run out of
    memory (the other ranks are then waiting for it in their first collective)."""
    if kind == "none" or rank != world - 1:
        return
    if kind == "crash":
        raise RuntimeError(f"injected fault: rank {rank} crashed on purpose (train.fault=crash)")
    if kind == "oom":
        raise torch.OutOfMemoryError(f"injected fault: rank {rank} ran out of memory on purpose (train.fault=oom)")
    while True:  # kind == "hang": the other ranks wait in their next collective
        time.sleep(3600)


class Phases:
    """Wall time of each start-up phase of a rank, in seconds, by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def end(self, name: str) -> None:
        """Close the phase that began at the previous end."""
        now = time.perf_counter()
        self.seconds[name] = now - self._mark
        self._mark = now


def _gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """All ranks' lists of floats (same length on every rank), indexed [rank][i]."""
    local = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return [t.tolist() for t in out]


def measure_point(job: PointJob, job_dir: Path, points_before: int = 0) -> None:
    """Train and measure one experiment point as this rank; rank 0 writes worker.json. `points_before`: the
    points these ranks measured before this one (warm ranks)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cfg = job.config
    hw, train, par = cfg.hardware, cfg.train, cfg.parallel
    phases = Phases()

    # The device, and the process group with a timeout below the point's, so that a rank left waiting
    # for a dead peer fails with its own error before the driver's timeout kills everything.
    dev = devices.setup(hw, int(os.environ.get("LOCAL_RANK", 0)))
    cuda = dev.device.type == "cuda"
    if cuda:
        kernels.forbid_math_attention()
        # the allocator's counters (num_ooms, num_alloc_retries) are accumulated over the process's life: from zero
        # for each point, as in a fresh rank, whatever the ranks ran before
        torch.cuda.reset_accumulated_memory_stats(dev.device)
    if not dist.is_initialized():  # a warm rank joined it for its first point
        dist.init_process_group(
            hw.backend,
            device_id=dev.device if cuda else None,
            timeout=dt.timedelta(seconds=job.pg_timeout_s),
        )
    load_wrappers(par.layout)  # imported now, so that their memory is part of the baseline
    family_of(cfg.model).load_code()  # the model's own modules too
    if not cuda:
        memtrack.load_trackers()
    resident = memtrack.ResidentMemory()  # baseline: this rank after its imports
    # One garbage-collection policy, fresh or warm: what exists before the point's build (a fresh rank's imports, a
    # warm rank's imports and what outlived its earlier points) is frozen out of the collector's walk, so the point's
    # collections, timed or not, walk what the point makes and nothing else; a warm rank collects that between
    # points (`release`), a walk of the point's objects alone.
    gc.freeze()
    gc.enable()  # off in a rank from its start to here (above `import torch`)
    phases.end("init_process_group_s")
    gate("process_group")

    # Build: only what this rank owns is ever allocated (see scaling.engine.parallel).
    snapshot = cuda and rank == 0 and cfg.launch.memory_snapshot
    if snapshot:  # every allocation from here to the end of the warm-up, with its stack
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=MEMORY_HISTORY_ENTRIES)
    wrapped = parallelize(cfg.model, train, par, dev.device, microbatches=job.grad_acc)
    build_peak_bytes = torch.cuda.max_memory_allocated(dev.device) if cuda else resident.peak_growth_bytes()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev.device)  # from here on: the training steps' peak
    resident.reset_peak()
    phases.end("build_s")
    gate("model_built")

    data = GlobalBatch(family_of(cfg.model).vocab_size(), train.seq_len, train.seed, **asdict(train.data))
    mbs, grad_acc = train.mbs, job.grad_acc
    losses: list[torch.Tensor] = []
    grad_norms: list[torch.Tensor] = []

    dp_rank, _ = par.layout.coordinates(rank)  # a tensor-parallel group's ranks train on one dp rank's rows

    def batches(step: int) -> list[torch.Tensor]:
        return step_batches(data, step, dp_rank, mbs, grad_acc, pin=cuda)

    def one_step(micro_batches: list[torch.Tensor], before_micro: Optional[Callable[[], None]] = None) -> float:
        t0 = time.perf_counter()
        loss, grad_norm = train_step(wrapped, micro_batches, before_micro)
        losses.append(loss)
        if grad_norm is not None:
            grad_norms.append(grad_norm)
        if cuda:
            torch.cuda.synchronize(dev.device)
        return time.perf_counter() - t0

    gate("first_step")
    _inject_fault(train.fault, rank, world)
    n_warmup = warmup_steps(train, dev.device.type)
    with kernels.AttentionWatch() as attention:  # the kernel the training step runs, compiled or not
        warmup_times = [one_step(batches(0))]
    dev.env["attention_kernel"] = attention.kernel
    tracked_peak, breakdown = None, {}
    if not cuda:  # the second step: live tensor bytes under torch's tracker, against the capacity
        micro_batches = batches(len(losses))
        tracked, fsdp, follow = wrapped.model, par.zero_stage >= ZeroStage.GRADIENTS, True
        if wrapped.pipeline is not None:  # FSDP2's tracker follows one root: a rank's one stage module, else none
            stages = wrapped.pipeline.modules
            tracked, fsdp = (stages[0], fsdp) if len(stages) == 1 else (wrapped.model, False)
            follow = not wrapped.pipeline.split_backward
        with memtrack.tracked_step(tracked, wrapped.optimizer, fsdp, dev.capacity_bytes, follow) as peak:
            warmup_times.append(one_step(micro_batches, peak.new_micro_step if follow else None))
        tracked_peak, breakdown = peak.peak_bytes, peak.breakdown
        memtrack.raise_if_exceeded(peak.exceeded)
    warmup_times += [one_step(batches(len(losses))) for _ in range(n_warmup - len(warmup_times))]
    if snapshot:
        torch.cuda.memory._dump_snapshot(str(job_dir / MEMORY_SNAPSHOT_FILE))
        torch.cuda.memory._record_memory_history(enabled=None)
    phases.end("warmup_s")

    # Every timed step's micro-batches exist before the window: no data work between two timed steps.
    timed_batches = [batches(len(losses) + i) for i in range(train.steps)]
    graphs_after_warmup = kernels.compiled_graphs()
    rows_before_window = data.rows_built
    if wrapped.pipeline is not None:
        wrapped.pipeline.reset_clock()
    dist.barrier()
    window_start = time.perf_counter()
    step_times = [one_step(micro_batches) for micro_batches in timed_batches]
    window_s = time.perf_counter() - window_start
    recompiles = kernels.compiled_graphs() - graphs_after_warmup
    idle = (
        None
        if wrapped.pipeline is None
        else [row[0] for row in _gather_floats([wrapped.pipeline.idle_frac() or 0.0], dev.device)]
    )
    rows_built_in_window = data.rows_built - rows_before_window

    # Every rank joins the collectives below, in the same order (keyword arguments run left to right).
    memory = _memory_per_rank(
        dev,
        {
            "peak_mem_bytes": tracked_peak,
            "peak_mem_reserved_bytes": None,
            "num_ooms": 0,
            "num_alloc_retries": 0,
            "device_used_bytes": None,
            "build_peak_mem_bytes": build_peak_bytes,
            "peak_rss_growth_bytes": resident.peak_growth_bytes(),
            "optimizer_state_bytes": memtrack.optimizer_state_bytes(wrapped.optimizer),
        },
    )
    report = WorkerReport(
        warmup_steps_run=n_warmup,
        warmup_step_times_s=warmup_times,
        compile=train.compile,
        recompiles_after_warmup=recompiles,
        phases_s=phases.seconds,
        measured_window_s=window_s,
        peak_mem_breakdown_rank0=breakdown or None,
        losses=_mean_over_ranks(losses, par.layout.pp),
        step_times_s=[max(ts) for ts in zip(*_gather_floats(step_times, dev.device))],
        final_param_norm=wrapped.param_norm(),
        peak_mem_source="cuda_max_memory_allocated" if cuda else "mem_tracker",
        peak_mem_bytes_per_rank=memory["peak_mem_bytes"],
        peak_mem_reserved_bytes_per_rank=memory["peak_mem_reserved_bytes"],
        device_used_bytes_per_rank=memory["device_used_bytes"],
        build_peak_mem_bytes_per_rank=memory["build_peak_mem_bytes"],
        peak_rss_growth_bytes_per_rank=memory["peak_rss_growth_bytes"],
        optimizer_state_bytes_per_rank=memory["optimizer_state_bytes"],
        num_ooms=sum(memory["num_ooms"] or [0]),
        num_alloc_retries=sum(memory["num_alloc_retries"] or [0]),
        env=_env(cfg.hardware, dev),
        rows_built_in_timed_window=rows_built_in_window,
        grad_norms=[float(n) for n in grad_norms] if grad_norms else None,
        points_before=points_before,
        pipeline_idle_frac_per_rank=idle,
    )
    if rank == 0:
        report.write(job_dir / WORKER_OUTPUT)


def _memory_per_rank(dev: devices.Device, memory: dict[str, Optional[int]]) -> dict[str, Optional[list[int]]]:
    """Every rank's memory figures by name, indexed by rank (on CUDA the allocator's own replace this rank's);
    None for a figure this device kind does not have."""
    if dev.device.type == "cuda":
        cm = memtrack.cuda_memory(dev.device)
        memory = {
            **memory,
            "peak_mem_bytes": cm["peak_allocated"],
            "peak_mem_reserved_bytes": cm["peak_reserved"],
            "num_ooms": cm["num_ooms"],
            "num_alloc_retries": cm["num_alloc_retries"],
            "device_used_bytes": cm["device_used"],
        }
    names = list(memory)
    gathered = _gather_floats([float("nan") if memory[k] is None else float(memory[k]) for k in names], dev.device)
    return {
        k: None if any(row[i] != row[i] for row in gathered) else [int(row[i]) for row in gathered]
        for i, k in enumerate(names)
    }  # NaN: a figure this device kind does not have


def _mean_over_ranks(losses: list[torch.Tensor], pp: int = 1) -> list[float]:
    """Each step's loss averaged over the ranks that hold one (each rank's is the mean over its own samples): every
    rank, or with pipeline stages those of the last stage (the others hold 0)."""
    summed = torch.stack(losses).double()
    dist.all_reduce(summed)
    return (summed / (dist.get_world_size() // pp)).tolist()


def _env(hardware: HardwareConfig, dev: devices.Device) -> dict[str, Any]:
    """Where the point ran, for the record's `env`; on CPU which cores each rank ran on (shared ones mean the
    point was oversubscribed)."""
    world = dist.get_world_size()
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backend": hardware.backend,
        "hostname": socket.gethostname(),
        "memory_capacity": dev.memory_capacity,
        "world_size": world,
        **{k: v for k, v in dev.env.items() if k != "cores"},
    }
    if dev.device.type != "cuda":
        cores: list[Any] = [None] * world
        dist.all_gather_object(cores, dev.env["cores"])
        env.update(cores_per_rank=cores, oversubscribed=len({c for rank in cores for c in rank}) < sum(map(len, cores)))
    return env


def release(cuda: bool) -> None:
    """After a point in a warm rank: free everything it made, so the next point starts as a fresh rank would
    (garbage collected, the CUDA allocator's cache emptied and its peaks reset, compiled graphs dropped, and the
    C heap's free pages handed back to the OS, so that resident-memory growth is measured from a trimmed heap)."""
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (AttributeError, OSError):  # not glibc
            pass


ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Where torch's ErrorHandler writes a rank's error (torchrun sets it per rank)."""


def _record_error(job_dir: Path, e: BaseException) -> None:
    """Write this rank's error for the point in `job_dir` as torchrun's `@record` writes a fresh rank's (the same
    writer, pointed at the point's directory), so the driver classifies it the same way (call it in `except`)."""
    path = job_dir / ELASTIC_LOGS / "warm" / os.environ["RANK"] / "error.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(ERROR_FILE_ENV)
    os.environ[ERROR_FILE_ENV] = str(path)
    try:
        ErrorHandler().record_exception(e)
    finally:
        if previous is None:
            del os.environ[ERROR_FILE_ENV]
        else:
            os.environ[ERROR_FILE_ENV] = previous


def serve(pool_dir: Path) -> None:
    """A warm rank: measure the points the driver hands this job, one after another, until it says stop."""
    n = 0
    cuda = False
    wake_fd = open_pipe(wake_pipe(pool_dir, int(os.environ["RANK"])))
    while (config_path := warm_command(pool_dir, n, wake_fd)) is not None:
        if int(os.environ["RANK"]) == 0:
            warm_taken(pool_dir, n)
        job = PointJob.read(config_path)
        cuda = job.config.hardware.device == "cuda"
        try:
            measure_point(job, config_path.parent, points_before=n)
        except memtrack.EmulatedOutOfMemoryError as e:  # every rank raised it together, outside any collective
            _record_error(config_path.parent, e)
        release(cuda)
        dist.barrier()  # every rank has freed the point before the driver hands out the next
        if int(os.environ["RANK"]) == 0:
            warm_done(pool_dir, n)
        n += 1
    if dist.is_initialized():
        _leave(cuda)


def _leave(cuda: bool) -> None:
    """Wait for every rank, then exit this process at once."""
    dist.barrier()
    if cuda:
        dist.destroy_process_group()
    # On gloo leave without tearing down: freeing the DDP reducer's gloo group while its worker thread
    # still waits for the GIL to release a finished work's tensors deadlocks the exit.
    sys.stdout.flush()
    sys.stderr.flush()
    if forked_by_agent():
        return  # forked by the agent (scaling/engine/agent.py): torchrun's process context ends it with os._exit
    os._exit(0)


def preload() -> None:
    """What a CPU rank of any layout imports beyond this module, for an agent that forks its ranks to import once
    (scaling/engine/agent.py): torch's compiler stack (a rank's first optimizer step imports it), every wrapper a
    layout may use and the memory trackers."""
    import torch._dynamo  # noqa: F401

    for name in WRAPPERS:
        importlib.import_module(name)
    memtrack.load_trackers()


@record
def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: `python -m scaling.engine.worker <job_dir>/config.json`, or
    `... --serve <pool_dir>` for warm ranks."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "--serve":
        serve(Path(argv[1]))
        return
    config_path = Path(argv[0])
    job = PointJob.read(config_path)
    measure_point(job, config_path.parent)
    _leave(job.config.hardware.device == "cuda")


if __name__ == "__main__":
    gate("torch_imported")
    main()
